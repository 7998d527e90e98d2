package reconcile

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// controlPlane adds another control plane to the cluster: a Ready Node
// labelled as kubeadm labels them, at ip.
func (e *env) controlPlane(name, ip string) {
	e.api.SetNode(name, "v1.37.2", true)
	e.api.SetControlPlaneNode(name, ip)
}

// publishes puts phase on a Node's annotations at time at, as that node's
// pass (or its publish unit) does.
func (e *env) publishes(name, phase string, at time.Time) {
	e.api.SetNodeAnnotations(name, map[string]string{status.AnnotationPrefix + status.KeyPhase: phase,
		status.AnnotationPrefix + status.KeyTime: at.UTC().Format(time.RFC3339)})
}

func (e *env) phaseOf(name string) string {
	return e.api.NodeAnnotations(name)[status.AnnotationPrefix+status.KeyPhase]
}

// watch records every phase this node (n1) published on its Node, in
// order, and at the moment kubeadm ran what every Node showed; then, as
// the pass goes, hook plays the other control planes.
type watch struct {
	e       *env
	phases  []string
	kubeadm map[string]string // Node name -> its phase when kubeadm upgrade ran
}

func (e *env) watch(hook func(n int, w *watch)) *watch {
	w := &watch{e: e}
	e.api.OnRequest = func(n int) {
		if p := e.phaseOf("n1"); p != "" && (len(w.phases) == 0 || w.phases[len(w.phases)-1] != p) && w.kubeadm == nil {
			w.phases = append(w.phases, p)
		}
		if hook != nil {
			hook(n, w)
		}
	}
	inner := e.rec.Reply
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if strings.HasPrefix(c.String(), "/usr/bin/kubeadm upgrade ") && w.kubeadm == nil {
			w.kubeadm = map[string]string{}
			for _, n := range []string{"n1", "cp1", "zz9"} {
				w.kubeadm[n] = e.phaseOf(n)
			}
		}
		return inner(ctx, c)
	}
	return w
}

// Issue 27: control planes upgrade one at a time without a lock. A
// control plane whose image and pin are new while another control plane
// publishes Upgrading waits, with its own flag down (Waiting on its Node,
// naming the other), and runs kubeadm only once the other is done and its
// own Upgrading is published.
func TestControlPlaneWaitsForTheOneUpgrading(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	e.controlPlane("cp1", "10.0.0.11")
	start := e.clock.Now()
	e.publishes("cp1", status.PhaseUpgrading, start.Add(-time.Minute))
	done := false
	w := e.watch(func(n int, w *watch) {
		if !done && e.clock.Now().Sub(start) >= 3*time.Minute {
			done = true
			e.publishes("cp1", status.PhaseConverged, e.clock.Now())
		}
	})
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v, ran %q", res.ExitCode, res.Err, e.lines())
	}
	if !reflect.DeepEqual(w.phases, []string{status.PhaseWaiting, status.PhaseUpgrading}) {
		t.Fatalf("n1 published %q before its kubeadm, want Waiting then Upgrading", w.phases)
	}
	if w.kubeadm["n1"] != status.PhaseUpgrading || w.kubeadm["cp1"] != status.PhaseConverged {
		t.Fatalf("at kubeadm upgrade node the Nodes showed %v", w.kubeadm)
	}
	if spent := e.clock.Now().Sub(start); spent < 3*time.Minute {
		t.Fatalf("ran after %s, before cp1 was done", spent)
	}
	e.logHas(t, "msg="+EventControlPlaneTurn, "outcome=ok", "node=n1")
	if st := e.status(t); st.Phase != status.PhaseConverged {
		t.Fatalf("status %+v", st)
	}
}

