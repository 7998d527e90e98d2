package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kairos-io/provider-kubernetes/internal/testutil/apiservertest"
)

// What a node's own credentials (its kubelet.conf: system:node:NAME) may
// do, against the real kube-apiserver v1.37.2 with the Node authorizer
// and the NodeRestriction admission as kubeadm runs them: on its own Node
// set a condition of its own in the status (the kubelet's are left as
// they are), cordon it, list the pods bound to it and evict them; on
// another node none of it; PodDisruptionBudgets it may not read.
func TestANodesOwnCredentialsAgainstTheRealAPIServer(t *testing.T) {
	s := apiservertest.Start(t)
	admin := clientFor(t, s.Admin, 10*time.Second)
	w1 := clientFor(t, s.NodeKubeconfig(t, "w1"), 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if w1.NodeName != "w1" {
		t.Fatalf("the node's client names node %q", w1.NodeName)
	}
	for _, name := range []string{"w1", "w2"} {
		if err := admin.createCluster(ctx, "nodes", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name}}); err != nil {
			t.Fatal(err)
		}
		// The kubelet's own conditions.
		st := `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status","lastHeartbeatTime":"2026-11-29T11:00:00Z","lastTransitionTime":"2026-11-29T10:00:00Z"},{"type":"MemoryPressure","status":"False","reason":"KubeletHasSufficientMemory","lastHeartbeatTime":"2026-11-29T11:00:00Z","lastTransitionTime":"2026-11-29T10:00:00Z"}]}}`
		if _, err := raw(admin.core.Patch("application/strategic-merge-patch+json").Resource("nodes").Name(name).SubResource("status").Body([]byte(st)).Do(ctx)); err != nil {
			t.Fatal(err)
		}
	}

	// A condition of the provider's own, on its own Node's status.
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	cond := NodeCondition{Type: "KubernetesUpgrade", Status: "Unknown", Reason: "Upgrading", Message: "upgrade-node", LastHeartbeatTime: t0, LastTransitionTime: t0}
	if err := w1.SetNodeCondition(ctx, "w1", cond); err != nil {
		t.Fatal(err)
	}
	cond.Status, cond.Reason, cond.Message, cond.LastHeartbeatTime = "True", "Converged", "converged at v1.37.2", t0.Add(time.Minute)
	if err := w1.SetNodeCondition(ctx, "w1", cond); err != nil {
		t.Fatal(err)
	}
	got, err := w1.NodeConditions(ctx, "w1")
	if err != nil {
		t.Fatal(err)
	}
	byType := map[string]NodeCondition{}
	for _, c := range got {
		byType[c.Type] = c
	}
	up := byType["KubernetesUpgrade"]
	if len(got) != 3 || up.Status != cond.Status || up.Reason != cond.Reason || up.Message != cond.Message ||
		!up.LastHeartbeatTime.Equal(cond.LastHeartbeatTime) || !up.LastTransitionTime.Equal(cond.LastTransitionTime) {
		t.Fatalf("conditions %+v, want the provider's %+v among 3", got, cond)
	}
	if r := byType["Ready"]; r.Status != "True" || r.Reason != "KubeletReady" || r.Message != "kubelet is posting ready status" ||
		!r.LastTransitionTime.Equal(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)) || byType["MemoryPressure"].Reason != "KubeletHasSufficientMemory" {
		t.Fatalf("the kubelet's conditions changed: %+v", byType)
	}
	// Not on another node's: the NodeRestriction admission.
	if err := w1.SetNodeCondition(ctx, "w2", cond); !IsForbidden(err) || !strings.Contains(err.Error(), `node "w1" is not allowed to modify node "w2"`) {
		t.Fatalf("a condition on another node's Node: %v", err)
	}

	// Cordon and uncordon its own Node; not another's.
	if was, err := w1.Cordon(ctx, "w1", true); err != nil || was {
		t.Fatalf("cordon: was %v, %v", was, err)
	}
	if was, err := w1.Cordon(ctx, "w1", true); err != nil || !was {
		t.Fatalf("cordon again: was %v, %v", was, err)
	}
	if _, err := w1.Cordon(ctx, "w2", true); !IsForbidden(err) {
		t.Fatalf("cordon another node: %v", err)
	}
	if was, err := admin.Cordon(ctx, "w2", true); err != nil || was {
		t.Fatalf("the admin cordons w2: was %v, %v", was, err)
	}

	// Its pods: listed (the spec.nodeName field selector) and evicted;
	// another node's neither.
	for _, p := range []struct{ name, node string }{{"a", "w1"}, {"b", "w2"}} {
		pod := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": p.name, "labels": map[string]string{"app": "x"}},
			"spec": map[string]any{"nodeName": p.node, "containers": []map[string]any{{"name": "c", "image": "registry.k8s.io/pause:3.10"}}}}
		if err := admin.Create(ctx, "default", "pods", pod); err != nil {
			t.Fatal(err)
		}
	}
	pods, err := w1.PodsOn(ctx, "w1")
	if err != nil || len(pods) != 1 || pods[0].String() != "default/a" || pods[0].UID == "" || pods[0].Labels["app"] != "x" || pods[0].Terminating {
		t.Fatalf("w1's pods %+v %v", pods, err)
	}
	if _, err := w1.PodsOn(ctx, "w2"); !IsForbidden(err) {
		t.Fatalf("another node's pods: %v", err)
	}
	others, err := admin.PodsOn(ctx, "w2")
	if err != nil || len(others) != 1 {
		t.Fatalf("w2's pods %+v %v", others, err)
	}
	if err := w1.Evict(ctx, others[0]); !IsForbidden(err) || !strings.Contains(err.Error(), "node w1 can only evict pods with spec.nodeName set to itself") {
		t.Fatalf("evict another node's pod: %v", err)
	}
	// An eviction names the very pod: a stale uid is refused, a Conflict
	// (after the apiserver's own retries of about 10s: a longer timeout).
	stale := pods[0]
	stale.UID = "00000000-0000-0000-0000-000000000000"
	slow := clientFor(t, s.NodeKubeconfig(t, "w1"), 30*time.Second)
	if err := slow.Evict(ctx, stale); !apierrors.IsConflict(err) || !strings.Contains(err.Error(), "the UID in the precondition (00000000-0000-0000-0000-000000000000) does not match") {
		t.Fatalf("evict with a stale uid: %v", err)
	}
	if err := w1.Evict(ctx, pods[0]); err != nil {
		t.Fatal(err)
	}
	// Bound to a node, the pod waits for its kubelet: terminating.
	if pods, err = w1.PodsOn(ctx, "w1"); err != nil || len(pods) != 1 || !pods[0].Terminating {
		t.Fatalf("after the eviction: %+v %v", pods, err)
	}
	if err := w1.Evict(ctx, NodePod{Namespace: "default", Name: "absent"}); !IsNotFound(err) {
		t.Fatalf("evict a pod that is not there: %v", err)
	}

	// Budgets: the admin reads them, the node may not.
	pdb := map[string]any{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": map[string]any{"name": "x"},
		"spec": map[string]any{"minAvailable": "50%", "selector": map[string]any{"matchLabels": map[string]string{"app": "x"}}}}
	if _, err := raw(admin.policy.Post().Namespace("default").Resource("poddisruptionbudgets").SetHeader("Content-Type", "application/json").
		Body(mustJSON(t, pdb)).Do(ctx)); err != nil {
		t.Fatal(err)
	}
	budgets, err := admin.DisruptionBudgets(ctx, "default")
	if err != nil || len(budgets) != 1 || budgets[0].Name != "x" || budgets[0].MinAvailable != "50%" || budgets[0].MaxUnavailable != "" ||
		!budgets[0].Selects(map[string]string{"app": "x", "tier": "web"}) || budgets[0].Selects(map[string]string{"app": "y"}) {
		t.Fatalf("budgets %+v %v", budgets, err)
	}
	if _, err := w1.DisruptionBudgets(ctx, "default"); !IsForbidden(err) {
		t.Fatalf("a node lists budgets: %v", err)
	}
}

// A peer's Ready condition is its kubelet's text: the record keeps a
// bounded, single-line copy with no key material, whatever it wrote.
func TestRecordBoundsNotReady(t *testing.T) {
	var n node
	n.Metadata.Name = "cp3"
	n.Status.Conditions = append(n.Status.Conditions, nodeCondition{Type: "Ready", Status: "False", Reason: "KubeletNotReady",
		Message: "line one\nline two token=abcdef.0123456789abcdef " + strings.Repeat("x", 100<<10)})
	r := record(n)
	if r.Ready || len(r.NotReady) > MaxNotReady || strings.Contains(r.NotReady, "\n") || strings.Contains(r.NotReady, "0123456789abcdef") ||
		!strings.HasPrefix(r.NotReady, "KubeletNotReady: line one line two") {
		t.Fatalf("NotReady of %d bytes: %.120q", len(r.NotReady), r.NotReady)
	}
}
