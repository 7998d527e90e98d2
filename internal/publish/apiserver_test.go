package publish

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/apiservertest"
)

// publish with the node's own credentials (its kubelet.conf), against the
// real kube-apiserver v1.37.2 with the Node authorizer and the
// NodeRestriction admission: the KubernetesUpgrade condition is created in
// the Node's status beside the annotations, updated by later passes with
// its transition time kept while the status stays and moved when it
// changes, and the kubelet's own conditions are left exactly as they were.
func TestPublishAgainstTheRealAPIServer(t *testing.T) {
	s := apiservertest.Start(t)
	s.Do(t, "POST", "/api/v1/nodes", "", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "w1"}})
	kubelet := []map[string]string{
		{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": "2026-11-29T11:00:00Z", "lastTransitionTime": "2026-11-29T10:00:00Z"},
		{"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "message": "kubelet has no disk pressure", "lastHeartbeatTime": "2026-11-29T11:00:00Z", "lastTransitionTime": "2026-11-29T10:00:00Z"},
	}
	s.Do(t, "PATCH", "/api/v1/nodes/w1/status", "application/strategic-merge-patch+json", map[string]any{"status": map[string]any{"conditions": kubelet}})

	n := testutil.NewNode(t, "w1")
	n.Write(paths.KubeletConf, s.NodeKubeconfig(t, "w1"), 0o600)
	e := &env{node: n, log: &testutil.SyncBuffer{}}
	type condition struct {
		Type, Status, Reason, Message, LastHeartbeatTime, LastTransitionTime string
	}
	node := func() (map[string]condition, map[string]string) {
		var nd struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Status struct {
				Conditions []condition `json:"conditions"`
			} `json:"status"`
		}
		if err := json.Unmarshal(s.Do(t, "GET", "/api/v1/nodes/w1", "", nil), &nd); err != nil {
			t.Fatal(err)
		}
		out := map[string]condition{}
		for _, c := range nd.Status.Conditions {
			out[c.Type] = c
		}
		return out, nd.Metadata.Annotations
	}
	publishAt := func(d status.Document, at time.Duration) {
		t.Helper()
		if err := status.Write(n.R(), d); err != nil {
			t.Fatal(err)
		}
		clk := testutil.NewClock()
		clk.Advance(at)
		if err := e.runAt(t, time.Minute, clk); err != nil {
			t.Fatalf("%v\n%s", err, e.log.String())
		}
	}
	kubeletKept := func(got map[string]condition) {
		t.Helper()
		for _, k := range kubelet {
			if c := got[k["type"]]; c != (condition{k["type"], k["status"], k["reason"], k["message"], k["lastHeartbeatTime"], k["lastTransitionTime"]}) {
				t.Fatalf("the kubelet's %s condition is now %+v", k["type"], c)
			}
		}
	}

	// A refused pass: False, the refusal code; created at 12:00.
	d := doc(status.PhaseRefused)
	d.Refusal, d.Reason, d.Message = "SkipLevel", "UpgradeRefused", "v1.35.1 -> v1.37.2 skips a minor"
	publishAt(d, 0)
	got, annotations := node()
	want := condition{"KubernetesUpgrade", "False", "SkipLevel", "v1.35.1 -> v1.37.2 skips a minor", "2026-11-29T12:00:00Z", "2026-11-29T12:00:00Z"}
	if got["KubernetesUpgrade"] != want || len(got) != 3 || annotations[status.AnnotationPrefix+status.KeyPhase] != "Refused" {
		t.Fatalf("after a refused pass: %+v, annotations %v", got, annotations)
	}
	kubeletKept(got)

	// A failed pass an hour later: still False, the transition kept.
	d.Phase, d.Refusal, d.Reason, d.Message, d.BootID = status.PhaseFailed, "", "KubeadmFailed", "kubeadm upgrade node: exit 1", "b-2"
	publishAt(d, time.Hour)
	got, _ = node()
	want = condition{"KubernetesUpgrade", "False", "KubeadmFailed", "kubeadm upgrade node: exit 1", "2026-11-29T13:00:00Z", "2026-11-29T12:00:00Z"}
	if got["KubernetesUpgrade"] != want || len(got) != 3 {
		t.Fatalf("after a failed pass: %+v", got)
	}
	kubeletKept(got)

	// A converged pass: True, the transition now.
	d.Phase, d.Reason, d.Message, d.BootID = status.PhaseConverged, "", "converged at v1.37.2", "b-3"
	publishAt(d, 2*time.Hour)
	got, annotations = node()
	want = condition{"KubernetesUpgrade", "True", "Converged", "converged at v1.37.2", "2026-11-29T14:00:00Z", "2026-11-29T14:00:00Z"}
	if got["KubernetesUpgrade"] != want || len(got) != 3 || annotations[status.AnnotationPrefix+status.KeyPhase] != "Converged" {
		t.Fatalf("after a converged pass: %+v, annotations %v", got, annotations)
	}
	kubeletKept(got)
}
