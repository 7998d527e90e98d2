package reconcile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/etcdsnap"
	"github.com/kairos-io/provider-kubernetes/internal/health"
	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// The control-plane gate's observations, shared by the pass (which waits
// on pkg/plan's DecideTurn and DecideHealth) and `provider-kubernetes
// preflight` (which refuses on them).

// EventControlPlaneTurn: a control plane's wait for its turn before its
// kubeadm upgrade.
const EventControlPlaneTurn = "control-plane-turn"

// ControlPlanePeers reads the control-plane Nodes as the gate decides on
// them: readiness, and the phase each published with its age at now.
// Needs list on Nodes (admin.conf).
func ControlPlanePeers(ctx context.Context, admin *kube.Client, now time.Time) ([]plan.Peer, error) {
	recs, err := admin.ControlPlaneNodes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]plan.Peer, 0, len(recs))
	for _, r := range recs {
		phase := r.Annotations[status.AnnotationPrefix+status.KeyPhase]
		p := plan.Peer{Name: r.Name, Ready: r.Ready, NotReady: r.NotReady, NoCNI: r.NoCNI,
			Upgrading: phase == status.PhaseUpgrading, Failed: phase == status.PhaseFailed}
		// A peer's reason is shown only when it is a reason code; anything
		// else it published is not repeated.
		if reason := r.Annotations[status.AnnotationPrefix+status.KeyReason]; p.Failed && status.IsCode(reason) {
			p.FailedReason = reason
		}
		if t, err := time.Parse(time.RFC3339, r.Annotations[status.AnnotationPrefix+status.KeyTime]); err == nil {
			p.Age, p.AgeKnown = now.Sub(t), true
		}
		out = append(out, p)
	}
	return out, nil
}

// ObserveTurn observes what plan.DecideTurn decides on for the control plane
// self, whose flag is raised or not.
func ObserveTurn(ctx context.Context, admin *kube.Client, self string, raised bool, now time.Time) plan.TurnFacts {
	f := plan.TurnFacts{Self: self, Raised: raised, Expiry: PassBound}
	peers, err := ControlPlanePeers(ctx, admin, now)
	if err != nil {
		f.PeersErr = err.Error()
	}
	f.Peers = peers
	return f
}

// ObserveHealth observes what plan.DecideHealth decides on for the control
// plane self: the cluster endpoint's /readyz (admin.conf points at it), the
// control-plane Nodes (readiness, and whose last pass failed),
// every member of a stacked etcd (etcdHealthy: one attempt), and for an
// apply every apiserver serving the cluster's version (or the pin, on a
// node resuming its own apply) and Ready.
func ObserveHealth(ctx context.Context, root paths.Root, admin *kube.Client, self string, etcdHealthy func(context.Context) error, apply bool, cluster, pin version.Version) plan.HealthFacts {
	f := plan.HealthFacts{Self: self}
	if err := admin.Readyz(ctx); err != nil {
		f.EndpointErr = err.Error()
	}
	peers, err := ControlPlanePeers(ctx, admin, time.Time{})
	if err != nil {
		f.PeersErr = err.Error()
	}
	f.Peers = peers
	if Stacked(root) {
		f.EtcdChecked = true
		if err := etcdHealthy(ctx); err != nil {
			f.EtcdErr = err.Error()
		}
	}
	if apply {
		servers, err := apiservers(ctx, admin)
		var missing []string
		if err == nil {
			missing, err = nameControlPlanes(ctx, admin, servers)
		}
		if err != nil {
			f.BehindErr = err.Error()
		} else {
			f.Behind, f.Needs = behind(servers, missing, cluster, pin), "the cluster's "+cluster.String()
		}
	}
	return f
}

// Stacked reports whether this node runs a stacked etcd member (kubeadm's
// etcd manifest). External etcd is the operator's: the apiserver's /readyz
// already includes its etcd check.
func Stacked(root paths.Root) bool {
	_, err := os.Lstat(root.Path(paths.EtcdManifest))
	return err == nil
}

