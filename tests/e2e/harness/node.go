package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/kairos"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
)

// Node is one nspawn container. Its persistent state (the overlay's upper
// dir and containerd's directory) lives under Dir and survives Stop, Kill,
// Reboot and SwapTree.
type Node struct {
	Name      string
	Index     int    // 1-based, in the order nodes were added
	IP        string // 10.0.0.(10+Index)
	PodSubnet string // 10.244.Index.0/24
	Dir       string // host directory of the node's state

	c       *Cluster
	netns   string
	machine string
	cgroup  string
	binds   []Bind

	op sync.Mutex // one lifecycle operation at a time

	mu        sync.Mutex
	tree      string
	proc      *exec.Cmd
	done      chan struct{} // closed when the nspawn process has exited
	exitErr   error
	nspawn    holder
	leader    holder
	state     string // what systemd reported at the end of the last Boot
	boots     int
	bootTook  time.Duration
	peak      uint64
	consoleAt int64    // console.log offset where the current boot starts
	execProcs []string // cgroup.procs of the container's cgroup roots (Exec joins them)
}

func (n *Node) upper() string      { return filepath.Join(n.Dir, "upper") }
func (n *Node) work() string       { return filepath.Join(n.Dir, "work") }
func (n *Node) root() string       { return filepath.Join(n.Dir, "root") }
func (n *Node) containerd() string { return filepath.Join(n.Dir, "containerd") }

// ConsoleLog is the host file collecting the node's console, all boots.
func (n *Node) ConsoleLog() string { return filepath.Join(n.Dir, "console.log") }

// Upper is the overlay's upper dir: the node's persistent state.
func (n *Node) Upper() string { return n.upper() }

// Tree is the OS tree the node boots (or booted) from.
func (n *Node) Tree() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.tree
}

// Running reports whether the node's container is up.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil && !closed(n.done)
}

// State is what systemd reported when the last Boot finished: "running" or
// "degraded" (a failed unit; see FailedUnits).
func (n *Node) State() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state
}

// Boots counts successful boots.
func (n *Node) Boots() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.boots
}

// LastBootTook is the last Boot's wall time (container start to systemd up).
func (n *Node) LastBootTook() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bootTook
}

// PeakMemory is the highest memory use of the node's cgroup subtree over the
// boots that ended so far (bytes; 0 when the host does not say).
func (n *Node) PeakMemory() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		if p := peakMemory(n.c.hier, n.cgroup); p > n.peak {
			return p
		}
	}
	return n.peak
}

// Leader is the host PID of the container's systemd (0 when stopped).
func (n *Node) Leader() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		return 0
	}
	return n.leader.PID
}

func (n *Node) holders() (nspawn, leader holder) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nspawn, n.leader
}

