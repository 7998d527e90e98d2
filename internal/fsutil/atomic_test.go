package fsutil

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestWriteFileAtomicModeAndContent(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	p := filepath.Join(t.TempDir(), "status.yaml")
	if err := WriteFileAtomic(p, []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("bb"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v %v (umask must not narrow it)", st, err)
	}
	if b, _ := os.ReadFile(p); string(b) != "bb" {
		t.Fatalf("content %q", b)
	}
	if _, err := os.Lstat(p + ".part"); !os.IsNotExist(err) {
		t.Fatal(".part left behind")
	}
}

func TestWriteFileAtomicDoesNotFollowAPlantedPart(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "f")
	if err := os.Symlink(victim, p+".part"); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("wrote through the planted symlink: %q", b)
	}
}

func TestWriteFileAtomicFailureLeavesTheOldFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := WriteFileAtomic(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The target became a directory: rename fails, the .part must go.
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("new"), 0o600); err == nil {
		t.Fatal("rename over a non-empty directory succeeded")
	}
	if _, err := os.Lstat(p + ".part"); !os.IsNotExist(err) {
		t.Fatal(".part left behind after a failure")
	}
}

func TestReadFileNoFollow(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.WriteFile(real, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFileNoFollow(link, 100); err == nil {
		t.Fatal("followed a symlink")
	}
	if _, err := ReadFileNoFollow(real, 4); err == nil {
		t.Fatal("read past the limit")
	}
	if b, err := ReadFileNoFollow(real, 5); err != nil || string(b) != "12345" {
		t.Fatalf("%q %v", b, err)
	}
	if _, err := ReadFileNoFollow(dir, 100); err == nil {
		t.Fatal("read a directory")
	}
}

func TestMkdirAllModeRefusesASymlink(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink(t.TempDir(), filepath.Join(dir, "d")); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAllMode(filepath.Join(dir, "d"), 0o700); err == nil {
		t.Fatal("accepted a symlink as the directory")
	}
	if err := MkdirAllMode(filepath.Join(dir, "e"), 0o700); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "e")); st.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v", st.Mode())
	}
}
