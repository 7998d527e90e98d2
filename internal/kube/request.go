package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StatusError is an apiserver's refusal: its Status (code, reason,
// message) or, for an answer that is not one, what client-go makes of the
// HTTP status. Error is the message, as client-go's StatusError.
type StatusError struct {
	Code    int32
	Reason  string
	Message string
}

func (e *StatusError) Error() string { return e.Message }

// knownReasons are apimachinery's: a 404 with any other reason is NotFound.
var knownReasons = map[string]bool{"Unauthorized": true, "Forbidden": true, "NotFound": true, "AlreadyExists": true,
	"Conflict": true, "Gone": true, "Invalid": true, "ServerTimeout": true, "StoreReadError": true, "Timeout": true,
	"TooManyRequests": true, "BadRequest": true, "MethodNotAllowed": true, "NotAcceptable": true,
	"RequestEntityTooLarge": true, "UnsupportedMediaType": true, "InternalError": true, "Expired": true,
	"ServiceUnavailable": true}

// IsNotFound reports an apiserver's answer that the object does not exist
// (apimachinery's errors.IsNotFound).
func IsNotFound(err error) bool {
	var e *StatusError
	if !errors.As(err, &e) {
		return false
	}
	return e.Reason == "NotFound" || !knownReasons[e.Reason] && e.Code == http.StatusNotFound
}

// request is one call, described as client-go's Request builder does.
type request struct {
	verb        string
	path        string // under the server's path prefix
	query       url.Values
	body        []byte
	contentType string        // of the body
	group       string        // of the resource, for the generic error messages
	resource    string        // "" for a non-resource path
	name        string        // the object's
	timeout     time.Duration // the server-side "timeout" parameter and the bound of the whole call, retries included; 0: none
	keepBody    bool          // an error answer's body is returned too (client-go's DoRaw)
}

// get is a GET of a named object (namespace "" for a cluster resource),
// bounded by the client's timeout, as the typed clients' Get.
func (c *Client) get(ctx context.Context, group, namespace, resource, name string, out any) error {
	b, err := c.do(ctx, request{verb: http.MethodGet, path: objectPath(group, namespace, resource, name),
		group: group, resource: resource, name: name, timeout: c.timeout})
	if err == nil {
		err = statusInBody(b)
	}
	if err != nil {
		return err
	}
	return decode(b, out)
}

// objectPath is a core ("" group) or apps object's path.
func objectPath(group, namespace, resource, name string) string {
	p := "/api/v1"
	if group != "" {
		p = "/apis/" + group + "/v1"
	}
	if namespace != "" {
		p += "/namespaces/" + namespace
	}
	p += "/" + resource
	if name != "" {
		p += "/" + name
	}
	return p
}

// decode reads a successful answer into out: field names matched
// case-sensitively, as client-go's JSON serializer does.
func decode(body []byte, out any) error {
	if len(body) == 0 {
		return errors.New("empty answer")
	}
	return unmarshalCaseSensitive(body, out)
}

// maxRetries is client-go's: an answer with a Retry-After (429, 5xx), or a
// GET whose connection broke, is tried again up to this many times.
const maxRetries = 10

