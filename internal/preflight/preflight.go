// Package preflight is `provider-kubernetes preflight`: run from the image
// a node is about to be upgraded to, before `kairos-agent upgrade` writes
// anything (the Kairos operator's NodeOp preflight runs that image with the
// node's root at /host), it decides what the node's next boot would decide
// and whether the cluster is ready for it now, and refuses when either would
// not go, so a refusal costs no A/B swap and no reboot.
//
// The decision is the pass's own: pkg/plan's Decide on the facts the pass
// would gather (internal/reconcile's Gather over the node's root), with
// the bundled kubeadm of this image and the cluster: section the next
// boot's agent.boot will send (observe.NextBootConfig, checked as the
// plugin checks it). For an upgrade the next boot would run, the cluster's
// readiness is the pass's too: a control plane's gate (pkg/plan's
// DecideTurn and DecideHealth over internal/reconcile's observations),
// asked now instead of waited on; a worker's wait for every apiserver at
// the pin (reconcile.ControlPlanesAt). It reads and never writes.
package preflight

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/plugin"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// Bound is how long one preflight may take, every read within it (the
// operator's preflight Pod has 120 s by default, pulling the image and
// starting included).
const Bound = time.Minute

// Event is the preflight's one structured line.
const Event = "preflight"

// Outcomes.
const (
	OutcomeProceed = "proceed"
	OutcomeRefused = "refused"
)

// Options configure a preflight.
type Options struct {
	// HostRoot is the node's root (the operator mounts it at /host).
	HostRoot paths.Root
	// ImageRoot is the root of the image being upgraded to: this binary's
	// own ("/" in the operator's Pod), where its bundle manifest is.
	ImageRoot paths.Root
	// Runner runs the image's kubeadm when its bundle manifest is missing.
	Runner runner.Runner
	Clock  wait.Clock
	// EtcdHealthy is one attempt at "every etcd member is healthy"; nil
	// uses the node's etcd manifest and healthcheck-client certificate.
	EtcdHealthy func(ctx context.Context) error
}

// Facts are the facts decided on, as printed (plan -o json's too).
type Facts = plan.Shown

// Result is the preflight's answer.
type Result struct {
	Outcome string    `json:"outcome"`
	Refusal plan.Code `json:"refusal,omitempty"`
	// Message says why it proceeds or refuses.
	Message string `json:"message"`
	// Plan is what the next boot would do.
	Plan  plan.Plan `json:"plan"`
	Facts Facts     `json:"facts"`
	// Notes say where facts came from and why one is unknown.
	Notes []string `json:"notes,omitempty"`
	// NoSection: the node's cloud-config has no cluster: section (nothing
	// was decided: the next boot runs no pass).
	NoSection bool `json:"noSection,omitempty"`
	// Observation is what Plan was decided on.
	Observation reconcile.Observation `json:"-"`
}

// Refused reports whether the preflight refuses.
func (r Result) Refused() bool { return r.Outcome == OutcomeRefused }

