// Package etcdclient makes the four read-only etcd v3 calls the provider
// needs (member list, a member's status, the alarm list, a key count at a
// revision) through go.etcd.io/etcd/client/v3, bounded against a member
// that misbehaves.
//
// A call behaves as clientv3's: it waits for the member to be reachable
// (clientv3's wait-for-ready and its retries of Unavailable answers) until
// its context ends. What this package adds:
//
//   - the last real error: clientv3 reports a call its context ended as
//     the context's bare error; here it also names what the last attempt
//     met ("connection refused", a TLS failure, a leader change), read by
//     an interceptor inside clientv3's retries;
//   - bounds: an answer larger than MaxAnswer is refused by gRPC before it
//     is read whole, a member list longer than MaxMembers is refused
//     before anything is done per member, and an endpoint that is not an
//     http(s) URL with a host is never dialled;
//   - no logging of its own: clientv3's zap logger is a no-op, the errors
//     come back to the caller.
package etcdclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// MaxAnswer bounds one answer's bytes: the member list of a real cluster
// is a few KiB, a status or a count a few hundred bytes.
const MaxAnswer = 2 << 20

// MaxMembers bounds the members a list may name before the provider acts
// on it (etcd recommends at most 7; kubeadm's stacked etcd has one per
// control plane).
const MaxMembers = 64

// Client talks to etcd members with one TLS identity.
type Client struct {
	endpoint string // the member calls go to, unless named (Status)
	cli      *clientv3.Client
	err      error // why there is no cli: a bad endpoint
}

// New is a client for endpoint ("https://host:port"), with dialTimeout the
// bound clientv3 puts on its own set-up calls. Nothing is dialled until a
// call.
func New(endpoint string, tlsCfg *tls.Config, dialTimeout time.Duration) *Client {
	endpoint = strings.TrimRight(endpoint, "/")
	c := &Client{endpoint: endpoint}
	if err := checkEndpoint(endpoint); err != nil {
		c.err = err
		return c
	}
	if tlsCfg != nil {
		tlsCfg = tlsCfg.Clone()
	}
	c.cli, c.err = clientv3.New(clientv3.Config{
		Endpoints:          []string{endpoint},
		TLS:                tlsCfg,
		DialTimeout:        dialTimeout,
		MaxCallRecvMsgSize: MaxAnswer,
		Logger:             zap.NewNop(),
		DialOptions:        []grpc.DialOption{grpc.WithChainUnaryInterceptor(recordAttempt)},
	})
	return c
}

// checkEndpoint refuses what is not an http(s) URL with a host: an etcd
// member's client URL comes from the member list, which a member writes.
func checkEndpoint(endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return errors.New("etcd endpoint is not an http(s) URL of a host and port")
	}
	return nil
}

// Close drops the client's connections.
func (c *Client) Close() error {
	if c.cli == nil {
		return nil
	}
	return c.cli.Close()
}

// attemptsKey carries a call's recorder of attempts in its context.
type attemptsKey struct{}

// attempts keeps the last error an attempt of one call met.
type attempts struct {
	mu   sync.Mutex
	last error
}

// recordAttempt runs inside clientv3's retries, once per attempt: it sees
// the gRPC status clientv3 later reduces to the context's error.
func recordAttempt(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if a, ok := ctx.Value(attemptsKey{}).(*attempts); ok && err != nil {
		a.mu.Lock()
		a.last = err
		a.mu.Unlock()
	}
	return err
}

// call runs f with a recorder of attempts, and names the last attempt's
// error when ctx ended the call.
func (c *Client) call(ctx context.Context, f func(ctx context.Context) error) error {
	if c.err != nil {
		return c.err
	}
	a := &attempts{}
	err := f(context.WithValue(ctx, attemptsKey{}, a))
	if err == nil || ctx.Err() == nil {
		return err
	}
	a.mu.Lock()
	last := a.last
	a.mu.Unlock()
	if last == nil || last.Error() == err.Error() {
		return err
	}
	return fmt.Errorf("%w (last attempt: %v)", err, last)
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
// serializable (the member's own view). A list longer than MaxMembers is
// refused.
func (c *Client) MemberList(ctx context.Context, serializable bool) ([]Member, error) {
	var opts []clientv3.OpOption
	if serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	var resp *clientv3.MemberListResponse
	err := c.call(ctx, func(ctx context.Context) (err error) {
		resp, err = c.cli.MemberList(ctx, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(resp.Members) > MaxMembers {
		return nil, fmt.Errorf("etcd lists %d members, more than %d: not a cluster the provider acts on", len(resp.Members), MaxMembers)
	}
	out := make([]Member, 0, len(resp.Members))
	for _, m := range resp.Members {
		out = append(out, member(m))
	}
	return out, nil
}

func member(m *pb.Member) Member {
	return Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner}
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

// Status asks the member at endpoint (a client URL, checked before it is
// dialled) for its status.
func (c *Client) Status(ctx context.Context, endpoint string) (Status, error) {
	endpoint = strings.TrimRight(endpoint, "/")
	if err := checkEndpoint(endpoint); err != nil {
		return Status{}, err
	}
	var resp *clientv3.StatusResponse
	err := c.call(ctx, func(ctx context.Context) (err error) {
		resp, err = c.cli.Status(ctx, endpoint)
		return err
	})
	if err != nil {
		return Status{}, err
	}
	st := Status{Version: resp.Version, DBSize: resp.DbSize, Leader: resp.Leader, Errors: resp.Errors, IsLearner: resp.IsLearner}
	if h := resp.Header; h != nil {
		st.ClusterID, st.MemberID, st.Revision = h.ClusterId, h.MemberId, h.Revision
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
	if s, ok := pb.AlarmType_name[int32(a)]; ok {
		return s
	}
	return strconv.Itoa(int(a))
}

// AlarmList lists the raised alarms of every member.
func (c *Client) AlarmList(ctx context.Context) ([]Alarm, error) {
	var resp *clientv3.AlarmResponse
	err := c.call(ctx, func(ctx context.Context) (err error) {
		resp, err = c.cli.AlarmList(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(resp.Alarms) > MaxMembers {
		return nil, fmt.Errorf("etcd lists %d alarms, more than %d", len(resp.Alarms), MaxMembers)
	}
	out := make([]Alarm, 0, len(resp.Alarms))
	for _, a := range resp.Alarms {
		out = append(out, Alarm{MemberID: a.MemberID, Type: AlarmType(a.Alarm)})
	}
	return out, nil
}

// CountAll counts every key at revision rev (0: the latest), serializable
// (the member's own store) when asked.
func (c *Client) CountAll(ctx context.Context, rev int64, serializable bool) (int64, error) {
	opts := []clientv3.OpOption{clientv3.WithFromKey(), clientv3.WithCountOnly()}
	if rev != 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	if serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	var resp *clientv3.GetResponse
	err := c.call(ctx, func(ctx context.Context) (err error) {
		resp, err = c.cli.Get(ctx, "", opts...)
		return err
	})
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}

// IsCompacted reports etcd's answer that the revision asked for has been
// compacted away.
func IsCompacted(err error) bool {
	return errors.Is(err, rpctypes.ErrCompacted)
}
