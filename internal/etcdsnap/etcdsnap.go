// Package etcdsnap takes the provider's pre-upgrade etcd snapshot: on the
// control plane that runs kubeadm upgrade apply, with stacked etcd, one
// snapshot per etcd cluster and target minor, written with the bundled
// etcdctl only onto ext4/xfs directly on dm-crypt (internal/cryptgate),
// verified with the bundled etcdutl's snapshot status before it counts. It never fails
// the upgrade: every attempt ends in one Outcome and one log line.
package etcdsnap

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/cryptgate"
	"github.com/kairos-io/provider-kubernetes/internal/etcdclient"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Outcome is how an attempt ended; the strings are the documented contract.
type Outcome string

// Outcomes.
const (
	Taken                        Outcome = "taken"
	SkippedAlreadyTaken          Outcome = "skipped-already-taken"
	SkippedEncryptionUnconfirmed Outcome = "skipped-encryption-unconfirmed"
	SkippedExternalEtcd          Outcome = "skipped-external-etcd"
	SkippedEtcdctlMissing        Outcome = "skipped-etcdctl-missing"
	SkippedInsufficientSpace     Outcome = "skipped-insufficient-space"
	Failed                       Outcome = "failed"
)

// Log events (the constant message of each line).
const (
	Event               = "etcd-snapshot"
	EventVersionWarning = "etcd-version-warning"
)

// Bounds.
const (
	DefaultTotal   = 2 * time.Minute  // the whole attempt
	DefaultRequest = 10 * time.Second // one etcd client request
	SpaceMargin    = 1 << 30          // free space needed beyond twice the database
	maxReason      = 300
)

// Options configure an attempt.
type Options struct {
	Root   paths.Root
	Runner runner.Runner // runs /usr/bin/etcdctl and /usr/bin/etcdutl
	Log    *slog.Logger
	// FS is the stat/statfs seam of the encryption gate; nil is the kernel's.
	FS  cryptgate.FS
	Now func() time.Time
	// Total bounds the attempt (0: ctx's deadline, else DefaultTotal);
	// Request bounds one client request (DefaultRequest).
	Total, Request time.Duration
}

// Result is what an attempt did.
type Result struct {
	Outcome Outcome
	Path    string // host path of the snapshot (taken, skipped-already-taken)
	// Reason says why it was skipped or failed: one sanitized, bounded line.
	Reason string
	// Detail says what was found in the backup directory and not trusted
	// (removed, set aside, the directory moved aside): one sanitized,
	// bounded line, apart from Reason so that neither hides the other.
	Detail string
	// Warnings are etcd-version-warning messages for the status document.
	Warnings []string

	ClusterID uint64
	DBSize    int64
	Revision  int64
	Keys      int
	Hash      uint32
	Pruned    int
	// SaveTook is etcdctl's time, VerifyTook the verification's (taken only).
	SaveTook, VerifyTook time.Duration
}

// Take runs one attempt for target and logs its one line. It never blocks
// longer than Options.Total and never panics out.
func Take(ctx context.Context, o Options, target version.Version) (res Result) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.FS == nil {
		o.FS = cryptgate.RealFS{}
	}
	if o.Total <= 0 {
		// The caller's bound (the pass's etcdSnapshot budget), else two minutes.
		o.Total = DefaultTotal
		if dl, ok := ctx.Deadline(); ok {
			o.Total = time.Until(dl)
		}
	}
	if o.Request <= 0 {
		o.Request = DefaultRequest
	}
	logCtx := ctx // the line is written even when the attempt's bound has passed
	ctx, cancel := context.WithTimeout(ctx, o.Total)
	defer cancel()
	a := &attempt{o: o, target: target}
	defer func() {
		if r := recover(); r != nil {
			res = Result{Outcome: Failed, Reason: fmt.Sprintf("internal error: %v", r)}
		}
		a.close()
		res.Reason = runner.Sanitize(res.Reason, maxReason)
		res.Detail = runner.Sanitize(res.Detail, maxReason)
		a.logLine(logCtx, res)
	}()
	res = a.withNotes(a.run(ctx))
	res.Warnings = a.warnings
	return res
}

