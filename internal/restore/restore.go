package restore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// Event is the log line's message; PhaseRestored the status phase a
// restore leaves until the next reconcile pass.
const (
	Event         = "restore-etcd"
	PhaseRestored = "EtcdRestored"
)

// Bounds.
const (
	DefaultVersionTimeout = 30 * time.Second // etcdutl version
	DefaultStatusTimeout  = 5 * time.Minute  // etcdutl snapshot status (walks the whole database)
	DefaultRestoreTimeout = 15 * time.Minute // etcdutl snapshot restore (copies it, checks its hash, writes the WAL)
	DefaultDialTimeout    = 2 * time.Second  // one probe of one of etcd's ports
	// Bound is the whole command's: every step above with room to spare.
	Bound = 25 * time.Minute
)

// Options configure a restore.
type Options struct {
	Root   paths.Root
	Runner runner.Runner // runs /usr/bin/etcdutl
	Log    *slog.Logger
	Now    func() time.Time

	VersionTimeout, StatusTimeout, RestoreTimeout, DialTimeout time.Duration
}

func (o Options) versionTimeout() time.Duration {
	return orDefault(o.VersionTimeout, DefaultVersionTimeout)
}
func (o Options) statusTimeout() time.Duration {
	return orDefault(o.StatusTimeout, DefaultStatusTimeout)
}
func (o Options) restoreTimeout() time.Duration {
	return orDefault(o.RestoreTimeout, DefaultRestoreTimeout)
}
func (o Options) dialTimeout() time.Duration { return orDefault(o.DialTimeout, DefaultDialTimeout) }

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Result is what a run did.
type Result struct {
	Plan Plan
	// Preview: not confirmed (--yes), the plan was only shown.
	Preview bool
	// Restored: the member was restored (also when writing the status failed after).
	Restored bool
	ExitCode int
	// Err is why it was refused (a sentinel of Decide's, joined) or failed.
	Err error
}

// Run restores this node's member: gather, decide, and only when yes,
// execute. Without yes nothing is changed and the plan is returned for
// showing (exit code usage, like reset without --yes).
func Run(ctx context.Context, o Options, r Request, yes bool) Result {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	r.Now = o.Now()
	if r.Token == "" {
		r.Token, r.TokenGenerated = newToken(), true
	}
	ctx, cancel := context.WithTimeout(ctx, Bound)
	defer cancel()

	if yes {
		unlock, err := reconcile.Lock(o.Root)
		if errors.Is(err, reconcile.ErrLocked) {
			return refused(o, fmt.Errorf("%w: wait for it to finish (journalctl -u %s)", ErrBusy, paths.ReconcileUnit))
		}
		if err != nil {
			return failed(o, Plan{}, fmt.Errorf("take the reconcile lock: %w", err))
		}
		defer unlock()
	}

	facts, h := gather(ctx, o, r)
	defer h.close()
	p, err := Decide(facts, r)
	if err != nil {
		return refused(o, err)
	}
	if !yes {
		return Result{Plan: p, Preview: true, ExitCode: reconcile.ExitUsage}
	}
	swapped, err := execute(ctx, o, p, h)
	if !swapped {
		if errors.Is(err, ErrSnapshot) {
			return refused(o, err)
		}
		return failed(o, p, err)
	}
	// The restored member is in place. The provider's own records go back
	// with the data, also when tidying up after the swap failed.
	verified, verr := resetVerified(o.Root, p)
	serr := status.Write(o.Root, statusDoc(o, p, verified))
	if verr != nil || serr != nil {
		err = errors.Join(err, fmt.Errorf("the provider's records were not reset (the next boot may act on the version the restore undid): %w", errors.Join(verr, serr)))
	}
	if err != nil {
		res := failed(o, p, fmt.Errorf("restored, but: %w", err))
		res.Restored = true
		return res
	}
	o.Log.Info(Event, "outcome", "restored", "member", p.Member.Name, "data_dir", p.Member.DataDir, "aside", p.Aside,
		"snapshot", p.SnapshotPath, "revision", p.Snapshot.Revision, "keys", p.Snapshot.Keys, "members", strings.Join(p.Members, ","),
		"node_version", p.Version.String(), "verified", verified)
	return Result{Plan: p, Restored: true, ExitCode: reconcile.ExitOK}
}

