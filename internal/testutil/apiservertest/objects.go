package apiservertest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"
)

// The objects a drain scenario needs, made with the admin's credentials.
// No controller manager runs: a PodDisruptionBudget's status is written
// here as the disruption controller would write it, a pod's status as its
// kubelet would report it, and Kubelet stands in for a node's kubelet
// removing the pods whose deletion started.

// JSON is Do with the answer decoded.
func (s *Server) JSON(t testing.TB, verb, path, contentType string, body any) map[string]any {
	t.Helper()
	var out map[string]any
	if err := json.Unmarshal(s.Do(t, verb, path, contentType, body), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// Node makes a Node.
func (s *Server) Node(t testing.TB, name string) {
	t.Helper()
	s.Do(t, "POST", "/api/v1/nodes", "", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name}})
}

// Controller makes a DaemonSet or a ReplicaSet (kind) in namespace whose
// pods are labelled app=name, and returns its uid (no controller creates
// its pods: Pod does).
func (s *Server) Controller(t testing.TB, namespace, kind, name string) string {
	t.Helper()
	resource := map[string]string{"DaemonSet": "daemonsets", "ReplicaSet": "replicasets"}[kind]
	spec := map[string]any{"selector": map[string]any{"matchLabels": map[string]string{"app": name}},
		"template": map[string]any{"metadata": map[string]any{"labels": map[string]string{"app": name}},
			"spec": map[string]any{"containers": []map[string]any{{"name": "c", "image": "registry.k8s.io/pause:3.10"}}}}}
	if kind == "ReplicaSet" {
		spec["replicas"] = 2
	}
	obj := s.JSON(t, "POST", "/apis/apps/v1/namespaces/"+namespace+"/"+resource, "", map[string]any{"apiVersion": "apps/v1", "kind": kind,
		"metadata": map[string]any{"name": name}, "spec": spec})
	return obj["metadata"].(map[string]any)["uid"].(string)
}

// Pod is a pod a scenario puts on a node.
type Pod struct {
	Node, Name, App string
	Namespace       string // "": default
	// Owner is its controlling owner, "" none: Kind ("DaemonSet",
	// "ReplicaSet", "Node"), APIVersion, Name and UID.
	OwnerKind, OwnerAPIVersion, Owner, OwnerUID string
	Annotations                                 map[string]string
	// Phase as its kubelet reports it; a Running pod is Ready.
	Phase string
}

// Pod makes a pod bound to its node, with its status.
func (s *Server) Pod(t testing.TB, p Pod) {
	t.Helper()
	if p.Namespace == "" {
		p.Namespace = "default"
	}
	meta := map[string]any{"name": p.Name, "labels": map[string]string{"app": p.App}, "annotations": p.Annotations}
	if p.OwnerKind != "" {
		meta["ownerReferences"] = []map[string]any{{"apiVersion": p.OwnerAPIVersion, "kind": p.OwnerKind, "name": p.Owner, "uid": p.OwnerUID, "controller": true}}
	}
	s.Do(t, "POST", "/api/v1/namespaces/"+p.Namespace+"/pods", "", map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": meta,
		"spec": map[string]any{"nodeName": p.Node, "containers": []map[string]any{{"name": "c", "image": "registry.k8s.io/pause:3.10"}}}})
	st := map[string]any{"phase": p.Phase}
	if p.Phase == "Running" {
		st["conditions"] = []map[string]string{{"type": "Ready", "status": "True"}}
	}
	s.Do(t, "PATCH", "/api/v1/namespaces/"+p.Namespace+"/pods/"+p.Name+"/status", "application/merge-patch+json", map[string]any{"status": st})
}

// Budget makes a PodDisruptionBudget over the pods labelled app with
// minAvailable, and its status (BudgetStatus).
func (s *Server) Budget(t testing.TB, name, app string, minAvailable, healthy, allowed int) {
	t.Helper()
	s.Do(t, "POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", "", map[string]any{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"minAvailable": minAvailable, "selector": map[string]any{"matchLabels": map[string]string{"app": app}}}})
	s.BudgetStatus(t, name, minAvailable, healthy, allowed)
}

