// Package reconcile is the boot-time pass: observe, decide, act, report.
// The decision is pkg/plan's; this package only carries it out within bounds
// and reports one log line per event and a status document.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/imageimport"
	"github.com/kairos-io/provider-kubernetes/internal/kubeadmbackup"
	"github.com/kairos-io/provider-kubernetes/internal/metrics"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Exit codes of the reconcile and plan commands.
const (
	ExitOK      = 0
	ExitFailed  = 1
	ExitUsage   = 2
	ExitRefused = 3
)

// Events: the constant message of each log line.
const (
	EventStart          = "reconcile-start"
	EventPlan           = "plan"
	EventWarning        = "plan-warning"
	EventRefuseUpgrade  = "refuse-upgrade"
	EventRefuseBoot     = "refuse-bootstrap"
	EventDone           = "reconcile-done"
	EventStatusFailed   = "status-write-failed"
	EventMetricsFailed  = "metrics-write-failed"
	EventStepUnavailble = "step-unavailable"
	EventObserve        = "observe"
	EventVerifiedRecord = "verified-record"
)

// Failure reasons in the status document.
const (
	ReasonKubeadmFailed           = "KubeadmFailed"
	ReasonKubeletRestartFailed    = "KubeletRestartFailed"
	ReasonHealthGateTimeout       = "HealthGateTimeout"
	ReasonControlPlaneNotUpgraded = "ControlPlaneNotUpgraded"
	ReasonClusterVersionUnknown   = "ClusterVersionUnknown"
	ReasonRepairFailed            = "KubeletRepairFailed"
	ReasonBootstrapUnavailable    = "BootstrapUnavailable"
	ReasonBootstrapFailed         = "BootstrapFailed"
	ReasonConfigFailed            = "ConfigInvalid"
	// ReasonNoTimeLeft: the waits before a kubeadm upgrade (repair, turn,
	// health) left less of the pass than kubeadm and the kubelet restart
	// need, so kubeadm was not started rather than cut by the pass's end.
	ReasonNoTimeLeft = "NoTimeLeftForUpgrade"
	// ReasonInterrupted: SIGTERM or SIGINT ended the pass (its context was
	// cancelled, the running command killed with its process group).
	ReasonInterrupted = "Interrupted"
	// ReasonImagesMissing: before a kubeadm action, an image the booted
	// image bundles was not in containerd and could not be imported again,
	// so kubeadm was not started (it checks no image under
	// imagePullPolicy Never, and an air-gapped node cannot pull one).
	ReasonImagesMissing = "BundledImagesMissing"
)

// ErrLocked is returned when another pass holds the lock.
var ErrLocked = errors.New("another reconcile pass is running on this node (reconcile.lock is held)")

// Steps are the seams for the steps other packages own. A nil step is
// reported as unavailable; the pass goes on where the contract allows it.
type Steps struct {
	// EtcdSnapshot runs before upgrade apply. It never fails the pass: it
	// returns the outcome and any warnings for the status document, and
	// logs its own one line per attempt.
	EtcdSnapshot func(ctx context.Context, target version.Version) SnapshotReport
	// RepairKubelet runs kubeadm init phase kubelet-start when the kubelet
	// or local API is down after the A/B swap. It returns warnings for the
	// status document (removed kubelet flags it cannot fix).
	RepairKubelet func(ctx context.Context, obs Observation) ([]string, error)
	// Bootstrap runs kubeadm init or join for a non-member.
	Bootstrap func(ctx context.Context, action plan.Action, obs Observation) error
	// Images runs just before each kubeadm action (init, join, upgrade
	// apply, upgrade node): the images the booted image bundles must be in
	// containerd (the kubelet's image GC may have removed one since the
	// boot's import), imported again if not; its error names those that
	// are not. pin is providerConfig's images.pin: false pins nothing and
	// takes off the pins set earlier. nil: not checked.
	Images func(ctx context.Context, pin bool) error
	// ReleasePins runs early in every pass whose providerConfig turns the
	// bundled images' pins off (images.pin: "false"): it takes off the
	// pins the boot's import-images set, which cannot read the setting. It
	// never fails the pass; it logs its own line. nil: not run.
	ReleasePins func(ctx context.Context)
}

// SnapshotReport is what the etcd snapshot step reports.
type SnapshotReport struct {
	Outcome  string   // taken, skipped-..., failed
	Warnings []string // e.g. etcd members below the version the target's etcd asks for
}

