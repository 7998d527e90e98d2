// Package fsutil writes files the way the provider promises: atomically,
// with exact modes, never through a symlink.
package fsutil

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// WriteFileAtomic writes data to path through path.part: created exclusively
// without following symlinks, fsynced, closed, renamed over path, the
// directory fsynced, then read back and compared. On any failure the .part
// file is removed and path is left as it was.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) (err error) {
	dir := filepath.Dir(path)
	part := path + ".part"
	// A stale .part from a crash is ours to remove; a symlink there is removed, not followed.
	if rmErr := os.Remove(part); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", part, rmErr)
	}
	fd, err := unix.Open(part, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return fmt.Errorf("create %s: %w", part, err)
	}
	f := os.NewFile(uintptr(fd), part)
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(part)
		}
	}()
	// The umask may have narrowed the mode: set it exactly.
	if err = f.Chmod(mode.Perm()); err != nil {
		return fmt.Errorf("chmod %s: %w", part, err)
	}
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", part, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", part, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", part, err)
	}
	if err = os.Rename(part, path); err != nil {
		return fmt.Errorf("rename %s: %w", part, err)
	}
	syncDir(dir)
	got, err := ReadFileNoFollow(path, int64(len(data))+1)
	if err != nil {
		return fmt.Errorf("verify %s: %w", path, err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("verify %s: content differs after rename", path)
	}
	return nil
}

// ErrTooLarge is returned by ReadFileNoFollow for a file over its limit.
var ErrTooLarge = errors.New("file too large")

// ReadFileNoFollow reads at most limit bytes of a regular file, refusing a
// symlink in the last component and, without blocking, anything but a
// regular file (a FIFO, socket, device or directory: ErrNotRegular).
func ReadFileNoFollow(path string, limit int64) ([]byte, error) {
	return readFile(path, limit)
}

// ErrUntrusted: a file the provider acts on could have been written by
// someone else (it, or a directory above it, is not root's own or is
// writable by another user).
var ErrUntrusted = errors.New("not root's own")

// ReadFileTrusted reads at most limit bytes of hostPath under root, a
// record the provider acts on and only root writes (the cluster file, the
// plugin's records, the verified-version record, the status mirror read
// back, kubeadm's saved manifests). The record counts only when root and
// every directory from root down to it are root's own (the provider's
// user) and writable by nobody else, and the file itself is too: whoever
// can write a directory can replace what is in it. The walk opens each
// component beneath the previous one's handle (O_NOFOLLOW, a symlink
// anywhere below root is ErrSymlink), never blocks on a FIFO or device
// (ErrNotRegular) and checks what it opened (fstat), so nothing can be
// swapped between check and read. An untrusted directory or file is
// ErrUntrusted naming it, even when the record below it is missing.
func ReadFileTrusted(root, hostPath string, limit int64) ([]byte, error) {
	return ReadFileTrustedBy(root, hostPath, limit, nil)
}

// ReadFileTrustedBy is ReadFileTrusted that also trusts a directory its
// group may write when that group is one of groups (AdminGroups: groups
// whose members are root already). A file is never trusted with group
// write, and nothing is with world write.
func ReadFileTrustedBy(root, hostPath string, limit int64, groups []uint32) ([]byte, error) {
	if root == "" {
		root = "/"
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	if err := trustedFdBy(fd, root, "directory", groups); err != nil {
		unix.Close(fd)
		return nil, err
	}
	var comps []string
	clean := true
	for _, c := range strings.Split(hostPath, "/") {
		switch c {
		case "", ".":
		case "..":
			clean = false
		default:
			comps = append(comps, c)
		}
	}
	if !clean || len(comps) == 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %q is not a clean path to a file", root, hostPath)
	}
	walked := strings.TrimSuffix(root, "/")
	for i, c := range comps {
		last := i == len(comps)-1
		walked += "/" + c
		flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
		if !last {
			flags |= unix.O_DIRECTORY
		} else {
			// A device is not even opened: the fstat below catches one
			// swapped in meanwhile.
			var pre unix.Stat_t
			if unix.Fstatat(fd, c, &pre, unix.AT_SYMLINK_NOFOLLOW) == nil && pre.Mode&unix.S_IFMT != unix.S_IFREG {
				unix.Close(fd)
				if pre.Mode&unix.S_IFMT == unix.S_IFLNK {
					return nil, fmt.Errorf("%s: %w", walked, ErrSymlink)
				}
				return nil, &KindError{Path: walked, Kind: Kind(pre.Mode), Want: "a regular file"}
			}
		}
		next, err := unix.Openat(fd, c, flags, 0)
		if err != nil {
			perr := pathErr(fd, c, walked, err)
			unix.Close(fd)
			return nil, perr
		}
		unix.Close(fd)
		fd = next
		want := "directory"
		if last {
			want = "file"
		}
		if err := trustedFdBy(fd, walked, want, groups); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	f := os.NewFile(uintptr(fd), walked)
	defer f.Close()
	return readBounded(f, walked, limit)
}

// trustedFdBy checks that what fd holds is what is wanted ("directory" or
// "file") and root's own (the provider's user), writable by nobody else
// but, for a directory, a group of groups (TrustedStat).
func trustedFdBy(fd int, path, want string, groups []uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	switch {
	case want == "directory" && st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return &KindError{Path: path, Kind: Kind(st.Mode), Want: "a directory"}
	case want == "file" && st.Mode&unix.S_IFMT != unix.S_IFREG:
		return &KindError{Path: path, Kind: Kind(st.Mode), Want: "a regular file"}
	}
	if !TrustedStat(&st, groups) {
		return fmt.Errorf("%s: %w (%s of uid %d, mode %04o): refusing to act on a file someone else could have written (or replaced, for a directory)",
			path, ErrUntrusted, want, st.Uid, st.Mode&0o7777)
	}
	return nil
}

func readFile(path string, limit int64) ([]byte, error) {
	f, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readBounded(f, path, limit)
}

func readBounded(f *os.File, path string, limit int64) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s: %w (%d bytes, limit %d)", path, ErrTooLarge, st.Size(), limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: %w (limit %d)", path, ErrTooLarge, limit)
	}
	return b, nil
}

// MkdirAllMode is EnsureDir for a caller that has nothing to report about
// an untrusted directory moved aside.
func MkdirAllMode(dir string, mode os.FileMode) error {
	_, err := EnsureDir(dir, mode)
	return err
}
