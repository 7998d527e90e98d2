package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The kubelet rotates its client certificate through a symlink in its own
// pki directory: that one link is followed, nothing else is.
func TestReadFileRotated(t *testing.T) {
	root := t.TempDir()
	pki := filepath.Join(root, "var/lib/kubelet/pki")
	if err := os.MkdirAll(pki, 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(root, "tmp")
	if err := os.MkdirAll(other, 0o777); err != nil {
		t.Fatal(err)
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(pki, "kubelet-client-2026-12-01.pem"), "cert")
	write(filepath.Join(other, "evil.pem"), "evil")
	link := func(name, target string) string {
		p := filepath.Join(pki, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return "/var/lib/kubelet/pki/" + name
	}
	ok := []string{
		link("current-abs.pem", "/var/lib/kubelet/pki/kubelet-client-2026-12-01.pem"),
		link("current-rel.pem", "kubelet-client-2026-12-01.pem"),
	}
	for _, p := range ok {
		if b, err := ReadFileRotated(root, p, 1<<10); err != nil || string(b) != "cert" {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
	if b, err := ReadFileRotated(root, "/var/lib/kubelet/pki/kubelet-client-2026-12-01.pem", 1<<10); err != nil || string(b) != "cert" {
		t.Errorf("a regular file: %q %v", b, err)
	}
	bad := []string{
		link("out-abs.pem", "/tmp/evil.pem"),
		link("out-rel.pem", "../../../../tmp/evil.pem"),
		link("dotdot.pem", "../pki/kubelet-client-2026-12-01.pem"),
		link("chain.pem", "current-rel.pem"),
		link("self.pem", "/var/lib/kubelet/pki/self.pem"),
	}
	for _, p := range bad {
		if b, err := ReadFileRotated(root, p, 1<<10); !errors.Is(err, ErrSymlink) {
			t.Errorf("%s: %q %v, want ErrSymlink", p, b, err)
		}
	}
	// A directory others can write: nobody's link is trusted.
	if err := os.Chmod(pki, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFileRotated(root, ok[0], 1<<10); !errors.Is(err, ErrSymlink) {
		t.Errorf("world-writable directory: %v", err)
	}
}
