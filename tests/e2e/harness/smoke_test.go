package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/system"
)

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

// smokeTree writes a tiny OS tree: a file naming the tree, a unit that
// records each boot in the node's persistent state, a unit named like the
// provider's reconcile unit and ordered as it is (after Kairos's boot stage)
// that records what it found in /run, and optionally a failing unit.
func smokeTree(t testing.TB, label string, failing bool) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tree-"+label)
	units := filepath.Join(dir, "usr/lib/systemd/system")
	wants := filepath.Join(units, "multi-user.target.wants")
	for _, d := range []string{wants, filepath.Join(dir, "usr/share/pk-smoke"), filepath.Join(dir, "usr/bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"usr/share/pk-smoke/tree": label + "\n",
		"usr/lib/systemd/system/pk-smoke.service": `[Unit]
Description=e2e smoke: this tree's unit runs
[Service]
Type=oneshot
RemainAfterExit=yes
StateDirectory=pk-smoke
ExecStart=/bin/sh -c 'cat /usr/share/pk-smoke/tree > /run/pk-smoke-ran; cat /proc/sys/kernel/random/boot_id >> /var/lib/pk-smoke/boots'
`,
		// Named like the provider's unit and ordered like it.
		"usr/lib/systemd/system/provider-kubernetes-reconcile.service": `[Unit]
Description=e2e smoke: stand-in reconcile, records what the boot stage left in /run
After=cos-setup-boot.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'stat -c %%a /run/provider-kubernetes/cluster.yaml > /run/pk-smoke-reconcile-saw 2>&1 || echo missing > /run/pk-smoke-reconcile-saw'
`,
	}
	links := []string{"pk-smoke.service", "provider-kubernetes-reconcile.service"}
	if failing {
		files["usr/lib/systemd/system/pk-smoke-fail.service"] = "[Unit]\nDescription=e2e smoke: a unit that fails\n[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo pk-smoke-fail-ran; exit 3'\n"
		links = append(links, "pk-smoke-fail.service")
	}
	for p, data := range files {
		// %% in the unit above is systemd's escape for a literal %.
		if err := os.WriteFile(filepath.Join(dir, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The node's containerd, as every OS image tree carries it.
	for name, src := range testutil.ContainerdBinaries(t) {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "usr/bin", name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range system.Units() {
		if u.Path == system.UnitDir+"/"+system.Containerd {
			if err := os.WriteFile(filepath.Join(units, system.Containerd), u.Data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	links = append(links, system.Containerd)
	for _, l := range links {
		if err := os.Symlink("../"+l, filepath.Join(wants, l)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// hostOriginals is what the host sysctls are when no cluster holds them:
// the record's originals while another cluster (another test package) is up.
func hostOriginals(t testing.TB) map[string]string {
	t.Helper()
	var orig map[string]string
	err := withStateLock(func() error {
		var rec sysctlRecord
		ok, err := loadJSON(sysctlRecordPath(), &rec)
		if err != nil {
			return err
		}
		if ok && rec.BootID == bootID() {
			orig = rec.Orig
			return nil
		}
		orig, err = readSysctls()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return orig
}

// hostSysctlsNow reads the host sysctls and whether some cluster still holds them.
func hostSysctlsNow(t testing.TB) (map[string]string, bool) {
	t.Helper()
	var cur map[string]string
	held := false
	err := withStateLock(func() error {
		var rec sysctlRecord
		ok, err := loadJSON(sysctlRecordPath(), &rec)
		if err != nil {
			return err
		}
		for _, h := range rec.Holders {
			held = held || ok && alive(h)
		}
		cur, err = readSysctls()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return cur, held
}

// buildHello builds a static binary that prints its PID and cgroups.
func buildHello(t testing.TB, ctx context.Context) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	prog := "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tb, _ := os.ReadFile(\"/proc/self/cgroup\")\n\tfmt.Printf(\"hello from pid %d\\n%s\", os.Getpid(), b)\n}\n"
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "hello")
	cmd := exec.CommandContext(ctx, filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-trimpath", "-ldflags=-s -w", "-o", out, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build hello: %v\n%s", err, b)
	}
	return out
}

func mustOut(t testing.TB, ctx context.Context, n *Node, args ...string) string {
	t.Helper()
	out, err := n.Output(ctx, args...)
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	return out
}

// TestNodeLifecycleSmoke boots two real nodes from the base rootfs plus a
// test tree and walks every lifecycle step the kubeadm scenarios rely on:
// boot, exec, Kairos's initramfs and boot stages, the private network, the A/B swap,
// a hard kill and a boot after it, a degraded boot and its diagnostics,
// and a cleanup that leaves the host as it was.
func TestNodeLifecycleSmoke(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	t0 := time.Now()
	base, err := EnsureBase(ctx, BaseOptions{Log: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("base ready in %s: %s + %s", time.Since(t0).Round(10*time.Millisecond), base.Rootfs, base.Config)
	before := hostOriginals(t)
	treeA, treeB, treeC := smokeTree(t, "A", false), smokeTree(t, "B", false), smokeTree(t, "C", true)

	tc := time.Now()
	c := New(t, Options{Base: base, BootBudget: 2 * time.Minute, StopBudget: 60 * time.Second})
	n1, err := c.AddNode(ctx, NodeSpec{Name: "n1", Tree: treeA})
	if err != nil {
		t.Fatal(err)
	}
	n2, err := c.AddNode(ctx, NodeSpec{Name: "n2", Tree: treeA})
	if err != nil {
		t.Fatal(err)
	}
	// The operator's cloud-config in /oem: yip stages Kairos's own agent
	// runs, the initramfs stage (early unit) and the boot stage
	// (cos-setup-boot.service), each leaving a file in /run.
	cluster := "cluster_token: not-a-real-token\nrole: init\n"
	if err := n1.WriteCloudConfig([]byte(smokeCloudConfig(cluster))); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"kernel.panic": "10", "kernel.panic_on_oops": "1", "vm.overcommit_memory": "1"} {
		if got, _ := os.ReadFile(sysctlPath(k)); strings.TrimSpace(string(got)) != v {
			t.Errorf("host %s = %q while the cluster is up, want %s", k, got, v)
		}
	}

	errs := make(chan error, 2)
	for _, n := range []*Node{n1, n2} {
		go func() { errs <- n.Boot(ctx) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("two nodes up in %s (boot n1 %s, n2 %s)", time.Since(tc).Round(10*time.Millisecond), n1.LastBootTook().Round(10*time.Millisecond), n2.LastBootTook().Round(10*time.Millisecond))

	t.Run("boot", func(t *testing.T) {
		if n1.State() != "running" {
			units, _ := n1.FailedUnits(ctx)
			t.Fatalf("systemd %s, failed units %v", n1.State(), units)
		}
		if got := mustOut(t, ctx, n1, "hostname"); got != "n1" {
			t.Errorf("hostname %q", got)
		}
		if a, b := mustOut(t, ctx, n1, "cat", "/etc/machine-id"), mustOut(t, ctx, n2, "cat", "/etc/machine-id"); a == b || len(a) != 32 {
			t.Errorf("machine ids %q and %q: want two distinct ids", a, b)
		}
		if got := mustOut(t, ctx, n1, "cat", "/run/pk-smoke-ran"); got != "A" {
			t.Errorf("tree unit saw %q, want A", got)
		}
		// is-enabled exits 1 for a masked unit: read what it printed.
		if got, _ := n1.Output(ctx, "systemctl", "is-enabled", "etcd.service"); got != "masked" {
			t.Errorf("etcd.service is %q, want masked", got)
		}
		out := mustOut(t, ctx, n1, "ctr", "version")
		if !strings.Contains(out, "Server:") || strings.Count(out, "Version:") < 2 {
			t.Errorf("ctr version does not show a server:\n%s", out)
		}
		if got := mustOut(t, ctx, n1, "readlink", "/dev/kmsg"); got != "/dev/null" {
			t.Errorf("/dev/kmsg -> %q", got)
		}
		// Exec'd commands live in the node's cgroups, at its root.
		if got := mustOut(t, ctx, n1, "cat", "/proc/self/cgroup"); strings.Contains(got, "..") || !strings.Contains(got, "memory:/\n") {
			t.Errorf("exec'd process cgroups:\n%s", got)
		}
	})

	t.Run("runc", func(t *testing.T) {
		// A real container: runc under containerd with cgroupfs on the
		// rw-remounted v1 hierarchies, the keyring and bpf syscalls allowed.
		b, err := os.ReadFile(buildHello(t, ctx))
		if err != nil {
			t.Fatal(err)
		}
		if err := n1.WriteFile("/opt/pk-smoke/rootfs/hello", b, 0o755); err != nil {
			t.Fatal(err)
		}
		out := mustOut(t, ctx, n1, "ctr", "run", "--rm", "--rootfs", "/opt/pk-smoke/rootfs", "pk-smoke", "/hello")
		if !strings.Contains(out, "hello from pid 1\n") || !strings.Contains(out, "memory:/default/pk-smoke") {
			t.Errorf("container output:\n%s", out)
		}
	})

	t.Run("kairos stages", func(t *testing.T) {
		if got := mustOut(t, ctx, n1, "cat", "/run/pk-smoke-initramfs"); got != "initramfs stage ran" {
			t.Errorf("initramfs stage marker %q", got)
		}
		if got := mustOut(t, ctx, n1, "stat", "-c", "%a %U", "/run/provider-kubernetes/cluster.yaml"); got != "600 root" {
			t.Errorf("cluster file mode/owner %q, want 600 root", got)
		}
		if got := mustOut(t, ctx, n1, "cat", "/run/provider-kubernetes/cluster.yaml"); got+"\n" != cluster {
			t.Errorf("cluster file %q", got)
		}
		if got := mustOut(t, ctx, n1, "cat", "/run/pk-smoke-reconcile-saw"); got != "600" {
			t.Errorf("the reconcile unit found %q, want the 0600 file (ordered after cos-setup-boot.service)", got)
		}
		if got := mustOut(t, ctx, n1, "systemctl", "show", "-p", "Result", "--value", "cos-setup-boot.service"); got != "success" {
			t.Errorf("cos-setup-boot.service result %q", got)
		}
		// No cloud-config, no file, and no failure.
		if got := mustOut(t, ctx, n2, "cat", "/run/pk-smoke-reconcile-saw"); got != "missing" {
			t.Errorf("n2 (no cluster section) reconcile saw %q", got)
		}
	})

	t.Run("network", func(t *testing.T) {
		mustOut(t, ctx, n1, "ping", "-c", "1", "-W", "5", n2.IP)
		mustOut(t, ctx, n2, "ping", "-c", "1", "-W", "5", n1.IP)
		if routes := mustOut(t, ctx, n1, "ip", "route"); !strings.Contains(routes, n2.PodSubnet+" via "+n2.IP) || !strings.Contains(routes, "default via "+BridgeIP) {
			t.Errorf("n1 routes:\n%s", routes)
		}
		// 10.0.0.0/24 exists only in the harness's namespaces.
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if strings.HasPrefix(a.String(), "10.0.0.") {
				t.Errorf("host namespace has %s", a)
			}
		}
	})

	t.Run("swap tree", func(t *testing.T) {
		mustOut(t, ctx, n1, "sh", "-c", "echo kept > /var/lib/pk-smoke/state")
		if err := n1.SwapTree(ctx, treeB); err != nil {
			t.Fatal(err)
		}
		if got := mustOut(t, ctx, n1, "cat", "/usr/share/pk-smoke/tree"); got != "B" {
			t.Errorf("tree file %q after the swap, want B", got)
		}
		if got := mustOut(t, ctx, n1, "cat", "/run/pk-smoke-ran"); got != "B" {
			t.Errorf("tree unit saw %q, want B", got)
		}
		if got := mustOut(t, ctx, n1, "cat", "/var/lib/pk-smoke/state"); got != "kept" {
			t.Errorf("upper state %q after the swap", got)
		}
		if got := mustOut(t, ctx, n1, "stat", "-c", "%a", "/run/provider-kubernetes/cluster.yaml"); got != "600" {
			t.Errorf("cluster file mode %q after the swap", got)
		}
		if boots := strings.Fields(mustOut(t, ctx, n1, "cat", "/var/lib/pk-smoke/boots")); len(boots) != 2 || boots[0] == boots[1] {
			t.Errorf("boot ids %v, want two distinct", boots)
		}
	})

	t.Run("kill and boot", func(t *testing.T) {
		// Written and never synced: a hard stop of the container keeps it
		// (the host's page cache is not lost; the container is).
		mustOut(t, ctx, n1, "sh", "-c", "echo before-crash > /var/lib/pk-smoke/crash")
		leader := n1.Leader()
		if err := n1.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		if n1.Running() || n1.Leader() != 0 {
			t.Fatal("node still running after Kill")
		}
		if err := syscall.Kill(leader, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("container PID 1 (%d) still there: %v", leader, err)
		}
		if _, err := n1.Exec(ctx, "true"); !errors.Is(err, ErrNotRunning) {
			t.Errorf("exec on a killed node: %v, want ErrNotRunning", err)
		}
		// Stopped: reads come from the layers.
		if b, err := n1.ReadFile("/var/lib/pk-smoke/crash"); err != nil || string(b) != "before-crash\n" {
			t.Errorf("stopped read of the upper: %q, %v", b, err)
		}
		if b, err := n1.ReadFile("/usr/share/pk-smoke/tree"); err != nil || string(b) != "B\n" {
			t.Errorf("stopped read of the tree: %q, %v", b, err)
		}
		// Start returns once systemd answers; the scenarios then watch their unit.
		if err := n1.Start(ctx); err != nil {
			t.Fatal(err)
		}
		u, err := n1.WaitUnit(ctx, "provider-kubernetes-reconcile.service", time.Minute)
		if err != nil || u.Result != "success" || u.ExecMainStatus != 0 || !u.Finished {
			t.Errorf("reconcile stand-in: %v (%v)", u, err)
		}
		if state, err := n1.WaitSystem(ctx, time.Minute); err != nil || state != "running" {
			t.Errorf("after Start: systemd %q (%v)", state, err)
		}
		if got := mustOut(t, ctx, n1, "cat", "/var/lib/pk-smoke/crash", "/var/lib/pk-smoke/state"); got != "before-crash\nkept" {
			t.Errorf("state after the crash %q", got)
		}
		if boots := strings.Fields(mustOut(t, ctx, n1, "cat", "/var/lib/pk-smoke/boots")); len(boots) != 3 {
			t.Errorf("boot ids %v, want three", boots)
		}
	})

	t.Run("degraded boot and diagnostics", func(t *testing.T) {
		if err := n2.SwapTree(ctx, treeC); err != nil {
			t.Fatal(err)
		}
		if n2.State() != "degraded" {
			t.Errorf("systemd %s with a failing unit, want degraded", n2.State())
		}
		units, err := n2.FailedUnits(ctx)
		if err != nil || len(units) != 1 || units[0] != "pk-smoke-fail.service" {
			t.Errorf("failed units %v (%v)", units, err)
		}
		u, err := n2.WaitUnit(ctx, "pk-smoke-fail.service", 10*time.Second)
		if err != nil || u.ActiveState != "failed" || u.Result != "exit-code" || u.ExecMainStatus != 3 {
			t.Errorf("failing unit: %v (%v)", u, err)
		}
		if j, err := n2.UnitJournal(ctx, "pk-smoke-fail.service"); err != nil || !strings.Contains(j, "pk-smoke-fail-ran") {
			t.Errorf("unit journal %q (%v)", j, err)
		}
		if err := n2.SetTree(treeA); err == nil {
			t.Error("SetTree on a running node must be refused")
		}
		if d := n2.Diagnostics(ctx); !strings.Contains(d, "pk-smoke-fail-ran") || !strings.Contains(d, "failed units: pk-smoke-fail.service") || !strings.Contains(d, "pk-smoke-fail.service: Failed with result 'exit-code'") {
			t.Errorf("diagnostics of a running node lack the failed unit's journal:\n%s", d)
		}
		if err := n2.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		// Down: the journal is read from the node's persistent state on the host.
		if d := n2.Diagnostics(ctx); !strings.Contains(d, "pk-smoke-fail.service: Failed with result 'exit-code'") || !strings.Contains(d, "read from the host") || !strings.Contains(d, "Shutting down") {
			t.Errorf("diagnostics of a stopped node lack the journal:\n%s", d)
		}
	})

	for _, n := range c.Nodes() {
		t.Logf("node %s: %d boots, peak memory %.1f MiB", n.Name, n.Boots(), float64(n.PeakMemory())/(1<<20))
	}

	tcl := time.Now()
	if err := c.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("cleanup in %s", time.Since(tcl).Round(10*time.Millisecond))
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), c.Name+"-") {
			t.Errorf("network namespace %s left", e.Name())
		}
	}
	for _, h := range c.hier {
		left, _ := filepath.Glob(filepath.Join(h.Mount, h.Parent, "pk-e2e-"+c.Name+"-*"))
		if len(left) > 0 {
			t.Errorf("cgroups left: %v", left)
		}
	}
	if after, held := hostSysctlsNow(t); !held && fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("host sysctls %v after cleanup, were %v", after, before)
	}
	if _, err := os.Stat(filepath.Join(recordsDir(), c.Name+".json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("cluster record left: %v", err)
	}
}

// BenchmarkNodeBootStop is one node's boot (container start until systemd
// reports running, containerd up) plus its orderly poweroff, warm base.
func BenchmarkNodeBootStop(b *testing.B) {
	Require(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	base, err := EnsureBase(ctx, BaseOptions{Log: testWriter{b}})
	if err != nil {
		b.Fatal(err)
	}
	c := New(b, Options{Base: base, Logf: func(string, ...any) {}})
	n, err := c.AddNode(ctx, NodeSpec{Name: "bench", Tree: smokeTree(b, "A", false)})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := n.Boot(ctx); err != nil {
			b.Fatal(err)
		}
		if err := n.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n.PeakMemory())/(1<<20), "peak-MiB")
}

// TestBootFailureIsDiagnosed boots a tree whose init dies at once: Boot
// fails fast (not at the end of its budget) with the console in the error,
// and leaves no process or cgroup of the node behind.
func TestBootFailureIsDiagnosed(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	base, err := EnsureBase(ctx, BaseOptions{Log: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(t.TempDir(), "broken")
	initPath := filepath.Join(tree, "usr/lib/systemd/systemd")
	if err := os.MkdirAll(filepath.Dir(initPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(initPath, []byte("#!/bin/sh\necho pk-broken-init-ran\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := New(t, Options{Base: base, BootBudget: 2 * time.Minute})
	n, err := c.AddNode(ctx, NodeSpec{Name: "broken", Tree: tree})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = n.Boot(ctx)
	took := time.Since(start)
	if err == nil {
		t.Fatal("a tree whose init exits booted")
	}
	if !strings.Contains(err.Error(), "pk-broken-init-ran") || !strings.Contains(err.Error(), "console") {
		t.Errorf("the error lacks the console:\n%v", err)
	}
	t.Logf("boot failed after %s: %.600s", took, err)
	if took > time.Minute {
		t.Errorf("Boot took %s to notice the container exited", took)
	}
	if n.Running() {
		t.Error("node running after a failed boot")
	}
	for _, h := range c.hier {
		if _, err := os.Stat(h.Dir(n.cgroup)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cgroup %s left after a failed boot", h.Dir(n.cgroup))
		}
	}
}

// smokeCloudConfig is an operator cloud-config whose yip stages leave
// marks: the initramfs stage a file in /run, the boot stage the given
// content as the provider's cluster file (0600).
func smokeCloudConfig(cluster string) string {
	return fmt.Sprintf(`#cloud-config
stages:
  initramfs:
  - name: smoke initramfs
    files:
    - path: /run/pk-smoke-initramfs
      permissions: 420
      content: "initramfs stage ran\n"
  boot:
  - name: smoke boot
    directories:
    - path: /run/provider-kubernetes
      permissions: 493
    files:
    - path: /run/provider-kubernetes/cluster.yaml
      permissions: 384
      content: %q
`, cluster)
}