// Options configure a pass. Everything the pass touches comes from here.
type Options struct {
	Root        paths.Root
	ClusterFile string
	Runner      runner.Runner
	Clock       wait.Clock
	Log         *slog.Logger
	Budgets     Budgets
	Steps       Steps
	Now         func() time.Time
	// EtcdHealthy is one attempt at "every etcd member is healthy"; nil
	// uses the real check through the node's etcd client certificate.
	EtcdHealthy func(ctx context.Context) error
	// LocalAPIReady is one attempt at "the local apiserver is back after
	// the static pods restarted"; nil uses the real check (its /readyz,
	// serving the certificate on disk).
	LocalAPIReady func(ctx context.Context) error
	// Listening is the local TCP ports that listen, as the static pods'
	// restart watches them; nil reads /proc/net (staticpods.Listening).
	Listening func() (map[int]bool, error)
}

// Result is the outcome of a pass.
type Result struct {
	Plan     plan.Plan
	Status   status.Document
	ExitCode int
	Err      error
}

type pass struct {
	Options
	obs *observe.Observer
	doc status.Document
	// notes are warnings learned while acting (no CNI yet, removed kubelet
	// flags, etcd members below the version the target's etcd asks for),
	// kept in the status next to the plan's.
	notes []string
	// repaired is set once the kubelet repair step ran in this pass.
	repaired bool
	// kubeletRestarted is when this pass last restarted the kubelet (its
	// restart or repair step began; zero when it did not): verify trusts
	// only a Ready condition posted since.
	kubeletRestarted time.Time
	// events are what this pass tells on its Node (see status.Event).
	events []status.Event
	// last is the status mirror as this pass found it (the last known
	// facts, nil when there is none to trust): what a failed read carries
	// forward instead of "unknown" or "not a member".
	last *status.Document
	// raised: this control plane published Upgrading on its Node (its turn
	// flag, see plan.DecideTurn); it stays up until the publish unit puts
	// the pass's outcome there.
	raised bool
	// redecided: the pass decided again once after its cluster moved.
	redecided bool
	// certsRead: the certificates were read in this pass (once, at its end).
	certsRead bool
	// metricsDir is the metrics textfile's directory ("" turned off);
	// metricsFailed: its write failed once in this pass (logged once).
	metricsDir    string
	metricsFailed bool
	// pin is providerConfig's images.pin (true unless "false").
	pin bool
	// renewed says what a certificate renewal of this pass did (its Event).
	renewed string
}

// event records one Event of this pass for the Node (published after it).
func (p *pass) event(eventType, reason, message string) {
	p.events = append(p.events, status.Event{Type: eventType, Reason: reason, Message: runner.Sanitize(message, 1000),
		Time: p.Now().UTC().Format(time.RFC3339)})
}

// upgrading reports whether a plan upgrades this node.
func upgrading(pl plan.Plan) bool {
	return pl.Has(plan.ActionUpgradeApply) || pl.Has(plan.ActionUpgradeNode) || pl.Has(plan.ActionRestartKubelet)
}

