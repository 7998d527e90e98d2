package kubeadmbackup

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// TestRemoveNeverEmptiesAMountPoint: a directory bind-mounted at a
// backup's name, or inside one, is refused as a mount point and nothing
// under it is removed. The test re-runs itself in a private mount
// namespace.
func TestRemoveNeverEmptiesAMountPoint(t *testing.T) {
	if os.Getenv("KUBEADMBACKUP_IN_MOUNTNS") == "" {
		testutil.RequireRoot(t)
		cmd := testutil.Command(t, 2*time.Minute, os.Args[0], "-test.run=^TestRemoveNeverEmptiesAMountPoint$", "-test.v", "-test.count=1", "-test.short")
		cmd.Env = append(os.Environ(), "KUBEADMBACKUP_IN_MOUNTNS=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestRemoveNeverEmptiesAMountPoint") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make the mounts private: %v", err)
	}
	for _, inside := range []string{"", "member/snap"} {
		root := t.TempDir()
		name := Prefix + "2026-12-01-05-21-10"
		at := filepath.Join(root, paths.KubeadmTmpDir, name, inside)
		if err := os.MkdirAll(at, 0o700); err != nil {
			t.Fatal(err)
		}
		precious := t.TempDir()
		if err := os.WriteFile(filepath.Join(precious, "precious"), []byte("someone's data"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(precious, at, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind mount: %v", err)
		}
		t.Cleanup(func() { _ = unix.Unmount(at, unix.MNT_DETACH) })
		err := Remove(paths.Root(root), Backup{Name: name})
		if _, serr := os.Stat(filepath.Join(precious, "precious")); serr != nil {
			t.Fatalf("mount at %q: emptied (%v): %v", inside, err, serr)
		}
		if !errors.Is(err, fsutil.ErrMountPoint) {
			t.Fatalf("mount at %q: %v", inside, err)
		}
	}
}
