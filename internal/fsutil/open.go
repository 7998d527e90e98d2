package fsutil

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// Sentinel errors of the checked opens: what was found where the provider
// reads, appends or keeps its files.
var (
	// ErrNotRegular: a FIFO, socket, device or directory where a regular
	// file is expected (or anything but a directory where one is).
	ErrNotRegular = errors.New("not a regular file")
	// ErrHardLink: a file the provider writes has another name elsewhere.
	ErrHardLink = errors.New("more than one hard link")
	// ErrForeignOwner: a file or directory the provider writes is owned by
	// another user.
	ErrForeignOwner = errors.New("owned by another user")
)

// KindError names what was found at a path instead of what was expected.
type KindError struct {
	Path string
	Kind string // "a FIFO", "a socket", "a directory", ...
	Want string // "a regular file" or "a directory"
}

func (e *KindError) Error() string { return fmt.Sprintf("%s is %s, not %s", e.Path, e.Kind, e.Want) }

// Is makes a KindError match ErrNotRegular.
func (e *KindError) Is(target error) bool { return target == ErrNotRegular }

// Kind names a file type for an error message.
func Kind(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFLNK:
		return "a symlink"
	}
	return "a special file"
}

// openErr turns a failed open into an error naming the path and, when the
// kernel refused because of what is there (a symlink, a FIFO without a
// reader, a socket, a directory), what was found.
func openErr(path string, err error, want string) error {
	var st unix.Stat_t
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.EISDIR) ||
		errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EOPNOTSUPP) {
		if unix.Lstat(path, &st) == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return fmt.Errorf("%s: %w", path, ErrSymlink)
			}
			return &KindError{Path: path, Kind: Kind(st.Mode), Want: want}
		}
	}
	return &os.PathError{Op: "open", Path: path, Err: err}
}

// open opens path with flags plus O_NOFOLLOW|O_NONBLOCK|O_NOCTTY|O_CLOEXEC,
// so neither a symlink is followed nor a FIFO or device blocks the open, then
// checks with fstat that a regular file was opened. O_NONBLOCK has no
// effect on the reads and writes of a regular file.
func open(path string, flags int, mode os.FileMode) (*os.File, *unix.Stat_t, error) {
	// A device is not even opened (opening one can have effects of its
	// own); the fstat below catches one swapped in meanwhile.
	var pre unix.Stat_t
	if err := unix.Lstat(path, &pre); err == nil && pre.Mode&unix.S_IFMT != unix.S_IFREG {
		if pre.Mode&unix.S_IFMT == unix.S_IFLNK {
			return nil, nil, fmt.Errorf("%s: %w", path, ErrSymlink)
		}
		return nil, nil, &KindError{Path: path, Kind: Kind(pre.Mode), Want: "a regular file"}
	}
	fd, err := unix.Open(path, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return nil, nil, openErr(path, err, "a regular file")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, nil, &KindError{Path: path, Kind: Kind(st.Mode), Want: "a regular file"}
	}
	return os.NewFile(uintptr(fd), path), &st, nil
}

// OpenRegular opens path read-only: never through a symlink in the last
// component, never blocking (a FIFO or device planted there is refused at
// once as an ErrNotRegular naming the path), only a regular file.
func OpenRegular(path string) (*os.File, error) {
	f, _, err := open(path, unix.O_RDONLY, 0)
	return f, err
}

// OpenOwned opens (creating it with mode when missing) a file the provider
// writes in place: a log it appends to (flags O_WRONLY|O_APPEND) or a lock
// file (O_RDWR). What is found there must be a regular file with a single
// link (a hard link would make the provider write into the linked file).
// One owned by another user, or whose mode grants anything beyond mode, is
// not reused: whoever could write it may still hold it open and keep
// writing after a chmod, so a new file (a new inode, exactly mode) is
// created beside it and renamed over it; what the old one held is not
// carried over. A file found with a narrower mode gets exactly mode.
func OpenOwned(path string, flags int, mode os.FileMode) (*os.File, error) {
	f, st, err := open(path, flags|unix.O_CREAT, mode)
	if err != nil {
		return nil, err
	}
	if st.Nlink != 1 {
		f.Close()
		return nil, fmt.Errorf("%s: %w (%d): refusing to write to it", path, ErrHardLink, st.Nlink)
	}
	if int(st.Uid) != os.Geteuid() || os.FileMode(st.Mode&0o7777)&^mode.Perm() != 0 {
		f.Close()
		return replaceOwned(path, flags, mode)
	}
	if os.FileMode(st.Mode&0o7777) != mode.Perm() {
		if err := unix.Fchmod(int(f.Fd()), uint32(mode.Perm())); err != nil {
			f.Close()
			return nil, &os.PathError{Op: "chmod", Path: path, Err: err}
		}
	}
	return f, nil
}

