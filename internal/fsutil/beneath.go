package fsutil

import (
	"errors"
	"fmt"
	"os"
	"strings"

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