// Run runs one pass.
func Run(ctx context.Context, opts Options) Result {
	if opts.Clock == nil {
		opts.Clock = wait.RealClock{}
	}
	if opts.Now == nil {
		opts.Now = opts.Clock.Now
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Budgets == (Budgets{}) {
		opts.Budgets = DefaultBudgets()
	}
	unlock, err := Lock(opts.Root)
	if err != nil {
		opts.Log.Error(EventDone, "outcome", "locked", "error", err.Error())
		return Result{ExitCode: ExitFailed, Err: err}
	}
	defer unlock()

	p := &pass{Options: opts, metricsDir: metrics.DefaultDir, pin: true}
	// Before anything is observed: a pass killed while it restarted the
	// static pods left their manifests parked.
	p.restoreParked()
	p.obs = &observe.Observer{Root: opts.Root, ClusterFile: opts.ClusterFile, Runner: opts.Runner, Clock: opts.Clock,
		APITimeout: opts.Budgets.APIRequest, Log: opts.Log}
	p.doc.BootID = p.obs.BootID()
	// Read before this pass writes anything: the facts the node knew.
	if d, err := status.ReadTrusted(opts.Root, paths.StatusMirror); err == nil {
		p.last = &d
		// What the node knew of its certificates until this pass reads them.
		p.doc.Certificates = d.Certificates
	} else if !errors.Is(err, os.ErrNotExist) {
		opts.Log.Warn(EventObserve, "note", runner.Sanitize("last known status: "+err.Error(), 400))
	}
	p.Log.Info(EventStart, "boot_id", p.doc.BootID, "window", images.Window().String())
	return p.run(ctx)
}

// WriteVerified records v as the version this node was last verified at
// (paths.VerifiedRecord, atomically: tests/powercut cuts a real kernel's
// disk during it).
func WriteVerified(root paths.Root, v version.Version) error {
	full := root.Path(paths.VerifiedRecord)
	if err := fsutil.MkdirAllMode(filepath.Dir(full), 0o755); err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(full, []byte(v.String()+"\n"), 0o644)
}

// Lock takes the per-node pass lock (flock on /run/provider-kubernetes/reconcile.lock).
// The directory must be root's (fsutil.EnsureDir); a lock file found
// loose or another user's is replaced by a new one (fsutil.OpenOwned), so
// the lock is held on the file the name now points to: checked after the
// flock, and taken again when a concurrent replacement moved the name.
func Lock(root paths.Root) (func(), error) {
	lp := root.Path(paths.LockFile)
	if err := fsutil.MkdirAllMode(filepath.Dir(lp), 0o755); err != nil {
		return nil, fmt.Errorf("lock dir: %w", err)
	}
	for attempt := 0; ; attempt++ {
		f, err := fsutil.OpenOwned(lp, unix.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("lock file: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, ErrLocked
			}
			return nil, fmt.Errorf("flock %s: %w", paths.LockFile, err)
		}
		var held, named unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Lstat(lp, &named) == nil &&
			held.Dev == named.Dev && held.Ino == named.Ino {
			return func() { f.Close() }, nil
		}
		f.Close()
		if attempt == 2 {
			return nil, fmt.Errorf("lock file %s: replaced while being locked, three times", paths.LockFile)
		}
	}
}

func (p *pass) clusterBudget() wait.Budget {
	return wait.Budget{Total: p.Budgets.ClusterVersion, Interval: 2 * time.Second, PerAttempt: p.Budgets.APIRequest}
}

func (p *pass) run(ctx context.Context) Result {
	obs := Gather(ctx, p.obs, Overrides{}, p.clusterBudget())
	if err := interrupted(ctx); err != nil {
		// What was observed after the signal is not to be decided on.
		return p.fail(ctx, obs, plan.Plan{}, "observe", ReasonInterrupted, err)
	}
	b, err := ConfigBudgets(obs, p.Budgets)
	if err != nil {
		return p.fail(ctx, obs, plan.Plan{}, "", ReasonConfigFailed, err)
	}
	p.Budgets = b
	if obs.Config.Cluster != nil {
		// Checked with the budgets above.
		p.metricsDir, _ = metrics.Dir(obs.Config.Cluster.ProviderConfig)
		p.pin, _ = imageimport.PinWanted(obs.Config.Cluster.ProviderConfig)
	}
	if !p.pin && p.Steps.ReleasePins != nil {
		p.Steps.ReleasePins(ctx)
	}
	obs.Budgets = p.Budgets
	pl := plan.Decide(images.Window(), obs.Facts)
	p.logPlan(obs, pl)

	if pl.Redecide {
		// What the repair step writes while it runs is this pass's
		// document, with the facts observed (or carried), never a blank one.
		p.setDoc(obs, pl, phaseOf(obs))
		p.doc.Message = pl.Message
		if err := p.act(ctx, obs, pl); err != nil {
			return p.fail(ctx, obs, pl, string(plan.ActionRepairKubelet), ReasonRepairFailed, err)
		}
		var ended *Result
		if obs, pl, ended = p.decideAgain(ctx, pl, string(plan.ActionRepairKubelet), "the cluster version is still unknown after the kubelet repair"); ended != nil {
			return *ended
		}
	}
	return p.carryOut(ctx, obs, pl)
}

// decideAgain observes and decides again, after the kubelet repair or
// after the cluster moved while this control plane waited for its turn.
// ended is the pass's end when it cannot go on: interrupted, or the
// cluster's version still unknown (why, reported against action).
func (p *pass) decideAgain(ctx context.Context, pl plan.Plan, action, why string) (Observation, plan.Plan, *Result) {
	obs := Gather(ctx, p.obs, Overrides{}, p.clusterBudget())
	obs.Budgets = p.Budgets
	if err := interrupted(ctx); err != nil {
		r := p.fail(ctx, obs, pl, "observe", ReasonInterrupted, err)
		return obs, pl, &r
	}
	pl = plan.Decide(images.Window(), obs.Facts)
	p.logPlan(obs, pl)
	if pl.Redecide {
		r := p.fail(ctx, obs, pl, action, ReasonClusterVersionUnknown, fmt.Errorf("%s: %s", why, strings.Join(obs.Notes, "; ")))
		return obs, pl, &r
	}
	return obs, pl, nil
}

// carryOut reports a refusal or a converged node, or acts on the plan.
func (p *pass) carryOut(ctx context.Context, obs Observation, pl plan.Plan) Result {
	switch pl.Verdict {
	case plan.VerdictRefuse:
		ev := EventRefuseUpgrade
		if !obs.Facts.Member {
			ev = EventRefuseBoot
		}
		p.Log.Error(ev, "code", string(pl.Refusal), "pin", plan.ShownPin(obs.Facts.Pin), "node", vs(obs.Facts.Node), "bundled", vs(obs.Facts.Bundled),
			"cluster", vs(obs.Facts.Cluster), "message", pl.Message)
		p.setDoc(obs, pl, status.PhaseRefused)
		p.certificates(obs.ControlPlane)
		p.doc.Reason, p.doc.Refusal, p.doc.Message = pl.Reason, string(pl.Refusal), pl.Message
		p.event("Warning", pl.Reason, string(pl.Refusal)+": "+pl.Message)
		p.writeStatus()
		p.Log.Info(EventDone, "outcome", "refused", "code", string(pl.Refusal))
		return Result{Plan: pl, Status: p.doc, ExitCode: ExitRefused}
	case plan.VerdictNone:
		p.setDoc(obs, pl, status.PhaseConverged)
		p.certificates(obs.ControlPlane)
		p.doc.Message = pl.Message
		p.writeStatus()
		p.Log.Info(EventDone, "outcome", "converged", "node", vs(obs.Facts.Node))
		return Result{Plan: pl, Status: p.doc, ExitCode: ExitOK}
	}

	p.setDoc(obs, pl, phaseOf(obs))
	p.doc.Message = pl.Message
	if upgrading(pl) && !p.redecided {
		p.event("Normal", status.EventUpgradeStarted, fmt.Sprintf("%s -> %s: %s (%s)", vs(obs.Facts.Node), pl.Pin, pl.Message, actionList(pl.Actions)))
	}
	p.writeStatus()
	if err := p.act(ctx, obs, pl); err != nil {
		if moved := (*clusterMoved)(nil); errors.As(err, &moved) && !p.redecided {
			// Once: what the control plane waited for happened; what it
			// does now is decided from what it observes now.
			p.redecided = true
			p.Log.Info(EventObserve, "note", moved.Error()+": deciding again")
			obs, pl, ended := p.decideAgain(ctx, pl, "observe", moved.Error()+", and it cannot be read now")
			if ended != nil {
				return *ended
			}
			return p.carryOut(ctx, obs, pl)
		}
		var se *stepError
		if errors.As(err, &se) {
			return p.fail(ctx, obs, pl, string(se.action), se.reason, se.err)
		}
		return p.fail(ctx, obs, pl, "", ReasonKubeadmFailed, err)
	}
	p.setDoc(obs, pl, status.PhaseConverged)
	p.doc.NodeVersion = pl.Pin.String()
	p.doc.Message = "converged at " + pl.Pin.String()
	// A bootstrap made it a member: the facts were observed before it.
	p.doc.Member = true
	// Read after the actions: an upgrade renews the certificates, an init
	// or a control plane's join writes them.
	p.certificates(obs.ControlPlane || pl.Has(plan.ActionInit) || (pl.Has(plan.ActionJoin) && obs.Facts.Role.ControlPlane()))
	if upgrading(pl) {
		p.event("Normal", status.EventUpgradeFinished, fmt.Sprintf("upgraded to %s and verified (%s)", pl.Pin, actionList(pl.Actions)))
	}
	if pl.Has(plan.ActionRenewCertificates) {
		p.doc.Message += "; " + p.renewed
		p.renewalEvent(pl, nil)
	}
	if pl.Has(plan.ActionVerify) || pl.Has(plan.ActionInit) || pl.Has(plan.ActionJoin) {
		// Only now is the node known to run the pin: a crash before this
		// line makes the next boot finish the kubelet restart and verify.
		if err := WriteVerified(p.Root, pl.Pin); err != nil {
			p.Log.Warn(EventVerifiedRecord, "outcome", "failed", "error", runner.Sanitize(err.Error(), 300))
			p.doc.Warnings = append(p.doc.Warnings, "the verified-version record was not written (the next boot verifies again): "+runner.Sanitize(err.Error(), 300))
		} else {
			p.doc.VerifiedVersion = pl.Pin.String()
		}
	}
	p.writeStatus()
	p.Log.Info(EventDone, "outcome", "converged", "node", pl.Pin.String(), "actions", actionList(pl.Actions))
	return Result{Plan: pl, Status: p.doc, ExitCode: ExitOK}
}

// clusterMoved: the cluster's version changed while this control plane
// waited for its turn; the pass observes and decides again.
type clusterMoved struct{ from, to version.Version }

func (e *clusterMoved) Error() string {
	return fmt.Sprintf("the cluster moved from %s to %s while this control plane waited for its turn", vs(e.from), vs(e.to))
}

type stepError struct {
	action plan.Action
	reason string
	err    error
}

func (e *stepError) Error() string { return fmt.Sprintf("%s: %v", e.action, e.err) }
func (e *stepError) Unwrap() error { return e.err }

func (p *pass) act(ctx context.Context, obs Observation, pl plan.Plan) error {
	for _, a := range pl.Actions {
		if err := interrupted(ctx); err != nil {
			return &stepError{action: a, reason: ReasonInterrupted, err: err}
		}
		p.doc.LastAction = string(a)
		p.writeStatus()
		start := p.Clock.Now()
		reason, err := p.step(ctx, a, obs, pl)
		if a == plan.ActionEtcdSnapshot {
			// The step logs its own single line (etcd-snapshot outcome=...).
			continue
		}
		if a == plan.ActionRenewCertificates {
			// Its own single line (cert-renew outcome=...).
			if err != nil {
				return &stepError{action: a, reason: reason, err: err}
			}
			continue
		}
		attrs := []any{"outcome", "ok", "duration", p.Clock.Now().Sub(start).Round(time.Millisecond).String()}
		if a == plan.ActionUpgradeApply {
			attrs = append(attrs, "target", pl.Pin.String())
		}
		if err != nil {
			attrs[1] = "failed"
			attrs = append(attrs, "reason", reason, "error", runner.Sanitize(err.Error(), 400))
			p.Log.Error(string(a), attrs...)
			return &stepError{action: a, reason: reason, err: err}
		}
		p.Log.Info(string(a), attrs...)
	}
	return nil
}

func (p *pass) step(ctx context.Context, a plan.Action, obs Observation, pl plan.Plan) (reason string, err error) {
	switch a {
	case plan.ActionInit, plan.ActionJoin:
		if p.Steps.Bootstrap == nil {
			return ReasonBootstrapUnavailable, errors.New("this build has no bootstrap step: init and join are not available")
		}
		if err := p.images(ctx); err != nil {
			return ReasonImagesMissing, err
		}
		return ReasonBootstrapFailed, p.Steps.Bootstrap(ctx, a, obs)
	case plan.ActionRepairKubelet:
		if p.Steps.RepairKubelet == nil {
			p.Log.Warn(EventStepUnavailble, "action", string(a))
			return "", nil
		}
		return ReasonRepairFailed, p.repairKubelet(ctx, obs)
	case plan.ActionEtcdSnapshot:
		if p.Steps.EtcdSnapshot == nil {
			p.Log.Warn(EventStepUnavailble, "action", string(a))
			return "", nil
		}
		// Never blocks the upgrade: bounded by its budget, the outcome is
		// reported, the pass goes on.
		sctx, cancel := context.WithTimeout(ctx, p.Budgets.EtcdSnapshot)
		defer cancel()
		r := p.Steps.EtcdSnapshot(sctx, pl.Pin)
		p.doc.EtcdSnapshot = r.Outcome
		p.notes = append(p.notes, r.Warnings...)
		p.doc.Warnings = append(p.doc.Warnings, r.Warnings...)
		return "", nil
	case plan.ActionWaitForClusterUpgrade:
		return ReasonControlPlaneNotUpgraded, p.waitForCluster(ctx, obs, pl.Pin)
	case plan.ActionUpgradeApply:
		if err := p.ensureKubelet(ctx, obs); err != nil {
			return ReasonRepairFailed, err
		}
		// The same gate as a follower's (its turn; kubeadm's own preflight
		// fails on a control plane that is still coming up after the
		// boot), plus every apiserver at the cluster's version.
		admin, err := p.controlPlaneGate(ctx, obs, pl, true)
		if err != nil {
			return ReasonHealthGateTimeout, err
		}
		// Control planes booted together all plan the apply; the one that
		// waited for its turn finds the cluster moved: decide again (an
		// upgrade node, once the cluster is at the pin).
		if c, err := admin.ClusterVersion(ctx); err == nil && c != obs.Facts.Cluster {
			return ReasonHealthGateTimeout, &clusterMoved{from: obs.Facts.Cluster, to: c}
		}
		if err := p.images(ctx); err != nil {
			return ReasonImagesMissing, err
		}
		if err := p.timeForUpgrade(ctx); err != nil {
			return ReasonNoTimeLeft, err
		}
		return ReasonKubeadmFailed, p.kubeadmUpgrade(ctx, obs, []string{"upgrade", "apply", pl.Pin.String(), "--yes"})
	case plan.ActionUpgradeNode:
		if err := p.ensureKubelet(ctx, obs); err != nil {
			return ReasonRepairFailed, err
		}
		if obs.ControlPlane {
			if _, err := p.controlPlaneGate(ctx, obs, pl, false); err != nil {
				return ReasonHealthGateTimeout, err
			}
		}
		if err := p.images(ctx); err != nil {
			return ReasonImagesMissing, err
		}
		if err := p.timeForUpgrade(ctx); err != nil {
			return ReasonNoTimeLeft, err
		}
		return ReasonKubeadmFailed, p.kubeadmUpgrade(ctx, obs, []string{"upgrade", "node"})
	case plan.ActionRestartKubelet:
		return ReasonKubeletRestartFailed, p.restartKubelet(ctx)
	case plan.ActionVerify:
		return ReasonHealthGateTimeout, p.verify(ctx, obs, pl)
	case plan.ActionRenewCertificates:
		return ReasonCertificateRenewalFailed, p.renewCertificates(ctx, obs, pl)
	case plan.ActionRestartControlPlane:
		return ReasonControlPlaneRestartFailed, p.restartControlPlane(ctx)
	}
	return "", fmt.Errorf("unknown action %q", a)
}

// images runs the Images step, when there is one.
func (p *pass) images(ctx context.Context) error {
	if p.Steps.Images == nil {
		return nil
	}
	return p.Steps.Images(ctx, p.pin)
}

func (p *pass) repairKubelet(ctx context.Context, obs Observation) error {
	p.repaired = true
	p.kubeletRestarted = p.Clock.Now()
	warnings, err := p.Steps.RepairKubelet(ctx, obs)
	p.notes = append(p.notes, warnings...)
	return err
}

// ensureKubelet runs the repair step before a kubeadm upgrade when it has
// not run in this pass: after the A/B swap a worker's kubelet can crash-loop
// on a removed flag while its API reads still work (kubelet.conf is only a
// client certificate), and upgrade node does not rewrite kubeadm-flags.env.
// The step itself decides whether kubelet-start is needed (repair.Repair:
// the local apiserver answers, or a worker's kubelet does: nothing).
func (p *pass) ensureKubelet(ctx context.Context, obs Observation) error {
	if p.repaired || p.Steps.RepairKubelet == nil {
		return nil
	}
	return p.repairKubelet(ctx, obs)
}

// timeForUpgrade refuses to start a kubeadm upgrade the pass's own
// deadline would cut: the waits before it (a repair, the control-plane
// turn, the health gate) can add up past what the pass bound leaves, and a
// kubeadm killed half-way leaves manifests of two versions. What must fit
// is kubeadm's budget and the kubelet restart after it; a verification cut
// short is finished by the next boot.
func (p *pass) timeForUpgrade(ctx context.Context) error {
	dl, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	need := sumDurations(p.Budgets.KubeadmUpgrade, p.Budgets.KubeletRestart)
	if left := time.Until(dl); left < need {
		return fmt.Errorf("%s of the pass was left and kubeadm's upgrade with the kubelet restart may take %s (budget.kubeadmUpgrade + budget.kubeletRestart): kubeadm was not started, the next boot runs it", left.Round(time.Second), need)
	}
	return nil
}

// UpgradeConfigPath is where the operator's UpgradeConfiguration is handed to
// kubeadm (tmpfs, 0600, removed after the command).
const UpgradeConfigPath = paths.TmpDir + "/upgrade-config.yaml"

// kubeadmUpgrade runs kubeadm upgrade apply|node, passing the operator's
// upgradeConfiguration (preflight choices and the like) as a config file.
func (p *pass) kubeadmUpgrade(ctx context.Context, obs Observation, args []string) error {
	if obs.Config.Kubeadm != nil && obs.Config.Kubeadm.UpgradeConfiguration != nil {
		doc := map[string]any{}
		for k, v := range obs.Config.Kubeadm.UpgradeConfiguration {
			doc[k] = v
		}
		if _, ok := doc["apiVersion"]; !ok {
			doc["apiVersion"] = "kubeadm.k8s.io/v1beta4"
		}
		if _, ok := doc["kind"]; !ok {
			doc["kind"] = "UpgradeConfiguration"
		}
		b, err := yaml.Marshal(doc)
		if err != nil {
			return fmt.Errorf("render upgradeConfiguration: %w", err)
		}
		full := p.Root.Path(UpgradeConfigPath)
		if err := fsutil.MkdirAllMode(filepath.Dir(full), 0o700); err != nil {
			return fmt.Errorf("tmp dir: %w", err)
		}
		if err := fsutil.WriteFileAtomic(full, b, 0o600); err != nil {
			return err
		}
		defer os.Remove(full)
		// The path kubeadm opens: re-based on the root like every host path.
		args = append(args, "--config", full)
	}
	// kubeadm's preflight changes nothing: a failure there (a health-check
	// Job that did not complete while the node settles after its boot) is
	// retried, bounded by the kubeadm budget and PreflightAttempts. A failure
	// in any later phase is not.
	ctx, cancel := context.WithTimeout(ctx, p.Budgets.KubeadmUpgrade)
	defer cancel()
	cmd := runner.Cmd{Path: paths.Kubeadm, Args: args}
	var err error
	for attempt := 1; ; attempt++ {
		var res runner.Result
		res, err = p.Runner.Run(ctx, cmd)
		p.keepOutput(cmd, res, err)
		if err == nil || attempt >= PreflightAttempts || !preflightFailure(res) || ctx.Err() != nil {
			return err
		}
		p.Log.Warn("kubeadm-preflight-retry", "attempt", attempt, "error", runner.Sanitize(err.Error(), 300))
		select {
		case <-ctx.Done():
			return err
		case <-p.Clock.After(PreflightRetryDelay):
		}
	}
}

// Preflight retries of a kubeadm upgrade command.
const (
	PreflightAttempts   = 3
	PreflightRetryDelay = 20 * time.Second
)

func preflightFailure(res runner.Result) bool {
	out := string(res.Stderr) + string(res.Stdout)
	return strings.Contains(out, "error execution phase preflight")
}

// keepOutput appends a kubeadm command's sanitized output to
// /var/log/provider-kubernetes-kubeadm.log (0600, never through a symlink,
// a hard link, a FIFO or into another user's file):
// the reconcile log carries one line per event, this file the detail an
// operator needs to see why kubeadm failed.
func (p *pass) keepOutput(cmd runner.Cmd, res runner.Result, err error) {
	full := p.Root.Path(paths.KubeadmLog)
	if mkErr := os.MkdirAll(filepath.Dir(full), 0o755); mkErr != nil {
		return
	}
	f, oerr := fsutil.OpenAppend(full, 0o600)
	if oerr != nil {
		p.Log.Warn("kubeadm-log-unwritable", "error", oerr.Error())
		return
	}
	defer f.Close()
	outcome := "ok"
	if err != nil {
		outcome = runner.Sanitize(err.Error(), 300)
	}
	fmt.Fprintf(f, "=== %s %s (boot %s): %s\n", p.Now().UTC().Format(time.RFC3339), cmd.Short(), p.doc.BootID, outcome)
	_, _ = f.Write(res.Transcript())
}

func (p *pass) restartKubelet(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.Budgets.KubeletRestart)
	defer cancel()
	p.kubeletRestarted = p.Clock.Now()
	for _, args := range [][]string{{"daemon-reload"}, {"restart", "kubelet"}} {
		if _, err := p.Runner.Run(ctx, runner.Cmd{Path: paths.Systemctl, Args: args}); err != nil {
			return err
		}
	}
	return nil
}

