package fsutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ReadFileRotated reads hostPath under root like ReadFileNoFollow, except
// that it follows one symlink the way the kubelet rotates its client
// certificate (/var/lib/kubelet/pki/kubelet-client-current.pem ->
// kubelet-client-<time>.pem, written with an absolute target): only to a
// file in the same directory, only when that directory is root's own and
// writable by nobody else (so nobody else could have planted the link),
// and never a second link. An absolute target is a host path: it is
// re-based under root.
func ReadFileRotated(root, hostPath string, limit int64) ([]byte, error) {
	full := filepath.Join(root, hostPath)
	fi, err := os.Lstat(full)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&os.ModeSymlink == 0 {
		return ReadFileNoFollow(full, limit)
	}
	dir := filepath.Dir(hostPath)
	target, err := os.Readlink(full)
	if err != nil {
		return nil, err
	}
	switch {
	case filepath.IsAbs(target):
		target = filepath.Clean(target)
	case !strings.Contains(target, "/"):
		target = filepath.Join(dir, target)
	default:
		target = ""
	}
	if target == "" || filepath.Dir(target) != dir || target == filepath.Clean(hostPath) {
		return nil, fmt.Errorf("%s: %w: it points outside its own directory", full, ErrSymlink)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(root, dir), &st); err != nil {
		return nil, err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("%s: %w: its directory is not root's own (uid %d, mode %04o)", full, ErrSymlink, st.Uid, st.Mode&0o7777)
	}
	return ReadFileNoFollow(filepath.Join(root, target), limit)
}