// EtcdHealthy is one attempt at "every etcd member is healthy", through the
// healthcheck-client certificate and the endpoint of this node's etcd
// manifest (as for the snapshot, not guesses).
func EtcdHealthy(ctx context.Context, root paths.Root) error {
	b, err := observe.ReadManifest(root.Path(paths.EtcdManifest))
	if err != nil {
		return fmt.Errorf("etcd manifest: %w", err)
	}
	ep, err := etcdsnap.ParseManifest(b)
	if err != nil {
		return err
	}
	tlsCfg, err := health.EtcdTLS(root.Path(ep.CA), root.Path(ep.Cert), root.Path(ep.Key))
	if err != nil {
		return err
	}
	return health.EtcdMembers(ctx, ep.URL, tlsCfg)
}

// ControlPlanesAt is one look at a worker's precondition: the cluster
// version (kubeadm-config) at target and every apiserver of the kubernetes
// endpoints serving target and Ready, read with the node's own credentials.
// lag says what is behind ("" when nothing is); err that it could not be read.
func ControlPlanesAt(ctx context.Context, client *kube.Client, target version.Version) (lag string, err error) {
	c, err := client.ClusterVersion(ctx)
	if err != nil {
		return "", err
	}
	if c.Less(target) {
		return fmt.Sprintf("cluster at %s, waiting for %s", c, target), nil
	}
	if target.Less(c) {
		return fmt.Sprintf("cluster moved past the pin to %s", c), nil
	}
	servers, err := apiservers(ctx, client)
	if err != nil {
		return "", err
	}
	if behind := behind(servers, nil, target, target); len(behind) > 0 {
		return fmt.Sprintf("control planes still behind %s: %s", target, strings.Join(behind, "; ")), nil
	}
	return "", nil
}

// takeTurn is the first half of the control-plane gate: this control
// plane's turn (plan.DecideTurn), its flag published on its own Node
// (phase Upgrading while it holds or claims the turn, Waiting when it
// withdraws), within budget.controlPlaneTurn. Once it goes, the flag stays
// up until the publish unit after the pass puts the pass's outcome there.
func (p *pass) takeTurn(ctx context.Context, admin *kube.Client, self string) error {
	start := p.Clock.Now()
	told := false // Waiting published while this node's flag is down
	b := wait.Budget{Total: p.Budgets.ControlPlaneTurn, Interval: 2 * time.Second, PerAttempt: 4 * p.Budgets.APIRequest}
	err := wait.Poll(ctx, p.Clock, b, "wait for this control plane's turn", func(ctx context.Context) (bool, error) {
		t := plan.DecideTurn(ObserveTurn(ctx, admin, self, p.raised, p.Now()))
		switch t.Verdict {
		case plan.TurnGo:
			return true, nil
		case plan.TurnRaise:
			if err := p.announce(ctx, admin, self, status.PhaseUpgrading, "taking its turn: "+t.Reason); err != nil {
				return false, fmt.Errorf("publish Upgrading on Node %s: %w", self, err)
			}
			p.raised = true
			return false, errors.New("published Upgrading on Node " + self + ": reading the control planes again")
		case plan.TurnWithdraw:
			if err := p.announce(ctx, admin, self, status.PhaseWaiting, t.Reason); err != nil {
				// Still up: decided again at the next attempt.
				return false, fmt.Errorf("%s; publish Waiting on Node %s: %w", t.Reason, self, err)
			}
			p.raised, told = false, true
			return false, errors.New(t.Reason)
		}
		if !p.raised && !told {
			// Best effort: status --cluster shows it waiting.
			told = p.announce(ctx, admin, self, status.PhaseWaiting, t.Reason) == nil
		}
		return false, errors.New(t.Reason)
	})
	attrs := []any{"outcome", "ok", "node", self, "duration", p.Clock.Now().Sub(start).String()}
	if err != nil {
		attrs[1] = "failed"
		p.Log.Error(EventControlPlaneTurn, append(attrs, "error", runner.Sanitize(err.Error(), 600))...)
		return err
	}
	p.Log.Info(EventControlPlaneTurn, attrs...)
	return nil
}

// announce puts this pass's status document, at phase with message, on
// its own Node now (the publish unit does it after the pass): the turn's
// flag other control planes read.
func (p *pass) announce(ctx context.Context, admin *kube.Client, node, phase, message string) error {
	p.doc.Phase, p.doc.Message = phase, message
	p.writeStatus()
	return admin.Annotate(ctx, node, status.Annotations(p.doc))
}