// waitForCluster is a worker's gate before its upgrade: the cluster
// version (kubeadm-config) at the target and every control plane's
// apiserver serving the target and Ready, read with the worker's own
// credentials. kubeadm-config flips when the first control plane finishes
// its apply; a kubelet upgraded then would be newer than the apiservers
// still at the old version, which the skew policy forbids.
func (p *pass) waitForCluster(ctx context.Context, obs Observation, target version.Version) error {
	if obs.Client == nil {
		return errors.New("no API client to watch the cluster version")
	}
	b := wait.Budget{Total: p.Budgets.WaitForCluster, Interval: 2 * time.Second, PerAttempt: p.Budgets.APIRequest * 4}
	start := p.Clock.Now()
	err := wait.Poll(ctx, p.Clock, b, "wait for every control plane to reach "+target.String(), func(ctx context.Context) (bool, error) {
		lag, err := ControlPlanesAt(ctx, obs.Client, target)
		if err == nil && lag != "" {
			err = errors.New(lag)
		}
		return err == nil, err
	})
	attrs := []any{"outcome", "ok", "target", target.String(), "duration", p.Clock.Now().Sub(start).String()}
	if err != nil {
		attrs[1] = "failed"
		p.Log.Error(EventClusterGate, append(attrs, "error", err.Error())...)
		return err
	}
	p.Log.Info(EventClusterGate, attrs...)
	return nil
}

