// Package health holds the probes the bounded gates poll: the kubelet's
// /healthz, an apiserver's /readyz, etcd member health. Each probe is one
// attempt bounded by its context; the gates (wait.Poll) give them budgets.
package health

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// KubeletHealthzURL is the kubelet's default healthz endpoint.
const KubeletHealthzURL = "http://127.0.0.1:10248/healthz"

// Prober runs single health probes.
type Prober struct {
	// HTTP is the client for plain probes; nil means a default without keep-alives.
	HTTP *http.Client
}

func (p Prober) plain() *http.Client {
	if p.HTTP != nil {
		return p.HTTP
	}
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
}

// Kubelet probes a kubelet healthz URL: healthy on 200 "ok".
func (p Prober) Kubelet(ctx context.Context, url string) error {
	return get(ctx, p.plain(), url)
}

// APIServerName is a name every kubeadm apiserver certificate carries,
// whatever its advertise address: the local probe connects to 127.0.0.1 but
// verifies the certificate for this name (kubeadm puts no loopback address
// in the serving certificate).
const APIServerName = "kubernetes"

// Readyz probes https://<hostport>/readyz, trusting only caPEM and requiring
// the certificate to be valid for serverName.
func (p Prober) Readyz(ctx context.Context, hostport, serverName string, caPEM []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return errors.New("no usable CA certificate to verify the apiserver")
	}
	c := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		Proxy:             nil,
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12},
	}}
	return get(ctx, c, "https://"+hostport+"/readyz")
}

func get(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, unwrapURL(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, firstLine(string(body)))
	}
	return nil
}

func unwrapURL(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// DefaultAttempt bounds one probe when the caller gives no deadline.
const DefaultAttempt = 5 * time.Second
