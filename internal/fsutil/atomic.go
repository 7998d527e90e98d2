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
	"syscall"

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
	return readFile(path, limit, false)
}

// ErrUntrusted: a file the provider acts on could have been written by
// someone else.
var ErrUntrusted = errors.New("not root's own")

// ReadFileTrusted is ReadFileNoFollow for a file the provider acts on and
// only root writes (the cluster file, the plugin's record): it must also be
// owned by the provider's user (root) and writable by nobody else, or it is
// refused (ErrUntrusted) rather than trusted.
func ReadFileTrusted(path string, limit int64) ([]byte, error) {
	return readFile(path, limit, true)
}

func readFile(path string, limit int64, trusted bool) ([]byte, error) {
	f, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if trusted {
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !ok || int(sys.Uid) != os.Geteuid() || st.Mode().Perm()&0o022 != 0 {
			uid := -1
			if ok {
				uid = int(sys.Uid)
			}
			return nil, fmt.Errorf("%s: %w (uid %d, mode %04o): refusing to act on a file someone else could have written", path, ErrUntrusted, uid, st.Mode().Perm())
		}
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
