package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary act as a test run that dies with a node
// up (see TestMain).
const helperEnv = "PK_E2E_HELPER_DYING_CLUSTER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		os.Exit(dyingCluster(dir))
	}
	os.Exit(m.Run())
}

// dyingCluster starts a cluster with one booted node, says "ready NAME
// NSPAWN-PID LEADER-PID" and waits to be killed.
func dyingCluster(dir string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	base, err := EnsureBase(ctx, BaseOptions{})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	c, err := Start(ctx, Options{Base: base, StateDir: dir, Name: "pkdying"})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	n, err := c.AddNode(ctx, NodeSpec{Name: "d1", Tree: filepath.Join(dir, "tree")})
	if err == nil {
		err = n.Boot(ctx)
	}
	if err != nil {
		fmt.Println("error", strings.ReplaceAll(err.Error(), "\n", " | "))
		_ = c.Cleanup(ctx)
		return 1
	}
	ns, leader := n.holders()
	fmt.Printf("ready %s %d %d\n", c.Name, ns.PID, leader.PID)
	time.Sleep(10 * time.Minute)
	return 0
}

// TestKilledRunIsSwept kills a test binary that has a node up, the way a go
// test timeout or a CI kill would: its container powers off by itself
// (nspawn's parent-death signal), and the next cluster's Start removes the
// dead run's network namespaces and cgroups, after which the host sysctls
// go back to their true originals.
func TestKilledRunIsSwept(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	base, err := EnsureBase(ctx, BaseOptions{Log: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	before := hostOriginals(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tree/usr/share"), 0o755); err != nil {
		t.Fatal(err)
	}

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ready ") || strings.HasPrefix(sc.Text(), "error ") {
				lines <- sc.Text()
				return
			}
		}
		close(lines)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(3 * time.Minute):
		t.Fatal("helper cluster did not come up within 3m")
	}
	var name string
	var nspawn, leader int
	if _, err := fmt.Sscanf(line, "ready %s %d %d", &name, &nspawn, &leader); err != nil {
		t.Fatalf("helper: %q", line)
	}
	if got, _ := os.ReadFile(sysctlPath("kernel.panic")); strings.TrimSpace(string(got)) != "10" {
		t.Fatalf("kernel.panic %q while the helper's cluster is up", got)
	}

	// The test binary dies without any cleanup.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// Its container powers off on its own.
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && (syscall.Kill(nspawn, 0) == nil || syscall.Kill(leader, 0) == nil) {
		time.Sleep(200 * time.Millisecond)
	}
	if syscall.Kill(nspawn, 0) == nil || syscall.Kill(leader, 0) == nil {
		t.Errorf("the dead run's container (nspawn %d, systemd %d) is still up after 60s", nspawn, leader)
	}
	if !netnsExists(name + "-d1") {
		t.Logf("the dead run's network namespace is already gone (another cluster's start swept it)")
	}

	c := New(t, Options{Base: base})
	if netnsExists(name+"-d1") || netnsExists(name+"-br") {
		t.Error("the dead run's network namespaces survived the sweep")
	}
	for _, h := range c.hier {
		if _, err := os.Stat(h.Dir("pk-e2e-" + name + "-d1")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the dead run's cgroup %s survived the sweep: %v", h.Dir("pk-e2e-"+name+"-d1"), err)
		}
	}
	if _, err := os.Stat(filepath.Join(recordsDir(), name+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dead run's record survived: %v", err)
	}
	if err := c.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if after, held := hostSysctlsNow(t); !held && fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("host sysctls %v, want the originals %v", after, before)
	}
}