func closed(ch chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// overlayOptions is the overlayfs mount data: lowers topmost first. Paths
// with ',' ':' or '\' would need escaping and are refused instead. index and
// redirect_dir are off so the upper stays valid over a different lower
// (the A/B swap).
func overlayOptions(lowers []string, upper, work string) (string, error) {
	all := append(append([]string(nil), lowers...), upper, work)
	for _, p := range all {
		if !filepath.IsAbs(p) || strings.ContainsAny(p, ",:\\\n") {
			return "", fmt.Errorf("overlay path %q: want an absolute path without ',' ':' or '\\'", p)
		}
	}
	return "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + upper + ",workdir=" + work + ",index=off,redirect_dir=off", nil
}

// bootSpec is everything one container start needs.
type bootSpec struct {
	Unshare, Mount, Nspawn string
	Procs                  []string // cgroup.procs files to join
	Overlay                string   // overlay mount data
	Root                   string   // the overlay's mount point
	Machine, Hostname      string
	NetNS                  string
	Containerd             string
	Binds                  []Bind
}

// bootScript runs in a private mount namespace: join the node's cgroups,
// mount the overlay (visible only in this namespace: it dies with the
// container, so nothing leaks onto the host), exec nspawn in place (same PID).
const bootScript = `set -eu
while [ "$1" != -- ]; do echo $$ > "$1"; shift; done
shift
"$1" -t overlay overlay -o "$2" "$3"
shift 3
exec "$@"`

// bootArgv is the unshare command line that starts a node.
func bootArgv(s bootSpec) []string {
	a := []string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", bootScript, "pk-e2e-boot"}
	a = append(a, s.Procs...)
	a = append(a, "--", s.Mount, s.Overlay, s.Root, s.Nspawn)
	return append(a, nspawnArgs(s)...)
}

// nspawnArgs are the recipe's flags: systemd as PID 1, no machined/scope
// (--register=no --keep-unit: the cgroup is the one the harness made), the
// node's network namespace, every capability and the keyring and bpf
// syscalls runc needs, containerd's state on a host dir (overlay on overlay
// does not work), and nothing copied from the host (resolv.conf, timezone,
// journal link).
func nspawnArgs(s bootSpec) []string {
	a := []string{
		"-q", "-D", s.Root, "-M", s.Machine, "--hostname=" + s.Hostname, "-b",
		"--register=no", "--keep-unit", "--console=read-only",
		"--network-namespace-path=" + filepath.Join(netnsDir, s.NetNS),
		"--capability=all", "--system-call-filter=@keyring bpf",
		"--resolv-conf=off", "--timezone=off", "--link-journal=no",
		"--bind=" + s.Containerd + ":/var/lib/containerd",
	}
	for _, b := range s.Binds {
		if b.ReadOnly {
			a = append(a, "--bind-ro="+b.Host+":"+b.Node)
		} else {
			a = append(a, "--bind="+b.Host+":"+b.Node)
		}
	}
	return a
}

// Boot starts the container and waits, within the cluster's boot budget,
// until systemd inside reports running or degraded: startup finished, every
// oneshot of multi-user.target done (with the provider's tree that includes
// a whole reconcile pass: size BootBudget for it, or use Start and
// WaitUnit). On failure the node is killed and the error carries the
// console and journal tails.
func (n *Node) Boot(ctx context.Context) error {
	n.op.Lock()
	defer n.op.Unlock()
	return n.boot(ctx, true)
}

// Start starts the container and returns as soon as systemd inside
// answers (startup may still be running): for scenarios that watch a long
// boot unit with WaitUnit.
func (n *Node) Start(ctx context.Context) error {
	n.op.Lock()
	defer n.op.Unlock()
	return n.boot(ctx, false)
}

// untilExit is ctx, also cancelled when the current nspawn exits.
func (n *Node) untilExit(ctx context.Context) (context.Context, context.CancelFunc) {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-done:
			cancel()
		case <-cctx.Done():
		}
	}()
	return cctx, cancel
}

// WaitSystem waits within budget until systemd in the running node reports
// running or degraded (startup finished) and returns which.
func (n *Node) WaitSystem(ctx context.Context, budget time.Duration) (string, error) {
	if !n.Running() {
		return "", fmt.Errorf("node %s: %w", n.Name, ErrNotRunning)
	}
	wctx, cancel := n.untilExit(ctx)
	defer cancel()
	state, err := n.waitSystem(wctx, budget, true)
	if err != nil {
		return state, fmt.Errorf("node %s: %w", n.Name, n.exitNote(err))
	}
	n.mu.Lock()
	n.state = state
	n.mu.Unlock()
	return state, nil
}

// waitSystem polls systemctl is-system-running: with full, until startup
// finished (running or degraded); without, until systemd answers at all.
func (n *Node) waitSystem(ctx context.Context, budget time.Duration, full bool) (string, error) {
	var state string
	args, what := []string{"systemctl", "is-system-running"}, "systemd answering in the node"
	if full {
		args, what = append(args, "--wait"), "systemd running in the node"
	}
	err := wait.Poll(ctx, nil, wait.Budget{Total: budget, Interval: time.Second, PerAttempt: 30 * time.Second},
		what, func(actx context.Context) (bool, error) {
			res, err := n.exec(actx, args)
			state = strings.TrimSpace(string(res.Stdout))
			switch {
			case state == "running" || state == "degraded":
				return true, nil
			case state == "":
				return false, err
			case !full && state != "offline" && state != "unknown":
				return true, nil
			}
			return false, fmt.Errorf("systemd is %s", state)
		})
	return state, err
}

// exitNote adds nspawn's exit to err when the container is gone.
func (n *Node) exitNote(err error) error {
	n.mu.Lock()
	done, ee := n.done, n.exitErr
	n.mu.Unlock()
	if closed(done) {
		return fmt.Errorf("%w (the container exited: %v)", err, ee)
	}
	return err
}

