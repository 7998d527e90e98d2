// Package etcdclient makes the four read-only etcd v3 calls the provider
// needs (member list, a member's status, the alarm list, a key count at a
// revision) as gRPC requests over Go's own HTTP/2 client, with the few
// protobuf fields read and written by hand.
//
// It behaves as go.etcd.io/etcd/client/v3 does for these calls: a call
// waits for the member to be reachable (connection failures and
// Unavailable answers are retried, 25 ms apart and doubling, up to 1 s)
// until its context ends, and then fails with the context's error; an
// etcd error is its message ("etcdserver: ..."). What it does not link is
// grpc-go, the generated protobuf types and zap: their init and size were
// a large part of what every provider process spent starting, a converged
// boot's included, for calls that only an upgrade makes.
package etcdclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client talks to etcd members with one TLS identity.
type Client struct {
	endpoint string // the member calls go to, unless named (Status)
	hc       *http.Client
}

// New is a client for endpoint ("https://host:port"), dialling each
// connection within dialTimeout (0: no bound but the call's context).
// Nothing is dialled until a call.
func New(endpoint string, tlsCfg *tls.Config, dialTimeout time.Duration) *Client {
	t := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsCfg.Clone(),
		TLSHandshakeTimeout: dialTimeout,
		Proxy:               nil, // gRPC to a member: never through a proxy
	}
	// gRPC is HTTP/2 only: negotiated by ALPN over TLS, with prior
	// knowledge over plain http:// client URLs.
	t.Protocols = new(http.Protocols)
	t.Protocols.SetHTTP2(true)
	t.Protocols.SetUnencryptedHTTP2(true)
	return &Client{endpoint: strings.TrimRight(endpoint, "/"), hc: &http.Client{Transport: t}}
}

// Close drops the client's connections.
func (c *Client) Close() error {
	c.hc.CloseIdleConnections()
	return nil
}

// Member is one etcd member.
type Member struct {
	ID         uint64
	Name       string
	PeerURLs   []string
	ClientURLs []string // empty until the member has started
	IsLearner  bool
}