// BudgetStatus writes a budget's status as the disruption controller
// would: observed, healthy pods of minAvailable desired, disruptions
// allowed.
func (s *Server) BudgetStatus(t testing.TB, name string, minAvailable, healthy, allowed int) {
	t.Helper()
	if err := s.TryBudgetStatus(name, minAvailable, healthy, allowed); err != nil {
		t.Fatal(err)
	}
}

// TryBudgetStatus is BudgetStatus returning the error.
func (s *Server) TryBudgetStatus(name string, minAvailable, healthy, allowed int) error {
	_, err := s.Try("PATCH", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/"+name+"/status", "application/merge-patch+json",
		map[string]any{"status": map[string]any{"observedGeneration": 1, "desiredHealthy": minAvailable, "currentHealthy": healthy,
			"disruptionsAllowed": allowed, "expectedPods": healthy}})
	return err
}

// BudgetStatusAfter writes a budget's status (BudgetStatus) after d, from
// a goroutine, and sends the outcome on the channel it returns: the
// disruption controller allowing a disruption again once an evicted pod's
// replacement is ready elsewhere.
func (s *Server) BudgetStatusAfter(d time.Duration, name string, minAvailable, healthy, allowed int) <-chan error {
	done := make(chan error, 1)
	go func() {
		time.Sleep(d)
		done <- s.TryBudgetStatus(name, minAvailable, healthy, allowed)
	}()
	return done
}

// PodsOn names the pods bound to node, and says whether the node is
// unschedulable.
func (s *Server) PodsOn(t testing.TB, node string) (names []string, unschedulable bool) {
	t.Helper()
	var l struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal(s.Do(t, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3D"+node, "", nil), &l); err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Items {
		names = append(names, p.Metadata.Name)
	}
	n := s.JSON(t, "GET", "/api/v1/nodes/"+node, "", nil)
	u, _ := n["spec"].(map[string]any)["unschedulable"].(bool)
	return names, u
}

// Kubelet stands in for node's kubelet until the test ends: a pod bound
// to it whose deletion started is removed (deleted with a grace period of
// 0, as the kubelet does once it has stopped the pod's containers).
func (s *Server) Kubelet(t testing.TB, node string) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		for ctx.Err() == nil {
			var l struct {
				Items []struct {
					Metadata struct {
						Name              string  `json:"name"`
						Namespace         string  `json:"namespace"`
						DeletionTimestamp *string `json:"deletionTimestamp"`
					} `json:"metadata"`
				} `json:"items"`
			}
			if b, err := s.Try("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3D"+node, "", nil); err == nil && json.Unmarshal(b, &l) == nil {
				for _, p := range l.Items {
					if p.Metadata.DeletionTimestamp != nil {
						_, _ = s.Try("DELETE", "/api/v1/namespaces/"+p.Metadata.Namespace+"/pods/"+p.Metadata.Name, "", map[string]any{"gracePeriodSeconds": 0})
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
}

// NodeWithPods makes a Node carrying what a node carries besides the
// workloads a scenario adds: a DaemonSet's pod (proxy-NODE-x), the
// kubelet's mirror pod of a static pod (static-NODE) and a finished pod
// (done-NODE). It returns the uid of a ReplicaSet (web-NODE) for the
// scenario's pods.
func (s *Server) NodeWithPods(t testing.TB, node string) (replicaSetUID string) {
	t.Helper()
	s.Node(t, node)
	ds := s.Controller(t, "default", "DaemonSet", "proxy-"+node)
	rs := s.Controller(t, "default", "ReplicaSet", "web-"+node)
	s.Pod(t, Pod{Node: node, Name: "proxy-" + node + "-x", App: "proxy-" + node, OwnerKind: "DaemonSet", OwnerAPIVersion: "apps/v1", Owner: "proxy-" + node, OwnerUID: ds, Phase: "Running"})
	s.Pod(t, Pod{Node: node, Name: "static-" + node, App: "static", OwnerKind: "Node", OwnerAPIVersion: "v1", Owner: node, OwnerUID: "00000000-0000-0000-0000-00000000000a",
		Annotations: map[string]string{"kubernetes.io/config.mirror": "hash"}, Phase: "Running"})
	s.Pod(t, Pod{Node: node, Name: "done-" + node, App: "done", Phase: "Succeeded"})
	return rs
}
