package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// buildProvider builds this command into the test's temp dir.
func buildProvider(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "provider-kubernetes")
	cmd := testutil.Command(t, 10*time.Minute, filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", out, ".")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// alive reports whether pid is a process that has not exited (a zombie
// waiting for its reaper has exited).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) STATE ...: comm may hold spaces, the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func readPID(t *testing.T, p string) int {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// healthyKubelet answers the kubelet's /healthz on its fixed loopback
// port, when the port is free, so the pass goes straight to kubeadm
// upgrade node; otherwise the repair's 30 s grace for a starting kubelet
// passes first (and kubeadm runs as kubelet-start).
func healthyKubelet(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:10248")
	if err != nil {
		t.Logf("127.0.0.1:10248 is taken (%v): the kubelet repair runs first", err)
		return
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// workerDueForUpgradeNode is a sandbox worker at v1.36.3, in a cluster at
// v1.37.2, with the 1.37.2 image booted and pinned: its pass runs kubeadm
// upgrade node first.
func workerDueForUpgradeNode(t *testing.T) *testutil.Node {
	t.Helper()
	return sandboxWorker(t, "v1.36.3")
}

// sandboxWorker is a sandbox worker of a v1.37.2 cluster, pinned at
// v1.37.2 and booted on the v1.37.2 image, last converged at nodeV.
func sandboxWorker(t *testing.T, nodeV string) *testutil.Node {
	t.Helper()
	n := testutil.NewNode(t, "n1")
	n.ClusterFile("worker", "v1.37.2", "")
	n.Bundle("v1.37.2")
	api := testutil.NewAPI(t, "v1.37.2")
	n.Member(api)
	api.SetNode("n1", nodeV, true)
	if err := status.Write(n.R(), status.Document{Phase: status.PhaseConverged, Member: true, NodeVersion: nodeV}); err != nil {
		t.Fatal(err)
	}
	healthyKubelet(t)
	return n
}

// TestSignalEndsAPassPromptly runs the real binary's reconcile pass on a
// sandbox worker that is due for an upgrade. The first command the pass
// runs is kubeadm (upgrade node), a stand-in script that starts a
// grandchild and sleeps. SIGTERM (then SIGINT) while it runs
// must end the pass within seconds: the context cancelled, the script and
// its grandchild killed with their process group, the node's lock free,
// the status saying the pass was interrupted.
func TestSignalEndsAPassPromptly(t *testing.T) {
	bin := buildProvider(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			n := workerDueForUpgradeNode(t)
			pids := t.TempDir()
			n.Write(paths.Kubeadm, fmt.Sprintf("#!/bin/sh\necho $$ > %[1]s/child.part && mv %[1]s/child.part %[1]s/child\nsleep 600 &\necho $! > %[1]s/grandchild.part && mv %[1]s/grandchild.part %[1]s/grandchild\nwait\n", pids), 0o755)

			cmd := exec.Command(bin, "reconcile", "--root", n.Root)
			var stderr testutil.SyncBuffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				for _, f := range []string{"child", "grandchild"} {
					if pid := readPID(t, filepath.Join(pids, f)); pid > 0 {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			})

			// Wait, bounded, until kubeadm and its grandchild run.
			deadline := time.Now().Add(60 * time.Second)
			var child, grandchild int
			for child == 0 || grandchild == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("kubeadm never ran:\n%s", stderr.String())
				}
				select {
				case err := <-done:
					t.Fatalf("the pass ended before kubeadm ran: %v\n%s", err, stderr.String())
				case <-time.After(20 * time.Millisecond):
				}
				child, grandchild = readPID(t, filepath.Join(pids, "child")), readPID(t, filepath.Join(pids, "grandchild"))
			}
			if !alive(child) || !alive(grandchild) {
				t.Fatal("kubeadm's processes are not running")
			}

			start := time.Now()
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: the pass still runs after 30 s:\n%s", sig, stderr.String())
			}
			took := time.Since(start)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit %v, want status 1:\n%s", err, stderr.String())
			}
			t.Logf("%s: the pass ended in %s", sig, took)

			// kubeadm and its grandchild were killed with their process group.
			for what, pid := range map[string]int{"kubeadm": child, "kubeadm's grandchild": grandchild} {
				gone := false
				for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
					if !alive(pid) {
						gone = true
						break
					}
				}
				if !gone {
					t.Fatalf("%s (pid %d) outlived the pass", what, pid)
				}
			}

			// The lock is free: another pass could take it now.
			fd, err := unix.Open(n.Path(paths.LockFile), unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
				t.Fatalf("the lock is still held: %v", err)
			}
			unix.Close(fd)

			// The status says the pass was interrupted, and by what.
			d, err := status.Read(n.R(), paths.StatusFile)
			if err != nil {
				t.Fatal(err)
			}
			if d.Phase != status.PhaseFailed || d.Reason != "Interrupted" || !strings.Contains(d.Message, "interrupted ("+sig.String()+" signal received) during upgrade-node") {
				t.Fatalf("status %+v", d)
			}
			if !strings.Contains(n.Read(paths.ReconcileLog), "msg=reconcile-done outcome=failed reason=Interrupted") {
				t.Fatalf("log:\n%s", n.Read(paths.ReconcileLog))
			}
		})
	}
}
