package drain

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/apiservertest"
)

// client is a kube.Client with the kubeconfig given, as a node reads it.
func client(t *testing.T, kubeconfig string) *kube.Client {
	t.Helper()
	n := testutil.NewNode(t, "x")
	n.Write(paths.KubeletConf, kubeconfig, 0o600)
	c, err := kube.Load(n.R(), 10*time.Second, paths.KubeletConf)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func drainWith(t *testing.T, api API, node string, budget time.Duration, o Options) (Result, error, string) {
	t.Helper()
	var log bytes.Buffer
	res, err := Run(context.Background(), Config{API: api, Node: node, Budget: budget, Interval: time.Second, Options: o,
		Log: slog.New(slog.NewTextHandler(&log, nil))})
	t.Logf("drain %s: %+v, %v\n%s", node, res, err, log.String())
	return res, err, log.String()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A drain against the real kube-apiserver v1.37.2: with the node's own
// credentials (its kubelet.conf) it cordons the node, evicts its pods
// through the Eviction API, leaves the DaemonSet's and the mirror pod,
// retries the pod a PodDisruptionBudget protects until the budget allows
// it; when the budget does not, it stops at its bound, names the budget
// and the pod, and makes the node schedulable again. It refuses a node
// with a pod no controller manages (nothing changed), and a node's
// credentials may not drain another node.
func TestDrainAgainstTheRealAPIServer(t *testing.T) {
	s := apiservertest.Start(t)
	admin := client(t, s.Admin)

	web := func(node, name, rs string) apiservertest.Pod {
		return apiservertest.Pod{Node: node, Name: name, App: "web-" + node, OwnerKind: "ReplicaSet", OwnerAPIVersion: "apps/v1", Owner: "web-" + node, OwnerUID: rs, Phase: "Running"}
	}

	t.Run("a budget blocks, then allows", func(t *testing.T) {
		rs := s.NodeWithPods(t, "w1")
		s.Pod(t, web("w1", "web-0", rs))
		s.Pod(t, web("w1", "web-1", rs))
		// Two healthy, one must stay: one disruption allowed.
		s.Budget(t, "web", "web-w1", 1, 2, 1)
		s.Kubelet(t, "w1")
		// The disruption controller, played: the first eviction spent the
		// allowed disruption; a while later the evicted pod's replacement
		// is healthy elsewhere and it allows one again.
		allowed := s.BudgetStatusAfter(4*time.Second, "web", 1, 2, 1)
		start := time.Now()
		res, err, log := drainWith(t, client(t, s.NodeKubeconfig(t, "w1")), "w1", time.Minute, Options{})
		if err != nil {
			t.Fatal(err)
		}
		// It waited for the budget: the second web pod was refused (429)
		// until the budget allowed one disruption again.
		if d := time.Since(start); d < 4*time.Second {
			t.Fatalf("drained in %s: before the budget allowed the second eviction", d)
		}
		if err := <-allowed; err != nil {
			t.Fatal(err)
		}
		left, cordoned := s.PodsOn(t, "w1")
		if !cordoned || len(left) != 2 || !contains(left, "proxy-w1-x") || !contains(left, "static-w1") {
			t.Fatalf("after the drain: cordoned %v, pods %v", cordoned, left)
		}
		if len(res.Evicted) != 3 || !contains(res.Evicted, "default/web-0") || !contains(res.Evicted, "default/web-1") || !contains(res.Evicted, "default/done-w1") ||
			len(res.Skipped) != 2 || len(res.Left) != 0 || res.Uncordoned {
			t.Fatalf("result %+v", res)
		}
		if !strings.Contains(log, "level=INFO msg=drain outcome=drained node=w1 evicted=3 skipped=2 left=0") {
			t.Fatalf("log %s", log)
		}
	})

	t.Run("a budget blocks to the end", func(t *testing.T) {
		rs := s.NodeWithPods(t, "w2")
		s.Pod(t, web("w2", "db-0", rs))
		s.Budget(t, "db", "web-w2", 1, 1, 0)
		s.Kubelet(t, "w2")
		// The node's own credentials may not list the budgets: the
		// apiserver's answer to the eviction names it.
		res, err, log := drainWith(t, client(t, s.NodeKubeconfig(t, "w2")), "w2", 5*time.Second, Options{})
		if !errors.Is(err, ErrNotDrained) || !strings.Contains(err.Error(), "default/db-0") {
			t.Fatalf("err %v", err)
		}
		if got := res.Left["default/db-0"]; !strings.Contains(got, "blocked: The disruption budget db needs 1 healthy pods and has 1 currently") {
			t.Fatalf("left %v", res.Left)
		}
		if len(res.Blocking) != 1 || !strings.HasPrefix(res.Blocking[0], "The disruption budget db needs 1 healthy pods and has 1 currently (the apiserver's answer to the eviction of default/db-0;") {
			t.Fatalf("blocking %q", res.Blocking)
		}
		left, cordoned := s.PodsOn(t, "w2")
		if cordoned || !res.Uncordoned || !contains(left, "db-0") || contains(left, "done-w2") {
			t.Fatalf("after the drain: cordoned %v (uncordoned %v), pods %v", cordoned, res.Uncordoned, left)
		}
		if !strings.Contains(log, "level=ERROR msg=drain outcome=failed node=w2 evicted=1 skipped=2 left=1") || !strings.Contains(log, "uncordoned=true") {
			t.Fatalf("log %s", log)
		}
		// With credentials that may list them: the budget's name and numbers.
		res, err, _ = drainWith(t, admin, "w2", 3*time.Second, Options{})
		if !errors.Is(err, ErrNotDrained) || len(res.Blocking) != 1 ||
			res.Blocking[0] != "default/db (minAvailable 1, maxUnavailable -: 1 of 1 desired healthy, 0 disruptions allowed)" {
			t.Fatalf("blocking %q, %v", res.Blocking, err)
		}
		// A node already cordoned before the drain stays cordoned.
		s.Do(t, "PATCH", "/api/v1/nodes/w2", "application/merge-patch+json", map[string]any{"spec": map[string]any{"unschedulable": true}})
		if res, err, _ = drainWith(t, admin, "w2", 2*time.Second, Options{}); !errors.Is(err, ErrNotDrained) || res.Uncordoned {
			t.Fatalf("a cordoned node: %+v %v", res, err)
		}
		if _, cordoned := s.PodsOn(t, "w2"); !cordoned {
			t.Fatal("the drain uncordoned a node cordoned before it")
		}
	})

	t.Run("a pod without a controller", func(t *testing.T) {
		s.NodeWithPods(t, "w3")
		s.Pod(t, apiservertest.Pod{Node: "w3", Name: "bare", App: "bare", Phase: "Running"})
		s.Kubelet(t, "w3")
		res, err, log := drainWith(t, client(t, s.NodeKubeconfig(t, "w3")), "w3", 30*time.Second, Options{})
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "default/bare") || len(res.Evicted) != 0 {
			t.Fatalf("%+v %v", res, err)
		}
		left, cordoned := s.PodsOn(t, "w3")
		if cordoned || len(left) != 4 {
			t.Fatalf("a refused drain changed the node: cordoned %v, pods %v", cordoned, left)
		}
		if !strings.Contains(log, "level=ERROR msg=drain outcome=refused node=w3") {
			t.Fatalf("log %s", log)
		}
		// --force: evicted, and the node drained.
		if res, err, _ = drainWith(t, client(t, s.NodeKubeconfig(t, "w3")), "w3", 30*time.Second, Options{Force: true}); err != nil || !contains(res.Evicted, "default/bare") {
			t.Fatalf("forced: %+v %v", res, err)
		}
	})

	t.Run("another node's credentials", func(t *testing.T) {
		s.NodeWithPods(t, "w4")
		res, err, _ := drainWith(t, client(t, s.NodeKubeconfig(t, "w1")), "w4", 30*time.Second, Options{})
		if !errors.Is(err, ErrForbidden) || len(res.Evicted) != 0 {
			t.Fatalf("w1's credentials draining w4: %+v %v", res, err)
		}
		if left, cordoned := s.PodsOn(t, "w4"); cordoned || len(left) != 3 {
			t.Fatalf("w4 changed: cordoned %v, pods %v", cordoned, left)
		}
	})
}
