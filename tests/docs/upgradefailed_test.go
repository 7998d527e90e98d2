package docs_test

import (
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// docs/upgrade-failed.md: what an operator sees of a failed and of a
// refused pass, on the node and for the whole cluster, printed by the
// page's own commands over what real passes wrote and published. The
// cluster is mid-rollout: cp1 upgraded it to 1.37.2, cp2 and cp3 still run
// 1.36.3; w1 was booted into the 1.37 image too early (its wait for every
// control plane fails: ControlPlaneNotUpgraded); w2's pin was bumped and
// its image not yet (refused: PinNewerThanImage).
func TestUpgradeFailedPage(t *testing.T) {
	inSandbox(t, func(t *testing.T, s *sandbox) {
		p := open(t, "upgrade-failed.md")
		api := testutil.NewAPI(t, "v1.37.2")
		// The apiservers a worker's wait asks: cp1's at 1.37.2, cp2's and
		// cp3's still at 1.36.3.
		cp2API, cp3API := testutil.NewAPI(t, "v1.37.2"), testutil.NewAPI(t, "v1.37.2")
		cp2API.SetServerVersion("v1.36.3")
		cp3API.SetServerVersion("v1.36.3")
		api.SetAPIServers(api.Addr(), cp2API.Addr(), cp3API.Addr())
		apiservers := map[string]string{"cp1": "v1.37.2", "cp2": "v1.36.3", "cp3": "v1.36.3"}
		api.Pod = func(name string) (*corev1.Pod, bool) {
			node := strings.TrimPrefix(name, "kube-apiserver-")
			v, ok := apiservers[node]
			if !ok {
				return nil, false
			}
			pod := testutil.StaticPod(name, "kube-apiserver", "registry.k8s.io/kube-apiserver:"+v)
			pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: testutil.NodeUID(node)}}
			return pod, true
		}

		// Every node's boot: its pass, then the publish unit.
		boot := func(n *node, want int) {
			t.Helper()
			if out, code := n.provider("reconcile"); code != want {
				t.Fatalf("%s: reconcile exit %d, want %d\n%s", n.Name, code, want, out)
			}
			if out, code := n.provider("publish", "--budget", "1m"); code != 0 {
				t.Fatalf("%s: publish exit %d\n%s", n.Name, code, out)
			}
		}
		var cp1 *node
		for _, name := range []string{"cp1", "cp2", "cp3"} {
			role := "controlplane"
			if name == "cp1" {
				role = "init"
			}
			n := s.node(name)
			n.clusterFile(role, apiservers[name], "")
			n.image(apiservers[name])
			n.controlPlane(api, apiservers[name])
			api.SetControlPlaneNode(name, "127.0.0.1")
			boot(n, 0)
			if name == "cp1" {
				cp1 = n
			}
		}
		w1 := s.node("w1")
		w1.clusterFile("worker", "v1.37.2", "providerConfig:\n  budget.waitForCluster: 3s\n")
		w1.image("v1.37.2")
		w1.worker(api, "v1.36.3")
		// The 1.37 image's kubelet started with the boot and registered its
		// version on the Node; the provider's record still says 1.36.3.
		api.SetNode("w1", "v1.37.2", true)
		boot(w1, 1)
		w2 := s.node("w2")
		w2.clusterFile("worker", "v1.37.2", "")
		w2.image("v1.36.3")
		w2.worker(api, "v1.36.3")
		boot(w2, 3)

		// The failed node's status, as the page shows it.
		out := w1.docOK(p, "provider-kubernetes status", "Phase:           Failed\n", "Reason:          ControlPlaneNotUpgraded\n",
			"Last action:     wait-for-cluster-upgrade\n", "control planes still behind v1.37.2: ", cp2API.Addr()+" at v1.36.3", cp3API.Addr()+" at v1.36.3")
		if got, want := sameStatus(out), sameStatus(example(t, p, "provider-kubernetes status")); got != want {
			t.Fatalf("docs/upgrade-failed.md shows the status printing:\n%s\nit prints:\n%s", want, got)
		}

		// The cluster, from a control plane: exit 1 while a node is not
		// converged at the target.
		out, code := cp1.doc(p, "provider-kubernetes status --cluster")
		if code != 1 {
			t.Fatalf("status --cluster: exit %d, want 1\n%s", code, out)
		}
		has(t, "status --cluster", out, "look at w1 failed (ControlPlaneNotUpgraded), w2 refused (PinNewerThanImage) first")
		if got, want := sameTable(out), sameTable(example(t, p, "provider-kubernetes status --cluster")); got != want {
			t.Fatalf("docs/upgrade-failed.md shows status --cluster printing:\n%s\nit prints:\n%s", want, got)
		}
	})
}

// sameStatus is a status printout with what differs from one pass to
// another blanked: the time and boot ID, the addresses and how long a wait
// took.
func sameStatus(s string) string {
	s = regexp.MustCompile(`(?m)^(Time|Boot ID): +.*$`).ReplaceAllString(strings.TrimSpace(s), "$1: …")
	s = regexp.MustCompile(`budget exhausted \([^)]*\)`).ReplaceAllString(s, "budget exhausted (…)")
	return regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}:\d+\b`).ReplaceAllString(s, "ADDR")
}

// sameTable is status --cluster's table with its columns' widths and the
// LAST PASS ages dropped.
func sameTable(s string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(l)
		for i := 1; i < len(f); i++ {
			if f[i] == "ago" {
				f = append(f[:i-1], f[i+1:]...)
				break
			}
		}
		out = append(out, strings.Join(f, " "))
	}
	return strings.Join(out, "\n")
}
