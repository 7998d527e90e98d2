package plan

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// The control-plane gate: before a control plane's kubeadm upgrade (apply
// or node), one control plane at a time and only on a healthy cluster. The
// pass waits on it (bounded); `provider-kubernetes preflight` refuses on
// it. It takes no lock: each control plane publishes its own phase on its
// own Node (Upgrading while it holds its turn) and decides from what every
// other control plane published, in two steps:
//
//  1. DecideTurn: whose turn it is, from the published phases alone;
//  2. DecideHealth: whether the cluster can take this control plane's
//     upgrade now.
//
// The turn is Burns's mutual exclusion over single-writer registers, a
// control plane's published phase being its flag and the Node names the
// order: with no flag raised by another, raise yours (publish Upgrading),
// then read again; withdraw (publish Waiting) when a control plane with a
// smaller name also raised its flag; go once no control plane with a
// larger name still has its flag up (it withdraws on seeing yours, or
// finishes). Two control planes that raise at the same moment cannot both
// go: the one whose read came second sees the other's flag. A flag older
// than the expiry (the pass bound: its pass cannot still be running) is not
// counted, so a node that died holding its turn stops the others for that
// long, not forever.

// Gate refusal codes: what `provider-kubernetes preflight` refuses with
// when the gate would not let this node's upgrade start now.
const (
	// ControlPlaneUpgrading: another control plane holds its turn.
	ControlPlaneUpgrading Code = "ControlPlaneUpgrading"
	// ControlPlaneNotReady: a control-plane Node is not Ready, or the
	// cluster endpoint does not answer /readyz.
	ControlPlaneNotReady Code = "ControlPlaneNotReady"
	// EtcdUnhealthy: a stacked etcd member does not answer, or an alarm is raised.
	EtcdUnhealthy Code = "EtcdUnhealthy"
	// ControlPlanesBehind: an apiserver is not at the version the upgrade
	// needs (a worker's target, the cluster's version before an apply).
	ControlPlanesBehind Code = "ControlPlanesBehind"
	// ControlPlaneFailed: another control plane's last pass failed (its
	// published phase is Failed): it may have stopped part-way through its
	// own upgrade, and a second control plane's upgrade would restart a
	// second etcd member and apiserver while the first is in doubt.
	ControlPlaneFailed Code = "ControlPlaneFailed"
	// ClusterStateUnknown: what the gate decides on could not be read.
	ClusterStateUnknown Code = "ClusterStateUnknown"
	// PinBehindImage: the image about to be swapped in bundles a newer
	// minor than the node's pin, so its boot would upgrade nothing.
	PinBehindImage Code = "PinBehindImage"
)

// BehindImage is the one rule the preflight adds to the boot's decision:
// a swap to an image whose Kubernetes minor is newer than the pin is
// refused before it happens. The boot itself would accept it (nothing to
// do, with a skew warning: the pin, not the image, says when to upgrade),
// but a rollout that swaps images before bumping pins reports every node
// done and upgrades none. Patch releases and OS-only images of the pin's
// minor pass.
func BehindImage(pl Plan, bundled version.Version) (Code, string) {
	if pl.Verdict != VerdictNone || pl.Pin.IsZero() || bundled.IsZero() || pl.Pin.Major != bundled.Major || pl.Pin.Minor >= bundled.Minor {
		return "", ""
	}
	return PinBehindImage, fmt.Sprintf("this image bundles Kubernetes %s and the node's pin is %s: swapped in, it would upgrade nothing; set the pin first (provider-kubernetes pin set %s), then the image", bundled, pl.Pin, bundled)
}

// Peer is one control-plane Node as the API shows it.
type Peer struct {
	Name  string
	Ready bool
	// NotReady is the Ready condition's reason and message when not Ready.
	NotReady string
	// NoCNI: NotReady only for want of a network plugin, a known state of a
	// cluster without a CNI yet (verify does not wait on it either).
	NoCNI bool
	// Upgrading: its published phase is Upgrading (its turn flag).
	Upgrading bool
	// Failed: its published phase is Failed; FailedReason is the reason
	// code it published, "" when none or not a code.
	Failed       bool
	FailedReason string
	// Age is how long ago that phase was published; AgeKnown is false when
	// its time cannot be read (then it counts, whatever its age).
	Age      time.Duration
	AgeKnown bool
}

// TurnFacts are what the turn is decided on.
type TurnFacts struct {
	// Self is this node's Node name; its own entry in Peers is ignored.
	Self string
	// Raised: this node has published Upgrading (its flag is up).
	Raised bool
	// Peers are the control-plane Nodes.
	Peers []Peer
	// PeersErr is why the control-plane Nodes could not be read ("": read).
	PeersErr string
	// Expiry: a published Upgrading at least this old is not counted.
	Expiry time.Duration
}

// TurnVerdict is what this node does about its turn.
type TurnVerdict string

// Turn verdicts.
const (
	// TurnWait: another control plane holds its turn; this node's flag is down.
	TurnWait TurnVerdict = "wait"
	// TurnRaise: nobody else's flag is up: publish Upgrading, then decide again.
	TurnRaise TurnVerdict = "raise"
	// TurnWithdraw: a control plane with a smaller name raised its flag
	// too: publish Waiting (flag down), then decide again.
	TurnWithdraw TurnVerdict = "withdraw"
	// TurnHold: this node's flag is up and a control plane with a larger
	// name still has its flag up: keep it up and decide again.
	TurnHold TurnVerdict = "hold"
	// TurnGo: this node holds the turn.
	TurnGo TurnVerdict = "go"
)

