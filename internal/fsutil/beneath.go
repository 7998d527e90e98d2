package fsutil

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrSymlink marks a path component that is a symlink where none is followed.
var ErrSymlink = errors.New("symlink not followed")

// OpenDirNoFollow opens the directory rel (a slash-separated host path such
// as "/etc/systemd/system") under root one component at a time, each with
// O_NOFOLLOW|O_DIRECTORY, so no symlink anywhere below root is followed: a
// planted link in any component fails with ErrSymlink (wrapped) instead of
// leading elsewhere. root itself is opened as given (the operator chose it).
func OpenDirNoFollow(root, rel string) (*os.File, error) {
	return walkBeneath(root, rel, false, 0)
}

// walkBeneath opens rel under root one component at a time, each with
// O_NOFOLLOW|O_DIRECTORY, creating a missing one with mode when create.
func walkBeneath(root, rel string, create bool, mode os.FileMode) (*os.File, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	walked := ""
	for _, c := range strings.Split(strings.Trim(rel, "/"), "/") {
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			unix.Close(fd)
			return nil, fmt.Errorf("%s: %q is not a clean path", root, rel)
		}
		walked += "/" + c
		next, err := unix.Openat(fd, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if create && errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(fd, c, uint32(mode.Perm())); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat(fd, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		if err != nil {
			perr := pathErr(fd, c, walked, err)
			unix.Close(fd)
			return nil, perr
		}
		unix.Close(fd)
		fd = next
	}
	return os.NewFile(uintptr(fd), walked), nil
}

// OpenAtNoFollow opens name in dir read-only without following a symlink
// (O_NOFOLLOW, O_NONBLOCK so a planted FIFO cannot block).
func OpenAtNoFollow(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathErr(int(dir.Fd()), name, dir.Name()+"/"+name, err)
	}
	return os.NewFile(uintptr(fd), dir.Name()+"/"+name), nil
}

// pathErr turns ELOOP/ENOTDIR on a symlink into ErrSymlink.
func pathErr(dirfd int, name, walked string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return fmt.Errorf("%s: %w", walked, ErrSymlink)
		}
	}
	return &os.PathError{Op: "open", Path: walked, Err: err}
}

// MkdirAllBeneath opens the directory rel under root as OpenDirNoFollow
// does, creating each missing component with mode (never following a
// symlink in any component, so a link planted in a parent, in a directory
// another user owns, cannot carry the walk elsewhere). What is written
// through the handle lands in the directory that was checked, whatever
// happens to the names meanwhile.
func MkdirAllBeneath(root, rel string, mode os.FileMode) (*os.File, error) {
	return walkBeneath(root, rel, true, mode)
}

// ReadDirAt lists the directory held by dir (not its name, which may have
// been swapped since it was opened).
func ReadDirAt(dir *os.File) ([]os.DirEntry, error) {
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir.Name(), Err: err}
	}
	f := os.NewFile(uintptr(fd), dir.Name())
	defer f.Close()
	return f.ReadDir(-1)
}

// ReadDirAtMost is ReadDirAt reading no more than n+1 entries: more than
// n is ErrTooLarge, so a directory of millions of entries is never read
// whole into memory.
func ReadDirAtMost(dir *os.File, n int) ([]os.DirEntry, error) {
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir.Name(), Err: err}
	}
	f := os.NewFile(uintptr(fd), dir.Name())
	defer f.Close()
	ents, err := f.ReadDir(n + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if len(ents) > n {
		return nil, fmt.Errorf("%s: more than %d entries: %w", dir.Name(), n, ErrTooLarge)
	}
	return ents, nil
}

// WriteFileAtomicAt is WriteFileAtomic for name in the directory held by
// dir: created exclusively without following a symlink, fsynced, renamed
// over name, the directory fsynced, read back and compared, all through
// the handle.
func WriteFileAtomicAt(dir *os.File, name string, data []byte, mode os.FileMode) error {
	return WriteFileAtomicAtGroup(dir, name, data, mode, -1)
}

