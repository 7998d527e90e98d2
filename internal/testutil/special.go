package testutil

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Special file kinds a hostile host can plant where the provider expects a
// regular file.
const (
	FIFO      = "fifo"
	Socket    = "socket"
	CharDev   = "chardev" // a character device node (1:3, what /dev/null is)
	Directory = "directory"
)

// SpecialKinds are the kinds Plant makes.
var SpecialKinds = []string{FIFO, Socket, CharDev, Directory}

// Plant makes a real special file of kind at path (parents created 0755).
// A FIFO gets a cleanup that opens it for reading and writing, so an open
// that blocked on it (the bug a test looks for) returns and the test
// binary can end.
func Plant(t testing.TB, path, kind string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	switch kind {
	case FIFO:
		err = unix.Mkfifo(path, 0o666)
		t.Cleanup(func() { Unblock(path) })
	case Socket:
		// A socket inode, as bind(2) leaves one (mknod makes it without the
		// 108-byte limit of a socket address).
		err = unix.Mknod(path, unix.S_IFSOCK|0o666, 0)
	case CharDev:
		RequireRoot(t)
		err = unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	case Directory:
		err = os.Mkdir(path, 0o755)
	default:
		t.Fatalf("unknown kind %q", kind)
	}
	if err != nil {
		t.Fatalf("plant %s at %s: %v", kind, path, err)
	}
}

// Unblock releases whoever is blocked opening the FIFO at path: it opens it
// read-write (a reader and a writer at once) for a moment.
func Unblock(path string) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	time.Sleep(50 * time.Millisecond)
	unix.Close(fd)
}

// Within runs fn and fails the test when it has not returned within limit
// (a hang guard, generous so it cannot flake); unblock, if not nil, is
// called to release a hung fn before the test fails.
func Within(t testing.TB, limit time.Duration, what string, fn func(), unblock func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(limit):
		if unblock != nil {
			unblock()
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		t.Fatalf("%s: still blocked after %s", what, limit)
	}
	return 0
}

// ShortRoot moves the node's sandbox root to a short path. A t.TempDir()
// root is a run of 40-odd letters and slashes that the log sanitizer takes
// for base64 key material and redacts, so a path under it cannot be found
// in a log line or a status message; on a node the root is /.
func ShortRoot(t testing.TB, n *Node) {
	t.Helper()
	dir, err := os.MkdirTemp("", "n.*.d")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(n.Root, dir); err != nil {
		t.Fatal(err)
	}
	n.Root = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
}