// Turn is the turn decision; Code and Reason say why it is not TurnGo.
type Turn struct {
	Verdict TurnVerdict
	Code    Code
	Reason  string
}

// DecideTurn decides this control plane's turn from what every control
// plane published.
func DecideTurn(f TurnFacts) Turn {
	if f.PeersErr != "" {
		v := TurnWait
		if f.Raised {
			v = TurnHold
		}
		return Turn{Verdict: v, Code: ClusterStateUnknown, Reason: "the control planes cannot be read: " + f.PeersErr}
	}
	var lower, higher []string
	for _, p := range f.Peers {
		if p.Name == f.Self || !p.Upgrading || (p.AgeKnown && p.Age >= f.Expiry) {
			continue
		}
		s := p.Name + " (published Upgrading "
		if p.AgeKnown {
			s += p.Age.Round(time.Second).String() + " ago)"
		} else {
			s += "at a time that cannot be read)"
		}
		if p.Name < f.Self {
			lower = append(lower, s)
		} else {
			higher = append(higher, s)
		}
	}
	sort.Strings(lower)
	sort.Strings(higher)
	switch {
	case !f.Raised && len(lower)+len(higher) > 0:
		return Turn{Verdict: TurnWait, Code: ControlPlaneUpgrading,
			Reason: "control plane " + strings.Join(append(lower, higher...), ", ") + " is upgrading: one control plane at a time"}
	case !f.Raised:
		return Turn{Verdict: TurnRaise, Reason: "no other control plane is upgrading"}
	case len(lower) > 0:
		return Turn{Verdict: TurnWithdraw, Code: ControlPlaneUpgrading,
			Reason: "control plane " + strings.Join(lower, ", ") + " also started: the smaller Node name goes first"}
	case len(higher) > 0:
		return Turn{Verdict: TurnHold, Code: ControlPlaneUpgrading,
			Reason: "control plane " + strings.Join(higher, ", ") + " started first: waiting for it to finish or withdraw"}
	}
	return Turn{Verdict: TurnGo}
}

// HealthFacts are what the cluster's readiness for this control plane's
// upgrade is decided on. An empty error string means read and fine.
type HealthFacts struct {
	// Self is this node's Node name: its own entry in Peers is not held
	// against it (its own last pass may have failed).
	Self string
	// EndpointErr: the cluster endpoint's /readyz.
	EndpointErr string
	// Peers are the control-plane Nodes (PeersErr: why they cannot be read).
	Peers    []Peer
	PeersErr string
	// EtcdChecked: stacked etcd, every member checked (EtcdErr: why not healthy).
	EtcdChecked bool
	EtcdErr     string
	// Behind names the apiservers not at Needs, the version the upgrade
	// needs (before an apply: "the cluster's v1.36.3"), BehindErr why they
	// cannot be asked.
	Behind    []string
	Needs     string
	BehindErr string
}

// DecideHealth returns "" when the cluster can take this control plane's
// upgrade now, else the first blocking check's code and every blocking
// check's reason.
func DecideHealth(f HealthFacts) (Code, string) {
	var code Code
	var why []string
	block := func(c Code, format string, a ...any) {
		if code == "" {
			code = c
		}
		why = append(why, fmt.Sprintf(format, a...))
	}
	if f.EndpointErr != "" {
		block(ControlPlaneNotReady, "the cluster endpoint is not ready: %s", f.EndpointErr)
	}
	if f.PeersErr != "" {
		block(ClusterStateUnknown, "the control-plane Nodes cannot be read: %s", f.PeersErr)
	}
	var notReady []string
	for _, p := range f.Peers {
		if !p.Ready && !p.NoCNI {
			notReady = append(notReady, p.Name+" ("+p.NotReady+")")
		}
	}
	if len(notReady) > 0 {
		sort.Strings(notReady)
		block(ControlPlaneNotReady, "control-plane Node not Ready: %s", strings.Join(notReady, ", "))
	}
	var failed []string
	for _, p := range f.Peers {
		if p.Failed && p.Name != f.Self {
			why := "no reason code published"
			if p.FailedReason != "" {
				why = p.FailedReason
			}
			failed = append(failed, p.Name+" ("+why+")")
		}
	}
	if len(failed) > 0 {
		sort.Strings(failed)
		block(ControlPlaneFailed, "the last pass of control plane %s failed: it may have stopped part-way through its own upgrade; bring it back to Converged (its next boot, or reset and rejoin it) before another control plane upgrades", strings.Join(failed, ", "))
	}
	if f.EtcdChecked && f.EtcdErr != "" {
		block(EtcdUnhealthy, "%s", f.EtcdErr)
	}
	if f.BehindErr != "" {
		block(ClusterStateUnknown, "the apiservers cannot be asked: %s", f.BehindErr)
	}
	if len(f.Behind) > 0 {
		block(ControlPlanesBehind, "control planes not at %s: %s", f.Needs, strings.Join(f.Behind, "; "))
	}
	return code, strings.Join(why, "; ")
}