// interrupted returns why ctx was cancelled when a signal (not the pass
// bound) ended it: signal.NotifyContext's cause names the signal.
func interrupted(ctx context.Context) error {
	if !errors.Is(ctx.Err(), context.Canceled) {
		return nil
	}
	if c := context.Cause(ctx); c != nil {
		return c
	}
	return ctx.Err()
}

func (p *pass) fail(ctx context.Context, obs Observation, pl plan.Plan, action, reason string, err error) Result {
	// A step that failed because a signal cancelled the pass was
	// interrupted, whatever error the interrupted command left.
	if cause := interrupted(ctx); cause != nil {
		reason = ReasonInterrupted
		at := action
		if at == "" {
			at = "the pass"
		}
		err = fmt.Errorf("interrupted (%v) during %s: any running command was killed with its process group; the next pass decides again", cause, at)
	}
	p.setDoc(obs, pl, status.PhaseFailed)
	p.certificates(obs.ControlPlane)
	p.doc.Reason = reason
	p.doc.Message = runner.Sanitize(err.Error(), 1000)
	if action != "" {
		p.doc.LastAction = action
	}
	if upgrading(pl) {
		p.event("Warning", status.EventUpgradeFailed, reason+": "+p.doc.Message)
	}
	p.renewalEvent(pl, err)
	p.writeStatus()
	p.Log.Error(EventDone, "outcome", "failed", "reason", reason, "action", action, "error", runner.Sanitize(err.Error(), 400))
	return Result{Plan: pl, Status: p.doc, ExitCode: ExitFailed, Err: err}
}

