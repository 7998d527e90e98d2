// Package kubeadmbackup finds and prunes the plaintext copies of the etcd
// data directory that kubeadm upgrade apply and upgrade node leave in
// /etc/kubernetes/tmp/kubeadm-backup-etcd-<timestamp> on every stacked
// control plane, on every upgrade, and never delete. Nothing here follows a
// symlink: a symlink is neither counted, sized nor removed.
package kubeadmbackup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Prefix and TimeLayout are kubeadm's names (phases/upgrade staticpods.go:
// "kubeadm-backup-etcd" + "-" + time.Now().Format("2006-01-02-15-04-05")).
const (
	Prefix     = "kubeadm-backup-etcd-"
	TimeLayout = "2006-01-02-15-04-05"
	// maxEntries bounds the walk of one backup.
	maxEntries = 200000
)

// Backup is one kubeadm-backup-etcd-* directory.
type Backup struct {
	Name  string
	Time  time.Time // zero when the name carries no kubeadm timestamp
	Bytes int64     // regular files' sizes, symlinks not followed
	Files int
}

// Summary is every backup in the directory, oldest first.
type Summary struct {
	Dir     string // host path
	Backups []Backup
	Count   int
	Bytes   int64
	// Skipped names entries left alone: symlinks, non-directories.
	Skipped []string
}

// ErrSymlink is returned when a path the provider would walk is a symlink.
var ErrSymlink = errors.New("symlink")

// List reads /etc/kubernetes/tmp under root. A missing directory is no backups.
func List(root paths.Root) (Summary, error) {
	s := Summary{Dir: paths.KubeadmTmpDir}
	cur := "/"
	for _, c := range strings.Split(strings.TrimPrefix(paths.KubeadmTmpDir, "/"), "/") {
		cur = path.Join(cur, c)
		st, err := os.Lstat(root.Path(cur))
		if errors.Is(err, os.ErrNotExist) {
			return s, nil
		}
		if err != nil {
			return s, fmt.Errorf("lstat %s: %w", cur, errors.Unwrap(err))
		}
		if st.Mode()&os.ModeSymlink != 0 {
			return s, fmt.Errorf("%s is a %w: not followed", cur, ErrSymlink)
		}
		if !st.IsDir() {
			return s, fmt.Errorf("%s is %s, not a directory", cur, kind(st))
		}
	}
	dir := root.Path(paths.KubeadmTmpDir)
	ents, err := fsutil.ReadDir(dir)
	if err != nil {
		return s, fmt.Errorf("read %s: %w", paths.KubeadmTmpDir, err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), Prefix) {
			continue
		}
		if !e.IsDir() || e.Type()&fs.ModeSymlink != 0 {
			s.Skipped = append(s.Skipped, e.Name())
			continue
		}
		b := Backup{Name: e.Name()}
		if t, err := time.ParseInLocation(TimeLayout, strings.TrimPrefix(e.Name(), Prefix), time.Local); err == nil {
			b.Time = t
		}
		n := 0
		err := filepath.WalkDir(filepath.Join(dir, e.Name()), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if n++; n > maxEntries {
				return fmt.Errorf("more than %d entries", maxEntries)
			}
			if d.Type().IsRegular() {
				info, err := d.Info()
				if err != nil {
					return err
				}
				b.Bytes += info.Size()
				b.Files++
			}
			return nil
		})
		if err != nil {
			return s, fmt.Errorf("size of %s: %w", e.Name(), err)
		}
		s.Backups = append(s.Backups, b)
		s.Count++
		s.Bytes += b.Bytes
	}
	sort.SliceStable(s.Backups, func(i, j int) bool {
		a, b := s.Backups[i], s.Backups[j]
		if a.Time.Equal(b.Time) {
			return a.Name < b.Name
		}
		return a.Time.Before(b.Time)
	})
	return s, nil
}

// Plan returns the backups to remove: every timestamped backup but the
// newest keep. A backup without kubeadm's timestamp is never removed.
func Plan(s Summary, keep int) []Backup {
	var dated []Backup
	for _, b := range s.Backups {
		if !b.Time.IsZero() {
			dated = append(dated, b)
		}
	}
	if keep < 0 {
		keep = 0
	}
	if len(dated) <= keep {
		return nil
	}
	return dated[:len(dated)-keep]
}

// Facts decide whether this node is verified at the cluster's version.
type Facts struct {
	ControlPlane   bool
	NodeVersion    version.Version // the kube-apiserver manifest (control planes)
	KubeletVersion version.Version // the Node's kubeletVersion
	ClusterVersion version.Version
}

// ErrNotVerified is wrapped when pruning is refused.
var ErrNotVerified = errors.New("this node is not verified at the cluster's version")

// Verified is nil when the node runs the cluster's version everywhere the
// provider checks: the upgrade these backups guard is over.
func Verified(f Facts) error {
	switch {
	case f.ClusterVersion.IsZero():
		return fmt.Errorf("%w: the cluster version is unknown", ErrNotVerified)
	case f.ControlPlane && f.NodeVersion != f.ClusterVersion:
		return fmt.Errorf("%w: kube-apiserver manifest at %s, cluster at %s", ErrNotVerified, vs(f.NodeVersion), f.ClusterVersion)
	case f.KubeletVersion != f.ClusterVersion:
		return fmt.Errorf("%w: kubelet at %s, cluster at %s", ErrNotVerified, vs(f.KubeletVersion), f.ClusterVersion)
	}
	return nil
}

func vs(v version.Version) string {
	if v.IsZero() {
		return "unknown"
	}
	return v.String()
}

// Remove deletes one backup, refusing when it is no longer a real directory.
// It goes through a handle on kubeadm's tmp directory opened beneath the
// root (no symlink followed), unlinks symlinks inside without following
// them, and never crosses a mount point (a bind mount planted at the name
// or inside is refused, not emptied).
func Remove(root paths.Root, b Backup) error {
	dir, err := fsutil.OpenDirNoFollow(string(root), paths.KubeadmTmpDir)
	if err != nil {
		return err
	}
	defer dir.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), b.Name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "stat", Path: path.Join(paths.KubeadmTmpDir, b.Name), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is no longer a directory", b.Name)
	}
	return fsutil.RemoveAllAt(dir, b.Name)
}

// kind names what a path holds (a FIFO, a socket, ...) for an error.
func kind(st os.FileInfo) string {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return fsutil.Kind(sys.Mode)
	}
	return "not a directory"
}