// Run decides. It never writes to either root.
func Run(ctx context.Context, o Options) Result {
	if o.Clock == nil {
		o.Clock = wait.RealClock{}
	}
	ctx, cancel := context.WithTimeout(ctx, Bound)
	defer cancel()
	b := reconcile.DefaultBudgets()

	var notes []string
	img := &observe.Observer{Root: o.ImageRoot, Runner: o.Runner, Clock: o.Clock, APITimeout: b.APIRequest}
	bundled, src, err := img.Bundled(ctx)
	if err != nil {
		notes = append(notes, "this image's kubeadm version unknown: "+err.Error())
	} else {
		notes = append(notes, "this image's kubeadm version from "+src)
	}
	host := &observe.Observer{Root: o.HostRoot, Runner: o.Runner, Clock: o.Clock, APITimeout: b.APIRequest}
	cfg, cfgNotes, err := host.NextBootConfig(plugin.Check)
	notes = append(notes, cfgNotes...)
	if errors.Is(err, observe.ErrNoSection) {
		return Result{Outcome: OutcomeProceed, Notes: notes, NoSection: true, Plan: plan.Plan{Verdict: plan.VerdictNone, Actions: []plan.Action{}},
			Message: err.Error() + ": the next boot runs no reconcile pass; nothing for the provider to check"}
	}
	obs := reconcile.Gather(ctx, host, reconcile.Overrides{Bundled: &bundled, Config: &reconcile.ConfigRead{Config: cfg, Err: err}},
		wait.Budget{Total: 10 * time.Second, Interval: 2 * time.Second, PerAttempt: b.APIRequest})
	obs.Notes = append(notes, obs.Notes...)
	pl := plan.Decide(images.Window(), obs.Facts)
	r := Result{Plan: pl, Observation: obs, Notes: obs.Notes, Facts: obs.Facts.Shown()}
	refuse := func(c plan.Code, msg string) Result {
		r.Outcome, r.Refusal, r.Message = OutcomeRefused, c, msg
		return r
	}
	r.Outcome, r.Message = OutcomeProceed, pl.Message
	behind, behindWhy := plan.BehindImage(pl, obs.Facts.Bundled)
	switch {
	case pl.Refused():
		return refuse(pl.Refusal, pl.Message)
	case behind != "":
		return refuse(behind, behindWhy)
	case pl.Redecide:
		// The pass would repair the kubelet, read again and decide again:
		// here the cluster's version is simply unknown.
		return refuse(plan.ClusterStateUnknown, "the cluster's version cannot be read from this node ("+strings.Join(lastNotes(obs.Notes, 2), "; ")+
			"): the upgrade it would decide cannot be checked now")
	case !pl.Has(plan.ActionUpgradeApply) && !pl.Has(plan.ActionUpgradeNode):
		// Nothing to do, a bootstrap, or finishing an interrupted
		// upgrade's kubelet restart and verification: no fleet rule.
		return r
	case !obs.ControlPlane:
		if obs.Client == nil {
			return refuse(plan.ClusterStateUnknown, "no API client to ask the control planes (kubelet.conf)")
		}
		wctx, cancel := context.WithTimeout(ctx, 4*b.APIRequest)
		lag, err := reconcile.ControlPlanesAt(wctx, obs.Client, pl.Pin)
		cancel()
		switch {
		case err != nil:
			return refuse(plan.ClusterStateUnknown, "the control planes cannot be asked: "+err.Error())
		case lag != "":
			return refuse(plan.ControlPlanesBehind, lag+": this worker's kubelet would be newer than an apiserver; upgrade the control planes first")
		}
		return r
	}
	if c, why := gate(ctx, o, host, obs, pl); c != "" {
		return refuse(c, why)
	}
	return r
}

// gate asks a control plane's gate now: its turn as if it were to raise
// its flag, then the cluster's health, as the pass would before its
// kubeadm upgrade.
func gate(ctx context.Context, o Options, host *observe.Observer, obs reconcile.Observation, pl plan.Plan) (plan.Code, string) {
	admin, err := kube.Load(o.HostRoot, reconcile.DefaultBudgets().APIRequest, paths.AdminConf)
	if err != nil {
		return plan.ClusterStateUnknown, "the control planes cannot be read: " + err.Error()
	}
	cert := ""
	if obs.Client != nil {
		cert = obs.Client.NodeName
	}
	self, err := host.NodeName(cert)
	if err != nil {
		return plan.ClusterStateUnknown, err.Error()
	}
	// Each look is bounded as one attempt of the pass's gate is.
	attempt := 4 * reconcile.DefaultBudgets().APIRequest
	tctx, cancel := context.WithTimeout(ctx, attempt)
	t := plan.DecideTurn(reconcile.ObserveTurn(tctx, admin, self, false, o.Clock.Now()))
	cancel()
	if t.Verdict != plan.TurnRaise {
		return t.Code, t.Reason
	}
	etcd := o.EtcdHealthy
	if etcd == nil {
		etcd = func(ctx context.Context) error { return reconcile.EtcdHealthy(ctx, o.HostRoot) }
	}
	hctx, cancel := context.WithTimeout(ctx, attempt)
	defer cancel()
	return plan.DecideHealth(reconcile.ObserveHealth(hctx, o.HostRoot, admin, self, etcd, pl.Has(plan.ActionUpgradeApply), obs.Facts.Cluster, pl.Pin))
}

// lastNotes are the last n notes (why the last facts are unknown).
func lastNotes(notes []string, n int) []string {
	if len(notes) > n {
		return notes[len(notes)-n:]
	}
	return notes
}

// String is the outcome for a person's first line.
func (r Result) String() string {
	if r.Refused() {
		return fmt.Sprintf("REFUSE %s: nothing was swapped", r.Refusal)
	}
	return "proceed: the upgrade may swap the image"
}
