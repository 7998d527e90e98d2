package testutil

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Containerd starts Debian's containerd with its own root, state and socket
// in a temp dir (CRI off: only the content store and images are needed) and
// stops it when the test ends.
func Containerd(t testing.TB) (address string) {
	t.Helper()
	bin, err := exec.LookPath("containerd")
	if err != nil || os.Getuid() != 0 {
		SkipUnlessCI(t, fmt.Sprintf("needs root and Debian's containerd (apt-get install containerd): containerd %q (%v), uid %d", bin, err, os.Getuid()))
	}
	if _, err := exec.LookPath("ctr"); err != nil {
		t.Fatalf("containerd without ctr: %v", err)
	}
	dir, err := os.MkdirTemp("", "ctrd-") // short: a unix socket path has a 108-byte limit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	address = filepath.Join(dir, "c.sock")
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), address, address+".ttrpc", filepath.Join(dir, "opt"))
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
		err := exec.CommandContext(vctx, "ctr", "--address", address, "version").Run()
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
