package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Gate events.
const (
	EventControlPlaneHealth = "control-plane-health"
	// EventClusterGate: a worker's wait for every control plane at the target.
	EventClusterGate = "control-planes-at-target"
	// EventAddons: kube-proxy and CoreDNS checked after the last control plane.
	EventAddons = "addons"
)

func (p *pass) budget(total time.Duration) wait.Budget {
	return wait.Budget{Total: total, Interval: 2 * time.Second, PerAttempt: p.Budgets.APIRequest}
}

// controlPlaneGate is the wait before a control plane's kubeadm upgrade
// (apply or node), in two halves: its turn (takeTurn: no other control
// plane upgrading, budget.controlPlaneTurn), then, holding it, a healthy
// cluster (budget.controlPlaneHealth): the cluster endpoint answers
// /readyz (admin.conf points at it), every control-plane Node is Ready,
// every etcd member is healthy. It never looks at another node's scheduler
// or controller-manager: a new scheduler cannot become Ready until every
// apiserver is new, so waiting on it would deadlock the rollout.
//
// Before an upgrade apply (apply set, the cluster at the observed
// version, the target the pin) it also waits for every control plane's apiserver to serve the
// cluster's version (or the target, on a node resuming its own apply) and
// be Ready: an apply while one lags would leave it two minors behind.
//
// It returns the admin client it read the cluster with.
func (p *pass) controlPlaneGate(ctx context.Context, obs Observation, pl plan.Plan, apply bool) (*kube.Client, error) {
	cluster, pin := obs.Facts.Cluster, pl.Pin
	admin, err := kube.Load(p.Root, p.Budgets.APIRequest, paths.AdminConf)
	if err != nil {
		p.Log.Error(EventControlPlaneTurn, "outcome", "failed", "error", runner.Sanitize(err.Error(), 600))
		return nil, err
	}
	self, err := p.selfName(obs)
	if err == nil {
		err = p.takeTurn(ctx, admin, self)
	}
	if err != nil {
		return nil, err
	}
	p.doc.Phase, p.doc.Message = status.PhaseUpgrading, pl.Message
	p.writeStatus()

	start := p.Clock.Now()
	checks := "cluster-endpoint-readyz,control-plane-nodes-ready"
	if Stacked(p.Root) {
		checks += ",etcd-members"
	}
	if apply {
		checks += ",apiservers-at-cluster-version"
	}
	b := wait.Budget{Total: p.Budgets.ControlPlaneHealth, Interval: 2 * time.Second, PerAttempt: 4 * p.Budgets.APIRequest}
	err = wait.Poll(ctx, p.Clock, b, "wait for a healthy control plane", func(ctx context.Context) (bool, error) {
		if _, why := plan.DecideHealth(ObserveHealth(ctx, p.Root, admin, self, p.etcdHealthy, apply, cluster, pin)); why != "" {
			return false, errors.New(why)
		}
		return true, nil
	})
	attrs := []any{"outcome", "ok", "checks", checks, "duration", p.Clock.Now().Sub(start).String()}
	if err != nil {
		attrs[1] = "failed"
		p.Log.Error(EventControlPlaneHealth, append(attrs, "error", runner.Sanitize(err.Error(), 600))...)
		return nil, err
	}
	p.Log.Info(EventControlPlaneHealth, attrs...)
	return admin, nil
}

// selfName is this node's Node name: its kubelet client certificate's,
// else its hostname.
func (p *pass) selfName(obs Observation) (string, error) {
	cert := ""
	if obs.Client != nil {
		cert = obs.Client.NodeName
	}
	return p.obs.NodeName(cert)
}

func (p *pass) etcdHealthy(ctx context.Context) error {
	if p.EtcdHealthy != nil {
		return p.EtcdHealthy(ctx)
	}
	return EtcdHealthy(ctx, p.Root)
}

// verify waits, bounded, until this node runs the target: its control-plane
// manifests and static pods (images at the target, running; the apiserver
// Ready), its kubelet reporting the target, the Node Ready (no CNI yet is
// reported, not waited on), and after an apply the cluster version.
func (p *pass) verify(ctx context.Context, obs Observation, pl plan.Plan) error {
	client := obs.Client
	if client == nil {
		c, err := p.obs.Client()
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		client = c
	}
	name, err := p.obs.NodeName(client.NodeName)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	target := pl.Pin
	noCNI := false
	start := p.Clock.Now()
	err = wait.Poll(ctx, p.Clock, p.budget(p.Budgets.Verify), "verify "+target.String(), func(ctx context.Context) (bool, error) {
		// The Node first: a control plane's mirror pods count only when
		// owned by it (its uid).
		ni, err := client.Node(ctx, name)
		if err != nil {
			return false, err
		}
		if obs.ControlPlane {
			if err := p.staticPodsAt(ctx, client, name, ni.UID, target); err != nil {
				return false, err
			}
		}
		// The cluster version too on a control plane: after its apply, a
		// follower's upgrade node, or finishing an interrupted upgrade
		// (kubeadm records it last: a cut apply leaves it behind).
		if obs.ControlPlane || pl.Has(plan.ActionUpgradeApply) {
			c, err := client.ClusterVersion(ctx)
			if err != nil {
				return false, err
			}
			if c != target {
				return false, fmt.Errorf("cluster version %s", c)
			}
		}
		if ni.KubeletVersion != target {
			return false, fmt.Errorf("node %s kubelet at %s", name, ni.KubeletVersion)
		}
		if !ni.Ready && !ni.NoCNI() {
			return false, fmt.Errorf("node %s NotReady: %s %s", name, ni.ReadyReason, ni.ReadyMessage)
		}
		// A Ready posted before this pass restarted the kubelet is the
		// previous kubelet's: the new one starts NotReady ("PLEG is not
		// healthy") until its first relist, and posts at its start.
		if since := p.kubeletRestarted.Truncate(time.Second); !since.IsZero() && ni.ReadyHeartbeat.Before(since) {
			return false, fmt.Errorf("node %s: the Ready condition was last posted %s, before the kubelet's restart at %s: waiting for the restarted kubelet's own",
				name, ni.ReadyHeartbeat.UTC().Format(time.RFC3339), since.UTC().Format(time.RFC3339))
		}
		noCNI = ni.NoCNI()
		return true, nil
	})
	if err == nil && noCNI {
		p.notes = append(p.notes, "node "+name+" is NotReady only because no CNI network plugin is installed yet")
		p.Log.Warn("node-not-ready-no-cni", "node", name)
	}
	if err == nil && obs.ControlPlane && (pl.Has(plan.ActionUpgradeApply) || pl.Has(plan.ActionUpgradeNode)) {
		err = p.verifyAddons(ctx, target, start)
	}
	return err
}