func (a *attempt) logLine(ctx context.Context, res Result) {
	attrs := []any{"outcome", string(res.Outcome), "target", a.target.String()}
	level := slog.LevelWarn
	switch res.Outcome {
	case Taken:
		level = slog.LevelInfo
		attrs = append(attrs, "path", res.Path, "cluster_id", fmt.Sprintf("%016x", res.ClusterID), "db_size", res.DBSize,
			"revision", res.Revision, "keys", res.Keys, "hash", fmt.Sprintf("%08x", res.Hash), "pruned", res.Pruned,
			"save", res.SaveTook.Round(time.Millisecond).String(), "verify", res.VerifyTook.Round(time.Millisecond).String())
	case SkippedAlreadyTaken:
		level = slog.LevelInfo
		attrs = append(attrs, "path", res.Path)
	case Failed:
		attrs = append(attrs, "reason", res.Reason)
	default: // a skip: detail= says why, then what was found
		d := res.Reason
		if d != "" && res.Detail != "" {
			d += "; "
		}
		if d += res.Detail; d != "" {
			attrs = append(attrs, "detail", d)
		}
		res.Detail = ""
	}
	if res.Detail != "" { // what was found in the directory and not trusted
		attrs = append(attrs, "detail", res.Detail)
	}
	a.o.Log.Log(ctx, level, Event, attrs...)
}

type attempt struct {
	o        Options
	target   version.Version
	ep       Endpoint
	cli      *etcdclient.Client
	warnings []string
	// dir is the backup directory, opened beneath the root without
	// following a symlink and flocked: every later read, write, removal and
	// the path etcdctl is given go through it, never through the name.
	dir *os.File
	// notes say what was found in the backup directory and not trusted
	// (moved aside or removed): the detail of the outcome line.
	notes []string
	// asides are the snapshots this attempt set aside, by note index: a
	// verified snapshot taken after them prunes them, and their note says so.
	asides map[int]aside
}

type aside struct{ name, why string }

func (a *attempt) close() {
	if a.cli != nil {
		_ = a.cli.Close()
		a.cli = nil
	}
	if a.dir != nil {
		_ = a.dir.Close()
		a.dir = nil
	}
}

func failed(format string, args ...any) Result {
	return Result{Outcome: Failed, Reason: fmt.Sprintf(format, args...)}
}

// withNotes puts what was found and not trusted in the outcome's detail.
func (a *attempt) withNotes(r Result) Result {
	r.Detail = strings.Join(a.notes, "; ")
	return r
}