func (n *Node) boot(ctx context.Context, full bool) error {
	c := n.c
	if n.Running() {
		return fmt.Errorf("node %s: already running", n.Name)
	}
	tree := n.Tree()
	if err := ValidateTree(tree); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	// A subtree left by a boot whose cleanup failed is removed first.
	_ = n.removeCgroups()
	procs, err := createCgroups(c.hier, n.cgroup)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	opts, err := overlayOptions(append([]string{tree}, c.o.Base.Lowers()...), n.upper(), n.work())
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	console, err := os.OpenFile(n.ConsoleLog(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer console.Close()
	off, _ := console.Seek(0, io.SeekEnd)
	fmt.Fprintf(console, "\n===== e2e: boot %d of %s, tree %s, %s =====\n", n.Boots()+1, n.Name, tree, time.Now().UTC().Format(time.RFC3339))

	spec := bootSpec{
		Unshare: c.tools.path("unshare"), Mount: c.tools.path("mount"), Nspawn: c.tools.path("systemd-nspawn"),
		Procs: procs, Overlay: opts, Root: n.root(), Machine: n.machine, Hostname: n.Name,
		NetNS: n.netns, Containerd: n.containerd(), Binds: n.binds,
	}
	cmd := exec.CommandContext(c.life, spec.Unshare, bootArgv(spec)...)
	cmd.Env = append([]string{}, runner.BaseEnv...)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = console, console
	// Own session (no terminal signals); if the test binary dies, nspawn gets
	// SIGTERM: an orderly poweroff of the container.
	// The signal comes when the forking thread ends: startOnSpawner forks
	// from one that never does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGTERM}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = c.o.StopBudget
	start := time.Now()
	if err := startOnSpawner(cmd); err != nil {
		_ = n.removeCgroups()
		return fmt.Errorf("node %s: start nspawn: %w", n.Name, err)
	}
	done := make(chan struct{})
	st, _ := procStart(cmd.Process.Pid)
	n.mu.Lock()
	n.proc, n.done, n.exitErr, n.consoleAt = cmd, done, nil, off
	n.nspawn, n.leader, n.state = holder{PID: cmd.Process.Pid, Start: st}, holder{}, ""
	n.mu.Unlock()
	go func() {
		err := cmd.Wait()
		n.mu.Lock()
		n.exitErr = err
		n.mu.Unlock()
		close(done)
	}()

	// Abort the waits at once when nspawn exits.
	bctx, cancel := n.untilExit(ctx)
	defer cancel()
	fail := func(what string, err error) error {
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer dcancel()
		diag := n.Diagnostics(dctx)
		err = n.exitNote(err)
		_ = n.kill(dctx, "boot failed")
		return fmt.Errorf("node %s: %s: %w\n%s", n.Name, what, err, diag)
	}

	err = wait.Poll(bctx, nil, wait.Budget{Total: 30 * time.Second, Interval: 100 * time.Millisecond, PerAttempt: 5 * time.Second},
		"container PID 1", func(context.Context) (bool, error) {
			pid := childNamed(cmd.Process.Pid, "systemd")
			if pid == 0 {
				return false, errors.New("no systemd child of nspawn yet")
			}
			st, err := procStart(pid)
			if err != nil {
				return false, err
			}
			mi, err := os.ReadFile("/proc/self/mountinfo")
			if err != nil {
				return false, err
			}
			lc, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if err != nil {
				return false, err
			}
			procs, err := containerCgroups(string(mi), string(lc))
			if err != nil {
				return false, err
			}
			n.mu.Lock()
			n.leader, n.execProcs = holder{PID: pid, Start: st}, procs
			n.mu.Unlock()
			return true, nil
		})
	if err != nil {
		return fail("find the container's systemd", err)
	}
	if err := c.saveRecord(); err != nil {
		return fail("record", err)
	}
	state, err := n.waitSystem(bctx, c.o.BootBudget, full)
	if err != nil {
		return fail("wait for systemd", err)
	}
	took := time.Since(start)
	n.mu.Lock()
	n.state, n.boots, n.bootTook = state, n.boots+1, took
	n.mu.Unlock()
	c.o.Logf("e2e: node %s up in %s (systemd %s, tree %s)", n.Name, took.Round(10*time.Millisecond), state, tree)
	if state == "degraded" {
		units, _ := n.FailedUnits(ctx)
		c.o.Logf("e2e: node %s degraded, failed units: %s", n.Name, strings.Join(units, ", "))
	}
	return nil
}

// Exec runs a command inside the node (nsenter into every namespace of
// the container's systemd) with a closed environment, bounded by ctx and at
// most 10 minutes. A non-zero exit is a *runner.ExitError naming the
// command and the last line it printed.
func (n *Node) Exec(ctx context.Context, args ...string) (runner.Result, error) {
	if len(args) == 0 {
		return runner.Result{}, errors.New("exec: no command")
	}
	if !n.Running() || n.Leader() == 0 {
		return runner.Result{}, fmt.Errorf("node %s: exec %s: %w", n.Name, args[0], ErrNotRunning)
	}
	res, err := n.exec(ctx, args)
	if err != nil {
		return res, fmt.Errorf("node %s: %w", n.Name, err)
	}
	return res, nil
}

func (n *Node) exec(ctx context.Context, args []string) (runner.Result, error) {
	pid := n.Leader()
	if pid == 0 {
		return runner.Result{}, ErrNotRunning
	}
	n.mu.Lock()
	procs := n.execProcs
	n.mu.Unlock()
	return n.c.o.Runner.Run(ctx, runner.Cmd{Path: "/bin/sh", Args: execArgv(procs, n.c.tools.path("nsenter"), pid, args), Timeout: 10 * time.Minute})
}

// killCgroups writes 1 to cgroup.kill beside each cgroup.procs of the
// container's cgroup roots that has one (cgroup v2 since Linux 5.14): every
// process in that subtree gets SIGKILL at once. It says whether one took.
func killCgroups(procs []string) bool {
	took := false
	for _, p := range procs {
		f, err := os.OpenFile(filepath.Join(filepath.Dir(p), "cgroup.kill"), os.O_WRONLY, 0)
		if err != nil {
			continue
		}
		_, err = f.Write([]byte("1"))
		took = took || err == nil
		f.Close()
	}
	return took
}

// containerCgroups are the cgroup.procs files of the container's cgroup
// roots: where its systemd sits, less systemd's own /init.scope (nspawn
// puts the payload one level down in the hierarchies systemd manages).
func containerCgroups(mountinfo, leaderCgroup string) ([]string, error) {
	hs, err := parseHierarchies(mountinfo, leaderCgroup)
	if err != nil {
		return nil, err
	}
	var procs []string
	for _, h := range hs {
		p := strings.TrimSuffix(h.Parent, "/init.scope")
		procs = append(procs, filepath.Join(h.Mount, p, "cgroup.procs"))
	}
	return procs, nil
}

// execScript joins the node's cgroups (so what runs inside is accounted to
// the node, sees itself at its cgroup root like the node's own processes,
// and dies with it), then execs nsenter.
const execScript = `set -e
while [ "$1" != -- ]; do echo $$ > "$1"; shift; done
shift
exec "$@"`

// execArgv is the /bin/sh command line of Exec: join the container's
// cgroup roots, then nsenter into all of its namespaces.
func execArgv(procs []string, nsenter string, pid int, args []string) []string {
	a := append([]string{"-c", execScript, "pk-e2e-exec"}, procs...)
	a = append(a, "--", nsenter, "-t", strconv.Itoa(pid), "-a", "--")
	return append(a, args...)
}

// Output runs a command inside the node and returns its trimmed stdout.
func (n *Node) Output(ctx context.Context, args ...string) (string, error) {
	res, err := n.Exec(ctx, args...)
	return strings.TrimSpace(string(res.Stdout)), err
}

// FailedUnits lists the node's failed units.
func (n *Node) FailedUnits(ctx context.Context) ([]string, error) {
	out, err := n.Output(ctx, "systemctl", "list-units", "--failed", "--no-legend", "--plain", "--full")
	if err != nil {
		return nil, err
	}
	var units []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			units = append(units, f[0])
		}
	}
	return units, nil
}

