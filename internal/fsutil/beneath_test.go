package fsutil

import (
	"errors"
	"os"
	"path/filepath"
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