func refused(o Options, err error) Result {
	o.Log.Warn(Event, "outcome", "refused", "reason", runner.Sanitize(err.Error(), 2000))
	return Result{ExitCode: reconcile.ExitRefused, Err: err}
}

func failed(o Options, p Plan, err error) Result {
	o.Log.Error(Event, "outcome", "failed", "member", p.Member.Name, "error", runner.Sanitize(err.Error(), 2000))
	return Result{Plan: p, ExitCode: reconcile.ExitFailed, Err: err}
}

// newToken is a fresh --initial-cluster-token.
func newToken() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return "etcd-restore-" + hex.EncodeToString(b)
}

// execute restores into a fresh directory inside the data dir, and only
// when etcdutl succeeded moves the old member directory aside and the
// restored one into its place: two renames on one filesystem, never a
// deletion of anything that was there before. swapped says the restored
// member is in place (an error then is about tidying up after).
func execute(ctx context.Context, o Options, p Plan, h *held) (swapped bool, err error) {
	if err := swap(ctx, o, p, h); err != nil {
		return false, err
	}
	dfd := int(h.dataDir.Fd())
	var errs []error
	if err := unix.Unlinkat(dfd, path.Base(p.Staging), unix.AT_REMOVEDIR); err != nil {
		errs = append(errs, fmt.Errorf("remove the emptied %s: %w", p.Staging, err))
	}
	if err := fixOwnership(o.Root, p, dfd); err != nil {
		errs = append(errs, err)
	}
	if err := unix.Fsync(dfd); err != nil {
		errs = append(errs, fmt.Errorf("fsync %s: %w", p.Member.DataDir, err))
	}
	return true, errors.Join(errs...)
}

// swap is the restore proper: etcdutl into the staging directory, then the
// two renames. On any error nothing that was there before has changed
// (its own staging directory is removed, the old member is back).
func swap(ctx context.Context, o Options, p Plan, h *held) error {
	dfd := int(h.dataDir.Fd())
	staging, aside := path.Base(p.Staging), path.Base(p.Aside)
	if err := unix.Mkdirat(dfd, staging, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", p.Staging, err)
	}
	// Only what this run created is ever removed: its own staging directory.
	// Through the held data directory's handle, never across a mount point.
	dropStaging := func() { _ = fsutil.RemoveAllAt(h.dataDir, staging) }
	_, err := o.Runner.Run(ctx, runner.Cmd{Path: paths.Etcdutl, Args: p.RestoreArgs(o.Root), Timeout: o.restoreTimeout(), Stdin: h.snap})
	if err != nil {
		dropStaging()
		var ee *runner.ExitError
		if errors.As(err, &ee) && (strings.Contains(ee.Tail, "sha256") || strings.Contains(ee.Tail, "hash")) {
			return fmt.Errorf("%w: %s: %s (nothing changed)", ErrSnapshot, p.SnapshotPath, ee.Error())
		}
		return fmt.Errorf("restore into %s: %w (nothing changed)", p.Staging, err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, staging+"/member", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		dropStaging()
		return fmt.Errorf("etcdutl left no member directory in %s (nothing changed)", p.Staging)
	}
	if p.Aside != "" {
		if err := unix.Renameat2(dfd, "member", dfd, aside, unix.RENAME_NOREPLACE); err != nil {
			dropStaging()
			return fmt.Errorf("move %s/member aside to %s: %w (nothing changed)", p.Member.DataDir, p.Aside, err)
		}
	}
	if err := unix.Renameat2(dfd, staging+"/member", dfd, "member", unix.RENAME_NOREPLACE); err != nil {
		err = fmt.Errorf("move the restored member into %s/member: %w", p.Member.DataDir, err)
		if p.Aside != "" {
			if berr := unix.Renameat2(dfd, aside, dfd, "member", unix.RENAME_NOREPLACE); berr != nil {
				return fmt.Errorf("%w; and moving the old one back failed too, it is at %s: %v", err, p.Aside, berr)
			}
		}
		dropStaging()
		return fmt.Errorf("%w (the old member directory is back in place)", err)
	}
	return nil
}

// fixOwnership leaves the restored member as etcd needs it: the data dir
// and member directory 0700, and everything owned by the data dir's owner
// (root on a kubeadm node; etcdutl ran as root).
func fixOwnership(root paths.Root, p Plan, dfd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return fmt.Errorf("fstat %s: %w", p.Member.DataDir, err)
	}
	if int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid() {
		// WalkDir never follows a symlink; Lchown changes a link, not its target.
		err := filepath.WalkDir(root.Path(p.Member.DataDir+"/member"), func(q string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(q, int(st.Uid), int(st.Gid))
		})
		if err != nil {
			return fmt.Errorf("give the restored member to uid %d: %w", st.Uid, err)
		}
	}
	if err := unix.Fchmodat(dfd, "member", 0o700, 0); err != nil {
		return fmt.Errorf("chmod %s/member: %w", p.Member.DataDir, err)
	}
	if err := unix.Fchmod(dfd, 0o700); err != nil {
		return fmt.Errorf("chmod %s: %w", p.Member.DataDir, err)
	}
	return nil
}

