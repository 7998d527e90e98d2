package testutil

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/testbin"
)

// ContainerdBinaries returns the node's containerd binaries
// (testbin.ContainerdCommands at images.Containerd, the ones the tree
// ships), building them from the module when the cache lacks them; skipped
// in -short mode.
func ContainerdBinaries(t testing.TB) map[string]string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds containerd from its module: not in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bins, err := testbin.Containerd(ctx, io.Discard)
	if err != nil {
		t.Fatalf("containerd: %v", err)
	}
	return bins
}

// Ctr is the ctr of the node's containerd.
func Ctr(t testing.TB) string {
	t.Helper()
	return ContainerdBinaries(t)["ctr"]
}

// Containerd starts the node's containerd (ContainerdBinaries) with its
// own root, state and socket in a temp dir (CRI off: only the content store
// and images are needed) and stops it when the test ends.
func Containerd(t testing.TB) (address string) {
	t.Helper()
	return startContainerd(t, false)
}

// ContainerdCRI is Containerd with its CRI on (the kubelet's image service
// on the same socket): what pins an image against the kubelet's image
// garbage collection is the CRI's view of it.
func ContainerdCRI(t testing.TB) (address string) {
	t.Helper()
	return startContainerd(t, true)
}

func startContainerd(t testing.TB, cri bool) (address string) {
	t.Helper()
	if os.Getuid() != 0 {
		SkipUnlessCI(t, fmt.Sprintf("needs root to run containerd: uid %d", os.Getuid()))
	}
	bins := ContainerdBinaries(t)
	bin, ctr := bins["containerd"], bins["ctr"]
	dir, err := os.MkdirTemp("", "ctrd-") // short: a unix socket path has a 108-byte limit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	address = filepath.Join(dir, "c.sock")
	plugins := `disabled_plugins = ["io.containerd.grpc.v1.cri"]`
	if cri {
		plugins = fmt.Sprintf(`[plugins."io.containerd.cri.v1.runtime".cni]
  conf_dir = %q`, filepath.Join(dir, "cni"))
	}
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
%s
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), plugins, address, address+".ttrpc", filepath.Join(dir, "opt"))
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer
	cmd := exec.Command(bin, "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		// The snapshotter may leave mounts behind; unmount before the dir goes.
		uctx, ucancel := context.WithTimeout(context.Background(), 30*time.Second)
		exec.CommandContext(uctx, "umount", "-R", filepath.Join(dir, "root")).Run()
		ucancel()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		vctx, vcancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := exec.CommandContext(vctx, ctr, "--address", address, "version").Run()
		vcancel()
		if err == nil {
			return address
		}
		select {
		case <-done:
			t.Fatalf("containerd exited: %s", logBuf.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd not answering after 30s: %s", logBuf.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
