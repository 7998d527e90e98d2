package docs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/apiservertest"
)

// docs/drain.md on a worker w1 of the real kube-apiserver v1.37.2 (in the
// sandbox's own network namespace; the test plays the disruption
// controller and the kubelet, which do not run): the drain with the
// node's own kubelet.conf, a PodDisruptionBudget allowing one disruption
// at a time; kubectl wait on the condition the provider's publish set;
// uncordon; a drain a budget blocks to its end; the page's RBAC, applied
// with its kubectl command, is enough for a ServiceAccount's drain.
func TestDrainPage(t *testing.T) {
	inSandbox(t, func(t *testing.T, s *sandbox) {
		p := open(t, "drain.md")
		api := apiservertest.Start(t)
		kubectl := testbin.KubernetesBinary(t, apiservertest.Version, "kubectl")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		w := s.node("w1")
		w.Write(paths.KubeletConf, api.NodeKubeconfig(t, "w1"), 0o600)
		w.Write(paths.AdminConf, api.Admin, 0o600)
		w.install(kubectl, paths.Kubectl)

		// w1 runs kube-proxy and two pods of a web Deployment's ReplicaSet,
		// of which a budget wants one available.
		api.Node(t, "w1")
		ds := api.Controller(t, "kube-system", "DaemonSet", "kube-proxy")
		rs := api.Controller(t, "default", "ReplicaSet", "web-6f7c9d8b5")
		api.Pod(t, apiservertest.Pod{Node: "w1", Namespace: "kube-system", Name: "kube-proxy-7xq2d", App: "kube-proxy",
			OwnerKind: "DaemonSet", OwnerAPIVersion: "apps/v1", Owner: "kube-proxy", OwnerUID: ds, Phase: "Running"})
		for _, name := range []string{"web-6f7c9d8b5-4kq2x", "web-6f7c9d8b5-9vzt8"} {
			api.Pod(t, apiservertest.Pod{Node: "w1", Name: name, App: "web-6f7c9d8b5", OwnerKind: "ReplicaSet", OwnerAPIVersion: "apps/v1",
				Owner: "web-6f7c9d8b5", OwnerUID: rs, Phase: "Running"})
		}
		api.Budget(t, "web", "web-6f7c9d8b5", 1, 2, 1)
		api.Kubelet(t, "w1")
		// The disruption controller, played: the first eviction spends the
		// one disruption; the replacement ready elsewhere, it allows one again.
		allowed := api.BudgetStatusAfter(3*time.Second, "web", 1, 2, 1)
		out := w.docOK(p, "provider-kubernetes drain", "level=INFO msg=drain outcome=drained node=w1 evicted=2 skipped=1 left=0")
		shows(t, out, example(t, p, "provider-kubernetes drain"))
		if err := <-allowed; err != nil {
			t.Fatal(err)
		}
		if pods, cordoned := api.PodsOn(t, "w1"); !cordoned || len(pods) != 1 || pods[0] != "kube-proxy-7xq2d" {
			t.Fatalf("after the drain: cordoned %v, pods %v", cordoned, pods)
		}

		// After the reboot: the Node still carries the previous boot's
		// publish (converged, verified at v1.36.3, condition True), which
		// the page's wait must not take for the upgrade; it returns once
		// the new boot's pass, converged at v1.37.2, is published.
		publish := func(v, boot string) {
			t.Helper()
			d := status.Document{Phase: status.PhaseConverged, Role: "worker", Member: true, Pin: v, Bundled: v, NodeVersion: v, VerifiedVersion: v,
				ClusterVersion: v, Message: "converged at " + v, Time: time.Now().UTC().Format(time.RFC3339), BootID: boot}
			if err := status.Write(w.R(), d); err != nil {
				t.Fatal(err)
			}
			if out, code := w.provider("publish", "--budget", "1m"); code != 0 || !strings.Contains(out, "condition=True/Converged") {
				t.Fatalf("publish: exit %d\n%s", code, out)
			}
		}
		publish("v1.36.3", "b-0")
		waited := make(chan string, 1)
		go func() {
			out, code := w.doc(p, "kubectl --kubeconfig /etc/kubernetes/admin.conf wait")
			waited <- fmt.Sprintf("exit %d\n%s", code, out)
		}()
		select {
		case out := <-waited:
			t.Fatalf("the page's wait returned on the previous boot's publish: %s", out)
		case <-time.After(5 * time.Second):
		}
		publish("v1.37.2", "b-1")
		select {
		case out := <-waited:
			has(t, "docs/drain.md: kubectl wait", out, "exit 0", "node/w1 condition met")
		case <-time.After(time.Minute):
			t.Fatal("the page's wait did not return after the upgrade's publish")
		}
		w.docOK(p, "kubectl --kubeconfig /etc/kubernetes/admin.conf uncordon", "node/w1 uncordoned")
		if _, cordoned := api.PodsOn(t, "w1"); cordoned {
			t.Fatal("uncordon left the node cordoned")
		}

		// A StatefulSet's pod whose budget allows no disruption: the drain
		// stops at its budget, names them, and uncordons.
		api.Pod(t, apiservertest.Pod{Node: "w1", Name: "db-0", App: "db", OwnerKind: "StatefulSet", OwnerAPIVersion: "apps/v1", Owner: "db",
			OwnerUID: "7d1c6c2e-0000-4000-8000-00000000db00", Phase: "Running"})
		api.Budget(t, "db", "db", 1, 1, 0)
		out, code := w.doc(p, "provider-kubernetes drain --budget 30s")
		if code != 1 || !strings.Contains(out, "drain: pods still on the node when the budget ended: default/db-0: ") {
			t.Fatalf("a blocked drain: exit %d\n%s", code, out)
		}
		shows(t, out, example(t, p, "provider-kubernetes drain --budget 30s"))
		if pods, cordoned := api.PodsOn(t, "w1"); cordoned || len(pods) != 2 {
			t.Fatalf("after a blocked drain: cordoned %v, pods %v", cordoned, pods)
		}

		// The page's RBAC, as the page applies it; a ServiceAccount's token
		// in a kubeconfig then drains w1, and may read the budgets.
		w.Write("/provider-kubernetes-drain.yaml", yamlBlock(t, section(t, read(t, "drain.md"), "## Which credentials may drain")), 0o644)
		w.docOK(p, "kubectl --kubeconfig /etc/kubernetes/admin.conf apply", "clusterrole.rbac.authorization.k8s.io/provider-kubernetes-drain created",
			"serviceaccount/provider-kubernetes-drain created", "clusterrolebinding.rbac.authorization.k8s.io/provider-kubernetes-drain created")
		sa := api.TokenKubeconfig(api.ServiceAccountToken(t, "kube-system", "provider-kubernetes-drain"))
		w.Write("/root/drain.kubeconfig", sa, 0o600)
		c, err := kube.Load(w.R(), 10*time.Second, "/root/drain.kubeconfig")
		if err != nil {
			t.Fatal(err)
		}
		if budgets, err := c.DisruptionBudgets(ctx, "default"); err != nil || len(budgets) != 2 {
			t.Fatalf("the ServiceAccount lists the budgets: %v %v", budgets, err)
		}
		api.BudgetStatus(t, "db", 1, 2, 1) // db-1 ready elsewhere
		w.docOK(p, "provider-kubernetes drain --kubeconfig /root/drain.kubeconfig --node w1", "evicted:  default/db-0\n",
			"level=INFO msg=drain outcome=drained node=w1 evicted=1 skipped=1 left=0")
	})
}

// shows checks a page's example output against what the command printed:
// every example line is a line of out, or, ending in "...", starts one.
func shows(t *testing.T, out, example string) {
	t.Helper()
	if strings.TrimSpace(example) == "" {
		t.Fatal("the page shows no example output here")
	}
	lines := strings.Split(out, "\n")
	for _, want := range strings.Split(strings.TrimSpace(example), "\n") {
		prefix, cut := strings.CutSuffix(want, "...")
		found := false
		for _, l := range lines {
			if l == want || cut && strings.HasPrefix(l, prefix) {
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("the page shows the line %q; the command printed:\n%s", want, out)
		}
	}
}

// yamlBlock is the one ```yaml block of a page's text.
func yamlBlock(t *testing.T, text string) string {
	t.Helper()
	_, rest, ok := strings.Cut(text, "\n```yaml\n")
	if !ok {
		t.Fatal("no ```yaml block")
	}
	block, _, ok := strings.Cut(rest, "\n```\n")
	if !ok || strings.Contains(rest[len(block):], "\n```yaml\n") {
		t.Fatal("not one closed ```yaml block")
	}
	return block + "\n"
}