// resetVerified keeps the provider's verified-version record (written by
// a pass after it verified the node) from claiming a version newer than
// the one the restored node runs: rolled back to v1.36.3 with a record of
// v1.37.2, a crash in the retried upgrade between kubeadm and the kubelet
// restart would be taken for converged (the plan finishes an upgrade only
// when the record is older than the pin). A newer record is set to the
// version of the manifests that go back, the version the node was at when
// the snapshot was taken; an older or equal one, or none, is left. It
// returns the record as it now is ("" when there is none).
func resetVerified(root paths.Root, p Plan) (string, error) {
	v, err := (&observe.Observer{Root: root}).VerifiedVersion()
	if err != nil {
		return "", err
	}
	if p.Version.IsZero() || !p.Version.Less(v) {
		if v.IsZero() {
			return "", nil
		}
		return v.String(), nil
	}
	if err := fsutil.WriteFileAtomic(root.Path(paths.VerifiedRecord), []byte(p.Version.String()+"\n"), 0o644); err != nil {
		return v.String(), fmt.Errorf("set %s back to %s: %w", paths.VerifiedRecord, p.Version, err)
	}
	return p.Version.String(), nil
}

// statusDoc is the status a restore leaves: this node is a control plane
// member at the version of the manifests that will be put back. The
// persistent mirror is what a node without a kube-apiserver manifest reads
// its version from (observe.WorkerVersion): left at the version the
// restore undid, a boot before the manifests are back would see a
// downgrade and refuse.
func statusDoc(o Options, p Plan, verified string) status.Document {
	d := status.Document{Phase: PhaseRestored, Member: true, Role: "controlplane", LastAction: Event,
		VerifiedVersion: verified, Time: o.Now().UTC().Format(time.RFC3339)}
	if !p.Version.IsZero() {
		d.NodeVersion = p.Version.String()
	}
	if b, err := fsutil.ReadFileNoFollow(o.Root.Path(paths.BootID), 64<<10); err == nil {
		d.BootID = strings.TrimSpace(string(b))
	}
	old := "there was no member directory"
	if p.Aside != "" {
		old = "the old member directory is " + p.Aside
	}
	d.Message = fmt.Sprintf("etcd member %s restored from %s (revision %d, %d keys) as one of %s with the cluster token %s; %s. "+
		"Once every member is restored, put the manifests back from %s",
		p.Member.Name, p.SnapshotPath, p.Snapshot.Revision, p.Snapshot.Keys, p.InitialCluster, p.Token, old, p.Manifests)
	return d
}