func (p *pass) setDoc(obs Observation, pl plan.Plan, phase string) {
	f := obs.Facts
	d := &p.doc
	d.Phase, d.Reason, d.Refusal, d.Message = phase, "", "", ""
	// A role or pin that fails validation may be a pasted secret: the
	// status files are world-readable, so it is described, not copied.
	d.Role, d.Member, d.Pin = f.Role.Shown(), f.Member, plan.ShownPin(f.Pin)
	d.Bundled, d.NodeVersion, d.ClusterVersion = vs(f.Bundled), vs(f.Node), vs(f.Cluster)
	d.VerifiedVersion = vs(f.Verified)
	d.Carried = nil
	p.carry(f)
	d.Warnings = append(append([]string(nil), pl.Warnings...), p.notes...)
	p.kubeadmBackups()
	d.Actions = nil
	for _, a := range pl.Actions {
		d.Actions = append(d.Actions, string(a))
	}
	d.Time = p.Now().UTC().Format(time.RFC3339)
}

// phaseOf is the phase of a pass about to act.
func phaseOf(obs Observation) string {
	if !obs.Facts.Member {
		return status.PhaseBootstrapping
	}
	return status.PhaseUpgrading
}

// carry keeps what the node knew when this pass could not read it: a
// member whose version could not be read (the API down, a manifest
// unreadable) keeps the last known nodeVersion of the status mirror, said
// in Carried with where from and since when (the original time when it
// was itself carried), rather than writing "unknown", which the next pass
// could not decide on.
func (p *pass) carry(f plan.Facts) {
	l, d := p.last, &p.doc
	if l == nil || !f.Member || !f.Node.IsZero() || !l.Member {
		return
	}
	v, err := version.Parse(l.NodeVersion)
	if err != nil {
		return
	}
	since := l.Time
	if l.Carried != nil && slices.Contains(l.Carried.Fields, "nodeVersion") && l.Carried.Since != "" {
		since = l.Carried.Since
	}
	d.NodeVersion = v.String()
	d.Carried = &status.Carried{Fields: []string{"member", "nodeVersion"}, From: paths.StatusMirror, Since: since}
}

