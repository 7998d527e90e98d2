package kubeadmbackup

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

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
	if !testutil.InPrivateMountNamespace(t) {
		return
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