// Stop powers the node off in order (SIGTERM to nspawn: systemd's
// poweroff), within the cluster's stop budget; past it the container is
// killed. The upper dir keeps everything written.
func (n *Node) Stop(ctx context.Context) error {
	n.op.Lock()
	defer n.op.Unlock()
	return n.stop(ctx)
}

// current is the running nspawn and its exit signal (nil when stopped).
func (n *Node) current() (*exec.Cmd, chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc, n.done
}

func (n *Node) stop(ctx context.Context) error {
	proc, done := n.current()
	if proc == nil {
		return nil
	}
	start := time.Now()
	if !closed(done) {
		_ = proc.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(n.c.o.StopBudget)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			n.c.o.Logf("e2e: node %s did not power off within %s: killing it", n.Name, n.c.o.StopBudget)
			return n.kill(ctx, "stop budget exhausted")
		case <-ctx.Done():
			_ = n.kill(context.WithoutCancel(ctx), "stop cancelled")
			return ctx.Err()
		}
	}
	err := n.afterExit(ctx)
	n.c.o.Logf("e2e: node %s stopped in %s", n.Name, time.Since(start).Round(10*time.Millisecond))
	return err
}

// WaitExit waits, within budget, for a node that is shutting itself down
// (`systemctl reboot` inside: logind, its inhibitor locks and the
// kubelet's graceful shutdown all run) to exit, sending it nothing. A node
// still running when the budget ends is an error and is left running.
func (n *Node) WaitExit(ctx context.Context, budget time.Duration) error {
	n.op.Lock()
	defer n.op.Unlock()
	proc, done := n.current()
	if proc == nil {
		return nil
	}
	start := time.Now()
	t := time.NewTimer(budget)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return fmt.Errorf("node %s: still running %s after it was asked to shut down", n.Name, budget)
	case <-ctx.Done():
		return ctx.Err()
	}
	err := n.afterExit(ctx)
	n.c.o.Logf("e2e: node %s shut itself down in %s", n.Name, time.Since(start).Round(10*time.Millisecond))
	return err
}

