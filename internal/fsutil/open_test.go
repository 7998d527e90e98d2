package fsutil_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// Every special file where a regular file is read, appended to or locked
// is refused at once, naming the path and what is there.
func TestSpecialFilesAreRefusedWithoutBlocking(t *testing.T) {
	for _, kind := range testutil.SpecialKinds {
		t.Run(kind, func(t *testing.T) {
			if kind == testutil.CharDev {
				testutil.RequireRoot(t)
			}
			dir := t.TempDir()
			p := filepath.Join(dir, "status.yaml")
			testutil.Plant(t, p, kind)
			ops := map[string]func() error{
				"read": func() error { _, err := fsutil.ReadFileNoFollow(p, 1<<20); return err },
				"append": func() error {
					f, err := fsutil.OpenAppend(p, 0o640)
					if err == nil {
						f.Close()
					}
					return err
				},
				"lock": func() error {
					f, err := fsutil.OpenOwned(p, syscall.O_RDWR, 0o600)
					if err == nil {
						f.Close()
					}
					return err
				},
			}
			for name, op := range ops {
				var err error
				took := testutil.Within(t, 5*time.Second, name+" of a "+kind, func() { err = op() }, func() { testutil.Unblock(p) })
				if !errors.Is(err, fsutil.ErrNotRegular) || !strings.Contains(err.Error(), p) {
					t.Fatalf("%s of a %s: %v (want ErrNotRegular naming %s)", name, kind, err, p)
				}
				t.Logf("%s of a %s: %v (%s)", name, kind, err, took)
			}
			if kind != testutil.Directory {
				// The special file itself is left as it was.
				var st syscall.Stat_t
				if err := syscall.Lstat(p, &st); err != nil || st.Mode&syscall.S_IFMT == syscall.S_IFREG {
					t.Fatalf("%s replaced: %v", kind, err)
				}
			}
		})
	}
}