// ReplacedSuffix starts the name of the file OpenOwned creates beside one
// it does not reuse, before renaming it over that one.
const ReplacedSuffix = ".new-"

// replaceOwned creates a new, empty file beside path (exclusively, never
// through a symlink), with exactly mode, and renames it over path.
func replaceOwned(path string, flags int, mode os.FileMode) (*os.File, error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	tmp := fmt.Sprintf("%s%s%x", path, ReplacedSuffix, rnd)
	fd, err := unix.Open(tmp, flags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_NOCTTY|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return nil, &os.PathError{Op: "create", Path: tmp, Err: err}
	}
	// The umask may have narrowed the mode: set it exactly.
	if err := unix.Fchmod(fd, uint32(mode.Perm())); err != nil {
		unix.Close(fd)
		_ = unix.Unlink(tmp)
		return nil, &os.PathError{Op: "chmod", Path: tmp, Err: err}
	}
	if err := unix.Rename(tmp, path); err != nil {
		unix.Close(fd)
		_ = unix.Unlink(tmp)
		return nil, fmt.Errorf("replace %s (owned by another user or with a loose mode): %w", path, err)
	}
	syncDir(filepath.Dir(path))
	return os.NewFile(uintptr(fd), path), nil
}

// OpenAppend is OpenOwned for appending: a log.
func OpenAppend(path string, mode os.FileMode) (*os.File, error) {
	return OpenOwned(path, unix.O_WRONLY|unix.O_APPEND, mode)
}

// EnsureDir makes dir a directory the provider can trust, with exactly
// mode, and returns where an untrusted directory found there was moved
// ("" when none was).
//
// Missing, it is created (with any missing parents). A symlink or anything
// but a directory there is refused. A private directory (mode grants
// nothing to group or others: where secrets, snapshots and the kubeadm
// configurations live) owned by another user, or writable by group or
// others, is never reused as found: whoever could write it could have
// planted or could swap what the provider writes there, so it is moved
// aside (to dir.untrusted-<UTC time>, closed to others) and created fresh.
// A shared directory (0755) owned by another user is refused; one with a
// looser mode gets exactly mode.
func EnsureDir(dir string, mode os.FileMode) (movedAside string, err error) {
	if err := os.MkdirAll(dir, mode); err != nil {
		var st unix.Stat_t
		if unix.Lstat(dir, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return "", fmt.Errorf("%s: %w", dir, ErrSymlink)
			}
			return "", &KindError{Path: dir, Kind: Kind(st.Mode), Want: "a directory"}
		}
		return "", err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", openErr(dir, err, "a directory")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return "", &os.PathError{Op: "fstat", Path: dir, Err: err}
	}
	private := mode.Perm()&0o077 == 0
	foreign := int(st.Uid) != os.Geteuid()
	loose := os.FileMode(st.Mode).Perm()&^mode.Perm()&0o022 != 0
	if private && (foreign || loose) {
		// Closed to everyone but its owner first, then moved aside whole.
		_ = unix.Fchmod(fd, 0o700)
		unix.Close(fd)
		aside := fmt.Sprintf("%s.untrusted-%s", dir, time.Now().UTC().Format("20060102T150405.000000000Z"))
		if err := unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, aside, unix.RENAME_NOREPLACE); err != nil {
			return "", fmt.Errorf("%s is owned by uid %d with mode %04o: move it aside: %w", dir, st.Uid, st.Mode&0o7777, err)
		}
		if err := unix.Mkdir(dir, uint32(mode.Perm())); err != nil {
			return aside, &os.PathError{Op: "mkdir", Path: dir, Err: err}
		}
		syncDir(filepath.Dir(dir))
		_, err := EnsureDir(dir, mode)
		return aside, err
	}
	defer unix.Close(fd)
	if foreign {
		return "", fmt.Errorf("%s: %w (uid %d): refusing to write in it", dir, ErrForeignOwner, st.Uid)
	}
	if os.FileMode(st.Mode&0o7777) != mode.Perm() {
		if err := unix.Fchmod(fd, uint32(mode.Perm())); err != nil {
			return "", &os.PathError{Op: "chmod", Path: dir, Err: err}
		}
	}
	return "", nil
}

// ReadDir lists a directory like os.ReadDir (sorted by name), opening it
// without following a symlink and without blocking: a FIFO or anything but
// a directory at path is an ErrNotRegular naming it (os.ReadDir's open
// blocks on a FIFO).
func ReadDir(path string) ([]os.DirEntry, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, openErr(path, err, "a directory")
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	ents, err := f.ReadDir(-1)
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	return ents, err
}

// SyncDir fsyncs a directory (after a rename in it), best effort.
func SyncDir(dir string) { syncDir(dir) }

func syncDir(dir string) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_ = unix.Fsync(fd)
	unix.Close(fd)
}
