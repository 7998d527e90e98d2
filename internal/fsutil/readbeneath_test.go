package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReadFileBeneath(t *testing.T) {
	root := t.TempDir()
	other := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "a", "b"), 0o755))
	must(os.WriteFile(filepath.Join(root, "a", "b", "f"), []byte("hello"), 0o644))
	must(os.WriteFile(filepath.Join(other, "f"), []byte("elsewhere"), 0o644))
	must(os.Symlink(other, filepath.Join(root, "a", "dirlink")))
	must(os.Symlink(filepath.Join(other, "f"), filepath.Join(root, "a", "b", "filelink")))
	must(unix.Mkfifo(filepath.Join(root, "a", "b", "fifo"), 0o644))

	if b, err := ReadFileBeneath(root, "/a/b/f", 5); err != nil || string(b) != "hello" {
		t.Errorf("a regular file: %q, %v", b, err)
	}
	for _, c := range []struct {
		rel  string
		want error
	}{
		{"/a/dirlink/f", ErrSymlink},
		{"/a/b/filelink", ErrSymlink},
		{"/a/b/fifo", ErrNotRegular},
		{"/a/b", ErrNotRegular},
	} {
		if b, err := ReadFileBeneath(root, c.rel, 64); !errors.Is(err, c.want) {
			t.Errorf("%s: %q, %v; want %v", c.rel, b, err, c.want)
		}
	}
	if _, err := ReadFileBeneath(root, "/a/b/f", 4); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the limit: %v", err)
	}
	if _, err := ReadFileBeneath(root, "/a/../a/b/f", 64); err == nil {
		t.Error("a path with .. was read")
	}
}
