package reset

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Errors of the safe walk.
var (
	// ErrSymlink: a path component the reset would have to go through is a
	// symlink; it is never followed.
	ErrSymlink = errors.New("is a symlink: not followed")
	// ErrNoMountID: the kernel does not report mount ids (statx
	// STATX_MNT_ID, Linux 5.8), so a bind mount of the same filesystem
	// could not be told apart: the walk refuses rather than guess.
	ErrNoMountID = errors.New("the kernel does not report mount ids (statx STATX_MNT_ID): refusing to walk without them")
)

// walker removes trees below directories it opened itself, never through a
// symlink, never into another mount (told by mount id, so a bind mount of
// the same filesystem counts), never into a kept directory.
type walker struct {
	// keep is the (dev, ino) of a directory that is never removed nor entered.
	keep *fileID
	// busy collects host paths left in place because they are mount points
	// or the kernel said EBUSY.
	busy []string
	// kept collects host paths skipped because they are the kept directory.
	kept []string
}

type fileID struct{ dev, ino uint64 }

type node struct {
	fd    int
	mnt   uint64
	id    fileID
	isDir bool
}

// statxFD describes an open fd.
func statxFD(fd int) (node, error) {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_INO|unix.STATX_MNT_ID, &st); err != nil {
		return node{}, err
	}
	if st.Mask&unix.STATX_MNT_ID == 0 {
		return node{}, ErrNoMountID
	}
	return node{fd: fd, mnt: st.Mnt_id, id: fileID{unix.Mkdev(st.Dev_major, st.Dev_minor), st.Ino}, isDir: st.Mode&unix.S_IFMT == unix.S_IFDIR}, nil
}

// openDir opens the directory at host path p under root, one component at
// a time with O_NOFOLLOW, so no component may be a symlink. The root
// itself is trusted (it is "/" on a node). os.ErrNotExist when a component
// is missing.
func openDir(root, p string) (int, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: root, Err: err}
	}
	walked := ""
	for _, comp := range strings.Split(strings.Trim(path.Clean(p), "/"), "/") {
		if comp == "" {
			continue
		}
		walked += "/" + comp
		next, err := unix.Openat(fd, comp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			var st unix.Stat_t
			if unix.Fstatat(fd, comp, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = ErrSymlink
			}
			unix.Close(fd)
			if errors.Is(err, unix.ENOENT) {
				return -1, fmt.Errorf("%s: %w", walked, os.ErrNotExist)
			}
			return -1, fmt.Errorf("%s: %w", walked, err)
		}
		unix.Close(fd)
		fd = next
	}
	return fd, nil
}

// emptyDir removes everything below the directory open at fd (host path
// p), keeping the directory itself.
func (w *walker) emptyDir(fd int, p string) error {
	top, err := statxFD(fd)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if w.keep != nil && top.id == *w.keep {
		w.kept = append(w.kept, p)
		return nil
	}
	_, err = w.emptyBelow(top, p)
	return err
}

// removeEntry removes the entry name of the directory dir (host path p is
// the entry's), a whole tree when it is a directory on dir's mount.
func (w *walker) removeEntry(dir node, name, p string) error {
	var st unix.Statx_t
	if err := unix.Statx(dir.fd, name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_MNT_ID, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("%s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		// Files, symlinks (the link itself, never its target), FIFOs,
		// sockets, devices: unlinked in this directory.
		return w.unlink(dir.fd, name, p, 0)
	}
	if st.Mnt_id != dir.mnt {
		w.busy = append(w.busy, p)
		return nil
	}
	cfd, err := unix.Openat(dir.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("%s: %w", p, err) // replaced by a symlink since the statx: ELOOP, not followed
	}
	child, err := statxFD(cfd)
	if err != nil {
		unix.Close(cfd)
		return fmt.Errorf("%s: %w", p, err)
	}
	// Checked again on the open fd: a mount placed there since the statx.
	if child.mnt != dir.mnt {
		unix.Close(cfd)
		w.busy = append(w.busy, p)
		return nil
	}
	if w.keep != nil && child.id == *w.keep {
		unix.Close(cfd)
		w.kept = append(w.kept, p)
		return nil
	}
	empty, err := w.emptyBelow(child, p)
	unix.Close(cfd)
	if err != nil || !empty {
		return err
	}
	return w.unlink(dir.fd, name, p, unix.AT_REMOVEDIR)
}

// emptyBelow empties the open directory d; it reports whether d is now
// empty (nothing was left because it was busy or kept).
func (w *walker) emptyBelow(d node, p string) (bool, error) {
	names, err := readNames(d.fd)
	if err != nil {
		return false, fmt.Errorf("%s: %w", p, err)
	}
	before := len(w.busy) + len(w.kept)
	var errs []error
	for _, name := range names {
		if err := w.removeEntry(d, name, path.Join(p, name)); err != nil {
			errs = append(errs, err)
		}
	}
	return len(errs) == 0 && len(w.busy)+len(w.kept) == before, errors.Join(errs...)
}

func (w *walker) unlink(dirfd int, name, p string, flags int) error {
	err := unix.Unlinkat(dirfd, name, flags)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EBUSY):
		w.busy = append(w.busy, p)
		return nil
	}
	return fmt.Errorf("remove %s: %w", p, err)
}

// readNames lists a directory open at fd without consuming fd.
func readNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	if _, err := f.Seek(0, 0); err != nil {
		return nil, err
	}
	return f.Readdirnames(-1)
}
