package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kairos-io/provider-kubernetes/tests/e2e/harness"
)

// apiProbe reads the API through the cluster's load balancer ten times a
// second for as long as it runs, the way any client of an HA cluster does,
// and counts what it saw per phase of the scenario: requests, failures and
// the longest time without a good answer. The figures are a measurement
// for the note (no timed assertion); what the test asserts is that the API
// kept answering while a control plane was down.
type apiProbe struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	start  time.Time
	phase  string
	order  []string
	phases map[string]*probePhase
	lastOK time.Time
	gap    time.Duration // the longest time between two good answers
	gapAt  string        // the phase the longest gap ended in
	errs   map[string]int
}

type probePhase struct {
	start     time.Time
	took      time.Duration
	requests  int
	failures  int
	longestNo time.Duration // the longest run of failures in this phase
	failedAt  time.Time     // the first failure of the current run
}

// startProbe reads with the admin credentials of kubeconfig (cp1's
// admin.conf) at lbAddr through the cluster's bridge namespace.
func startProbe(t testing.TB, c *harness.Cluster, kubeconfig []byte, lbAddr, phase string) *apiProbe {
	t.Helper()
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		t.Fatalf("probe: admin.conf: %v", err)
	}
	cfg.Host = "https://" + lbAddr
	cfg.Dial = c.DialContext
	cfg.Timeout = 2 * time.Second
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatalf("probe: client: %v", err)
	}
	url := cfg.Host + "/api/v1/namespaces/kube-system"
	ctx, cancel := context.WithCancel(context.Background())
	now := time.Now()
	p := &apiProbe{cancel: cancel, done: make(chan struct{}), start: now, lastOK: now, phases: map[string]*probePhase{}, errs: map[string]int{}}
	p.setPhase(phase)
	go func() {
		defer close(p.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			err := probeGet(rctx, hc, url)
			rcancel()
			if ctx.Err() != nil {
				return
			}
			p.record(time.Now(), err)
		}
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *apiProbe) record(now time.Time, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ph := p.phases[p.phase]
	ph.requests++
	if err != nil {
		ph.failures++
		if ph.failedAt.IsZero() {
			ph.failedAt = now
		}
		if k := probeErrClass(err); p.errs[k] > 0 || len(p.errs) < 20 {
			p.errs[k]++
		}
		return
	}
	if !ph.failedAt.IsZero() {
		if d := now.Sub(ph.failedAt); d > ph.longestNo {
			ph.longestNo = d
		}
		ph.failedAt = time.Time{}
	}
	if d := now.Sub(p.lastOK); d > p.gap {
		p.gap, p.gapAt = d, p.phase
	}
	p.lastOK = now
}

// probeGet is one authenticated read: a good answer is 200 with a body.
// It uses client-go's transport (TLS, credentials) but not its RESTClient,
// whose retries on Retry-After answers would hide the failures the probe
// counts; the body is read up to 1 MiB.
func probeGet(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || n == 0 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

// probeErrClass keeps an error's kind, not its addresses or ports.
func probeErrClass(err error) string {
	s := err.Error()
	for _, k := range []string{"context deadline exceeded", "connection refused", "connection reset", "EOF", "http2", "TLS handshake", "i/o timeout", "Too many requests", "the server is currently unable", "etcdserver"} {
		if strings.Contains(s, k) {
			return k
		}
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

// setPhase starts counting under a new name (the step of the scenario).
func (p *apiProbe) setPhase(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if cur := p.phases[p.phase]; cur != nil {
		cur.took += now.Sub(cur.start)
	}
	p.phase = name
	ph := p.phases[name]
	if ph == nil {
		ph = &probePhase{}
		p.phases[name] = ph
		p.order = append(p.order, name)
	}
	ph.start = now
}

// ok is the number of good answers in a phase.
func (p *apiProbe) ok(phase string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	ph := p.phases[phase]
	if ph == nil {
		return 0
	}
	return ph.requests - ph.failures
}

func (p *apiProbe) stop() {
	p.cancel()
	<-p.done
}

// report stops the probe and returns its figures, one line per phase.
func (p *apiProbe) report() string {
	p.stop()
	p.setPhase("")
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	total, failed := 0, 0
	for _, name := range p.order {
		if name == "" {
			continue
		}
		ph := p.phases[name]
		total += ph.requests
		failed += ph.failures
		rps := 0.0
		if s := ph.took.Seconds(); s > 0 {
			rps = float64(ph.requests) / s
		}
		fmt.Fprintf(&b, "  %-40s %6s %5d requests (%4.1f/s) %4d failed, longest run of failures %s\n",
			name, ph.took.Round(time.Second), ph.requests, rps, ph.failures, ph.longestNo.Round(100*time.Millisecond))
	}
	var kinds []string
	for k, n := range p.errs {
		kinds = append(kinds, fmt.Sprintf("%s x%d", k, n))
	}
	sort.Strings(kinds)
	fmt.Fprintf(&b, "  in all: %s, %d requests, %d failed; the longest time without a good answer %s (in %q); failures: %s",
		time.Since(p.start).Round(time.Second), total, failed, p.gap.Round(100*time.Millisecond), p.gapAt, strings.Join(kinds, ", "))
	return b.String()
}