func (a *attempt) run(ctx context.Context) Result {
	root := a.o.Root
	b, err := fsutil.ReadFileNoFollow(root.Path(paths.EtcdManifest), 1<<20)
	if errors.Is(err, os.ErrNotExist) {
		return Result{Outcome: SkippedExternalEtcd, Reason: paths.EtcdManifest + " does not exist: no stacked etcd on this node"}
	}
	if err != nil {
		return failed("read %s: %s", paths.EtcdManifest, bare(err))
	}
	if a.ep, err = ParseManifest(b); err != nil {
		return failed("%v", err)
	}

	// The version warning does not depend on the snapshot being possible.
	a.checkMemberVersions(ctx)

	// Both bundled tools or nothing: a snapshot etcdutl cannot verify never
	// counts, so it is not worth writing.
	for _, tool := range []string{paths.Etcdctl, paths.Etcdutl} {
		if st, err := os.Stat(root.Path(tool)); errors.Is(err, os.ErrNotExist) {
			return Result{Outcome: SkippedEtcdctlMissing, Reason: tool + " is not in this image"}
		} else if err != nil {
			return failed("stat %s: %s", tool, bare(err))
		} else if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			return Result{Outcome: SkippedEtcdctlMissing, Reason: tool + " is not an executable file"}
		}
	}

	v, res, ok := a.gateAndPrepare()
	if !ok {
		return res
	}

	cli, err := a.client(ctx)
	if err != nil {
		return failed("%v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, a.o.Request)
	st, err := cli.Status(rctx, a.ep.URL)
	cancel()
	if err != nil {
		return failed("etcd status at %s: %v", a.ep.URL, err)
	}
	clusterID, dbSize := st.ClusterID, st.DBSize
	dir := paths.EtcdBackupDir

	// One attempt at a time from here: the existing snapshots are checked,
	// and removed when they do not pass, under the directory's lock.
	if err := a.lock(); err != nil {
		return failed("%v", err)
	}
	a.removeStale()
	existing, err := a.existing(ctx, v, clusterID)
	if err != nil {
		return failed("%v", err)
	}
	if existing != "" {
		return Result{Outcome: SkippedAlreadyTaken, Path: filepath.Join(dir, existing), ClusterID: clusterID, DBSize: dbSize}
	}
	// No snapshot yet, and this node's upgrade apply already began: what
	// etcd holds now is not the clean pre-upgrade state the snapshot
	// promises, so none is taken.
	if started := ApplyStarted(a.target, a.controlPlaneManifests()); started != "" {
		return Result{Outcome: Failed, ClusterID: clusterID, DBSize: dbSize,
			Reason: "the upgrade apply had already started (" + started + ") and no snapshot was taken before it: none is taken from a partially upgraded cluster; take a manual backup"}
	}

	var sf unix.Statfs_t
	if err := unix.Fstatfs(int(a.dir.Fd()), &sf); err != nil {
		return failed("statfs %s: %v", dir, err)
	}
	free := int64(sf.Bavail) * int64(sf.Bsize)
	if need := 2*dbSize + SpaceMargin; free < need {
		return Result{Outcome: SkippedInsufficientSpace, ClusterID: clusterID, DBSize: dbSize,
			Reason: fmt.Sprintf("%d bytes free on %s, %d needed (2 x database %d + 1 GiB)", free, dir, need, dbSize)}
	}

	res = a.save(ctx, v, clusterID)
	res.ClusterID, res.DBSize = clusterID, dbSize
	return res
}

// gateAndPrepare confirms the backup directory is on encrypted storage,
// creating it (0700 root:root) only after its parent was confirmed.
func (a *attempt) gateAndPrepare() (cryptgate.Verdict, Result, bool) {
	root, dir := a.o.Root, paths.EtcdBackupDir
	forbidden := []string{paths.KubernetesDir, paths.EtcdDir}
	if a.ep.DataDir != paths.EtcdDir {
		forbidden = append(forbidden, a.ep.DataDir)
	}
	unconfirmed := func(v cryptgate.Verdict) (cryptgate.Verdict, Result, bool) {
		return v, Result{Outcome: SkippedEncryptionUnconfirmed, Reason: v.Reason}, false
	}
	f := cryptgate.Gather(root, dir, forbidden, a.o.FS)
	if f.Missing == dir {
		pv := cryptgate.Check(root, filepath.Dir(dir), forbidden, a.o.FS)
		if !pv.Confirmed {
			return unconfirmed(pv)
		}
		if err := os.Mkdir(root.Path(dir), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return pv, failed("create %s: %s", dir, bare(err)), false
		}
		f = cryptgate.Gather(root, dir, forbidden, a.o.FS)
	}
	v := cryptgate.Decide(f)
	if !v.Confirmed {
		return unconfirmed(v)
	}
	// Root's alone, 0700: a directory another user owns or can write is
	// never reused as found (it could hold planted files, or have them
	// swapped under the provider): it is moved aside and made fresh, on the
	// same confirmed filesystem, and gated again.
	aside, err := fsutil.EnsureDir(root.Path(dir), 0o700)
	if err != nil {
		return v, failed("%s: %s", dir, bare(err)), false
	}
	if aside != "" {
		a.notes = append(a.notes, fmt.Sprintf("%s was owned by another user or writable by others: moved aside to %s", dir, filepath.Base(aside)))
		if v = cryptgate.Decide(cryptgate.Gather(root, dir, forbidden, a.o.FS)); !v.Confirmed {
			return unconfirmed(v)
		}
	}
	return v, Result{}, true
}

// Snapshot file names: etcd-<cluster id>-v<target minor>-<UTC time>.db.
var snapName = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^etcd-([0-9a-f]{16})-v([0-9]+\.[0-9]+)-([0-9]{8}T[0-9]{6}Z)\.db$`)
})

func (a *attempt) name(clusterID uint64) string {
	return fmt.Sprintf("etcd-%016x-v%d.%d-%s.db", clusterID, a.target.Major, a.target.Minor, a.o.Now().UTC().Format("20060102T150405Z"))
}

// existing returns the name of a snapshot already taken for this cluster
// and target minor that still deserves the name: a regular file, root:root
// 0600 with one link, on the confirmed device, passing the verification a
// new snapshot passes (sha256 trailer, etcdutl snapshot status). One that
// does not never counts (a planted or damaged file must not stop the real
// snapshot from being taken): it is set aside (setAside) and noted for the
// outcome line. An error is returned only when the verification could not
// finish (the attempt's bound): nothing is moved then.
func (a *attempt) existing(ctx context.Context, v cryptgate.Verdict, clusterID uint64) (string, error) {
	ents, err := fsutil.ReadDirAt(a.dir)
	if err != nil {
		return "", fmt.Errorf("read %s: %s", paths.EtcdBackupDir, bare(err))
	}
	want := fmt.Sprintf("%016x", clusterID)
	minor := a.target.MinorOf().String()
	for _, e := range ents {
		m := snapName().FindStringSubmatch(e.Name())
		if m == nil || m[1] != want || m[2] != minor {
			continue
		}
		_, verr := verifyFile(ctx, a.o.Runner, a.o.FS, a.at(e.Name()), a.o.Root.Path(paths.EtcdBackupDir+"/"+e.Name()), v.Dev, true)
		if verr == nil {
			return e.Name(), nil
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("verify the existing %s: %v", e.Name(), verr)
		}
		if err := a.setAside(e.Name(), runner.Sanitize(verr.Error(), 120)); err != nil {
			return "", err
		}
	}
	_ = unix.Fsync(int(a.dir.Fd()))
	return "", nil
}

// Set-aside snapshots: <name>.unverified, why in <name>.reason beside it.
const (
	unverifiedSuffix = ".unverified"
	reasonSuffix     = ".reason"
	// MaxUnverified is how many set-aside snapshots are kept: the newest
	// (by the time in the name). The next verified snapshot prunes them all.
	MaxUnverified = 1
)

// setAside keeps a snapshot that failed its re-verification instead of
// deleting it: once the apply has begun no new one is taken, so it may be
// the only copy of the pre-upgrade state there is (a changed mode, bit rot
// etcdutl or the trailer still lets one read around). It is renamed to
// <name>.unverified, never counts again, and <name>.reason (0600) says why
// and when. Only a regular file is kept: anything else under the name (a
// symlink, a FIFO, a directory) holds no snapshot and is removed, never
// followed. Every step is on names in the held directory.
func (a *attempt) setAside(name, why string) error {
	dfd := int(a.dir.Fd())
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat the unverifiable %s (%s): %v", name, why, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		if err := fsutil.RemoveAllAt(a.dir, name); err != nil {
			return fmt.Errorf("remove the unverifiable %s (%s): %s", name, why, bare(err))
		}
		a.notes = append(a.notes, fmt.Sprintf("removed %s: %s", name, why))
		_ = unix.Fsync(dfd)
		return nil
	}
	to := name + unverifiedSuffix
	err := unix.Renameat2(dfd, name, dfd, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) {
		// The same snapshot set aside before (or something planted under
		// its name): the one found now replaces it.
		if rerr := fsutil.RemoveAllAt(a.dir, to); rerr != nil {
			return fmt.Errorf("set aside the unverifiable %s (%s): %s", name, why, bare(rerr))
		}
		err = unix.Renameat2(dfd, name, dfd, to, unix.RENAME_NOREPLACE)
	}
	if err != nil {
		return fmt.Errorf("set aside the unverifiable %s (%s): %v", name, why, err)
	}
	note := fmt.Sprintf("set aside %s as %s: %s", name, to, why)
	line := fmt.Sprintf("%s did not pass its re-verification at %s (target %s): %s. It never counts as the pre-upgrade snapshot; the next verified snapshot removes it.\n",
		name, a.o.Now().UTC().Format(time.RFC3339), a.target, why)
	if err := fsutil.WriteFileAtomicAt(a.dir, name+reasonSuffix, []byte(line), 0o600); err != nil {
		note += fmt.Sprintf(" (%s not written: %s)", name+reasonSuffix, bare(err))
	}
	if a.asides == nil {
		a.asides = map[int]aside{}
	}
	a.asides[len(a.notes)] = aside{name, why}
	a.notes = append(a.notes, note)
	a.boundAsides()
	_ = unix.Fsync(dfd)
	return nil
}

// asideOf returns the snapshot name a set-aside file or its reason
// belongs to ("" for any other name).
func asideOf(name string) string {
	for _, suffix := range []string{unverifiedSuffix, reasonSuffix} {
		if base, ok := strings.CutSuffix(name, suffix); ok && snapName().MatchString(base) {
			return base
		}
	}
	return ""
}

// boundAsides keeps the newest MaxUnverified set-aside snapshots (by the
// time in their names) and removes the others with their reasons, and any
// reason left without its snapshot. Names are unlinked, never followed.
func (a *attempt) boundAsides() {
	ents, err := fsutil.ReadDirAt(a.dir)
	if err != nil {
		return
	}
	var kept []string
	reasons := map[string]bool{}
	for _, e := range ents {
		base := asideOf(e.Name())
		switch {
		case base == "":
		case strings.HasSuffix(e.Name(), unverifiedSuffix):
			kept = append(kept, base)
		default:
			reasons[base] = true
		}
	}
	when := func(base string) string { return snapName().FindStringSubmatch(base)[3] }
	sort.Slice(kept, func(i, j int) bool {
		if when(kept[i]) != when(kept[j]) {
			return when(kept[i]) > when(kept[j])
		}
		return kept[i] > kept[j]
	})
	dfd := int(a.dir.Fd())
	for i, base := range kept {
		if i < MaxUnverified {
			delete(reasons, base)
			continue
		}
		if unix.Unlinkat(dfd, base+unverifiedSuffix, 0) == nil {
			a.notes = append(a.notes, fmt.Sprintf("removed the older set-aside %s (at most %d kept)", base+unverifiedSuffix, MaxUnverified))
		}
	}
	for base := range reasons {
		_ = unix.Unlinkat(dfd, base+reasonSuffix, 0)
	}
}

// at is name in the held backup directory, as a path any process (etcdctl,
// etcdutl, the provider itself) resolves through the handle, not the name.
func (a *attempt) at(name string) string {
	return fsutil.HandlePath(a.dir) + "/" + name
}

// stillAt confirms the backup directory's name still leads to the held
// directory: a swap (a symlink put at the name, the directory moved away)
// means what was written there is not where the name says.
func (a *attempt) stillAt() error {
	now, err := fsutil.OpenDirNoFollow(string(a.o.Root), paths.EtcdBackupDir)
	if err != nil {
		return fmt.Errorf("%s was replaced during the attempt: %s", paths.EtcdBackupDir, bare(err))
	}
	defer now.Close()
	var x, y unix.Stat_t
	if err := unix.Fstat(int(a.dir.Fd()), &x); err != nil {
		return err
	}
	if err := unix.Fstat(int(now.Fd()), &y); err != nil {
		return err
	}
	if x.Dev != y.Dev || x.Ino != y.Ino {
		return fmt.Errorf("%s was replaced during the attempt by another directory", paths.EtcdBackupDir)
	}
	return nil
}

// controlPlaneManifests reads this node's etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler manifests (those that can be
// read) by component: what ApplyStarted looks at.
func (a *attempt) controlPlaneManifests() map[string][]byte {
	out := map[string][]byte{}
	for _, c := range applyOrder {
		if b, err := fsutil.ReadFileNoFollow(a.o.Root.Path(paths.ManifestsDir+"/"+c+".yaml"), 1<<20); err == nil {
			out[c] = b
		}
	}
	return out
}

// applyOrder is the order in which kubeadm upgrade apply replaces this
// node's static pod manifests (cmd/kubeadm/app/phases/upgrade/staticpods.go,
// StaticPodControlPlane: the local etcd first, waited for, then
// constants.ControlPlaneComponents).
var applyOrder = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// ApplyStarted says whether an upgrade apply to target already began on
// this control plane, from its static pod manifests by component (etcd
// only with stacked etcd: external etcd has no manifest). kubeadm replaces
// etcd.yaml first and waits for the new member before it touches the
// others, so a cut in that window leaves only etcd at the target: etcd.yaml
// at the etcd image target's kubeadm deploys (images/versions.yaml) counts,
// as does any of the other three at target's minor or later. etcd.yaml says
// nothing when that image is not known to differ from the one the minor
// before deploys: the same tag on both sides (kubeadm then leaves etcd
// as it is), or a minor before the window, whose etcd the version manifest
// does not know (kubeadm 1.35.4 lists 3.6.6-0 for 1.34 as for 1.35). It
// returns what shows it ("" when nothing does).
func ApplyStarted(target version.Version, manifests map[string][]byte) string {
	for _, c := range applyOrder {
		b, ok := manifests[c]
		if !ok {
			continue
		}
		img, err := observe.ManifestImage(b, c)
		if err != nil {
			continue
		}
		tag := observe.ImageTag(img)
		if c == "etcd" {
			if want, ok := etcdMoves(target); ok && tag == want {
				return fmt.Sprintf("this node's etcd manifest already runs %s, the etcd of %s (kubeadm replaces it first)", tag, target.MinorOf())
			}
			continue
		}
		v, err := version.ParseReported(tag)
		if err != nil {
			continue
		}
		if v.Major == target.Major && v.Minor >= target.Minor {
			return fmt.Sprintf("this node's %s manifest already runs %s", c, v)
		}
	}
	return ""
}

// etcdMoves returns the etcd image tag the kubeadm of target's minor
// deploys, when the version manifest shows it differs from the minor
// before's: only then does etcd.yaml at that tag mean the apply began.
func etcdMoves(target version.Version) (string, bool) {
	to, ok := images.ForMinor(target.MinorOf())
	if !ok || target.Minor == 0 {
		return "", false
	}
	from, ok := images.ForMinor(version.Minor{Major: target.Major, Minor: target.Minor - 1})
	if !ok || from.Etcd == to.Etcd {
		return "", false
	}
	return to.Etcd, true
}

// lock serialises attempts (the reconcile pass and the etcd-snapshot
// command) with a flock on the directory itself.
func (a *attempt) lock() error {
	d, err := fsutil.OpenDirNoFollow(string(a.o.Root), paths.EtcdBackupDir)
	if err != nil {
		return fmt.Errorf("open %s: %w", paths.EtcdBackupDir, err)
	}
	fd := int(d.Fd())
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = d.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return errors.New("another etcd snapshot is being taken on this node")
		}
		return fmt.Errorf("flock %s: %w", paths.EtcdBackupDir, err)
	}
	a.dir = d
	return nil
}

// removeStale removes .part files a crash left (they are on the same
// encrypted storage; they never counted).
func (a *attempt) removeStale() {
	ents, err := fsutil.ReadDirAt(a.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "etcd-") && strings.HasSuffix(e.Name(), ".part") && !e.IsDir() {
			_ = unix.Unlinkat(int(a.dir.Fd()), e.Name(), 0)
		}
	}
}

// save runs etcdctl snapshot save into a .part file, verifies it, makes it
// 0600 root:root, renames it to its final name and prunes older snapshots.
func (a *attempt) save(ctx context.Context, v cryptgate.Verdict, clusterID uint64) Result {
	root := a.o.Root
	finalName := a.name(clusterID)
	final := filepath.Join(paths.EtcdBackupDir, finalName)
	part := final + ".part"
	partName := finalName + ".part"
	// etcdctl, etcdutl and the provider reach the file through the held
	// directory (/proc/<pid>/fd/<n>/...), never through the name, which a
	// wrapper or another user's process could swap for a symlink meanwhile.
	fullPart := a.at(partName)
	dfd := int(a.dir.Fd())
	cleanup := func() {
		_ = unix.Unlinkat(dfd, partName, 0)
		_ = unix.Unlinkat(dfd, partName+".part", 0) // etcdctl's own temporary name
	}

	deadline, _ := ctx.Deadline()
	left := time.Until(deadline)
	reserve := min(30*time.Second, left/4)
	budget := left - reserve
	if budget < time.Second {
		return failed("no time left for etcdctl within the %s bound", a.o.Total)
	}
	dial := min(10*time.Second, budget)
	args := []string{
		"--endpoints=" + a.ep.URL,
		"--cacert=" + root.Path(a.ep.CA), "--cert=" + root.Path(a.ep.Cert), "--key=" + root.Path(a.ep.Key),
		fmt.Sprintf("--dial-timeout=%ds", int(dial.Seconds())), fmt.Sprintf("--command-timeout=%ds", int(budget.Seconds())),
		"snapshot", "save", fullPart,
	}
	t0 := time.Now()
	stopWriteBehind := writeBehind(fullPart + ".part") // etcdctl writes there, then renames
	_, err := a.o.Runner.Run(ctx, runner.Cmd{Path: paths.Etcdctl, Args: args, Timeout: budget})
	stopWriteBehind()
	if err != nil {
		cleanup()
		return failed("etcdctl snapshot save: %v", err)
	}
	t1 := time.Now()
	// The name must still lead to the held directory before the gate's
	// device check (made by host path) and the verification mean anything.
	if err := a.stillAt(); err != nil {
		cleanup()
		return failed("%v: the snapshot does not count", err)
	}
	st, err := verifyFile(ctx, a.o.Runner, a.o.FS, fullPart, root.Path(part), v.Dev, false)
	if err != nil {
		cleanup()
		return failed("verify snapshot: %v", err)
	}
	if err := a.checkKeyCount(ctx, st.Revision, st.Keys); err != nil {
		cleanup()
		return failed("verify snapshot: %v", err)
	}
	if err := Commit(a.dir, partName, finalName); err != nil {
		cleanup()
		return failed("%v", err)
	}
	if err := a.stillAt(); err != nil {
		_ = unix.Unlinkat(dfd, finalName, 0)
		return failed("%v: the snapshot does not count", err)
	}
	res := Result{Outcome: Taken, Path: final, Revision: st.Revision, Keys: st.Keys, Hash: st.Hash,
		SaveTook: t1.Sub(t0), VerifyTook: time.Since(t1)}
	res.Pruned = a.prune(filepath.Base(final))
	return res
}

// Commit is the atomic end of a save, in the held directory dir: the
// verified partName is made 0600 root:root and durable (fsync), renamed to
// finalName (never over an existing file) and the rename made durable (the
// directory's fsync). A power cut at any point leaves either no finalName
// or the whole snapshot there (tests/powercut cuts a real kernel's disk
// during it). On failure partName is left for the caller to remove.
func Commit(dir *os.File, partName, finalName string) error {
	if err := seal(fsutil.HandlePath(dir) + "/" + partName); err != nil {
		return err
	}
	dfd := int(dir.Fd())
	if err := unix.Renameat2(dfd, partName, dfd, finalName, unix.RENAME_NOREPLACE); err != nil {
		return fmt.Errorf("rename %s: %w", filepath.Join(dir.Name(), partName), err)
	}
	_ = unix.Fsync(dfd)
	return nil
}

// seal makes the verified file 0600 root:root and durable.
func seal(p string) error {
	f, err := fsutil.OpenRegular(p)
	if err != nil {
		return fmt.Errorf("open snapshot: %w", err)
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := unix.Fchown(fd, 0, 0); err != nil {
		return fmt.Errorf("chown snapshot: %w", err)
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return fmt.Errorf("chmod snapshot: %w", err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("fsync snapshot: %w", err)
	}
	return nil
}

func syncDir(dir string) { fsutil.SyncDir(dir) }

// prune removes every other snapshot file (older targets, other clusters)
// and every set-aside one with its reason, now that a new one is verified.
// Only regular files with our names. It returns how many snapshots (set
// aside or not) it removed.
func (a *attempt) prune(keep string) int {
	ents, err := fsutil.ReadDirAt(a.dir)
	if err != nil {
		return 0
	}
	n, removed := 0, map[string]bool{}
	for _, e := range ents {
		name := e.Name()
		if name == keep || !e.Type().IsRegular() || !snapName().MatchString(name) && asideOf(name) == "" {
			continue
		}
		if unix.Unlinkat(int(a.dir.Fd()), name, 0) == nil && !strings.HasSuffix(name, reasonSuffix) {
			n++
			removed[name] = true
		}
	}
	if n > 0 {
		_ = unix.Fsync(int(a.dir.Fd()))
	}
	// What this attempt set aside is gone too: a verified snapshot replaced it.
	for i, x := range a.asides {
		if removed[x.name+unverifiedSuffix] {
			a.notes[i] = fmt.Sprintf("removed %s: %s (the new snapshot replaces it)", x.name, x.why)
		}
	}
	return n
}

// client connects with the healthcheck-client certificate, read without
// following symlinks.
func (a *attempt) client(ctx context.Context) (*etcdclient.Client, error) {
	if a.cli != nil {
		return a.cli, nil
	}
	root := a.o.Root
	read := func(p string) ([]byte, error) {
		b, err := fsutil.ReadFileNoFollow(root.Path(p), 1<<20)
		if err != nil {
			return nil, fmt.Errorf("read %s: %s", p, bare(err))
		}
		return b, nil
	}
	ca, err := read(a.ep.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s holds no PEM certificate", a.ep.CA)
	}
	cert, err := read(a.ep.Cert)
	if err != nil {
		return nil, err
	}
	key, err := read(a.ep.Key)
	if err != nil {
		return nil, err
	}
	kp, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("healthcheck-client certificate and key (%s): unusable", a.ep.Cert)
	}
	cli := etcdclient.New(a.ep.URL, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS12}, a.o.Request)
	a.cli = cli
	return cli, nil
}

// checkMemberVersions warns, before an upgrade whose etcd has a member
// version rule (3.7 asks for 3.6.11), about every member below it.
func (a *attempt) checkMemberVersions(ctx context.Context) {
	entry, ok := images.ForMinor(a.target.MinorOf())
	if !ok {
		return
	}
	min, ok := VersionRule(entry.Etcd)
	if !ok {
		return
	}
	members, err := a.memberVersions(ctx)
	var lagging []string
	if err != nil {
		lagging = []string{"(member list unreadable: " + runner.Sanitize(err.Error(), 120) + ")"}
	} else {
		lagging = Lagging(entry.Etcd, members)
	}
	if len(lagging) == 0 {
		return
	}
	msg := VersionWarning(a.target.String(), entry.Etcd, lagging)
	a.warnings = append(a.warnings, msg)
	a.o.Log.Warn(EventVersionWarning, "members", strings.Join(lagging, ","), "minimum", min,
		"target", a.target.String(), "target_etcd", entry.Etcd, "message", msg)
}

// memberVersions reads every member's binary version (Maintenance.Status
// against each member's first client URL).
func (a *attempt) memberVersions(ctx context.Context) ([]Member, error) {
	cli, err := a.client(ctx)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, a.o.Request)
	defer cancel()
	members, err := cli.MemberList(rctx, true)
	if err != nil {
		return nil, fmt.Errorf("member list: %w", err)
	}
	out := make([]Member, len(members))
	type answer struct {
		i int
		v string
	}
	ch := make(chan answer, len(members))
	for i, m := range members {
		name := m.Name
		if name == "" {
			name = fmt.Sprintf("%016x", m.ID)
		}
		out[i].Name = name
		if len(m.ClientURLs) == 0 {
			ch <- answer{i, ""}
			continue
		}
		go func(i int, u string) {
			sctx, cancel := context.WithTimeout(ctx, a.o.Request)
			defer cancel()
			st, err := cli.Status(sctx, u)
			if err != nil {
				ch <- answer{i, ""}
				return
			}
			ch <- answer{i, st.Version}
		}(i, m.ClientURLs[0])
	}
	for range members {
		r := <-ch
		out[r.i].Version = r.v
	}
	return out, nil
}

// checkKeyCount compares the snapshot's key count with the cluster's at the
// snapshot's revision. A revision compacted meanwhile cannot be compared.
func (a *attempt) checkKeyCount(ctx context.Context, rev int64, keys int) error {
	if rev == 0 {
		return nil // an empty keyspace: nothing to compare at
	}
	rctx, cancel := context.WithTimeout(ctx, a.o.Request)
	defer cancel()
	count, err := a.cli.CountAll(rctx, rev, true)
	if err != nil {
		if etcdclient.IsCompacted(err) {
			return nil
		}
		return fmt.Errorf("count keys at revision %d: %w", rev, err)
	}
	if count != int64(keys) {
		return fmt.Errorf("the snapshot holds %d keys at revision %d, etcd has %d", keys, rev, count)
	}
	return nil
}

// bare drops the root-based path from a path error.
func bare(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}
