package etcdsnap

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/cryptgate"
)

// verifyFile checks a snapshot etcdctl saved before it may count: a regular
// file (not through a symlink) on the device the gate confirmed, a sha256
// trailer matching its content (what etcdutl restore checks), and etcdutl's
// snapshot status: bbolt's integrity check, the hash, revision and key
// count, in that order. etcdutl's Status cannot be cancelled: on ctx's end
// verifyFile returns and that read finishes alone.
func verifyFile(ctx context.Context, fs cryptgate.FS, path string, dev cryptgate.Dev) (snapshot.Status, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return snapshot.Status{}, fmt.Errorf("open: %w", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return snapshot.Status{}, err
	}
	if !fi.Mode().IsRegular() {
		return snapshot.Status{}, errors.New("not a regular file")
	}
	st, err := fs.Stat(path)
	if err != nil {
		return snapshot.Status{}, fmt.Errorf("stat: %w", err)
	}
	if st.Dev != dev {
		return snapshot.Status{}, fmt.Errorf("written to device %s, not the confirmed %s", st.Dev, dev)
	}
	size := fi.Size()
	if size%512 != sha256.Size {
		return snapshot.Status{}, fmt.Errorf("no sha256 trailer (%d bytes)", size)
	}

	// The trailer first: bbolt trusts the file it opens and can panic on a
	// damaged one in a goroutine of its own, where no recover reaches.
	if err := checkTrailer(ctx, f, size); err != nil {
		return snapshot.Status{}, err
	}
	type statusResult struct {
		st  snapshot.Status
		err error
	}
	sc := make(chan statusResult, 1)
	go func() {
		s, err := snapshot.NewV3(zap.NewNop()).Status(path)
		sc <- statusResult{s, err}
	}()
	select {
	case r := <-sc:
		if r.err != nil {
			return snapshot.Status{}, fmt.Errorf("etcdutl snapshot status: %w", r.err)
		}
		if r.st.Revision < 0 || r.st.TotalKey < 0 || r.st.Revision == 0 && r.st.TotalKey != 0 {
			return snapshot.Status{}, fmt.Errorf("etcdutl snapshot status: revision %d with %d keys", r.st.Revision, r.st.TotalKey)
		}
		return r.st, nil
	case <-ctx.Done():
		return snapshot.Status{}, fmt.Errorf("etcdutl snapshot status: %w", ctx.Err())
	}
}

// checkTrailer compares the sha256 of everything before the last 32 bytes
// with those bytes, reading in bounded chunks and stopping at ctx's end.
func checkTrailer(ctx context.Context, f *os.File, size int64) error {
	h := sha256.New()
	buf := make([]byte, 1<<20)
	r := io.NewSectionReader(f, 0, size-sha256.Size)
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("sha256: %w", err)
		}
		n, err := r.Read(buf)
		h.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("sha256: read: %w", err)
		}
	}
	want := make([]byte, sha256.Size)
	if _, err := f.ReadAt(want, size-sha256.Size); err != nil {
		return fmt.Errorf("sha256: read trailer: %w", err)
	}
	if got := h.Sum(nil); string(got) != string(want) {
		return errors.New("sha256 trailer does not match the content")
	}
	return nil
}
