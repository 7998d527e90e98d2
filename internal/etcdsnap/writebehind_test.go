package etcdsnap

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// syncReq is one write-back request writeBehind made.
type syncReq struct {
	path      string // what the descriptor named when the request was made
	off, n    int64
	flags     int
	sizeAtReq int64 // the file's size then
}

// recordSyncs records writeBehind's requests (still passing them to the
// kernel) for the rest of the test.
func recordSyncs(t *testing.T) func() []syncReq {
	var mu sync.Mutex
	var reqs []syncReq
	old := syncFileRange
	syncFileRange = func(fd int, off, n int64, flags int) error {
		p, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		var st unix.Stat_t
		_ = unix.Fstat(fd, &st)
		mu.Lock()
		reqs = append(reqs, syncReq{path: p, off: off, n: n, flags: flags, sizeAtReq: st.Size})
		mu.Unlock()
		return old(fd, off, n, flags)
	}
	t.Cleanup(func() { syncFileRange = old })
	return func() []syncReq {
		mu.Lock()
		defer mu.Unlock()
		return append([]syncReq(nil), reqs...)
	}
}

// stopWithin calls stop and fails the test if it has not returned within
// limit (a hung open would hold it forever).
func stopWithin(t *testing.T, stop func(), limit time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("writeBehind did not stop within %s: blocked", limit)
	}
}

// TestWriteBehindRequestsCompletedStretches: a file growing the way
// etcdctl writes one gets asynchronous write-back requests for contiguous
// whole MiB from its start, each for data already written, never the
// unfinished end; and the bytes are unchanged.
func TestWriteBehindRequestsCompletedStretches(t *testing.T) {
	reqs := recordSyncs(t)
	p := filepath.Join(t.TempDir(), "etcd-x.db.part.part")
	stop := writeBehind(p)
	time.Sleep(3 * writeBehindEvery) // it waits for the file to appear
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 3<<20+12345) // writes that end inside a MiB
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	for range 13 { // 39 MiB and then some
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
		time.Sleep(writeBehindEvery)
	}
	size := int64(13 * len(chunk))
	whole := size &^ (1<<20 - 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(writeBehindEvery) {
		if r := reqs(); len(r) > 0 && r[len(r)-1].off+r[len(r)-1].n >= whole-writeBehindChunk {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests %+v: not up to %d", reqs(), whole-writeBehindChunk)
		}
	}
	stopWithin(t, stop, 10*time.Second)
	var next int64
	for _, r := range reqs() {
		if r.path != p || r.flags != unix.SYNC_FILE_RANGE_WRITE {
			t.Fatalf("request %+v: want SYNC_FILE_RANGE_WRITE on %s only (asynchronous, no wait)", r, p)
		}
		if r.off != next || r.off%(1<<20) != 0 || r.n%(1<<20) != 0 || r.n < writeBehindChunk {
			t.Fatalf("request %+v after %d: want contiguous whole MiB from 0, at least %d at a time", r, next, writeBehindChunk)
		}
		if r.off+r.n > r.sizeAtReq {
			t.Fatalf("request %+v reaches past what was written", r)
		}
		next = r.off + r.n
	}
	if next > whole {
		t.Fatalf("requested up to %d: past the last whole MiB %d", next, whole)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != size {
		t.Fatalf("%d bytes", len(b))
	}
	for i := 0; i < len(b); i += len(chunk) {
		if !equalPrefix(b[i:], chunk) {
			t.Fatalf("bytes at %d changed", i)
		}
	}
}

func equalPrefix(b, chunk []byte) bool {
	n := min(len(b), len(chunk))
	return string(b[:n]) == string(chunk[:n])
}

// TestWriteBehindLeavesAnythingElseAlone: a FIFO, a symlink or a directory
// where etcdctl's file is expected is never followed, never blocks and
// gets no request.
func TestWriteBehindLeavesAnythingElseAlone(t *testing.T) {
	for _, kind := range []string{"fifo", "symlink", "directory"} {
		t.Run(kind, func(t *testing.T) {
			reqs := recordSyncs(t)
			dir := t.TempDir()
			p := filepath.Join(dir, "etcd-x.db.part.part")
			target := filepath.Join(dir, "elsewhere")
			if err := os.WriteFile(target, make([]byte, 32<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			var err error
			switch kind {
			case "fifo":
				err = syscall.Mkfifo(p, 0o600)
			case "symlink":
				err = os.Symlink(target, p)
			case "directory":
				err = os.Mkdir(p, 0o700)
			}
			if err != nil {
				t.Fatal(err)
			}
			stop := writeBehind(p)
			time.Sleep(10 * writeBehindEvery)
			stopWithin(t, stop, 10*time.Second)
			if r := reqs(); len(r) != 0 {
				t.Fatalf("requests %+v on a %s", r, kind)
			}
			for _, fd := range openFDs(t) {
				if strings.HasPrefix(fd, dir) {
					t.Fatalf("%s still open", fd)
				}
			}
		})
	}
}

// openFDs lists what this process's descriptors name.
func openFDs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			out = append(out, l)
		}
	}
	return out
}

// TestWriteBehindFollowsEtcdctl: with the real etcdctl saving a 64 MiB
// database, the write-back requests go to the file etcdctl is writing (its
// own temporary name, or the .part it renames that to), and the snapshot
// is taken and verified as ever; nothing stays open.
func TestWriteBehindFollowsEtcdctl(t *testing.T) {
	testutil.RequireRoot(t)
	reqs := recordSyncs(t)
	f := newFixture(t)
	f.etcd.PutKeys("/registry/big/", 16384, 4096)
	res := f.take(v1372)
	if res.Outcome != Taken || res.Keys != 16384 {
		t.Fatalf("%s %s keys %d", res.Outcome, res.Reason, res.Keys)
	}
	part := f.node.Path(res.Path) + ".part"
	r := reqs()
	if len(r) == 0 {
		t.Fatal("no write-back requested while etcdctl wrote 64 MiB")
	}
	for _, q := range r {
		if q.path != part+".part" && q.path != part {
			t.Fatalf("request on %s, want etcdctl's %s.part", q.path, part)
		}
	}
	t.Logf("%d requests, up to %d MiB", len(r), (r[len(r)-1].off+r[len(r)-1].n)>>20)
	for _, fd := range openFDs(t) {
		if strings.HasPrefix(fd, f.node.Path(paths.EtcdBackupDir)) {
			t.Fatalf("%s still open", fd)
		}
	}
}