// verifyAddons: once the last control plane runs the target, kubeadm has
// moved kube-proxy and CoreDNS (it defers them until every apiserver is
// new); they must then run the target kubeadm's versions, rolled out and
// available, within what is left of the verify budget (start: when the
// verification began). Before the last control plane nothing is checked.
func (p *pass) verifyAddons(ctx context.Context, target version.Version, start time.Time) error {
	admin, err := kube.Load(p.Root, p.Budgets.APIRequest, paths.AdminConf)
	if err != nil {
		return fmt.Errorf("add-ons: %w", err)
	}
	images, err := p.obs.BundleImages()
	if err != nil {
		p.notes = append(p.notes, "add-ons: the CoreDNS version the image deploys is unknown ("+err.Error()+"): its tag is not checked")
	}
	proxyTag, corednsTag := addonImages(target, images)
	left := p.Budgets.Verify - p.Clock.Now().Sub(start)
	if left < p.Budgets.APIRequest {
		left = p.Budgets.APIRequest
	}
	last, checked := false, false
	var notes []string
	b := wait.Budget{Total: left, Interval: 2 * time.Second, PerAttempt: 4 * p.Budgets.APIRequest}
	err = wait.Poll(ctx, p.Clock, b, "verify kube-proxy and CoreDNS", func(ctx context.Context) (bool, error) {
		servers, err := apiservers(ctx, admin)
		if err != nil {
			return false, err
		}
		missing, err := nameControlPlanes(ctx, admin, servers)
		if err != nil {
			return false, err
		}
		last = false
		if lag := behind(servers, missing, target, target); len(lag) > 0 {
			if older(servers, missing, target) {
				// Not the last control plane: the add-ons move with the last one.
				return true, nil
			}
			// An apiserver not Ready or not answering says nothing of
			// which control plane is last: ask again.
			return false, fmt.Errorf("apiservers: %s", strings.Join(lag, "; "))
		}
		last = true
		notes, err = addonsAt(ctx, admin, proxyTag, corednsTag)
		if err != nil {
			return false, err
		}
		checked = true
		return true, nil
	})
	attrs := []any{"outcome", "ok", "last_control_plane", last, "kube_proxy", proxyTag, "coredns", corednsTag}
	switch {
	case err != nil:
		attrs[1] = "failed"
		p.Log.Error(EventAddons, append(attrs, "error", err.Error())...)
		return fmt.Errorf("add-ons after the last control plane: %w", err)
	case !checked:
		attrs[1] = "not-last"
	}
	p.notes = append(p.notes, notes...)
	p.Log.Info(EventAddons, attrs...)
	return nil
}

// staticPodsAt checks this control plane's manifests and mirror pods (those
// of its current Node, uid: not one left from before a reset and join).
func (p *pass) staticPodsAt(ctx context.Context, client *kube.Client, node, uid string, target version.Version) error {
	v, err := p.obs.ControlPlaneVersion()
	if err != nil {
		return err
	}
	if v != target {
		return fmt.Errorf("control plane manifests at %s", v)
	}
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		pod, err := client.Pod(ctx, "kube-system", c+"-"+node)
		if err != nil {
			return err
		}
		if !pod.OfNode(uid) {
			return fmt.Errorf("static pod %s-%s is the mirror pod of an earlier Node %s (uid %s, now %s): not replaced by this kubelet yet", c, node, node, pod.NodeUID, uid)
		}
		tag, err := version.ParseReported(observe.ImageTag(pod.Image))
		if err != nil || tag != target {
			return fmt.Errorf("static pod %s-%s runs %s", c, node, pod.Image)
		}
		if !pod.Running {
			return fmt.Errorf("static pod %s-%s not running yet", c, node)
		}
		// Only this node's apiserver must be Ready; its scheduler and
		// controller-manager must run the target (readiness can lag the
		// other apiservers during a rolling upgrade).
		if c == "kube-apiserver" && !pod.Ready {
			return fmt.Errorf("static pod %s-%s not Ready yet", c, node)
		}
	}
	return nil
}
