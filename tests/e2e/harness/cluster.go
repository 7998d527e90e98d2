package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/runner"
)

// Options configures a cluster of nodes.
type Options struct {
	Name       string               // short cluster name (netns, cgroup, machine names); default "pk" + random hex
	StateDir   string               // nodes' persistent state; New defaults to t.TempDir()
	Base       Base                 // from EnsureBase
	Logf       func(string, ...any) // progress; New defaults to t.Logf
	BootBudget time.Duration        // container start until systemd reports running/degraded; default 3m
	StopBudget time.Duration        // orderly poweroff before SIGKILL; default 90s
	Runner     runner.Runner        // host commands (ip, nsenter, journalctl); default runner.Exec{}
}

// Cluster is a set of nodes on one private network.
type Cluster struct {
	Name string

	o        Options
	tools    tools
	net      netOps
	hier     []hierarchy
	bridgeNS string
	lbs      []*LoadBalancer
	ownState bool

	life     context.Context // the nspawn processes' lifetime
	stopLife context.CancelFunc

	mu      sync.Mutex
	nodes   []*Node
	sysctls bool
	cleaned bool
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,19}$`)

// ErrNotRunning is returned for an operation that needs a booted node.
var ErrNotRunning = errors.New("node is not running")

// New starts a cluster for a test: its Cleanup is registered with t (and
// runs first among t's cleanups registered before it, so a t.TempDir state
// dir outlives it). On failure every node's console and journal tail is
// logged before teardown.
func New(t testing.TB, o Options) *Cluster {
	t.Helper()
	if o.StateDir == "" {
		o.StateDir = t.TempDir()
	}
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if t.Failed() {
			t.Logf("%s", c.APIDiagnostics(ctx))
			for _, n := range c.Nodes() {
				t.Logf("%s", n.Diagnostics(ctx))
			}
		}
		if err := c.Cleanup(ctx); err != nil {
			t.Errorf("cleanup of cluster %s: %v", c.Name, err)
		}
	})
	return c
}

// Start makes the cluster's bridge network and takes the host sysctls.
// Cleanup undoes all of it. Start first sweeps what dead runs left behind.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	tl, err := Check()
	if err != nil {
		return nil, err
	}
	if o.Base.Rootfs == "" || o.Base.Kairos == "" || o.Base.Config == "" {
		return nil, errors.New("harness: Options.Base is empty (call EnsureBase)")
	}
	if o.StateDir == "" {
		d, err := os.MkdirTemp("", "pk-e2e-")
		if err != nil {
			return nil, err
		}
		o.StateDir = d
	}
	if o.Name == "" {
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		o.Name = "pk" + hex.EncodeToString(b)
	}
	if !nameRE.MatchString(o.Name) {
		return nil, fmt.Errorf("harness: cluster name %q: want %s", o.Name, nameRE)
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.BootBudget <= 0 {
		o.BootBudget = 3 * time.Minute
	}
	if o.StopBudget <= 0 {
		o.StopBudget = 90 * time.Second
	}
	if o.Runner == nil {
		o.Runner = runner.Exec{}
	}
	hs, err := hostHierarchies()
	if err != nil {
		return nil, err
	}
	life, stop := context.WithCancel(context.WithoutCancel(ctx))
	c := &Cluster{
		Name: o.Name, o: o, tools: tl, net: netOps{r: o.Runner, tools: tl}, hier: hs,
		bridgeNS: o.Name + "-br", life: life, stopLife: stop,
	}
	if err := c.sweep(ctx); err != nil {
		o.Logf("e2e: sweeping leftovers of earlier runs: %v", err)
	}
	if err := c.saveRecord(); err != nil {
		stop()
		return nil, err
	}
	if err := acquireSysctls(); err != nil {
		_ = c.Cleanup(ctx)
		return nil, fmt.Errorf("host sysctls: %w", err)
	}
	c.sysctls = true
	if err := c.net.run(ctx, bridgeSteps(c.bridgeNS)); err != nil {
		_ = c.Cleanup(ctx)
		return nil, fmt.Errorf("bridge network: %w", err)
	}
	return c, nil
}

// NodeSpec describes a node to add.
type NodeSpec struct {
	Name  string // hostname and Kubernetes node name
	Tree  string // the OS tree (a directory) of the node's first boot
	Binds []Bind // extra host directories bound into the node
}

// Bind is a host directory bound into a node.
type Bind struct {
	Host, Node string
	ReadOnly   bool
}

// Nodes returns the nodes in the order they were added.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Node(nil), c.nodes...)
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes() {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// AddNode creates a node (state dirs, identity files, network namespace,
// routes); it is not booted.
func (c *Cluster) AddNode(ctx context.Context, spec NodeSpec) (*Node, error) {
	if !nameRE.MatchString(spec.Name) {
		return nil, fmt.Errorf("harness: node name %q: want %s", spec.Name, nameRE)
	}
	if err := ValidateTree(spec.Tree); err != nil {
		return nil, err
	}
	for _, b := range spec.Binds {
		if !filepath.IsAbs(b.Host) || !filepath.IsAbs(b.Node) || strings.ContainsAny(b.Host+b.Node, ":,\n") {
			return nil, fmt.Errorf("harness: bind %q:%q: want absolute paths without ':' or ','", b.Host, b.Node)
		}
	}
	c.mu.Lock()
	if c.cleaned {
		c.mu.Unlock()
		return nil, errors.New("harness: cluster cleaned up")
	}
	for _, n := range c.nodes {
		if n.Name == spec.Name {
			c.mu.Unlock()
			return nil, fmt.Errorf("harness: node %s exists", spec.Name)
		}
	}
	idx := len(c.nodes) + 1
	if idx > 89 {
		c.mu.Unlock()
		return nil, errors.New("harness: at most 89 nodes")
	}
	n := &Node{
		c: c, Name: spec.Name, Index: idx, IP: NodeIP(idx), PodSubnet: PodSubnet(idx),
		Dir: filepath.Join(c.o.StateDir, spec.Name), netns: c.Name + "-" + spec.Name,
		machine: c.Name + "-" + spec.Name, cgroup: "pk-e2e-" + c.Name + "-" + spec.Name,
		tree: spec.Tree, binds: spec.Binds,
	}
	c.nodes = append(c.nodes, n)
	others := append([]*Node(nil), c.nodes[:len(c.nodes)-1]...)
	c.mu.Unlock()

	if err := c.saveRecord(); err != nil {
		return nil, err
	}
	for _, d := range []string{n.upper(), n.work(), n.root(), n.containerd()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	mid := make([]byte, 16)
	_, _ = rand.Read(mid)
	files := []struct {
		path, data string
		mode       os.FileMode
	}{
		{"/etc/hostname", n.Name + "\n", 0o644},
		{"/etc/machine-id", hex.EncodeToString(mid) + "\n", 0o444},
		{"/etc/cni/net.d/10-bridge.conflist", cniConflist(n.PodSubnet), 0o644},
	}
	for _, f := range files {
		if err := n.WriteFile(f.path, []byte(f.data), f.mode); err != nil {
			return nil, err
		}
	}
	if err := c.net.run(ctx, nodeSteps(n.netns, c.bridgeNS, fmt.Sprintf("veth%d", idx), n.IP)); err != nil {
		return nil, fmt.Errorf("node %s network: %w", n.Name, err)
	}
	if err := c.net.forward(ctx, n.netns); err != nil {
		return nil, err
	}
	for _, o := range others {
		if err := c.net.ip(ctx, podRouteStep(n.netns, o.PodSubnet, o.IP)...); err != nil {
			return nil, err
		}
		if err := c.net.ip(ctx, podRouteStep(o.netns, n.PodSubnet, n.IP)...); err != nil {
			return nil, err
		}
	}
	if err := c.writeHosts(); err != nil {
		return nil, err
	}
	return n, nil
}

// writeHosts gives every node an /etc/hosts naming all nodes.
func (c *Cluster) writeHosts() error {
	nodes := c.Nodes()
	var hs []hostEntry
	for _, n := range nodes {
		hs = append(hs, hostEntry{IP: n.IP, Name: n.Name})
	}
	data := []byte(hostsFile(hs))
	var errs []error
	for _, n := range nodes {
		errs = append(errs, n.WriteFile("/etc/hosts", data, 0o644))
	}
	return errors.Join(errs...)
}

// Cleanup stops every node (orderly, then hard), deletes the network
// namespaces and cgroup subtrees, restores the host sysctls, and checks
// that nothing is left. It is idempotent; node state on disk stays (in
// StateDir) for the caller to keep or remove.
func (c *Cluster) Cleanup(ctx context.Context) error {
	c.mu.Lock()
	if c.cleaned {
		c.mu.Unlock()
		return nil
	}
	c.cleaned = true
	nodes := append([]*Node(nil), c.nodes...)
	c.mu.Unlock()

	var errs []error
	var wg sync.WaitGroup
	nodeErrs := make([]error, len(nodes))
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodeErrs[i] = n.shutdown(ctx)
		}()
	}
	wg.Wait()
	errs = append(errs, nodeErrs...)
	c.mu.Lock()
	lbs := c.lbs
	c.mu.Unlock()
	for _, lb := range lbs {
		errs = append(errs, lb.stop())
	}
	c.stopLife()
	var ns []string
	for _, n := range nodes {
		ns = append(ns, n.netns)
	}
	ns = append(ns, c.bridgeNS)
	errs = append(errs, c.net.delAll(ctx, ns))
	if c.sysctls {
		errs = append(errs, releaseSysctls())
	}
	// What must be gone now.
	for _, name := range ns {
		if netnsExists(name) {
			errs = append(errs, fmt.Errorf("network namespace %s left", name))
		}
	}
	for _, n := range nodes {
		for _, h := range c.hier {
			if _, err := os.Stat(h.Dir(n.cgroup)); err == nil {
				errs = append(errs, fmt.Errorf("cgroup %s left", h.Dir(n.cgroup)))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return c.removeRecord()
}

// clusterRecord is what a later run needs to undo this one if it dies.
type clusterRecord struct {
	Name     string       `json:"name"`
	Owner    holder       `json:"owner"`
	BootID   string       `json:"bootID"`
	NetNS    []string     `json:"netns"`
	Nodes    []nodeRecord `json:"nodes"`
	StateDir string       `json:"stateDir"`
}

type nodeRecord struct {
	Name    string   `json:"name"`
	Cgroups []string `json:"cgroups"`
	Nspawn  holder   `json:"nspawn"`
	Leader  holder   `json:"leader"`
}

func recordsDir() string { return filepath.Join(StateDir, "clusters") }

func (c *Cluster) record() clusterRecord {
	r := clusterRecord{Name: c.Name, Owner: self(), BootID: bootID(), StateDir: c.o.StateDir, NetNS: []string{c.bridgeNS}}
	for _, n := range c.Nodes() {
		r.NetNS = append(r.NetNS, n.netns)
		nr := nodeRecord{Name: n.Name}
		for _, h := range c.hier {
			nr.Cgroups = append(nr.Cgroups, h.Dir(n.cgroup))
		}
		nr.Nspawn, nr.Leader = n.holders()
		r.Nodes = append(r.Nodes, nr)
	}
	return r
}

func (c *Cluster) saveRecord() error {
	return withStateLock(func() error {
		if err := os.MkdirAll(recordsDir(), 0o700); err != nil {
			return err
		}
		return saveJSON(filepath.Join(recordsDir(), c.Name+".json"), c.record())
	})
}

func (c *Cluster) removeRecord() error {
	return withStateLock(func() error {
		err := os.Remove(filepath.Join(recordsDir(), c.Name+".json"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	})
}

// sweep undoes what runs whose test binary died left behind: their
// containers (by recorded PID, checked against its start time), the
// processes in their own cgroup subtrees, the subtrees, their network
// namespaces. Host sysctls are handled by their own record.
func (c *Cluster) sweep(ctx context.Context) error {
	return withStateLock(func() error {
		files, _ := filepath.Glob(filepath.Join(recordsDir(), "*.json"))
		var errs []error
		for _, f := range files {
			var r clusterRecord
			if ok, err := loadJSON(f, &r); err != nil || !ok {
				continue
			}
			if r.BootID == bootID() && alive(r.Owner) {
				continue
			}
			c.o.Logf("e2e: sweeping cluster %s left by dead process %d", r.Name, r.Owner.PID)
			for _, n := range r.Nodes {
				for _, h := range []holder{n.Leader, n.Nspawn} {
					if h.PID > 0 && alive(h) {
						_ = syscall.Kill(h.PID, syscall.SIGKILL)
					}
				}
			}
			deadline := time.Now().Add(20 * time.Second)
			for _, n := range r.Nodes {
				for _, d := range n.Cgroups {
					if !strings.Contains(filepath.Base(d), "pk-e2e-") {
						continue // never touch a cgroup the harness did not name
					}
					for time.Now().Before(deadline) {
						pids := pidsIn(d)
						if len(pids) == 0 {
							break
						}
						for _, p := range pids {
							_ = syscall.Kill(p, syscall.SIGKILL)
						}
						time.Sleep(200 * time.Millisecond)
					}
					if err := removeCgroupDir(d); err != nil {
						errs = append(errs, err)
					}
				}
			}
			errs = append(errs, c.net.delAll(ctx, r.NetNS))
			if err := os.Remove(f); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}

// pidsIn lists the processes in a cgroup directory and below.
func pidsIn(dir string) []int {
	return cgroupPIDs([]hierarchy{{Mount: filepath.Dir(dir), Parent: "/"}}, filepath.Base(dir))
}

// APIDiagnostics is what the API says of kube-system (DaemonSets, pods and
// their nodes, leader leases, recent events), asked with kubectl on the
// first running node that has admin.conf.
func (c *Cluster) APIDiagnostics(ctx context.Context) string {
	var b strings.Builder
	for _, n := range c.Nodes() {
		if !n.Running() {
			continue
		}
		if _, err := n.exec(ctx, []string{"test", "-r", "/etc/kubernetes/admin.conf"}); err != nil {
			continue
		}
		fmt.Fprintf(&b, "===== the API, asked on %s =====\n", n.Name)
		for _, q := range [][]string{
			{"get", "nodes", "-o", "wide"},
			{"get", "ds,deploy", "-n", "kube-system", "-o", "wide"},
			{"get", "ds", "kube-proxy", "-n", "kube-system", "-o", "jsonpath={.metadata.generation} {.status}"},
			{"get", "pods", "-n", "kube-system", "-o", "wide"},
			{"get", "pods", "-n", "kube-system", "-l", "k8s-app=kube-proxy", "-o", "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.metadata.labels.pod-template-generation} del={.metadata.deletionTimestamp} {.status.phase} {.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}"},
			{"get", "leases", "-n", "kube-system"},
			{"get", "events", "-n", "kube-system", "--sort-by=.lastTimestamp"},
		} {
			res, err := n.exec(ctx, append([]string{"kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf", "--request-timeout=20s"}, q...))
			fmt.Fprintf(&b, "--- kubectl %s ---\n%s%s\n", strings.Join(q, " "), tailLines(string(res.Stdout), 80), tailLines(string(res.Stderr), 5))
			if err != nil {
				fmt.Fprintf(&b, "(%v)\n", err)
			}
		}
		return b.String()
	}
	return "===== the API: no running node with admin.conf =====\n"
}
