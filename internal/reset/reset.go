// Package reset takes a node out of Kubernetes: kubeadm reset -f through
// the runner, then kubeadm's own backup copies removed and /etc/kubernetes,
// /var/lib/kubelet and /var/lib/etcd emptied while the directories stay
// (they are mount points on Kairos). It never follows a symlink, never
// crosses into another mount and keeps the provider's etcd snapshots.
package reset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// Status reasons of a failed reset.
const (
	ReasonKubeadmResetFailed = "KubeadmResetFailed"
	ReasonMountBusy          = "MountBusy"
	ReasonUnsafePath         = "UnsafePath"
	ReasonCleanupFailed      = "CleanupFailed"
	ReasonLocked             = "Locked"
)

// Log events.
const (
	EventReset   = "reset"
	EventWarning = "reset-warning"
)

// Emptied are the directories a reset empties and keeps, in order.
var Emptied = []string{paths.KubernetesDir, paths.KubeletDir, paths.EtcdDir}

// BackupPrefix names kubeadm's own copies in /etc/kubernetes/tmp.
const BackupPrefix = "kubeadm-backup-"

// DefaultKubeadmTimeout bounds kubeadm reset -f.
const DefaultKubeadmTimeout = 5 * time.Minute

// EtcdMemberWarning is the warning of a stacked control plane.
const EtcdMemberWarning = "this node ran a stacked etcd member: kubeadm reset removes it from the etcd cluster only when the cluster answered; " +
	"check etcdctl member list on a remaining control plane and remove it (etcdctl member remove ID), or it counts against quorum"

// Options configure a reset.
type Options struct {
	Root           paths.Root
	Runner         runner.Runner
	Log            *slog.Logger
	Now            func() time.Time
	KubeadmTimeout time.Duration
}

// Result is the outcome. ExitCode is reconcile.ExitRefused for a refusal
// (nothing changed, no status written: Status is only its reason and
// message, not the node's state).
type Result struct {
	Status   status.Document
	ExitCode int
	Err      error
}

// Run resets the node.
func Run(ctx context.Context, o Options) Result {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.KubeadmTimeout <= 0 {
		o.KubeadmTimeout = DefaultKubeadmTimeout
	}
	doc := status.Document{Phase: status.PhaseResetFailed, LastAction: "reset"}
	if b, err := fsutil.ReadFileNoFollow(o.Root.Path(paths.BootID), 64<<10); err == nil {
		doc.BootID = strings.TrimSpace(string(b))
	}
	finish := func(reason string, err error) Result {
		doc.Time = o.Now().UTC().Format(time.RFC3339)
		if err == nil {
			doc.Phase, doc.Reason = status.PhaseReset, ""
			doc.Message = "reset: kubeadm reset done; " + strings.Join(Emptied, ", ") + " emptied; " + paths.EtcdBackupDir + " kept"
		} else {
			// Paths and errnos only (kubeadm's output reaches here already
			// sanitized by the runner): bounded to one line, paths intact.
			doc.Phase, doc.Reason, doc.Message = status.PhaseResetFailed, reason, oneLine(err.Error(), 2000)
		}
		if werr := status.Write(o.Root, doc); werr != nil {
			o.Log.Error(reconcile.EventStatusFailed, "error", werr.Error())
		}
		if err != nil {
			o.Log.Error(EventReset, "outcome", "failed", "reason", reason, "error", doc.Message)
			return Result{Status: doc, ExitCode: reconcile.ExitFailed, Err: err}
		}
		o.Log.Info(EventReset, "outcome", "reset", "kept", paths.EtcdBackupDir)
		return Result{Status: doc, ExitCode: reconcile.ExitOK}
	}

	// A refused reset changes nothing: no command, nothing removed, no
	// status written (a pass holding the lock owns the status). The refusal
	// is returned (printed, or the plugin's response) and logged.
	refuse := func(reason string, err error) Result {
		doc.Reason, doc.Message = reason, oneLine(err.Error(), 2000)
		doc.Time = o.Now().UTC().Format(time.RFC3339)
		o.Log.Error(EventReset, "outcome", "refused", "reason", reason, "error", doc.Message)
		return Result{Status: doc, ExitCode: reconcile.ExitRefused, Err: err}
	}
	unlock, err := reconcile.Lock(o.Root)
	if err != nil {
		if !errors.Is(err, reconcile.ErrLocked) {
			return refuse(ReasonUnsafePath, err) // the lock file itself is not one to trust
		}
		return refuse(ReasonLocked, err)
	}
	defer unlock()

	// kubeadm reset -f empties these directories by path and follows a
	// symlink in their place (or a parent's) into wherever it points: a
	// symlinked one is refused before kubeadm runs, not found afterwards.
	// (Someone who can swap a directory for a link between this check and
	// kubeadm's removal can also write there directly.)
	if err := noSymlinkedDir(o.Root); err != nil {
		return refuse(ReasonUnsafePath, fmt.Errorf("%w: kubeadm reset -f would follow it, so nothing was run or removed", err))
	}

	if _, err := os.Lstat(o.Root.Path(paths.EtcdManifest)); err == nil {
		doc.Warnings = append(doc.Warnings, EtcdMemberWarning)
		o.Log.Warn(EventWarning, "warning", EtcdMemberWarning)
	}

	var failures []failure
	if _, err := o.Runner.Run(ctx, runner.Cmd{Path: paths.Kubeadm, Args: []string{"reset", "-f"}, Timeout: o.KubeadmTimeout}); err != nil {
		failures = append(failures, failure{ReasonKubeadmResetFailed, fmt.Errorf("kubeadm reset -f: %w (the directories were emptied anyway)", err)})
	}
	failures = append(failures, clean(o.Root)...)
	if len(failures) == 0 {
		return finish("", nil)
	}
	// The status names the most actionable reason: a busy mount, an unsafe
	// path, a cleanup error, then kubeadm's failure.
	reason := ""
	for _, r := range []string{ReasonMountBusy, ReasonUnsafePath, ReasonCleanupFailed, ReasonKubeadmResetFailed} {
		for _, f := range failures {
			if f.reason == r && reason == "" {
				reason = r
			}
		}
	}
	errs := make([]error, len(failures))
	for i, f := range failures {
		errs[i] = f.err
	}
	return finish(reason, errors.Join(errs...))
}

