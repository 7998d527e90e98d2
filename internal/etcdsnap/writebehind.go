package etcdsnap

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
)

// Write-behind tuning: how often the growing file is looked at, and how
// much new data makes a write-back request worth it.
const (
	writeBehindEvery = 20 * time.Millisecond
	writeBehindChunk = 8 << 20
)

// syncFileRange is the kernel call (a variable so a test can see the
// requests).
var syncFileRange = unix.SyncFileRange

// writeBehind starts the write-back of the file etcdctl is writing while it
// writes it. etcdctl ends its save with an fsync of the whole snapshot: with
// the data still dirty (a 1 GiB snapshot stays under the kernel's
// background threshold on most nodes), that fsync writes all of it while
// nothing else happens. Asking the kernel to start writing each completed
// stretch as it lands (sync_file_range SYNC_FILE_RANGE_WRITE: asynchronous,
// no wait, no flush) lets the disk work while etcd streams, so the fsync
// finds little left. It changes no byte and no durability promise: the
// fsyncs (etcdctl's, then the seal's) still decide.
//
// The file is opened the way every host file is (fsutil.OpenRegular: no
// symlink followed, never blocking on a FIFO, a regular file only) and only
// read-only; anything else found at the name is left alone. Only whole MiB
// below the current end are requested, never the page etcdctl is filling.
// stop ends it and returns once the file is closed.
func writeBehind(path string) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		var f *os.File
		defer func() {
			if f != nil {
				f.Close()
			}
		}()
		var requested int64
		t := time.NewTicker(writeBehindEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if f == nil {
				var err error
				if f, err = fsutil.OpenRegular(path); err != nil {
					f = nil
					if errors.Is(err, os.ErrNotExist) {
						continue // etcdctl has not created it yet
					}
					return // not a regular file, or unreadable: nothing to help
				}
			}
			var st unix.Stat_t
			if unix.Fstat(int(f.Fd()), &st) != nil {
				return
			}
			end := st.Size &^ (1<<20 - 1)
			if end-requested < writeBehindChunk {
				continue
			}
			if syncFileRange(int(f.Fd()), requested, end-requested, unix.SYNC_FILE_RANGE_WRITE) != nil {
				return
			}
			requested = end
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