// The wait is bounded by budget.controlPlaneTurn and reports what it
// waited for; the node's flag is left down.
func TestControlPlaneTurnGivesUpWithTheLastReason(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	e.controlPlane("cp1", "10.0.0.11")
	start := e.clock.Now()
	e.publishes("cp1", status.PhaseUpgrading, start)
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed || len(e.lines()) != 0 {
		t.Fatalf("exit %d, ran %q", res.ExitCode, e.lines())
	}
	if spent, b := e.clock.Now().Sub(start), DefaultBudgets().ControlPlaneTurn; spent < b || spent > b+5*time.Second {
		t.Fatalf("spent %s, budget %s", spent, b)
	}
	st := e.status(t)
	for _, want := range []string{"wait for this control plane's turn: budget exhausted (10m0s", "control plane cp1 (published Upgrading 10m", "ago) is upgrading: one control plane at a time"} {
		if st.Phase != status.PhaseFailed || st.Reason != ReasonHealthGateTimeout || st.LastAction != "upgrade-node" || !strings.Contains(st.Message, want) {
			t.Fatalf("status %+v, want %q", st, want)
		}
	}
	if p := e.phaseOf("n1"); p != status.PhaseWaiting {
		t.Fatalf("n1's published phase is %q, want its flag down (Waiting)", p)
	}
	e.logHas(t, "msg="+EventControlPlaneTurn, "outcome=failed", "is upgrading: one control plane at a time")
}

// Two control planes booted together both see nobody upgrading and both
// publish Upgrading. The one with the smaller Node name goes: n1 sees cp1's
// flag after raising its own, withdraws (Waiting) and goes once cp1 is done.
func TestControlPlanesStartingTogetherTheSmallerNameGoesFirst(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	e.controlPlane("cp1", "10.0.0.11")
	e.publishes("cp1", status.PhaseConverged, e.clock.Now())
	var cp1Raised time.Time
	w := e.watch(func(n int, w *watch) {
		switch {
		case cp1Raised.IsZero() && e.phaseOf("n1") == status.PhaseUpgrading:
			// cp1 read before n1 published, and raised at the same moment.
			cp1Raised = e.clock.Now()
			e.publishes("cp1", status.PhaseUpgrading, cp1Raised)
		case !cp1Raised.IsZero() && e.phaseOf("cp1") == status.PhaseUpgrading && e.clock.Now().Sub(cp1Raised) >= 2*time.Minute:
			e.publishes("cp1", status.PhaseConverged, e.clock.Now())
		}
	})
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v, ran %q", res.ExitCode, res.Err, e.lines())
	}
	if !reflect.DeepEqual(w.phases, []string{status.PhaseUpgrading, status.PhaseWaiting, status.PhaseUpgrading}) {
		t.Fatalf("n1 published %q, want Upgrading, Waiting (cp1 goes first), Upgrading", w.phases)
	}
	if w.kubeadm["cp1"] != status.PhaseConverged {
		t.Fatalf("n1 ran kubeadm while cp1 showed %q", w.kubeadm["cp1"])
	}
	e.logHas(t, "msg="+EventControlPlaneTurn, "outcome=ok")
}

// The other way round: n1 keeps its flag up while zz9 (a larger name)
// raised at the same moment, and goes once zz9 withdraws on seeing it.
func TestControlPlanesStartingTogetherTheLargerNameWithdraws(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	e.controlPlane("zz9", "10.0.0.19")
	raised := false
	w := e.watch(func(n int, w *watch) {
		switch {
		case !raised && e.phaseOf("n1") == status.PhaseUpgrading:
			raised = true
			e.publishes("zz9", status.PhaseUpgrading, e.clock.Now())
		case raised && e.phaseOf("zz9") == status.PhaseUpgrading && n%5 == 0:
			// zz9's next read sees n1's flag: it withdraws.
			e.publishes("zz9", status.PhaseWaiting, e.clock.Now())
		}
	})
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v, ran %q", res.ExitCode, res.Err, e.lines())
	}
	if !reflect.DeepEqual(w.phases, []string{status.PhaseUpgrading}) || w.kubeadm["zz9"] != status.PhaseWaiting {
		t.Fatalf("n1 published %q; at kubeadm zz9 showed %q", w.phases, w.kubeadm["zz9"])
	}
}