// noSymlinkedDir returns ErrSymlink (wrapped, with the path) when one of
// the directories kubeadm reset empties, or a parent, is a symlink; a
// missing one is no obstacle.
func noSymlinkedDir(root paths.Root) error {
	r := root.Path("/") // the root itself ("/" on a node)
	for _, d := range Emptied {
		fd, err := openDir(r, d)
		if err == nil {
			unix.Close(fd)
			continue
		}
		if errors.Is(err, ErrSymlink) {
			return err
		}
	}
	return nil
}

type failure struct {
	reason string
	err    error
}

// clean removes kubeadm's backups and empties the directories.
func clean(root paths.Root) []failure {
	r := root.Path("/") // the root itself ("/" on a node)
	w := &walker{}
	if fd, err := openDir(r, paths.EtcdBackupDir); err == nil {
		if n, err := statxFD(fd); err == nil {
			w.keep = &n.id
		}
		unix.Close(fd)
	}
	var out []failure
	add := func(err error) {
		switch {
		case err == nil:
		case errors.Is(err, ErrSymlink):
			out = append(out, failure{ReasonUnsafePath, fmt.Errorf("%w: nothing under it was removed", err)})
		default:
			out = append(out, failure{ReasonCleanupFailed, err})
		}
	}

	// kubeadm's own backup copies (every Secret, in plaintext): the reset
	// promises to remove them.
	if fd, err := openDir(r, paths.KubeadmTmpDir); err == nil {
		if d, err := statxFD(fd); err != nil {
			add(fmt.Errorf("%s: %w", paths.KubeadmTmpDir, err))
		} else if names, err := readNames(fd); err != nil {
			add(fmt.Errorf("%s: %w", paths.KubeadmTmpDir, err))
		} else {
			for _, name := range names {
				if strings.HasPrefix(name, BackupPrefix) {
					add(w.removeEntry(d, name, paths.KubeadmTmpDir+"/"+name))
				}
			}
		}
		unix.Close(fd)
	} else if !errors.Is(err, os.ErrNotExist) {
		add(err)
	}

	for _, dir := range Emptied {
		fd, err := openDir(r, dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			add(err)
			continue
		}
		add(w.emptyDir(fd, dir))
		unix.Close(fd)
	}
	if len(w.busy) > 0 {
		out = append(out, failure{ReasonMountBusy, fmt.Errorf("mount points left in place (busy): %s; unmount them (umount -R PATH) and run provider-kubernetes reset again",
			strings.Join(w.busy, ", "))})
	}
	if len(w.kept) > 0 {
		out = append(out, failure{ReasonUnsafePath, fmt.Errorf("%s is reachable as %s: kept, not emptied", paths.EtcdBackupDir, strings.Join(w.kept, ", "))})
	}
	return out
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}