// Kill stops the node hard, like pulling the plug: SIGKILL to the
// container's PID 1 (the kernel then kills everything in its PID namespace),
// then to nspawn if it lingers. Writes already made stay in the upper dir.
func (n *Node) Kill(ctx context.Context) error {
	n.op.Lock()
	defer n.op.Unlock()
	return n.kill(ctx, "Kill")
}

func (n *Node) kill(ctx context.Context, why string) error {
	n.mu.Lock()
	proc, done, nspawn, leader, procs := n.proc, n.done, n.nspawn, n.leader, n.execProcs
	n.mu.Unlock()
	if proc == nil {
		return nil
	}
	if !closed(done) {
		// A power cut stops every process at once. SIGKILL to systemd
		// alone does not: the kernel kills the rest of the container
		// only as systemd exits, and a pass blocked on systemctl sees
		// systemd go first and logs its way to the end (seen on a fast
		// machine: restart-kubelet failed, reconcile-done, all before the
		// kill landed). cgroup v2's cgroup.kill puts SIGKILL on every
		// process of the container in one go; the leader's SIGKILL stays
		// for a host without it.
		if !killCgroups(procs) {
			n.c.o.Logf("e2e: node %s: no cgroup.kill took (cgroup v2, Linux 5.14); SIGKILL to its systemd only, which a pass may outlive by a few lines", n.Name)
		}
		if leader.PID > 0 && alive(leader) {
			_ = syscall.Kill(leader.PID, syscall.SIGKILL)
		}
		t := time.NewTimer(30 * time.Second)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			if alive(nspawn) {
				_ = syscall.Kill(nspawn.PID, syscall.SIGKILL)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				return fmt.Errorf("node %s: nspawn %d did not exit after SIGKILL", n.Name, nspawn.PID)
			}
		}
	}
	n.c.o.Logf("e2e: node %s killed (%s)", n.Name, why)
	return n.afterExit(ctx)
}

// afterExit waits for the node's cgroup subtree to empty (killing what the
// harness itself started there if it lingers), records the peak memory and
// removes the subtree.
func (n *Node) afterExit(ctx context.Context) error {
	err := wait.Poll(ctx, nil, wait.Budget{Total: 30 * time.Second, Interval: 200 * time.Millisecond, PerAttempt: 5 * time.Second},
		"node "+n.Name+" processes gone", func(context.Context) (bool, error) {
			pids := cgroupPIDs(n.c.hier, n.cgroup)
			if len(pids) == 0 {
				return true, nil
			}
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			return false, fmt.Errorf("%d processes left: %v", len(pids), pids)
		})
	n.mu.Lock()
	if p := peakMemory(n.c.hier, n.cgroup); p > n.peak {
		n.peak = p
	}
	n.proc, n.leader = nil, holder{}
	n.mu.Unlock()
	return errors.Join(err, n.removeCgroups(), n.c.saveRecord())
}

