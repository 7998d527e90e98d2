package restore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
)

// held is what gathering opened and the executor uses: the snapshot (the
// descriptor etcdutl reads) and the data dir (every rename is relative to
// it, so no path is looked up again).
type held struct {
	snap    *os.File
	dataDir *os.File
}

func (h *held) close() {
	for _, f := range []*os.File{h.snap, h.dataDir} {
		if f != nil {
			f.Close()
		}
	}
}

// gather reads every fact the decision needs and changes nothing.
func gather(ctx context.Context, o Options, r Request) (Facts, *held) {
	var f Facts
	h := &held{}
	root := o.Root

	for _, p := range []string{paths.EtcdManifest, paths.APIServerManifest} {
		if _, err := os.Lstat(root.Path(p)); err == nil || !errors.Is(err, os.ErrNotExist) {
			f.InPlace = append(f.InPlace, p)
		}
	}

	b, err := fsutil.ReadFileTrusted(string(root), r.Manifests+"/etcd.yaml", 1<<20)
	if err == nil {
		f.Member, err = ParseMember(b)
	}
	f.MemberErr = err
	if ents, err := fsutil.ReadDir(root.Path(r.Manifests)); err == nil {
		for _, e := range ents {
			if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".yaml") {
				f.PutBack = append(f.PutBack, e.Name())
			}
		}
	}
	if v, err := observe.ManifestImageVersion(root.Path(r.Manifests+"/kube-apiserver.yaml"), "kube-apiserver"); err == nil {
		f.Version = v
	}

	if f.MemberErr == nil {
		for _, l := range f.Member.Listen {
			switch err := probe(ctx, o, l.Addr); {
			case err == nil:
				f.Listening = append(f.Listening, l.Addr+" ("+l.Flag+")")
			case !errors.Is(err, syscall.ECONNREFUSED):
				f.Unknown = append(f.Unknown, fmt.Sprintf("%s (%s): %v", l.Addr, l.Flag, err))
			}
		}
		h.dataDir, f.HasMember, f.InUse, f.DataDirErr = openDataDir(root, f.Member.DataDir)
	}

	f.Etcdutl, f.EtcdutlErr = etcdutlVersion(ctx, o)
	h.snap, f.Snapshot, f.SnapshotErr = openSnapshot(ctx, o, r.Snapshot)
	return f, h
}

// probe dials addr: nil means something listens there, ECONNREFUSED that
// nothing does; anything else leaves it unknown.
func probe(ctx context.Context, o Options, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, o.dialTimeout())
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	c.Close()
	return nil
}

// openDataDir opens the data dir without following a symlink in any
// component, and looks at its member directory and whether a running
// etcd holds the database (bbolt takes a flock on it).
func openDataDir(root paths.Root, dataDir string) (dir *os.File, hasMember, inUse bool, err error) {
	dir, err = fsutil.OpenDirNoFollow(root.Path("/"), dataDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, false, false, fmt.Errorf("does not exist")
		}
		return nil, false, false, err
	}
	var st unix.Stat_t
	switch err := unix.Fstatat(int(dir.Fd()), "member", &st, unix.AT_SYMLINK_NOFOLLOW); {
	case errors.Is(err, unix.ENOENT):
		return dir, false, false, nil
	case err != nil:
		dir.Close()
		return nil, false, false, fmt.Errorf("stat member: %w", err)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		dir.Close()
		return nil, false, false, fmt.Errorf("%s/member is %s, not a directory", dataDir, fsutil.Kind(st.Mode))
	}
	inUse, err = dbLocked(dir)
	if err != nil {
		dir.Close()
		return nil, false, false, err
	}
	return dir, true, inUse, nil
}

