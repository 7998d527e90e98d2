package fsutil_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// A record counts only when every directory from the root down to it is
// root's own and writable by nobody else: a root-owned file in a directory
// uid 1000 owns, or that is 0777 (at any level, sticky or not), could have
// been put there by someone else and is refused, naming that directory.
func TestReadFileTrustedChecksEveryDirectoryAboveTheRecord(t *testing.T) {
	testutil.RequireRoot(t)
	const rec = "/usr/local/provider-kubernetes/verified-version"
	for _, tc := range []struct {
		name string
		dir  string // host path of the directory made untrusted ("" none)
		mod  func(string) error
	}{
		{"trusted", "", nil},
		{"parent-chowned-1000", "/usr/local/provider-kubernetes", func(p string) error { return os.Chown(p, 1000, 1000) }},
		{"parent-0777", "/usr/local/provider-kubernetes", func(p string) error { return os.Chmod(p, 0o777) }},
		{"grandparent-chowned-1000", "/usr/local", func(p string) error { return os.Chown(p, 1000, 1000) }},
		{"top-1777", "/usr", func(p string) error { return os.Chmod(p, 0o1777) }},
		{"root-0777", "/", func(p string) error { return os.Chmod(p, 0o777) }},
		{"group-writable", "/usr/local", func(p string) error { return os.Chmod(p, 0o775) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := testutil.NewNode(t, "n1")
			n.Write(rec, "v1.37.2\n", 0o644)
			if tc.mod != nil {
				if err := tc.mod(n.Path(tc.dir)); err != nil {
					t.Fatal(err)
				}
			}
			b, err := fsutil.ReadFileTrusted(n.Root, rec, 4<<10)
			if tc.mod == nil {
				if err != nil || string(b) != "v1.37.2\n" {
					t.Fatalf("a trusted record: %q, %v", b, err)
				}
				return
			}
			if !errors.Is(err, fsutil.ErrUntrusted) || !strings.Contains(err.Error(), filepath.Clean(n.Path(tc.dir))) {
				t.Fatalf("a record below an untrusted %s: %q, %v; want ErrUntrusted naming the directory", tc.dir, b, err)
			}
			// A record missing below an untrusted directory is refused too, not "no record".
			if err := os.Remove(n.Path(rec)); err != nil {
				t.Fatal(err)
			}
			if _, err := fsutil.ReadFileTrusted(n.Root, rec, 4<<10); !errors.Is(err, fsutil.ErrUntrusted) {
				t.Fatalf("a missing record below an untrusted %s: %v; want ErrUntrusted", tc.dir, err)
			}
		})
	}
}

// The walk follows no symlink below the root, not even a root-owned one
// in a trusted directory, and refuses the file itself when it is not root's own.
func TestReadFileTrustedRefusesLinksAndForeignFiles(t *testing.T) {
	testutil.RequireRoot(t)
	n := testutil.NewNode(t, "n1")
	n.Write("/elsewhere/provider-kubernetes/verified-version", "v1.37.2\n", 0o644)
	if err := os.MkdirAll(n.Path("/usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(n.Path("/elsewhere"), n.Path("/usr/local")); err != nil {
		t.Fatal(err)
	}
	if _, err := fsutil.ReadFileTrusted(n.Root, "/usr/local/provider-kubernetes/verified-version", 4<<10); !errors.Is(err, fsutil.ErrSymlink) {
		t.Fatalf("through a symlinked directory: %v; want ErrSymlink", err)
	}
	n.Write("/run/provider-kubernetes/cluster.yaml", "x", 0o600)
	if err := os.Chown(n.Path("/run/provider-kubernetes/cluster.yaml"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := fsutil.ReadFileTrusted(n.Root, "/run/provider-kubernetes/cluster.yaml", 4<<10); !errors.Is(err, fsutil.ErrUntrusted) {
		t.Fatalf("a file of uid 1000: %v; want ErrUntrusted", err)
	}
	if _, err := fsutil.ReadFileTrusted(n.Root, "/run/../etc/passwd", 4<<10); err == nil {
		t.Fatal("a path with .. was read")
	}
	if _, err := fsutil.ReadFileTrusted(n.Root, "/run/provider-kubernetes/none", 4<<10); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing record: %v; want ErrNotExist", err)
	}
}

// ReadFileTrustedBy trusts a directory its group may write only when the
// group is one of those given (AdminGroups'), never a file its group may
// write, never world write.
func TestReadFileTrustedByAdminGroup(t *testing.T) {
	testutil.RequireRoot(t) // files of another group
	root := t.TempDir()
	dir := filepath.Join(root, "oem")
	if err := os.Mkdir(dir, 0o770); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "90_custom.yaml")
	if err := os.WriteFile(f, []byte("x"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, f} {
		if err := os.Chown(p, 0, 900); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name          string
		dirMode, mode os.FileMode
		groups        []uint32
		ok            bool
	}{
		{"the admin group's directory", 0o770, 0o640, []uint32{900}, true},
		{"no group given", 0o770, 0o640, nil, false},
		{"another group given", 0o770, 0o640, []uint32{27}, false},
		{"world write too", 0o777, 0o640, []uint32{900}, false},
		{"the file writable by the group", 0o770, 0o660, []uint32{900}, false},
	} {
		if err := os.Chmod(dir, c.dirMode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, c.mode); err != nil {
			t.Fatal(err)
		}
		b, err := fsutil.ReadFileTrustedBy(root, "/oem/90_custom.yaml", 10, c.groups)
		if c.ok && (err != nil || string(b) != "x") || !c.ok && !errors.Is(err, fsutil.ErrUntrusted) {
			t.Errorf("%s: %q %v", c.name, b, err)
		}
	}
}