func (n *Node) removeCgroups() error {
	var errs []error
	for _, h := range n.c.hier {
		d := h.Dir(n.cgroup)
		var err error
		for i := 0; i < 50; i++ {
			if err = removeCgroupDir(d); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Reboot is Stop then Boot, on the same tree.
func (n *Node) Reboot(ctx context.Context) error {
	n.op.Lock()
	defer n.op.Unlock()
	if err := n.stop(ctx); err != nil {
		return err
	}
	return n.boot(ctx, true)
}

// SwapTree is the A/B image swap: stop the node (in order), put dir as the
// overlay's OS tree in place of the old one, keep the upper dir (all of the
// node's state), and boot.
func (n *Node) SwapTree(ctx context.Context, dir string) error {
	if err := ValidateTree(dir); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	n.op.Lock()
	defer n.op.Unlock()
	if err := n.stop(ctx); err != nil {
		return err
	}
	n.mu.Lock()
	old := n.tree
	n.tree = dir
	n.mu.Unlock()
	n.c.o.Logf("e2e: node %s: image swap %s -> %s", n.Name, old, dir)
	return n.boot(ctx, true)
}

// SetTree puts dir as the OS tree of the node's next boot; the node must be
// stopped (SwapTree does stop, swap and boot in one).
func (n *Node) SetTree(dir string) error {
	if err := ValidateTree(dir); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	n.op.Lock()
	defer n.op.Unlock()
	if n.Running() {
		return fmt.Errorf("node %s: set tree while running: stop it first", n.Name)
	}
	n.mu.Lock()
	n.tree = dir
	n.mu.Unlock()
	return nil
}

// WriteCloudConfig writes the operator's cloud-config (a "#cloud-config"
// document, typically with a cluster: section) to /oem/90_custom.yaml in the
// node's persistent state, 0600, as an operator does on an installed
// Kairos node. On every boot kairos-init's initramfs stage sends it to the
// provider's plugin (agent.boot) and the boot stage runs what the plugin
// wrote.
func (n *Node) WriteCloudConfig(data []byte) error {
	return n.WriteFile(kairos.OEMCloudConfig, data, 0o600)
}

// EditCloudConfig changes the node's /oem cloud-config in place, as an
// operator edits it (bumping the pin is an edit of that file).
func (n *Node) EditCloudConfig(edit func([]byte) ([]byte, error)) error {
	b, err := n.ReadFile(kairos.OEMCloudConfig)
	if err != nil {
		return err
	}
	out, err := edit(b)
	if err != nil {
		return fmt.Errorf("node %s: edit %s: %w", n.Name, kairos.OEMCloudConfig, err)
	}
	return n.WriteCloudConfig(out)
}

// UnitState is what systemd says about a unit in the current boot.
type UnitState struct {
	Unit           string
	ActiveState    string // active, activating, inactive, failed, ...
	SubState       string
	Result         string // success, exit-code, timeout, signal, ...
	ExecMainStatus int    // the exit code of its main process (the provider's: 0 ok, 1 failed, 3 refused)
	Finished       bool   // its main process ran and exited in this boot, the unit failed, or a condition skipped it
	Skipped        bool   // a Condition*= was false: the unit did not run in this boot
	// Monotonic microseconds of this boot: when its main process started
	// and exited (0 when it did not).
	StartedUS, ExitedUS int64
}

func (u UnitState) String() string {
	if u.Skipped {
		return fmt.Sprintf("%s skipped (a condition was false)", u.Unit)
	}
	return fmt.Sprintf("%s %s/%s result=%s status=%d", u.Unit, u.ActiveState, u.SubState, u.Result, u.ExecMainStatus)
}

// unitShowProps are the properties UnitState reads.
var unitShowProps = []string{"ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainStartTimestampMonotonic",
	"ExecMainExitTimestampMonotonic", "ConditionResult", "ConditionTimestampMonotonic"}

// parseUnitShow reads `systemctl show -p ...` output (KEY=VALUE lines).
func parseUnitShow(unit, out string) UnitState {
	u := UnitState{Unit: unit}
	condFalse, condChecked := false, false
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), "=")
		if !ok {
			continue
		}
		switch k {
		case "ActiveState":
			u.ActiveState = v
		case "SubState":
			u.SubState = v
		case "Result":
			u.Result = v
		case "ExecMainStatus":
			u.ExecMainStatus, _ = strconv.Atoi(v)
		case "ExecMainStartTimestampMonotonic":
			u.StartedUS, _ = strconv.ParseInt(v, 10, 64)
		case "ExecMainExitTimestampMonotonic":
			u.ExitedUS, _ = strconv.ParseInt(v, 10, 64)
		case "ConditionResult":
			condFalse = v == "no"
		case "ConditionTimestampMonotonic":
			condChecked = v != "" && v != "0"
		}
	}
	u.Skipped = condFalse && condChecked && u.ExitedUS == 0
	u.Finished = u.ActiveState == "failed" || u.Skipped || u.ExitedUS > 0 && u.ActiveState != "activating" && u.ActiveState != "deactivating"
	return u
}

