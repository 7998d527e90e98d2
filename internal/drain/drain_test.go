package drain

import (
	"reflect"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/kube"
)

// The decision over a node's pods: what stays (excluded, the kubelet's
// mirror pods, DaemonSet pods), what is waited for (terminating), what is
// evicted (a controller's pods; finished pods whoever owns them) and what
// a drain refuses without --force (running pods no controller manages).
func TestDecide(t *testing.T) {
	pod := func(name, controller, phase string, mirror, terminating bool) kube.NodePod {
		return kube.NodePod{Namespace: "default", Name: name, UID: "uid-" + name, Controller: controller, Phase: phase, Mirror: mirror, Terminating: terminating}
	}
	pods := []kube.NodePod{
		pod("web-0", "ReplicaSet", "Running", false, false),
		pod("db-0", "StatefulSet", "Running", false, false),
		pod("proxy", "DaemonSet", "Running", false, false),
		pod("kube-apiserver-w1", "Node", "Running", true, false),
		pod("static-no-owner", "", "Running", true, false),
		pod("leaving", "ReplicaSet", "Running", false, true),
		pod("bare-leaving", "", "Running", false, true),
		pod("job-done", "Job", "Succeeded", false, false),
		pod("bare-done", "", "Failed", false, false),
		pod("bare", "", "Running", false, false),
		pod("drainer", "Job", "Running", false, false),
	}
	names := func(ps []kube.NodePod) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		return out
	}
	skipped := func(ss []Skipped) map[string]string {
		out := map[string]string{}
		for _, s := range ss {
			out[s.Pod.Name] = s.Why
		}
		return out
	}
	p := Decide(pods, Options{Exclude: map[string]bool{"default/drainer": true}})
	if got, want := names(p.Evict), []string{"web-0", "db-0", "job-done", "bare-done"}; !reflect.DeepEqual(got, want) {
		t.Errorf("evict %v, want %v", got, want)
	}
	if got, want := names(p.Terminating), []string{"leaving", "bare-leaving"}; !reflect.DeepEqual(got, want) {
		t.Errorf("terminating %v, want %v", got, want)
	}
	if got, want := names(p.Unmanaged), []string{"bare"}; !reflect.DeepEqual(got, want) {
		t.Errorf("unmanaged %v, want %v", got, want)
	}
	want := map[string]string{"proxy": "DaemonSet", "kube-apiserver-w1": "mirror pod", "static-no-owner": "mirror pod", "drainer": "excluded"}
	if got := skipped(p.Skipped); !reflect.DeepEqual(got, want) {
		t.Errorf("skipped %v, want %v", got, want)
	}
	if got, want := names(p.Left()), []string{"bare", "bare-done", "bare-leaving", "db-0", "job-done", "leaving", "web-0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("left %v, want %v", got, want)
	}
	// --force: the pod without a controller is evicted too.
	p = Decide(pods, Options{Force: true})
	if got, want := names(p.Evict), []string{"web-0", "db-0", "job-done", "bare-done", "bare", "drainer"}; !reflect.DeepEqual(got, want) || len(p.Unmanaged) != 0 {
		t.Errorf("forced: evict %v (want %v), unmanaged %v", got, want, names(p.Unmanaged))
	}
	// Nothing on the node: nothing left.
	if p := Decide(nil, Options{}); len(p.Left()) != 0 || len(p.Skipped) != 0 {
		t.Errorf("no pods: %+v", p)
	}
}