// WriteFileAtomicAtGroup is WriteFileAtomicAt giving the new file the
// group gid (-1: the writer's) before it is renamed into place: a file
// replaced keeps the group it had, so nobody gains or loses read access.
func WriteFileAtomicAtGroup(dir *os.File, name string, data []byte, mode os.FileMode, gid int) (err error) {
	if name == "" || strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return fmt.Errorf("%q is not a file name", name)
	}
	dfd, shown := int(dir.Fd()), dir.Name()+"/"+name
	part := name + ".part"
	if rmErr := unix.Unlinkat(dfd, part, 0); rmErr != nil && !errors.Is(rmErr, unix.ENOENT) {
		return fmt.Errorf("remove stale %s.part: %w", shown, rmErr)
	}
	fd, err := unix.Openat(dfd, part, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return fmt.Errorf("create %s.part: %w", shown, err)
	}
	f := os.NewFile(uintptr(fd), shown+".part")
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = unix.Unlinkat(dfd, part, 0)
		}
	}()
	// The group before the mode: a chown may clear mode bits.
	if gid >= 0 {
		if err = f.Chown(-1, gid); err != nil {
			return fmt.Errorf("chown %s.part: %w", shown, err)
		}
	}
	if err = f.Chmod(mode.Perm()); err != nil {
		return fmt.Errorf("chmod %s.part: %w", shown, err)
	}
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("write %s.part: %w", shown, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("fsync %s.part: %w", shown, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("close %s.part: %w", shown, err)
	}
	if err = unix.Renameat(dfd, part, dfd, name); err != nil {
		return fmt.Errorf("rename %s.part: %w", shown, err)
	}
	_ = unix.Fsync(dfd)
	r, err := OpenAtNoFollow(dir, name)
	if err != nil {
		return fmt.Errorf("verify %s: %w", shown, err)
	}
	defer r.Close()
	got, err := io.ReadAll(io.LimitReader(r, int64(len(data))+1))
	if err != nil {
		return fmt.Errorf("verify %s: %w", shown, err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("verify %s: content differs after rename", shown)
	}
	return nil
}

// HandlePath is a path another process (a child the provider runs) can
// open to reach exactly the directory or file held by f: the provider's
// own /proc/<pid>/fd/<n>, valid while f is open. A name swapped for a
// symlink after the check does not change where it leads.
func HandlePath(f *os.File) string {
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
}

// ErrMountPoint marks an entry that is a mount point (or has one below
// it): it is never removed, nor emptied.
var ErrMountPoint = errors.New("a mount point")

// RemoveAllAt removes name in the directory held by dir and, when it is
// a directory, everything below it: never following a symlink (one is
// unlinked), and never crossing a mount boundary: an entry whose mount id
// differs from its parent's (a bind mount planted at the name, or below
// it) stops the removal with ErrMountPoint before anything under it is
// removed.
func RemoveAllAt(dir *os.File, name string) error {
	return removeAt(int(dir.Fd()), name, dir.Name()+"/"+name, 0)
}

func mountID(dirfd int, name string, flags int) (uint64, bool, error) {
	var stx unix.Statx_t
	if err := unix.Statx(dirfd, name, flags|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID|unix.STATX_TYPE, &stx); err != nil {
		return 0, false, err
	}
	root := stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	return stx.Mnt_id, root, nil
}

func removeAt(dirfd int, name, shown string, depth int) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("%s: not a name to remove", shown)
	}
	parent, _, err := mountID(dirfd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return &os.PathError{Op: "statx", Path: shown, Err: err}
	}
	child, isRoot, err := mountID(dirfd, name, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "statx", Path: shown, Err: err}
	}
	if child != parent || isRoot {
		return fmt.Errorf("%s is %w: not removed", shown, ErrMountPoint)
	}
	err = unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return &os.PathError{Op: "unlink", Path: shown, Err: err}
	}
	if depth >= 64 {
		return fmt.Errorf("%s: nested too deep to remove", shown)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: shown, Err: err}
	}
	d := os.NewFile(uintptr(fd), shown)
	names, err := d.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n, shown+"/"+n, depth+1); err != nil {
				break
			}
		}
	}
	d.Close()
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: shown, Err: err}
	}
	return nil
}