// do sends r as client-go's REST client does: the server URL's path
// prefix, the "timeout" parameter, JSON accepted, the credentials, the
// user agent; retried after a Retry-After (or, for a GET, a connection
// broken under it: after 1 s) within the call's bound. A non-2xx answer
// is a *StatusError.
func (c *Client) do(ctx context.Context, r request) ([]byte, error) {
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	u := *c.conn.base
	u.Path = path.Join("/", u.Path, r.path)
	q := url.Values{}
	for k, vs := range r.query {
		q[k] = vs
	}
	if r.timeout > 0 {
		q.Set("timeout", r.timeout.String())
	}
	u.RawQuery = q.Encode()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, r.verb, u.String(), nil)
		if err != nil {
			return nil, err
		}
		if r.body != nil {
			req.Body = io.NopCloser(bytes.NewReader(r.body))
			req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(r.body)), nil }
			req.ContentLength = int64(len(r.body))
			req.Header.Set("Content-Type", r.contentType)
		}
		req.Header.Set("Accept", "application/json")
		if err := c.authorize(req); err != nil {
			return nil, err
		}
		resp, err := c.hc.Do(req)
		var wait time.Duration
		if err != nil {
			if r.verb != http.MethodGet || !brokenConnection(err) || attempt >= maxRetries {
				return nil, err
			}
			wait = time.Second
		} else {
			body, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			secs, again := retryAfter(resp)
			switch {
			case again && attempt < maxRetries:
				wait = time.Duration(secs) * time.Second
			case rerr != nil:
				return nil, fmt.Errorf("unexpected error when reading response body. Please retry. Original error: %w", rerr)
			default:
				out, err := answer(resp, body, r)
				if err != nil && r.keepBody {
					return body, err
				}
				return out, err
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// authorize sets what the user authenticates with, and the user agent.
func (c *Client) authorize(req *http.Request) error {
	u := c.conn.user
	req.Header.Set("User-Agent", userAgent)
	token := u.Token
	if c.exec != nil {
		t, _, err := c.exec.credentials(req.Context())
		if err != nil {
			return err
		}
		token = t
	}
	switch {
	case token != "":
		req.Header.Set("Authorization", "Bearer "+token)
	case u.Username != "" || u.Password != "":
		req.SetBasicAuth(u.Username, u.Password)
	}
	if u.Impersonate != "" {
		req.Header.Set("Impersonate-User", u.Impersonate)
		if u.ImpersonateUID != "" {
			req.Header.Set("Impersonate-Uid", u.ImpersonateUID)
		}
		for _, g := range u.ImpersonateGroups {
			req.Header.Add("Impersonate-Group", g)
		}
		for k, vs := range u.ImpersonateUserExtra {
			for _, v := range vs {
				req.Header.Add("Impersonate-Extra-"+url.PathEscape(k), v)
			}
		}
	}
	return nil
}

// retryAfter is an answer's Retry-After in seconds, for 429 and 5xx.
func retryAfter(resp *http.Response) (int, bool) {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode < 500 {
		return 0, false
	}
	i, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	return i, err == nil
}

// brokenConnection is client-go's retryable error for a GET: reset, EOF,
// a lost HTTP/2 connection.
func brokenConnection(err error) bool {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, syscall.ECONNRESET) || err == io.EOF || err == io.ErrUnexpectedEOF {
		return true
	}
	msg := err.Error()
	return msg == "http: can't write HTTP request on broken connection" ||
		strings.Contains(msg, "http2: server sent GOAWAY and closed the connection") ||
		strings.Contains(msg, "connection reset by peer") ||
		strings.Contains(strings.ToLower(msg), "use of closed network connection") ||
		strings.Contains(msg, "http2: client connection lost")
}

// answer is the body of a 2xx answer, else the error client-go makes of
// it: the Status the body holds, else a message by HTTP status.
func answer(resp *http.Response, body []byte, r request) ([]byte, error) {
	if resp.StatusCode >= http.StatusOK && resp.StatusCode <= http.StatusPartialContent {
		return body, nil
	}
	ctype := resp.Header.Get("Content-Type")
	if ctype == "" {
		ctype = "application/json"
	}
	media, _, _ := mime.ParseMediaType(ctype)
	if media == "application/json" {
		var st apiStatus
		if unmarshalCaseSensitive(body, &st) == nil && st.Kind == "Status" && st.Status == "Failure" {
			return nil, &StatusError{Code: st.Code, Reason: st.Reason, Message: st.Message}
		}
	}
	msg := "unknown"
	if isText(resp) {
		b := body
		if len(b) > 2048 {
			b = b[:2048]
		}
		msg = strings.TrimSpace(string(b))
	}
	return nil, genericError(resp.StatusCode, r.verb, r.group, r.resource, r.name, msg)
}

// isText is client-go's isTextResponse.
func isText(resp *http.Response) bool {
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		return true
	}
	media, _, err := mime.ParseMediaType(ct)
	return err == nil && strings.HasPrefix(media, "text/")
}

// genericError is apimachinery's NewGenericServerResponse.
func genericError(code int, verb, group, resource, name, serverMessage string) *StatusError {
	reason := ""
	message := fmt.Sprintf("the server responded with the status code %d but did not return more information", code)
	switch code {
	case http.StatusConflict:
		reason = "Conflict"
		if verb == http.MethodPost {
			reason = "AlreadyExists"
		}
		message = "the server reported a conflict"
	case http.StatusNotFound:
		reason, message = "NotFound", "the server could not find the requested resource"
	case http.StatusBadRequest:
		reason, message = "BadRequest", "the server rejected our request for an unknown reason"
	case http.StatusUnauthorized:
		reason, message = "Unauthorized", "the server has asked for the client to provide credentials"
	case http.StatusForbidden:
		reason, message = "Forbidden", serverMessage
	case http.StatusNotAcceptable:
		reason, message = "NotAcceptable", serverMessage
		if serverMessage == "" || serverMessage == "unknown" {
			message = "the server was unable to respond with a content type that the client supports"
		}
	case http.StatusUnsupportedMediaType:
		reason, message = "UnsupportedMediaType", serverMessage
	case http.StatusMethodNotAllowed:
		reason, message = "MethodNotAllowed", "the server does not allow this method on the requested resource"
	case http.StatusUnprocessableEntity:
		reason, message = "Invalid", "the server rejected our request due to an error in our request"
	case http.StatusServiceUnavailable:
		reason, message = "ServiceUnavailable", "the server is currently unable to handle the request"
	case http.StatusGatewayTimeout:
		reason, message = "Timeout", "the server was unable to return a response in the time allotted, but may still be processing the request"
	case http.StatusTooManyRequests:
		reason, message = "TooManyRequests", "the server has received too many requests and has asked us to try again later"
	default:
		if code >= 500 {
			reason, message = "InternalError", fmt.Sprintf("an error on the server (%q) has prevented the request from succeeding", serverMessage)
		}
	}
	qualified := resource
	if resource != "" && group != "" {
		qualified += "." + group
	}
	switch {
	case qualified != "" && name != "":
		message = fmt.Sprintf("%s (%s %s %s)", message, strings.ToLower(verb), qualified, name)
	case qualified != "":
		message = fmt.Sprintf("%s (%s %s)", message, strings.ToLower(verb), qualified)
	}
	return &StatusError{Code: int32(code), Reason: reason, Message: message}
}

// apiStatus is the part of a metav1.Status the client reads.
type apiStatus struct {
	Kind    string `json:"kind"`
	Status  string `json:"status"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Code    int32  `json:"code"`
}