// A flag older than the pass bound belongs to a pass that cannot still be
// running (a node that died in its upgrade): it no longer stops the others.
func TestAStaleUpgradingDoesNotHoldTheTurn(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	e.controlPlane("cp1", "10.0.0.11")
	start := e.clock.Now()
	e.publishes("cp1", status.PhaseUpgrading, start.Add(-PassBound))
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v, ran %q", res.ExitCode, res.Err, e.lines())
	}
	if spent := e.clock.Now().Sub(start); spent > 10*time.Second {
		t.Fatalf("waited %s for a flag older than the pass bound", spent)
	}
}

// Control planes booted together into the new image all plan the apply.
// The one that waited for its turn finds the cluster moved to the pin:
// it decides again and runs kubeadm upgrade node, not a second apply.
func TestApplyThatWaitedForItsTurnBecomesAnUpgradeNode(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	cp1 := testutil.NewAPI(t, "v1.36.3")
	e.api.SetAPIServers(e.api.Addr(), cp1.Addr())
	e.controlPlane("cp1", strings.Split(cp1.Addr(), ":")[0])
	start := e.clock.Now()
	e.publishes("cp1", status.PhaseUpgrading, start)
	done := false
	w := e.watch(func(n int, w *watch) {
		if !done && e.clock.Now().Sub(start) >= 2*time.Minute {
			// cp1's apply is done: kubeadm-config at the target.
			done = true
			cp1.SetClusterVersion("v1.37.2")
			e.api.SetClusterVersion("v1.37.2")
			e.publishes("cp1", status.PhaseConverged, e.clock.Now())
		}
	})
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v, ran %q (want an upgrade node)", res.ExitCode, res.Err, e.lines())
	}
	if w.kubeadm["cp1"] != status.PhaseConverged || w.kubeadm["n1"] != status.PhaseUpgrading {
		t.Fatalf("at kubeadm the Nodes showed %v", w.kubeadm)
	}
	e.logHas(t, "msg="+EventObserve, "the cluster moved from v1.36.3 to v1.37.2 while this control plane waited for its turn: deciding again")
	e.logHas(t, "msg="+EventPlan, "actions=upgrade-node,restart-kubelet,verify")
	st := e.status(t)
	started := 0
	for _, ev := range st.Events {
		if ev.Reason == status.EventUpgradeStarted {
			started++
		}
	}
	if st.Phase != status.PhaseConverged || strings.Join(st.Actions, ",") != "upgrade-node,restart-kubelet,verify" || started != 1 {
		t.Fatalf("status %+v", st)
	}
}

// Holding its turn, a control plane still waits for every control-plane
// Node to be Ready (a NotReady one only for want of a CNI excepted, as
// verify does), and gives up naming the one that is not.
func TestControlPlaneGateWaitsForEveryControlPlaneReady(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	e.api.SetNodeCondition("cp1", "v1.37.2", false, "PLEG is not healthy")
	e.api.SetControlPlaneNode("cp1", "10.0.0.11")
	e.api.SetNodeCondition("cp2", "v1.37.2", false, "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized")
	e.api.SetControlPlaneNode("cp2", "10.0.0.12")
	start := e.clock.Now()
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed || len(e.lines()) != 0 {
		t.Fatalf("exit %d, ran %q", res.ExitCode, e.lines())
	}
	b := DefaultBudgets()
	if spent := e.clock.Now().Sub(start); spent < b.ControlPlaneHealth || spent > b.ControlPlaneHealth+10*time.Second {
		t.Fatalf("spent %s, health budget %s", spent, b.ControlPlaneHealth)
	}
	st := e.status(t)
	if st.Reason != ReasonHealthGateTimeout || !strings.Contains(st.Message, "control-plane Node not Ready: cp1 (PLEG is not healthy)") || strings.Contains(st.Message, "cp2") {
		t.Fatalf("status %+v", st)
	}
	// It held its turn while it waited: the others wait for it.
	if p := e.phaseOf("n1"); p != status.PhaseUpgrading {
		t.Fatalf("n1's published phase %q", p)
	}
	e.logHas(t, "msg="+EventControlPlaneHealth, "outcome=failed", "checks=cluster-endpoint-readyz,control-plane-nodes-ready,etcd-members", "cp1 (PLEG is not healthy)")
}
