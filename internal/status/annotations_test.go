package status

import (
	"strings"
	"testing"
)

func annotated(phase string) Document {
	return Document{Phase: phase, Role: "worker", Member: true, Pin: "v1.37.2", Bundled: "v1.37.2", NodeVersion: "v1.37.2",
		ClusterVersion: "v1.37.2", Time: "2026-11-29T12:00:00Z", BootID: "b-1"}
}

func TestAnnotations(t *testing.T) {
	d := annotated(PhaseRefused)
	d.Refusal, d.Reason, d.Message = "PinNewerThanImage", "UpgradeRefused", "pin v1.37.2 is newer than the kubeadm v1.36.3 this image bundles\x1b[2J"+strings.Repeat("x", 900)
	a := Annotations(d)
	for k, want := range map[string]string{"phase": "Refused", "outcome": "refused", "refusal": "PinNewerThanImage", "reason": "UpgradeRefused",
		"pin": "v1.37.2", "node-version": "v1.37.2", "bundled": "v1.37.2", "time": "2026-11-29T12:00:00Z", "boot-id": "b-1", "role": "worker"} {
		if a[AnnotationPrefix+k] != want {
			t.Errorf("%s = %q, want %q", k, a[AnnotationPrefix+k], want)
		}
	}
	if m := a[AnnotationPrefix+"message"]; len(m) > MaxAnnotationMessage+16 || strings.ContainsRune(m, 0x1b) {
		t.Errorf("message not bounded and sanitized: %d bytes %q", len(m), m[:40])
	}
	// A converged pass clears the refusal of an earlier one.
	a = Annotations(annotated(PhaseConverged))
	if v, ok := a[AnnotationPrefix+"refusal"]; !ok || v != "" || a[AnnotationPrefix+"outcome"] != "converged" {
		t.Errorf("converged: refusal %q (set %v), outcome %q", v, ok, a[AnnotationPrefix+"outcome"])
	}
	// A pass waiting at the control-plane gate is running, as is an upgrading one.
	for _, ph := range []string{PhaseWaiting, PhaseUpgrading} {
		if got := Annotations(annotated(ph))[AnnotationPrefix+"outcome"]; got != "running" {
			t.Errorf("%s: outcome %q, want running", ph, got)
		}
	}
	for k := range a {
		if !strings.HasPrefix(k, AnnotationPrefix) {
			t.Errorf("annotation %s outside the prefix", k)
		}
	}
}
