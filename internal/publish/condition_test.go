package publish

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// The mapping docs/reference.md documents: converged is True, a refusal or
// a failure False with its code or reason, anything in progress or
// unknown Unknown with the phase; a value of the document that is not a
// CamelCase word never becomes the reason.
func TestConditionFromThePass(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	with := func(phase, refusal, reason string) status.Document {
		d := doc(phase)
		d.Refusal, d.Reason, d.Message = refusal, reason, "a message"
		return d
	}
	for _, c := range []struct {
		d              status.Document
		status, reason string
	}{
		{with("Converged", "", ""), "True", "Converged"},
		{with("Refused", "PinNewerThanImage", "UpgradeRefused"), "False", "PinNewerThanImage"},
		{with("Refused", "Skip\nLevel", "UpgradeRefused"), "False", "UpgradeRefused"},
		{with("Refused", "", "bad reason"), "False", "Refused"},
		{with("Failed", "", "KubeadmFailed"), "False", "KubeadmFailed"},
		{with("Failed", "", "\x1b[2JForged"), "False", "Failed"},
		{with("Upgrading", "", ""), "Unknown", "Upgrading"},
		{with("Waiting", "", ""), "Unknown", "Waiting"},
		{with("Bootstrapping", "", ""), "Unknown", "Bootstrapping"},
		{with("ResetFailed", "", "KubeadmResetFailed"), "Unknown", "ResetFailed"},
		{with("EtcdRestored", "", ""), "Unknown", "EtcdRestored"},
		{with("", "", ""), "Unknown", "PhaseUnknown"},
		{with("converged; rm -rf", "", ""), "Unknown", "PhaseUnknown"},
	} {
		got := Condition(c.d, nil, now)
		if got.Type != "KubernetesUpgrade" || got.Status != c.status || got.Reason != c.reason || got.Message != "a message" {
			t.Errorf("phase %q refusal %q reason %q: %+v, want %s/%s", c.d.Phase, c.d.Refusal, c.d.Reason, got, c.status, c.reason)
		}
		if !got.LastHeartbeatTime.Equal(now) || !got.LastTransitionTime.Equal(now) {
			t.Errorf("a first condition: heartbeat %s transition %s, want both %s", got.LastHeartbeatTime, got.LastTransitionTime, now)
		}
	}
	// The message as the annotation carries it: escaped, bounded.
	d := doc("Failed")
	d.Message = "kubeadm said\x1b[2J\n" + strings.Repeat("x", 900)
	if m := Condition(d, nil, now).Message; len(m) > status.MaxAnnotationMessage+16 || strings.ContainsAny(m, "\x1b\n") || m != status.Annotations(d)[status.AnnotationPrefix+status.KeyMessage] {
		t.Errorf("message not escaped and bounded as the annotation's: %d bytes %q", len(m), m[:40])
	}
}

// The transition time moves only when the status does: a later pass with
// the same status keeps it (a new reason too), a change of status sets it.
func TestConditionTransitionTime(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	t1, t2 := t0.Add(time.Hour), t0.Add(2*time.Hour)
	prev := Condition(doc("Refused"), nil, t0)
	failed := doc("Failed")
	failed.Reason = "KubeadmFailed"
	same := Condition(failed, &prev, t1)
	if same.Status != "False" || !same.LastTransitionTime.Equal(t0) || !same.LastHeartbeatTime.Equal(t1) {
		t.Fatalf("refused then failed: %+v, want the transition at %s, the heartbeat at %s", same, t0, t1)
	}
	changed := Condition(doc("Converged"), &same, t2)
	if changed.Status != "True" || !changed.LastTransitionTime.Equal(t2) || !changed.LastHeartbeatTime.Equal(t2) {
		t.Fatalf("failed then converged: %+v, want the transition at %s", changed, t2)
	}
	// A condition someone wrote without a transition time gets one.
	bare := kube.NodeCondition{Type: "KubernetesUpgrade", Status: "True"}
	if c := Condition(doc("Converged"), &bare, t2); !c.LastTransitionTime.Equal(t2) {
		t.Fatalf("no transition time before: %+v", c)
	}
}

// publish sets the condition on the node's own Node beside the
// annotations, leaves the kubelet's Ready condition as it is, and keeps
// the transition time over passes of the same outcome.
func TestPublishSetsTheCondition(t *testing.T) {
	e := newEnv(t)
	conds := func() map[corev1.NodeConditionType]corev1.NodeCondition {
		out := map[corev1.NodeConditionType]corev1.NodeCondition{}
		for _, c := range e.api.NodeConditions("n1") {
			out[c.Type] = c
		}
		return out
	}
	d := doc(status.PhaseRefused)
	d.Refusal, d.Reason, d.Message = "SkipLevel", "UpgradeRefused", "v1.35.1 -> v1.37.2 skips a minor"
	if err := status.Write(e.node.R(), d); err != nil {
		t.Fatal(err)
	}
	if err := e.run(t, time.Minute); err != nil {
		t.Fatal(err)
	}
	c := conds()
	up, ready := c["KubernetesUpgrade"], c["Ready"]
	if up.Status != "False" || up.Reason != "SkipLevel" || up.Message != "v1.35.1 -> v1.37.2 skips a minor" || up.LastTransitionTime.IsZero() {
		t.Fatalf("condition %+v", up)
	}
	if ready.Status != "True" || ready.Message != "kubelet is posting ready status" || len(c) != 2 {
		t.Fatalf("the kubelet's conditions changed: %+v", c)
	}
	if !strings.Contains(e.log.String(), "condition=False/SkipLevel") {
		t.Fatalf("log %s", e.log.String())
	}
	// A later pass fails: still False, the transition kept.
	d.Phase, d.Refusal, d.Reason, d.BootID = status.PhaseFailed, "", "KubeadmFailed", "b-2"
	if err := status.Write(e.node.R(), d); err != nil {
		t.Fatal(err)
	}
	later := testutil.NewClock()
	later.Advance(time.Hour)
	if err := e.runAt(t, time.Minute, later); err != nil {
		t.Fatal(err)
	}
	again := conds()["KubernetesUpgrade"]
	if again.Reason != "KubeadmFailed" || !again.LastTransitionTime.Equal(&up.LastTransitionTime) || !again.LastHeartbeatTime.Time.Equal(later.Now()) {
		t.Fatalf("after a failed pass an hour later: %+v (before %+v)", again, up)
	}
	// Then a converged one: True, the transition now.
	d.Phase, d.Reason, d.BootID = status.PhaseConverged, "", "b-3"
	if err := status.Write(e.node.R(), d); err != nil {
		t.Fatal(err)
	}
	later.Advance(time.Hour)
	if err := e.runAt(t, time.Minute, later); err != nil {
		t.Fatal(err)
	}
	if done := conds()["KubernetesUpgrade"]; done.Status != "True" || done.Reason != "Converged" || !done.LastTransitionTime.Time.Equal(later.Now()) {
		t.Fatalf("after a converged pass: %+v", done)
	}
	if ready := conds()["Ready"]; ready.Status != "True" || ready.Message != "kubelet is posting ready status" {
		t.Fatalf("the kubelet's Ready condition changed: %+v", ready)
	}
}
