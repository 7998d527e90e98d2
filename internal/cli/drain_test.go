package cli

import (
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/apiservertest"
)

// drain's usage errors read nothing (the root does not exist) and name a
// bad value without quoting it.
func TestDrainUsage(t *testing.T) {
	root := t.TempDir() + "/nowhere"
	for _, args := range [][]string{
		{"drain", "--root", root, "--node", "Not_A_Node\x1b[2J"},
		{"drain", "--root", root, "--exclude-pod", "no-slash"},
		{"drain", "--root", root, "--exclude-pod", "Bad/x"},
		{"drain", "--root", root, "--budget", "0s"},
		{"drain", "--root", root, "extra"},
		{"drain", "--root", "relative"},
	} {
		code, _, errOut := run(args...)
		if code != reconcile.ExitUsage || strings.ContainsRune(errOut, 0x1b) {
			t.Errorf("%q: exit %d %q", args, code, errOut)
		}
	}
	// No kubeconfig at all: it fails saying which it tried.
	t.Setenv("KUBECONFIG", "")
	if code, _, errOut := run("drain", "--root", root); code != reconcile.ExitFailed || !strings.Contains(errOut, "drain: no readable kubeconfig (tried /etc/kubernetes/kubelet.conf)") {
		t.Fatalf("no kubeconfig: exit %d %q", code, errOut)
	}
}

// The command over the real kube-apiserver v1.37.2, with the node's own
// kubelet.conf (the default): exit 3 and nothing changed for a pod
// without a controller, 0 with --force and what it did printed, 1 when a
// budget blocks to the end, with the budget and the pod named and the
// node schedulable again; a pod named with --exclude-pod stays.
func TestDrainCommandAgainstTheRealAPIServer(t *testing.T) {
	s := apiservertest.Start(t)
	t.Setenv("KUBECONFIG", "")
	n := testutil.NewNode(t, "w5")
	n.Write(paths.KubeletConf, s.NodeKubeconfig(t, "w5"), 0o600)
	rs := s.NodeWithPods(t, "w5")
	s.Pod(t, apiservertest.Pod{Node: "w5", Name: "bare", App: "bare", Phase: "Running"})
	s.Pod(t, apiservertest.Pod{Node: "w5", Name: "drainer", App: "drainer", Phase: "Running"})
	s.Kubelet(t, "w5")

	code, out, errOut := run("drain", "--root", n.Root, "--exclude-pod", "default/drainer")
	if code != reconcile.ExitRefused || !strings.Contains(out, "left:     default/bare: no controller: evicted, it would not be created again (--force evicts it)\n") ||
		!strings.Contains(errOut, "drain: refused: pods without a controller would be lost: default/bare; nothing changed\n") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if pods, cordoned := s.PodsOn(t, "w5"); cordoned || len(pods) != 5 {
		t.Fatalf("a refused drain changed the node: cordoned %v, pods %v", cordoned, pods)
	}

	code, out, errOut = run("drain", "--root", n.Root, "--force", "--exclude-pod", "default/drainer")
	if code != reconcile.ExitOK {
		t.Fatalf("--force: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"node w5: 2 pods evicted\n", "evicted:  default/bare\n", "evicted:  default/done-w5\n",
		"skipped:  default/drainer (excluded)\n", "skipped:  default/proxy-w5-x (DaemonSet)\n", "skipped:  default/static-w5 (mirror pod)\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	if pods, cordoned := s.PodsOn(t, "w5"); !cordoned || len(pods) != 3 {
		t.Fatalf("after the drain: cordoned %v, pods %v", cordoned, pods)
	}

	// Uncordoned by hand, a new pod a budget protects: blocked to the end.
	s.Do(t, "PATCH", "/api/v1/nodes/w5", "application/merge-patch+json", map[string]any{"spec": map[string]any{"unschedulable": false}})
	s.Pod(t, apiservertest.Pod{Node: "w5", Name: "web-0", App: "web-w5", OwnerKind: "ReplicaSet", OwnerAPIVersion: "apps/v1", Owner: "web-w5", OwnerUID: rs, Phase: "Running"})
	s.Budget(t, "web", "web-w5", 1, 1, 0)
	code, out, errOut = run("drain", "--root", n.Root, "--budget", "4s", "--exclude-pod", "default/drainer")
	if code != reconcile.ExitFailed || !strings.Contains(out, "left:     default/web-0: blocked: The disruption budget web needs 1 healthy pods and has 1 currently\n") ||
		!strings.Contains(out, "blocking: The disruption budget web needs 1 healthy pods and has 1 currently (the apiserver's answer to the eviction of default/web-0;") ||
		!strings.Contains(out, "node w5 is schedulable again (it was before the drain)\n") ||
		!strings.Contains(errOut, "drain: pods still on the node when the budget ended: default/web-0: ") ||
		!strings.Contains(errOut, "level=ERROR msg=drain outcome=failed node=w5 ") {
		t.Fatalf("blocked: exit %d\n%s\n%s", code, out, errOut)
	}
	if pods, cordoned := s.PodsOn(t, "w5"); cordoned || len(pods) != 4 {
		t.Fatalf("after a failed drain: cordoned %v, pods %v", cordoned, pods)
	}

	// Another node's, with this node's credentials: the API forbids it.
	s.Node(t, "w6")
	code, _, errOut = run("drain", "--root", n.Root, "--node", "w6")
	if code != reconcile.ExitFailed || !strings.Contains(errOut, "a node's own kubelet.conf may drain only that node; see docs/drain.md") {
		t.Fatalf("another node: exit %d\n%s", code, errOut)
	}
}
