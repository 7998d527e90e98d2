package bootstrap

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// Where the rendered configurations are handed to kubeadm: tmpfs, 0600 in
// a 0700 directory, removed when the command returns.
const (
	InitConfigPath = paths.TmpDir + "/init-config.yaml"
	JoinConfigPath = paths.TmpDir + "/join-config.yaml"
)

// Log events (constant messages).
const (
	EventConfig = "bootstrap-config"
	EventProbe  = "bootstrap-probe"
)

// ErrControlPlaneExists: init refuses to clobber a control plane that
// already answers at the endpoint.
var ErrControlPlaneExists = errors.New("a control plane already answers TLS at the endpoint: refusing a second kubeadm init (set role: controlplane or worker to join it, or reset that cluster first)")

// Step runs kubeadm init and kubeadm join for the reconcile pass.
type Step struct {
	Root   paths.Root
	Runner runner.Runner
	Clock  wait.Clock
	Log    *slog.Logger
	// Budgets are the base budgets; the cluster section's
	// providerConfig.budgets override them for each pass.
	Budgets reconcile.Budgets
}

// Bootstrap implements reconcile.Steps.Bootstrap.
func (s *Step) Bootstrap(ctx context.Context, action plan.Action, obs reconcile.Observation) error {
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	c := obs.Config.Cluster
	if c == nil {
		return errors.New("no cluster section was read: nothing to bootstrap from")
	}
	base := s.Budgets
	if base == (reconcile.Budgets{}) {
		base = reconcile.DefaultBudgets()
	}
	b, err := base.WithOverrides(c.ProviderConfig)
	if err != nil {
		return err
	}
	switch action {
	case plan.ActionInit:
		return s.init(ctx, c, b)
	case plan.ActionJoin:
		return s.join(ctx, c, b)
	}
	return fmt.Errorf("bootstrap: unexpected action %q", action)
}

func (s *Step) init(ctx context.Context, c *clusterconfig.Cluster, b reconcile.Budgets) error {
	r, err := RenderInit(c)
	if err != nil {
		return err
	}
	s.Log.Info(EventConfig, "action", "init", "endpoint", r.Endpoint, "token", string(r.TokenSource), "certificate_key", string(r.KeySource))
	live, err := AnswersTLS(ctx, r.Endpoint, b.APIRequest)
	s.Log.Info(EventProbe, "endpoint", r.Endpoint, "answers_tls", live, "detail", errString(err))
	if live {
		return fmt.Errorf("%w (%s)", ErrControlPlaneExists, r.Endpoint)
	}
	return s.withConfig(InitConfigPath, r.Config, func(file string) error {
		_, err := s.Runner.Run(ctx, runner.Cmd{Path: paths.Kubeadm, Timeout: b.KubeadmBootstrap,
			Args: []string{"init", "--config", file, "--upload-certs", "--skip-token-print", "--skip-certificate-key-print"}})
		return err
	})
}

func (s *Step) join(ctx context.Context, c *clusterconfig.Cluster, b reconcile.Budgets) error {
	r, err := RenderJoin(c)
	if err != nil {
		return err
	}
	s.Log.Info(EventConfig, "action", "join", "endpoint", r.Endpoint, "control_plane", r.ControlPlane,
		"token", string(r.TokenSource), "certificate_key", string(r.KeySource), "ca_pins", len(r.CAHashes))
	if r.ControlPlane {
		roots, err := caRoots(c)
		if err != nil {
			return err
		}
		if err := WaitReady(ctx, s.Clock, wait.Budget{Total: b.ControlPlaneReady, Interval: 2 * time.Second, PerAttempt: b.APIRequest},
			r.Endpoint, r.CAHashes, roots); err != nil {
			return err
		}
	}
	return s.withConfig(JoinConfigPath, r.Config, func(file string) error {
		_, err := s.Runner.Run(ctx, runner.Cmd{Path: paths.Kubeadm, Timeout: b.KubeadmBootstrap,
			Args: []string{"join", "--config", file}})
		return err
	})
}

// withConfig writes the configuration 0600 into the 0700 tmpfs directory,
// runs fn with its path (re-based on the root, "/" on a node) and removes
// it whatever happened.
func (s *Step) withConfig(hostPath string, data []byte, fn func(file string) error) error {
	full := s.Root.Path(hostPath)
	if err := fsutil.MkdirAllMode(filepath.Dir(full), 0o700); err != nil {
		return fmt.Errorf("tmp dir: %w", err)
	}
	if err := fsutil.WriteFileAtomic(full, data, 0o600); err != nil {
		return err
	}
	defer os.Remove(full)
	return fn(full)
}