// kubeadmBackups reports kubeadm's own etcd copies, which accumulate on
// every upgrade of a stacked control plane and can fill the disk.
func (p *pass) kubeadmBackups() {
	d := &p.doc
	d.KubeadmEtcdBackups = nil
	s, err := kubeadmbackup.List(p.Root)
	if err != nil {
		d.Warnings = append(d.Warnings, "kubeadm etcd backups: "+runner.Sanitize(err.Error(), 300))
		return
	}
	if s.Count == 0 {
		return
	}
	d.KubeadmEtcdBackups = &status.Backups{Count: s.Count, Bytes: s.Bytes, Dir: s.Dir}
	if s.Count > 1 {
		d.Warnings = append(d.Warnings, fmt.Sprintf("%d kubeadm etcd backups (%s, plaintext copies of etcd) in %s: once this node is verified at the cluster's version, run provider-kubernetes prune-kubeadm-backups",
			s.Count, status.HumanBytes(s.Bytes), s.Dir))
	}
}

func (p *pass) writeStatus() {
	p.doc.Time = p.Now().UTC().Format(time.RFC3339)
	p.doc.Events = p.events
	if err := status.Write(p.Root, p.doc); err != nil {
		p.Log.Error(EventStatusFailed, "error", err.Error())
	}
	if err := metrics.Write(p.Root, p.metricsDir, p.doc); err != nil && !p.metricsFailed {
		p.metricsFailed = true
		p.Log.Warn(EventMetricsFailed, "error", runner.Sanitize(err.Error(), 300))
	}
}

func (p *pass) logPlan(obs Observation, pl plan.Plan) {
	f := obs.Facts
	p.Log.Info(EventPlan, "verdict", string(pl.Verdict), "actions", actionList(pl.Actions), "refusal", string(pl.Refusal),
		"member", f.Member, "role", f.Role.Shown(), "pin", plan.ShownPin(f.Pin), "bundled", vs(f.Bundled), "node", vs(f.Node),
		"cluster", vs(f.Cluster), "message", pl.Message)
	for _, n := range obs.Notes {
		p.Log.Info(EventObserve, "note", runner.Sanitize(n, 400))
	}
	for _, w := range pl.Warnings {
		p.Log.Warn(EventWarning, "warning", w)
	}
}

func actionList(as []plan.Action) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = string(a)
	}
	return strings.Join(s, ",")
}

func vs(v version.Version) string {
	if v.IsZero() {
		return "unknown"
	}
	return v.String()
}