// EnsureDirAt is EnsureDir for a private directory (mode grants nothing to
// group or others) name in the directory held by parent, returning a
// handle on it: missing, it is created; a symlink or anything but a
// directory is refused; one owned by another user or writable by others
// is closed, moved aside (name.untrusted-<UTC time>, in the same parent)
// and made fresh. Everything goes through the parent's handle.
func EnsureDirAt(parent *os.File, name string, mode os.FileMode) (dir *os.File, movedAside string, err error) {
	pfd, shown := int(parent.Fd()), parent.Name()+"/"+name
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || mode.Perm()&0o077 != 0 {
		return nil, "", fmt.Errorf("%s: not a private directory name", shown)
	}
	for try := 0; try < 2; try++ {
		if err := unix.Mkdirat(pfd, name, uint32(mode.Perm())); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, movedAside, &os.PathError{Op: "mkdir", Path: shown, Err: err}
		}
		fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, movedAside, pathErr(pfd, name, shown, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, movedAside, &os.PathError{Op: "fstat", Path: shown, Err: err}
		}
		if int(st.Uid) == os.Geteuid() && os.FileMode(st.Mode).Perm()&0o022 == 0 {
			if os.FileMode(st.Mode&0o7777) != mode.Perm() {
				if err := unix.Fchmod(fd, uint32(mode.Perm())); err != nil {
					unix.Close(fd)
					return nil, movedAside, &os.PathError{Op: "chmod", Path: shown, Err: err}
				}
			}
			return os.NewFile(uintptr(fd), shown), movedAside, nil
		}
		_ = unix.Fchmod(fd, 0o700)
		unix.Close(fd)
		aside := fmt.Sprintf("%s.untrusted-%s", name, time.Now().UTC().Format("20060102T150405.000000000Z"))
		if err := unix.Renameat2(pfd, name, pfd, aside, unix.RENAME_NOREPLACE); err != nil {
			return nil, movedAside, fmt.Errorf("%s is owned by uid %d with mode %04o: move it aside: %w", shown, st.Uid, st.Mode&0o7777, err)
		}
		movedAside = parent.Name() + "/" + aside
		_ = unix.Fsync(pfd)
	}
	return nil, movedAside, fmt.Errorf("%s: replaced again while being made fresh", shown)
}

// ReadFileBeneath reads at most limit bytes of the regular file rel under
// root without following a symlink in any component (OpenDirNoFollow, then
// OpenAtNoFollow: never blocking on a FIFO or device, refused as a
// KindError naming rel). Unlike ReadFileTrusted it does not ask who owns
// the file: for a file the caller only reads (a manifest in the image, a
// file a build wrote in its scratch tree).
func ReadFileBeneath(root, rel string, limit int64) ([]byte, error) {
	// path.Dir would clean a ".." away: refuse it before.
	if c := "/" + strings.Trim(rel, "/"); path.Clean(c) != c || c == "/" {
		return nil, fmt.Errorf("%s: %q is not a clean path to a file", root, rel)
	}
	dir, err := OpenDirNoFollow(root, path.Dir("/"+strings.Trim(rel, "/")))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	f, err := OpenAtNoFollow(dir, path.Base(rel))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: rel, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, &KindError{Path: rel, Kind: Kind(st.Mode), Want: "a regular file"}
	}
	return readBounded(f, rel, limit)
}

// WriteScratchBeneath writes data, mode 0600, as the file rel (a host
// path such as "/run/provider-kubernetes/tmp/x.yaml") under root, for a
// command to read: its directory is made 0700 if missing and opened
// without following a symlink in any component, and the file is written
// atomically through that handle. remove deletes the file again, through
// the same handle (a no-op after an error).
func WriteScratchBeneath(root, rel string, data []byte) (remove func(), err error) {
	dir, err := MkdirAllBeneath(root, path.Dir(rel), 0o700)
	if err != nil {
		return func() {}, fmt.Errorf("scratch directory: %w", err)
	}
	name := path.Base(rel)
	if err := WriteFileAtomicAt(dir, name, data, 0o600); err != nil {
		dir.Close()
		return func() {}, err
	}
	return func() {
		_ = unix.Unlinkat(int(dir.Fd()), name, 0)
		dir.Close()
	}, nil
}
