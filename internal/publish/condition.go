package publish

import (
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// ConditionType is the Node condition publish sets beside the
// annotations, in the Node's status, so `kubectl describe node`, `kubectl
// wait` and the tools that read conditions see the last pass.
const ConditionType = "KubernetesUpgrade"

// The condition's status answers one question: is this node's Kubernetes
// where its pin asks, verified there?
//
//   - True: yes, the last pass converged (phase Converged).
//   - False: no, and it will not get there by itself: the last pass
//     refused or failed. The reason is the refusal code or the failure
//     reason; the next boot decides again.
//   - Unknown: not known yet: a pass is upgrading or bootstrapping the
//     node or waiting for its turn at the control-plane gate, or the last
//     document says something else (a reset, a restored etcd member). The
//     reason is the phase.
//
// So `kubectl wait --for=condition=KubernetesUpgrade=True` waits for
// success only, and `=False` for a stop that needs a person.
const (
	ConditionTrue    = "True"
	ConditionFalse   = "False"
	ConditionUnknown = "Unknown"
)

// Reasons of the condition that are not a phase, a refusal code or a
// failure reason.
const (
	// ReasonUnknownPhase is the reason when the document's phase is not a
	// reason itself (empty, or not CamelCase).
	ReasonUnknownPhase = "PhaseUnknown"
)

// reasonOr is the first of the candidates that is a CamelCase word, else
// fallback: a value from the document that is not one is never used as
// a reason.
func reasonOr(fallback string, candidates ...string) string {
	for _, c := range candidates {
		if status.IsCode(c) {
			return c
		}
	}
	return fallback
}

// Condition is the KubernetesUpgrade condition for the document d, given
// the Node's current one (nil when it has none), published at now: the
// heartbeat is now; the transition time is kept while the status stays
// the same, and is now when it changes.
func Condition(d status.Document, prev *kube.NodeCondition, now time.Time) kube.NodeCondition {
	c := kube.NodeCondition{Type: ConditionType, Message: status.NodeMessage(d), LastHeartbeatTime: now, LastTransitionTime: now}
	switch d.Phase {
	case status.PhaseConverged:
		c.Status, c.Reason = ConditionTrue, status.PhaseConverged
	case status.PhaseRefused:
		c.Status, c.Reason = ConditionFalse, reasonOr(status.PhaseRefused, d.Refusal, d.Reason)
	case status.PhaseFailed:
		c.Status, c.Reason = ConditionFalse, reasonOr(status.PhaseFailed, d.Reason)
	default:
		c.Status, c.Reason = ConditionUnknown, reasonOr(ReasonUnknownPhase, d.Phase)
	}
	if prev != nil && prev.Status == c.Status && !prev.LastTransitionTime.IsZero() {
		c.LastTransitionTime = prev.LastTransitionTime
	}
	return c
}

// find is the condition of type t among cs, or nil.
func find(cs []kube.NodeCondition, t string) *kube.NodeCondition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}
