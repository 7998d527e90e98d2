package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestOpenDirNoFollow(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	elsewhere := t.TempDir()
	if err := os.WriteFile(filepath.Join(elsewhere, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(root, "etc/systemd/system/kubelet.service.d")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(elsewhere, "f"), filepath.Join(root, "etc/systemd/system/link")); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDirNoFollow(root, "/etc/systemd/system")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := OpenDirNoFollow(root, "/etc/systemd/system/kubelet.service.d"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("symlinked dir: %v", err)
	}
	if _, err := OpenAtNoFollow(d, "link"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("symlinked file: %v", err)
	}
	if _, err := OpenDirNoFollow(root, "/etc/../etc"); err == nil {
		t.Fatal(".. accepted")
	}
	if _, err := OpenDirNoFollow(root, "/etc/missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
}

// The replacement gets the group asked for (a file replaced keeps who may
// read it) and exactly the mode, whatever the umask.
func TestWriteFileAtomicAtGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("gives a file another group: needs root")
	}
	root := t.TempDir()
	dir, err := OpenDirNoFollow(root, "/")
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	for _, c := range []struct {
		gid, want int
		mode      os.FileMode
	}{{4, 4, 0o640}, {-1, os.Getegid(), 0o604}} {
		if err := WriteFileAtomicAtGroup(dir, "f", []byte("x"), c.mode, c.gid); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(filepath.Join(root, "f"))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Gid) != c.want || fi.Mode() != c.mode {
			t.Fatalf("gid %d: written %v gid %d", c.gid, fi.Mode(), st.Gid)
		}
	}
}

// A scratch file for a command lands 0600 in a 0700 directory made beneath
// the root and goes with remove; a symlink planted for its directory is
// not followed.
func TestWriteScratchBeneath(t *testing.T) {
	root := t.TempDir()
	remove, err := WriteScratchBeneath(root, "/run/pk/tmp/a.yaml", []byte("x: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(root, "run/pk/tmp/a.yaml")
	st, err := os.Lstat(full)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("%v %v", st, err)
	}
	if d, err := os.Lstat(filepath.Dir(full)); err != nil || d.Mode().Perm() != 0o700 {
		t.Fatalf("directory %v %v", d, err)
	}
	remove()
	if _, err := os.Lstat(full); !os.IsNotExist(err) {
		t.Fatalf("not removed: %v", err)
	}

	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(root, "run/pk/link")); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteScratchBeneath(root, "/run/pk/link/b.yaml", []byte("x: 1\n")); !errors.Is(err, ErrSymlink) {
		t.Fatalf("through a symlinked directory: %v", err)
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
		t.Fatalf("%d files written through the link", len(ents))
	}
}
