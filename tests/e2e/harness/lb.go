package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// LBPackage is the Debian package of the load balancer (.ci/host-packages.sh
// installs it).
const LBPackage = "haproxy"

// LoadBalancer is HAProxy in the cluster's bridge namespace, listening on
// BridgeIP:Port and passing TCP through to the apiservers it finds ready:
// the highly available control-plane endpoint an HA cluster is run behind,
// instead of the first control plane's own address. Every node reaches it
// through its default route (the bridge).
type LoadBalancer struct {
	Addr    string // BridgeIP:Port
	dir     string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when haproxy has exited
	waitErr error         // how, once exited is closed
	log     string
}

// lbConfig is HAProxy's configuration (pure, so it is asserted without
// root): TCP mode, a backend dropped after two failed /readyz checks a
// second apart (anonymous /readyz is what kubeadm's apiserver allows) and
// taken back after two good ones; the connections to a backend marked down
// are closed (a killed node sends no reset: they would hang until the
// client's own health check gives up); a connection that cannot be made is
// redispatched to another backend.
func lbConfig(addr string, backends []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
  maxconn 4096
defaults
  mode tcp
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  retries 2
  option redispatch
frontend apiserver
  bind %s
  default_backend apiservers
backend apiservers
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter 1s fall 2 rise 2 check check-ssl verify none on-marked-down shutdown-sessions
`, addr)
	for i, be := range backends {
		fmt.Fprintf(&b, "  server cp%d %s\n", i+1, be)
	}
	return b.String()
}

// StartLoadBalancer starts HAProxy on BridgeIP:port in front of backends
// (host:port); it dies with the test process (Pdeathsig) and Cleanup stops
// it. It returns once the port accepts connections (within a minute).
func (c *Cluster) StartLoadBalancer(ctx context.Context, port int, backends []string) (*LoadBalancer, error) {
	bin := findTool("haproxy")
	if bin == "" {
		return nil, fmt.Errorf("%w: haproxy is missing (apt-get install --no-install-recommends %s)", ErrUnavailable, LBPackage)
	}
	dir, err := os.MkdirTemp("", "e2e-lb-")
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			os.RemoveAll(dir)
		}
	}()
	lb := &LoadBalancer{Addr: net.JoinHostPort(BridgeIP, fmt.Sprint(port)), dir: dir, exited: make(chan struct{}), log: filepath.Join(dir, "haproxy.log")}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(lbConfig(lb.Addr, backends)), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(lb.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// -db: in the foreground. nsenter (--net only) execs haproxy in its own
	// process, so the parent-death signal set here holds for haproxy.
	lb.cmd = exec.Command(c.tools.path("nsenter"), "--net="+filepath.Join(netnsDir, c.bridgeNS), "--", bin, "-db", "-f", cfg)
	lb.cmd.Stdout, lb.cmd.Stderr = logf, logf
	lb.cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	lb.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// Forked from the spawner's thread, which never ends (spawn.go), so
	// its parent-death signal comes only with the test process.
	if err := startOnSpawner(lb.cmd); err != nil {
		return nil, fmt.Errorf("start haproxy: %w", err)
	}
	go func() {
		lb.waitErr = lb.cmd.Wait()
		close(lb.exited)
	}()
	started = true
	c.mu.Lock()
	c.lbs = append(c.lbs, lb)
	c.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dial := c.DialContext
	for {
		conn, err := dial(wctx, "tcp", lb.Addr)
		if err == nil {
			conn.Close()
			return lb, nil
		}
		select {
		case <-lb.exited:
			b, _ := os.ReadFile(lb.log)
			return nil, fmt.Errorf("haproxy exited (%v): %s", lb.waitErr, strings.TrimSpace(string(b)))
		case <-wctx.Done():
			return nil, fmt.Errorf("haproxy on %s: no listener within a minute: %v", lb.Addr, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop ends HAProxy: SIGTERM, then SIGKILL after ten seconds.
func (lb *LoadBalancer) stop() error {
	defer os.RemoveAll(lb.dir)
	if lb.cmd.Process == nil {
		return nil
	}
	select {
	case <-lb.exited:
		return nil
	default:
	}
	_ = syscall.Kill(-lb.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-lb.exited:
		return nil
	case <-time.After(10 * time.Second):
	}
	_ = syscall.Kill(-lb.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-lb.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("haproxy (pid %d) did not exit", lb.cmd.Process.Pid)
	}
}

// DialContext opens a connection from inside the cluster's bridge
// namespace, where nodes and the load balancer are reachable (nothing is
// routed from the host's). A socket keeps the namespace it was made in, so
// only its creation runs on an OS thread moved into the namespace; that
// thread is never given back to the runtime (the goroutine ends locked, so
// the thread exits).
func (c *Cluster) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: this thread's namespace is not the process's.
		f, err := os.Open(filepath.Join(netnsDir, c.bridgeNS))
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("setns %s: %w", c.bridgeNS, err)}
			return
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		ch <- result{conn, err}
	}()
	select {
	case r := <-ch:
		return r.conn, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}