// UnitState reads a unit's state in the running node.
func (n *Node) UnitState(ctx context.Context, unit string) (UnitState, error) {
	args := []string{"systemctl", "show", unit}
	for _, p := range unitShowProps {
		args = append(args, "-p", p)
	}
	out, err := n.Output(ctx, args...)
	if err != nil {
		return UnitState{Unit: unit}, err
	}
	return parseUnitShow(unit, out), nil
}

// WaitUnit waits within budget until unit has run and finished in this
// boot (a oneshot such as the reconcile pass), and returns how it ended.
// The wait ends early if the container exits.
func (n *Node) WaitUnit(ctx context.Context, unit string, budget time.Duration) (UnitState, error) {
	if !n.Running() {
		return UnitState{Unit: unit}, fmt.Errorf("node %s: %w", n.Name, ErrNotRunning)
	}
	wctx, cancel := n.untilExit(ctx)
	defer cancel()
	var last UnitState
	err := wait.Poll(wctx, nil, wait.Budget{Total: budget, Interval: 2 * time.Second, PerAttempt: 30 * time.Second},
		"node "+n.Name+": "+unit+" finished", func(actx context.Context) (bool, error) {
			u, err := n.UnitState(actx, unit)
			if err != nil {
				return false, err
			}
			last = u
			if u.Finished {
				return true, nil
			}
			return false, fmt.Errorf("%s", u)
		})
	if err != nil {
		return last, n.exitNote(err)
	}
	return last, nil
}

// UnitJournal is the unit's journal of this boot, messages only.
func (n *Node) UnitJournal(ctx context.Context, unit string) (string, error) {
	return n.Output(ctx, "journalctl", "-b", "-u", unit, "--no-pager", "-o", "cat")
}

// shutdown is Cleanup's stop: orderly, then hard, then the cgroups.
func (n *Node) shutdown(ctx context.Context) error {
	n.op.Lock()
	defer n.op.Unlock()
	if err := n.stop(ctx); err != nil {
		if kerr := n.kill(context.WithoutCancel(ctx), "cleanup"); kerr != nil {
			return errors.Join(err, kerr)
		}
	}
	return n.removeCgroups()
}

// whiteout reports whether fi is an overlayfs whiteout (a 0:0 char device).
func whiteout(fi fs.FileInfo) bool {
	if fi.Mode()&fs.ModeCharDevice == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Rdev == 0
}