// dbLocked tries a shared, non-blocking flock on member/snap/db: a running
// etcd holds an exclusive one.
func dbLocked(dataDir *os.File) (bool, error) {
	fd := int(dataDir.Fd())
	for i, c := range []string{"member", "snap", "db"} {
		flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
		if i < 2 {
			flags |= unix.O_DIRECTORY
		}
		next, err := unix.Openat(fd, c, flags, 0)
		if i > 0 {
			unix.Close(fd)
		}
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("open member/snap/db: %w", err)
		}
		fd = next
	}
	defer unix.Close(fd)
	err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("flock member/snap/db: %w", err)
	}
	_ = unix.Flock(fd, unix.LOCK_UN)
	return false, nil
}

// etcdutlVersion asks the bundled etcdutl itself ("etcdutl version: 3.6.8").
func etcdutlVersion(ctx context.Context, o Options) (string, error) {
	res, err := o.Runner.Run(ctx, runner.Cmd{Path: paths.Etcdutl, Args: []string{"version"}, Timeout: o.versionTimeout()})
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(res.Stdout))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "etcdutl version:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no %q line in its output", "etcdutl version:")
}

// openSnapshot opens the snapshot as the restore will read it and checks
// it: a regular file (no symlink, no FIFO), root's and closed to everyone
// else (it holds every Secret of the cluster), saved by etcdctl snapshot
// save (its sha256 trailer is there: etcdutl restore checks it), and the
// bundled etcdutl's snapshot status reads the database through it.
func openSnapshot(ctx context.Context, o Options, p string) (*os.File, Snapshot, error) {
	f, err := fsutil.OpenRegular(o.Root.Path(p))
	if err != nil {
		return nil, Snapshot{}, err
	}
	fail := func(err error) (*os.File, Snapshot, error) {
		f.Close()
		return nil, Snapshot{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fail(fmt.Errorf("fstat: %w", err))
	}
	if int(st.Uid) != os.Geteuid() {
		return fail(fmt.Errorf("owned by uid %d, not root: chown root:root it", st.Uid))
	}
	if m := st.Mode & 0o777; m&0o077 != 0 {
		return fail(fmt.Errorf("mode %04o: it holds every Secret of the cluster and others can read it: chmod 0600 it", m))
	}
	if st.Size <= sha256.Size || st.Size%512 != sha256.Size {
		return fail(fmt.Errorf("%d bytes, no sha256 trailer: not a file etcdctl snapshot save wrote (a copy of a data dir's db is not a snapshot)", st.Size))
	}
	res, err := o.Runner.Run(ctx, runner.Cmd{Path: paths.Etcdutl, Args: []string{"snapshot", "status", snapshotArg, "-w", "json"},
		Timeout: o.statusTimeout(), Stdin: f})
	if err != nil {
		return fail(err) // names etcdutl snapshot status and its last error line
	}
	s, err := parseStatus(res.Stdout, st.Size)
	if err != nil {
		return fail(err)
	}
	return f, s, nil
}

// parseStatus reads etcdutl snapshot status -w json.
func parseStatus(b []byte, fileSize int64) (Snapshot, error) {
	var ds struct {
		Hash      *uint32 `json:"hash"`
		Revision  *int64  `json:"revision"`
		TotalKey  *int    `json:"totalKey"`
		TotalSize *int64  `json:"totalSize"`
		Version   string  `json:"version"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(b), &ds); err != nil {
		return Snapshot{}, fmt.Errorf("etcdutl snapshot status: unreadable output: %w", err)
	}
	if ds.Hash == nil || ds.Revision == nil || ds.TotalKey == nil || ds.TotalSize == nil {
		return Snapshot{}, errors.New("etcdutl snapshot status: hash, revision, totalKey or totalSize missing")
	}
	if *ds.TotalSize <= 0 || *ds.TotalSize > fileSize || *ds.Revision < 0 || *ds.TotalKey < 0 {
		return Snapshot{}, fmt.Errorf("etcdutl snapshot status: revision %d, %d keys, a database of %d bytes in a %d-byte file", *ds.Revision, *ds.TotalKey, *ds.TotalSize, fileSize)
	}
	return Snapshot{Hash: *ds.Hash, Revision: *ds.Revision, Keys: *ds.TotalKey, Size: *ds.TotalSize, Version: ds.Version}, nil
}