func TestOpenAppendRefusesAHardLinkReplacesAForeignOwner(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	victim := filepath.Join(dir, "passwd")
	if err := os.WriteFile(victim, []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "reconcile.log")
	if err := os.Link(victim, log); err != nil {
		t.Fatal(err)
	}
	if _, err := fsutil.OpenAppend(log, 0o640); !errors.Is(err, fsutil.ErrHardLink) {
		t.Fatalf("hard link: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "root:x:0:0::/root:/bin/sh\n" {
		t.Fatalf("linked file changed: %q", b)
	}
	if st, _ := os.Stat(victim); st.Mode().Perm() != 0o644 {
		t.Fatalf("linked file's mode changed: %v", st.Mode())
	}

	foreign := filepath.Join(dir, "foreign.log")
	if err := os.WriteFile(foreign, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(foreign, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	var before syscall.Stat_t
	if err := syscall.Stat(foreign, &before); err != nil {
		t.Fatal(err)
	}
	f, err := fsutil.OpenAppend(foreign, 0o640)
	if err != nil {
		t.Fatalf("foreign owner: %v", err)
	}
	f.Close()
	var after syscall.Stat_t
	if err := syscall.Stat(foreign, &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino == before.Ino || int(after.Uid) != os.Geteuid() || after.Mode&0o7777 != 0o640 {
		t.Fatalf("another user's file reused: inode %d -> %d, uid %d, mode %o", before.Ino, after.Ino, after.Uid, after.Mode&0o7777)
	}
}

// TestOpenAppendReplacesALooseFile: a descriptor opened while the log was
// 0666 keeps its write access through any chmod; the log is replaced (a
// new inode, 0640), so what is written through the old descriptor never
// reaches the file the provider appends to.
func TestOpenAppendReplacesALooseFile(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "reconcile.log")
	if err := os.WriteFile(log, []byte("old\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(log, 0o666); err != nil {
		t.Fatal(err)
	}
	var before syscall.Stat_t
	if err := syscall.Stat(log, &before); err != nil {
		t.Fatal(err)
	}
	held, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	f, err := fsutil.OpenAppend(log, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := held.WriteString("forged\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("new\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var after syscall.Stat_t
	if err := syscall.Stat(log, &after); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(log); after.Ino == before.Ino || after.Mode&0o7777 != 0o640 || string(b) != "new\n" {
		t.Fatalf("inode %d -> %d, mode %o, content %q", before.Ino, after.Ino, after.Mode&0o7777, b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("left beside it: %v", ents)
	}
	// A narrower mode is widened in place to exactly the mode: nobody else
	// could write it.
	narrow := filepath.Join(dir, "narrow.log")
	if err := os.WriteFile(narrow, []byte("kept\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if f, err = fsutil.OpenAppend(narrow, 0o640); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if st, _ := os.Stat(narrow); st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", st.Mode())
	}
	if b, _ := os.ReadFile(narrow); string(b) != "kept\n" {
		t.Fatalf("content %q", b)
	}
	// Created fresh: exactly the mode whatever the umask.
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	fresh := filepath.Join(dir, "fresh.log")
	f, err = fsutil.OpenAppend(fresh, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if st, _ := os.Stat(fresh); st.Mode().Perm() != 0o640 {
		t.Fatalf("fresh mode %v", st.Mode())
	}
}

func TestEnsureDirNeverReusesAnUntrustedPrivateDir(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range []struct {
		name string
		uid  int
		mode os.FileMode
	}{
		{"owned by another user", 65534, 0o700},
		{"group-writable", 0, 0o770},
		{"world-writable", 0, 0o777},
	} {
		t.Run(c.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "tmp")
			if err := os.Mkdir(dir, c.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, c.mode); err != nil {
				t.Fatal(err)
			}
			planted := filepath.Join(dir, "join-config.yaml")
			if err := os.WriteFile(planted, []byte("planted"), 0o666); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, c.uid, c.uid); err != nil {
				t.Fatal(err)
			}
			aside, err := fsutil.EnsureDir(dir, 0o700)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(aside, dir+".untrusted-") {
				t.Fatalf("moved aside to %q", aside)
			}
			var st syscall.Stat_t
			if err := syscall.Lstat(dir, &st); err != nil || st.Uid != 0 || st.Mode&0o7777 != 0o700 || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
				t.Fatalf("new dir: %+v %v", st, err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Fatalf("the planted content was kept: %v", ents)
			}
			if _, err := os.Stat(filepath.Join(aside, "join-config.yaml")); err != nil {
				t.Fatalf("the untrusted directory is not kept aside: %v", err)
			}
			if st, _ := os.Stat(aside); st.Mode().Perm() != 0o700 {
				t.Fatalf("the directory moved aside is %v: close it", st.Mode())
			}
		})
	}
}

func TestEnsureDirSharedAndTrusted(t *testing.T) {
	testutil.RequireRoot(t)
	parent := t.TempDir()
	// A root-owned private dir with a looser read mode: tightened, kept.
	keep := filepath.Join(parent, "keep")
	if err := os.Mkdir(keep, 0o755); err != nil {
		t.Fatal(err)
	}
	if aside, err := fsutil.EnsureDir(keep, 0o700); err != nil || aside != "" {
		t.Fatalf("%q %v", aside, err)
	}
	if st, _ := os.Stat(keep); st.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v", st.Mode())
	}
	// A shared dir with a loose mode: tightened.
	shared := filepath.Join(parent, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := fsutil.EnsureDir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(shared); st.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", st.Mode())
	}
	// A shared dir owned by someone else: refused, untouched.
	if err := os.Chown(shared, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := fsutil.EnsureDir(shared, 0o755); !errors.Is(err, fsutil.ErrForeignOwner) {
		t.Fatalf("foreign shared dir: %v", err)
	}
	// A symlink or a FIFO in place of the directory: refused.
	link := filepath.Join(parent, "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	if _, err := fsutil.EnsureDir(link, 0o700); !errors.Is(err, fsutil.ErrSymlink) {
		t.Fatalf("symlink: %v", err)
	}
	fifo := filepath.Join(parent, "fifo")
	testutil.Plant(t, fifo, testutil.FIFO)
	if _, err := fsutil.EnsureDir(fifo, 0o700); !errors.Is(err, fsutil.ErrNotRegular) || !strings.Contains(err.Error(), "a FIFO") {
		t.Fatalf("fifo: %v", err)
	}
}

func TestReadDirRefusesWhatIsNotADirectory(t *testing.T) {
	dir := t.TempDir()
	for _, kind := range []string{testutil.FIFO, testutil.Socket} {
		p := filepath.Join(dir, kind)
		testutil.Plant(t, p, kind)
		var err error
		testutil.Within(t, 5*time.Second, "ReadDir of a "+kind, func() { _, err = fsutil.ReadDir(p) }, func() { testutil.Unblock(p) })
		if !errors.Is(err, fsutil.ErrNotRegular) || !strings.Contains(err.Error(), p+" is a") {
			t.Fatalf("%s: %v", kind, err)
		}
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := fsutil.ReadDir(filepath.Join(dir, "link")); !errors.Is(err, fsutil.ErrSymlink) {
		t.Fatalf("symlink: %v", err)
	}
	ents, err := fsutil.ReadDir(dir)
	if err != nil || len(ents) != 3 || ents[0].Name() != "fifo" || ents[1].Name() != "link" {
		t.Fatalf("%v %v", ents, err)
	}
}
