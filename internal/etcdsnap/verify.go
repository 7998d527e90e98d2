package etcdsnap

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/cryptgate"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
)

// dbStatus is what `etcdutl snapshot status -w json` prints (etcdutl's
// snapshot.Status). Pointers tell a missing field from a zero one.
type dbStatus struct {
	Hash      *uint32 `json:"hash"`
	Revision  *int64  `json:"revision"`
	TotalKey  *int    `json:"totalKey"`
	TotalSize *int64  `json:"totalSize"`
	Version   string  `json:"version"`
}

// snapshotStatus is a verified snapshot's identity.
type snapshotStatus struct {
	Hash     uint32
	Revision int64
	Keys     int
}

// statusArg is the file etcdutl is told to read: its own standard input,
// which is the descriptor verifyFile opened and checked, so the file
// etcdutl reads is exactly that one (no second lookup by path).
const statusArg = "/proc/self/fd/0"

// verifyFile checks a snapshot etcdctl saved before it may count, and a
// snapshot found in the directory before it is trusted (sealed: then it
// must also be root:root 0600 with a single link, as the step leaves
// them): a regular file (not through a symlink, opened without blocking)
// on the device the gate confirmed, a sha256
// trailer matching its content (what etcdutl restore checks), and the
// bundled etcdutl's snapshot status: bbolt's integrity check, the hash,
// revision and key count. etcdutl runs as a child through the runner, so
// the pages bbolt maps while it walks the database (the whole file) are
// that short-lived process's, not the provider's, and the runner bounds it.
// Both checks read the file through pread/mmap, never its offset, so they
// share the one descriptor.
//
// path is opened (a path through the held backup directory's handle, so
// the file is the one in the directory that was checked); statPath is the
// same file's host path, which the encryption gate's stat seam knows.
func verifyFile(ctx context.Context, run runner.Runner, fs cryptgate.FS, path, statPath string, dev cryptgate.Dev, sealed bool) (snapshotStatus, error) {
	f, err := fsutil.OpenRegular(path)
	if errors.Is(err, fsutil.ErrNotRegular) || errors.Is(err, fsutil.ErrSymlink) {
		var st unix.Stat_t
		if unix.Lstat(path, &st) == nil {
			return snapshotStatus{}, fmt.Errorf("%s, not a regular file", fsutil.Kind(st.Mode))
		}
	}
	if err != nil {
		return snapshotStatus{}, fmt.Errorf("open: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return snapshotStatus{}, err
	}
	if sealed {
		if err := checkSealed(f); err != nil {
			return snapshotStatus{}, err
		}
	}
	st, err := fs.Stat(statPath)
	if err != nil {
		return snapshotStatus{}, fmt.Errorf("stat: %w", err)
	}
	if st.Dev != dev {
		return snapshotStatus{}, fmt.Errorf("written to device %s, not the confirmed %s", st.Dev, dev)
	}
	size := fi.Size()
	if size%512 != sha256.Size {
		return snapshotStatus{}, fmt.Errorf("no sha256 trailer (%d bytes)", size)
	}

	// The trailer and etcdutl at once, one core each: etcdutl is a child
	// process, so a damaged file can at worst make it fail, and both must
	// pass. A wrong trailer is the error reported first.
	deadline, ok := ctx.Deadline()
	if !ok {
		return snapshotStatus{}, errors.New("etcdutl snapshot status: no deadline")
	}
	trailer := make(chan error, 1)
	go func() { trailer <- checkTrailer(ctx, f, size) }()
	out, err := run.Run(ctx, runner.Cmd{Path: paths.Etcdutl, Args: []string{"snapshot", "status", statusArg, "-w", "json"},
		Timeout: time.Until(deadline), Stdin: f})
	if terr := <-trailer; terr != nil {
		return snapshotStatus{}, terr
	}
	if err != nil {
		return snapshotStatus{}, err // names /usr/bin/etcdutl snapshot status and its last error line
	}
	return parseStatus(out.Stdout, size)
}

// checkSealed: root:root, 0600, one link.
func checkSealed(f *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if st.Uid != 0 || st.Gid != 0 {
		return fmt.Errorf("owned by %d:%d, not root:root", st.Uid, st.Gid)
	}
	if m := st.Mode & 0o7777; m != 0o600 {
		return fmt.Errorf("mode %04o, not 0600", m)
	}
	if st.Nlink != 1 {
		return fmt.Errorf("%d hard links", st.Nlink)
	}
	return nil
}

// parseStatus reads etcdutl's JSON and refuses anything that does not
// describe a database that fits the file.
func parseStatus(b []byte, fileSize int64) (snapshotStatus, error) {
	var ds dbStatus
	dec := json.NewDecoder(bytes.NewReader(bytes.TrimSpace(b)))
	if err := dec.Decode(&ds); err != nil {
		return snapshotStatus{}, fmt.Errorf("etcdutl snapshot status: unreadable output: %w", err)
	}
	if dec.More() {
		return snapshotStatus{}, errors.New("etcdutl snapshot status: more than one status in its output")
	}
	if ds.Hash == nil || ds.Revision == nil || ds.TotalKey == nil || ds.TotalSize == nil {
		return snapshotStatus{}, errors.New("etcdutl snapshot status: hash, revision, totalKey or totalSize missing")
	}
	rev, keys, total := *ds.Revision, *ds.TotalKey, *ds.TotalSize
	if rev < 0 || keys < 0 || rev == 0 && keys != 0 {
		return snapshotStatus{}, fmt.Errorf("etcdutl snapshot status: revision %d with %d keys", rev, keys)
	}
	if total <= 0 || total > fileSize {
		return snapshotStatus{}, fmt.Errorf("etcdutl snapshot status: database of %d bytes in a %d-byte file", total, fileSize)
	}
	return snapshotStatus{Hash: *ds.Hash, Revision: rev, Keys: keys}, nil
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