// WriteFile writes a file into the node: through the running container's
// root, or into the upper dir while it is stopped (removing a whiteout that
// hides the path). Parents are created 0755. It never follows a symlink out
// of the node.
func (n *Node) WriteFile(p string, data []byte, mode os.FileMode) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("node %s: write %s: want an absolute path", n.Name, p)
	}
	rel := strings.TrimPrefix(path.Clean(p), "/")
	base := n.upper()
	live := false
	if pid := n.Leader(); pid != 0 && n.Running() {
		base, live = fmt.Sprintf("/proc/%d/root", pid), true
	}
	r, err := os.OpenRoot(base)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	defer r.Close()
	if err := r.MkdirAll(path.Dir(rel), 0o755); err != nil && path.Dir(rel) != "." {
		return fmt.Errorf("node %s: write %s: %w", n.Name, p, err)
	}
	if !live {
		if fi, err := r.Lstat(rel); err == nil && whiteout(fi) {
			if err := r.Remove(rel); err != nil {
				return fmt.Errorf("node %s: write %s: %w", n.Name, p, err)
			}
		}
	}
	f, err := r.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("node %s: write %s: %w", n.Name, p, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("node %s: write %s: %w", n.Name, p, err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadFile reads a file of the node: through the running container's
// root, or while stopped from the layers (upper, tree, base) in order; a
// whiteout in the upper dir means the file was deleted.
func (n *Node) ReadFile(p string) ([]byte, error) {
	if !path.IsAbs(p) {
		return nil, fmt.Errorf("node %s: read %s: want an absolute path", n.Name, p)
	}
	rel := strings.TrimPrefix(path.Clean(p), "/")
	if pid := n.Leader(); pid != 0 && n.Running() {
		r, err := os.OpenRoot(fmt.Sprintf("/proc/%d/root", pid))
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return r.ReadFile(rel)
	}
	layers := append([]string{n.upper(), n.Tree()}, n.c.o.Base.Lowers()...)
	for i, l := range layers {
		r, err := os.OpenRoot(l)
		if err != nil {
			return nil, err
		}
		fi, err := r.Lstat(rel)
		if err == nil && i == 0 && whiteout(fi) {
			r.Close()
			return nil, fmt.Errorf("node %s: read %s: %w", n.Name, p, fs.ErrNotExist)
		}
		if err == nil {
			b, err := r.ReadFile(rel)
			r.Close()
			return b, err
		}
		r.Close()
	}
	return nil, fmt.Errorf("node %s: read %s: %w", n.Name, p, fs.ErrNotExist)
}

// Diagnostics is what a failure report needs: the console of the current
// (or last) boot and the journal's tail, read inside the running node or,
// when it is down, from its persistent journal on the host.
func (n *Node) Diagnostics(ctx context.Context) string {
	var b strings.Builder
	running := n.Running()
	fmt.Fprintf(&b, "===== node %s (%s, tree %s, boots %d, running %t) =====\n", n.Name, n.IP, n.Tree(), n.Boots(), running)
	n.mu.Lock()
	off := n.consoleAt
	n.mu.Unlock()
	if f, err := os.Open(n.ConsoleLog()); err == nil {
		_, _ = f.Seek(off, io.SeekStart)
		data, _ := io.ReadAll(io.LimitReader(f, 4<<20))
		f.Close()
		fmt.Fprintf(&b, "--- console (last 60 lines) ---\n%s\n", tailLines(string(data), 60))
	}
	if running {
		if units, err := n.FailedUnits(ctx); err == nil {
			fmt.Fprintf(&b, "--- failed units: %s\n", strings.Join(units, " "))
			// Each failed unit's own journal: the boot's tail may be all
			// other units' chatter (kairos-agent's stages are verbose).
			for _, u := range units {
				res, err := n.exec(ctx, []string{"journalctl", "-b", "-u", u, "--no-pager", "-n", "40", "-o", "short-monotonic"})
				fmt.Fprintf(&b, "--- journal of this boot: %s (last 40) ---\n%s\n", u, strings.TrimRight(string(res.Stdout), "\n"))
				if err != nil {
					fmt.Fprintf(&b, "(journalctl: %v)\n", err)
				}
			}
		}
		for _, q := range journalQueries {
			res, err := n.exec(ctx, append([]string{"journalctl"}, q.args...))
			fmt.Fprintf(&b, "--- journal of this boot: %s ---\n%s\n", q.what, strings.TrimRight(string(res.Stdout), "\n"))
			if err != nil {
				fmt.Fprintf(&b, "(journalctl: %v)\n", err)
			}
		}
		return b.String()
	}
	jdir := filepath.Join(n.upper(), "var/log/journal")
	if _, err := os.Stat(jdir); err != nil {
		fmt.Fprintf(&b, "--- no persistent journal (%v) ---\n", err)
		return b.String()
	}
	for _, q := range journalQueries {
		res, err := n.c.o.Runner.Run(ctx, runner.Cmd{
			Path:    n.c.tools.path("journalctl"),
			Args:    append([]string{"-D", jdir}, q.args...),
			Timeout: 30 * time.Second,
		})
		fmt.Fprintf(&b, "--- journal of the last boot, read from the host: %s ---\n%s\n", q.what, strings.TrimRight(string(res.Stdout), "\n"))
		if err != nil {
			fmt.Fprintf(&b, "(journalctl: %v)\n", err)
		}
	}
	return b.String()
}

// journalQueries are what Diagnostics reads: the warnings and errors (a
// failed unit, a crash-looping kubelet) and the plain tail.
var journalQueries = []struct {
	what string
	args []string
}{
	{"warnings and errors (last 80)", []string{"-b", "-p", "warning", "--no-pager", "-n", "80", "-o", "short-monotonic"}},
	{"tail (last 120 lines)", []string{"-b", "--no-pager", "-n", "120", "-o", "short-monotonic"}},
}