// MemberList lists the members: linearizable (through the leader) unless
// serializable (the member's own view).
func (c *Client) MemberList(ctx context.Context, serializable bool) ([]Member, error) {
	var req []byte
	if !serializable {
		req = appendBool(req, 1, true) // linearizable
	}
	b, err := c.call(ctx, c.endpoint, "/etcdserverpb.Cluster/MemberList", req)
	if err != nil {
		return nil, err
	}
	var out []Member
	err = fields(b, func(num int, typ byte, v uint64, data []byte) error {
		if num != 2 || typ != wireBytes {
			return nil
		}
		var m Member
		err := fields(data, func(num int, typ byte, v uint64, data []byte) error {
			switch {
			case num == 1 && typ == wireVarint:
				m.ID = v
			case num == 2 && typ == wireBytes:
				m.Name = string(data)
			case num == 3 && typ == wireBytes:
				m.PeerURLs = append(m.PeerURLs, string(data))
			case num == 4 && typ == wireBytes:
				m.ClientURLs = append(m.ClientURLs, string(data))
			case num == 5 && typ == wireVarint:
				m.IsLearner = v != 0
			}
			return nil
		})
		out = append(out, m)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("member list answer: %w", err)
	}
	return out, nil
}

// Status is what a member says of itself.
type Status struct {
	ClusterID uint64 // from the response header
	MemberID  uint64
	Revision  int64
	Version   string
	DBSize    int64
	Leader    uint64
	Errors    []string
	IsLearner bool
}

// Status asks the member at endpoint (a client URL) for its status.
func (c *Client) Status(ctx context.Context, endpoint string) (Status, error) {
	b, err := c.call(ctx, strings.TrimRight(endpoint, "/"), "/etcdserverpb.Maintenance/Status", nil)
	if err != nil {
		return Status{}, err
	}
	var st Status
	err = fields(b, func(num int, typ byte, v uint64, data []byte) error {
		switch {
		case num == 1 && typ == wireBytes:
			h, err := header(data)
			st.ClusterID, st.MemberID, st.Revision = h.clusterID, h.memberID, h.revision
			return err
		case num == 2 && typ == wireBytes:
			st.Version = string(data)
		case num == 3 && typ == wireVarint:
			st.DBSize = int64(v)
		case num == 4 && typ == wireVarint:
			st.Leader = v
		case num == 8 && typ == wireBytes:
			st.Errors = append(st.Errors, string(data))
		case num == 10 && typ == wireVarint:
			st.IsLearner = v != 0
		}
		return nil
	})
	if err != nil {
		return Status{}, fmt.Errorf("status answer: %w", err)
	}
	return st, nil
}

// Alarm is a raised alarm.
type Alarm struct {
	MemberID uint64
	Type     AlarmType
}

// AlarmType is etcd's alarm type.
type AlarmType int32

// String is the name etcd gives the alarm.
func (a AlarmType) String() string {
	switch a {
	case 0:
		return "NONE"
	case 1:
		return "NOSPACE"
	case 2:
		return "CORRUPT"
	}
	return strconv.Itoa(int(a))
}

// AlarmList lists the raised alarms of every member.
func (c *Client) AlarmList(ctx context.Context) ([]Alarm, error) {
	// action GET, memberID 0 (all), alarm NONE (all): every field zero.
	b, err := c.call(ctx, c.endpoint, "/etcdserverpb.Maintenance/Alarm", nil)
	if err != nil {
		return nil, err
	}
	var out []Alarm
	err = fields(b, func(num int, typ byte, v uint64, data []byte) error {
		if num != 2 || typ != wireBytes {
			return nil
		}
		var a Alarm
		err := fields(data, func(num int, typ byte, v uint64, _ []byte) error {
			switch {
			case num == 1 && typ == wireVarint:
				a.MemberID = v
			case num == 2 && typ == wireVarint:
				a.Type = AlarmType(int32(v))
			}
			return nil
		})
		out = append(out, a)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("alarm answer: %w", err)
	}
	return out, nil
}

// CountAll counts every key at revision rev (0: the latest), serializable
// (the member's own store) when asked.
func (c *Client) CountAll(ctx context.Context, rev int64, serializable bool) (int64, error) {
	// The whole keyspace: key and range_end both "\x00".
	var req []byte
	req = appendBytes(req, 1, []byte{0})
	req = appendBytes(req, 2, []byte{0})
	if rev != 0 {
		req = appendVarint(req, 4, uint64(rev))
	}
	if serializable {
		req = appendBool(req, 7, true)
	}
	req = appendBool(req, 9, true) // count_only
	b, err := c.call(ctx, c.endpoint, "/etcdserverpb.KV/Range", req)
	if err != nil {
		return 0, err
	}
	var n int64
	err = fields(b, func(num int, typ byte, v uint64, _ []byte) error {
		if num == 4 && typ == wireVarint {
			n = int64(v)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("range answer: %w", err)
	}
	return n, nil
}

// Error is an etcd member's (or its gRPC server's) refusal.
type Error struct {
	Code    Code
	Message string
}

// Error is the message as clientv3 gives it: etcd's own errors bare
// ("etcdserver: ..."), others with their gRPC code.
func (e *Error) Error() string {
	if strings.HasPrefix(e.Message, "etcdserver: ") {
		return e.Message
	}
	return fmt.Sprintf("rpc error: code = %s desc = %s", e.Code, e.Message)
}

// Code is a gRPC status code.
type Code uint32

// The codes the provider tells apart.
const (
	OK          Code = 0
	Unknown     Code = 2
	OutOfRange  Code = 11
	Unavailable Code = 14
)

var codeNames = []string{"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
	"PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented", "Internal",
	"Unavailable", "DataLoss", "Unauthenticated"}

func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "Code(" + strconv.Itoa(int(c)) + ")"
}

// compactedMessage is etcd's rpctypes.ErrCompacted.
const compactedMessage = "etcdserver: mvcc: required revision has been compacted"

// IsCompacted reports etcd's answer that the revision asked for has been
// compacted away (rpctypes.ErrCompacted).
func IsCompacted(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == OutOfRange && e.Message == compactedMessage
}

// maxAnswer bounds an answer (the member list of a large cluster is a few KiB).
const maxAnswer = 16 << 20

// call makes one unary gRPC call, waiting for the member as clientv3 does:
// connection failures and Unavailable answers are retried until ctx ends,
// which then fails the call with ctx's error (and the last failure).
func (c *Client) call(ctx context.Context, endpoint, method string, req []byte) ([]byte, error) {
	backoff := 25 * time.Millisecond
	for {
		b, err := c.once(ctx, endpoint, method, req)
		if err == nil {
			return b, nil
		}
		var e *Error
		transient := !errors.As(err, &e) || e.Code == Unavailable
		if ctx.Err() != nil {
			if errors.Is(err, ctx.Err()) {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w (last attempt: %v)", ctx.Err(), err)
		}
		if !transient {
			return nil, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (last attempt: %v)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (c *Client) once(ctx context.Context, endpoint, method string, msg []byte) ([]byte, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, &Error{Code: Unknown, Message: fmt.Sprintf("etcd endpoint %q is not an http(s) URL", endpoint)}
	}
	frame := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(msg)))
	frame = append(frame, msg...)
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, u.Scheme+"://"+u.Host+method, bytes.NewReader(frame))
	if err != nil {
		return nil, err
	}
	r.Header.Set("Content-Type", "application/grpc")
	r.Header.Set("Te", "trailers")
	r.Header.Set("User-Agent", "provider-kubernetes")
	if d, ok := ctx.Deadline(); ok {
		r.Header.Set("Grpc-Timeout", grpcTimeout(time.Until(d)))
	}
	resp, err := c.hc.Do(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		return nil, &Error{Code: Unknown, Message: fmt.Sprintf("%s answered over HTTP/%d.%d, not gRPC", u.Host, resp.ProtoMajor, resp.ProtoMinor)}
	}
	if resp.StatusCode != http.StatusOK {
		code := Unknown
		switch resp.StatusCode {
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout, http.StatusTooManyRequests:
			code = Unavailable
		}
		return nil, &Error{Code: code, Message: fmt.Sprintf("unexpected HTTP status %d from %s", resp.StatusCode, u.Host)}
	}
	// A trailers-only answer (an error before any message) has its status
	// in the headers.
	if st := resp.Header.Get("Grpc-Status"); st != "" {
		if err := grpcStatus(st, resp.Header.Get("Grpc-Message")); err != nil {
			return nil, err
		}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+6))
	if err != nil {
		return nil, err
	}
	// The trailers, read once the body is.
	if err := grpcStatus(resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message")); err != nil {
		return nil, err
	}
	if len(body) < 5 {
		return nil, &Error{Code: Unknown, Message: "an answer without a message"}
	}
	if body[0] != 0 {
		return nil, &Error{Code: Unknown, Message: "a compressed answer, not asked for"}
	}
	n := binary.BigEndian.Uint32(body[1:5])
	if n > maxAnswer || int(n) != len(body)-5 {
		return nil, &Error{Code: Unknown, Message: fmt.Sprintf("an answer of %d bytes framed as %d", len(body)-5, n)}
	}
	return body[5:], nil
}

// grpcStatus is the error a grpc-status (and its percent-encoded message) says.
func grpcStatus(status, message string) error {
	if status == "" {
		return &Error{Code: Unknown, Message: "an answer without a gRPC status"}
	}
	code, err := strconv.ParseUint(status, 10, 32)
	if err != nil {
		return &Error{Code: Unknown, Message: fmt.Sprintf("gRPC status %q", status)}
	}
	if code == 0 {
		return nil
	}
	if m, err := url.PathUnescape(message); err == nil {
		message = m
	}
	return &Error{Code: Code(code), Message: message}
}

// grpcTimeout is a grpc-timeout header value: at most 8 digits and a unit.
func grpcTimeout(d time.Duration) string {
	if d < time.Millisecond {
		d = time.Millisecond
	}
	if ms := d.Milliseconds(); ms < 1e8 {
		return strconv.FormatInt(ms, 10) + "m"
	}
	return strconv.FormatInt(min(int64(d.Seconds()), 1e8-1), 10) + "S"
}

// The protobuf wire types read and written here.
const (
	wireVarint = 0
	wire64     = 1
	wireBytes  = 2
	wire32     = 5
)

func appendTag(b []byte, num int, typ byte) []byte {
	return binary.AppendUvarint(b, uint64(num)<<3|uint64(typ))
}

func appendVarint(b []byte, num int, v uint64) []byte {
	return binary.AppendUvarint(appendTag(b, num, wireVarint), v)
}

func appendBool(b []byte, num int, v bool) []byte {
	if !v {
		return b
	}
	return appendVarint(b, num, 1)
}

func appendBytes(b []byte, num int, v []byte) []byte {
	return append(binary.AppendUvarint(appendTag(b, num, wireBytes), uint64(len(v))), v...)
}

var errMalformed = errors.New("malformed protobuf")

// fields walks a message's fields: f gets each one's number, wire type,
// and its varint value or its bytes. Fixed-width fields are skipped.
func fields(b []byte, f func(num int, typ byte, v uint64, data []byte) error) error {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 || tag>>3 == 0 || tag>>3 > 1<<29 {
			return errMalformed
		}
		b = b[n:]
		num, typ := int(tag>>3), byte(tag&7)
		var v uint64
		var data []byte
		switch typ {
		case wireVarint:
			if v, n = binary.Uvarint(b); n <= 0 {
				return errMalformed
			}
			b = b[n:]
		case wireBytes:
			l, n := binary.Uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return errMalformed
			}
			data, b = b[n:n+int(l)], b[n+int(l):]
		case wire64:
			if len(b) < 8 {
				return errMalformed
			}
			b = b[8:]
			continue
		case wire32:
			if len(b) < 4 {
				return errMalformed
			}
			b = b[4:]
			continue
		default:
			return errMalformed
		}
		if err := f(num, typ, v, data); err != nil {
			return err
		}
	}
	return nil
}

type respHeader struct {
	clusterID, memberID uint64
	revision            int64
}

func header(b []byte) (respHeader, error) {
	var h respHeader
	err := fields(b, func(num int, typ byte, v uint64, _ []byte) error {
		if typ != wireVarint {
			return nil
		}
		switch num {
		case 1:
			h.clusterID = v
		case 2:
			h.memberID = v
		case 3:
			h.revision = int64(v)
		}
		return nil
	})
	return h, err
}