// AnswersTLS reports whether something completes a TLS handshake at
// endpoint within timeout. It only detects a live server (no request is
// sent, nothing is trusted), so the certificate is not verified here.
func AnswersTLS(ctx context.Context, endpoint string, timeout time.Duration) (bool, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}} // presence probe only: nothing is sent, nothing trusted
	conn, err := d.DialContext(ctx, "tcp", endpoint)
	if err != nil {
		return false, err
	}
	conn.Close()
	return true, nil
}

// caRoots are the CA certificates of cluster.ca_certs, nil when none.
func caRoots(c *clusterconfig.Cluster) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for i, p := range c.CACerts {
		certs, err := parseCerts([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("ca_certs[%d]: %w", i, err)
		}
		out = append(out, certs...)
	}
	return out, nil
}

// WaitReady waits, bounded, until the control plane at endpoint answers
// /readyz with 200, over TLS verified against a CA matching one of pins:
// roots when given (cluster.ca_certs), else the CA the cluster publishes in
// kube-public/cluster-info, accepted only when it matches a pin (as kubeadm
// discovery does). The last real error is returned on timeout.
func WaitReady(ctx context.Context, clk wait.Clock, b wait.Budget, endpoint string, pins []string, roots []*x509.Certificate) error {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return err
	}
	var pool *x509.CertPool
	if len(roots) > 0 {
		pool, err = pinnedPool(roots, pins)
		if err != nil {
			return err
		}
	}
	return wait.Poll(ctx, clk, b, "wait for the control plane at "+endpoint+" to be ready", func(ctx context.Context) (bool, error) {
		if pool == nil {
			p, err := clusterInfoCA(ctx, endpoint, pins)
			if err != nil {
				return false, err
			}
			pool = p
		}
		client := &http.Client{Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12},
			Proxy:           nil,
		}}
		defer client.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+endpoint+"/readyz", nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("/readyz answered %d: %s", resp.StatusCode, runner.Sanitize(string(body), 200))
		}
		return true, nil
	})
}

// pinnedPool keeps the roots whose public key matches a pin.
func pinnedPool(roots []*x509.Certificate, pins []string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for _, c := range roots {
		if slices.Contains(pins, clusterconfig.SPKIHash(c)) {
			pool.AddCert(c)
			n++
		}
	}
	if n == 0 {
		return nil, errors.New("no CA certificate matches caCertHashes")
	}
	return pool, nil
}

// clusterInfoCA reads the public kube-public/cluster-info ConfigMap (as
// kubeadm discovery does, before anything is trusted) and returns its CA
// when that CA matches a pin. Nothing is sent but the GET.
func clusterInfoCA(ctx context.Context, endpoint string, pins []string) (*x509.CertPool, error) {
	client := &http.Client{Transport: &http.Transport{
		// Unverified on purpose: the CA it returns is trusted only if it matches a pin.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12},
		Proxy:           nil,
	}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+endpoint+"/api/v1/namespaces/kube-public/configmaps/cluster-info", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("kube-public/cluster-info answered %d", resp.StatusCode)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&cm); err != nil {
		return nil, fmt.Errorf("kube-public/cluster-info: %w", err)
	}
	cas, err := kube.ClusterCAData([]byte(cm.Data["kubeconfig"]))
	if err != nil {
		return nil, fmt.Errorf("kube-public/cluster-info kubeconfig: %w", err)
	}
	var certs []*x509.Certificate
	for _, ca := range cas {
		cs, err := parseCerts(ca)
		if err != nil {
			return nil, fmt.Errorf("kube-public/cluster-info CA: %w", err)
		}
		certs = append(certs, cs...)
	}
	pool, err := pinnedPool(certs, pins)
	if err != nil {
		return nil, fmt.Errorf("kube-public/cluster-info: %w: refusing to trust it", err)
	}
	return pool, nil
}

func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		blk, rest := pem.Decode(b)
		if blk == nil {
			break
		}
		b = rest
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no certificate")
	}
	return out, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return runner.Sanitize(err.Error(), 200)
}
