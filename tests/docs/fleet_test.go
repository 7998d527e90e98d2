package docs_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
)

// docs/fleet-upgrade.md: the preflight as the Kairos operator runs it, a
// Pod of the new image with the node's root read-only at /host, from the
// page's NodeOp and from its command; on the second control plane while
// the first one upgrades (refused, printing what the page shows), then
// once it is done (the upgrade goes on). Neither changes the node.
func TestFleetUpgradePage(t *testing.T) {
	inSandbox(t, func(t *testing.T, s *sandbox) {
		p := open(t, "fleet-upgrade.md")
		page := read(t, "fleet-upgrade.md")

		// The node: cp2, a control plane at 1.36.3 on the 1.36 image whose
		// cloud-config pin was bumped to 1.37.2; cp1 already upgraded the
		// cluster and still publishes Upgrading.
		api := testutil.NewAPI(t, "v1.37.2")
		host := s.node("cp2")
		host.clusterFile("controlplane", "v1.36.3", "")
		host.image("v1.36.3")
		host.controlPlane(api, "v1.36.3")
		host.Write("/oem/90_custom.yaml", testutil.CloudConfig("controlplane", "v1.37.2"), 0o600)
		etcdtest.Start(t, host.Node, etcdtest.Config{})
		for _, n := range []string{"cp1", "cp2", "cp3"} {
			api.SetNode(n, "v1.37.2", true)
			api.SetControlPlaneNode(n, "127.0.0.1")
		}
		published := func(phase string, ago time.Duration) {
			api.SetNodeAnnotations("cp1", map[string]string{status.AnnotationPrefix + status.KeyPhase: phase,
				status.AnnotationPrefix + status.KeyTime: time.Now().Add(-ago).UTC().Format(time.RFC3339)})
		}
		published(status.PhaseUpgrading, 90*time.Second)

		// The preflight Pod: the new image, the node's root at /host, read-only.
		pod := s.node("preflight")
		pod.image("v1.37.2")
		if err := os.Mkdir(pod.Path("/host"), 0o755); err != nil {
			t.Fatal(err)
		}
		pod.mount(host.Root, "host", "", unix.MS_BIND|unix.MS_REC, "")
		if err := unix.Mount("", pod.Path("/host"), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Fatal(err)
		}
		before := testutil.Digest(t, host.Root, "/proc", "/sys", "/dev", "/usr", "/var/lib/etcd")

		// The NodeOp's preflight command, as the page writes it.
		var nodeOp struct {
			Kind string `json:"kind"`
			Spec struct {
				Preflight struct {
					Command []string `json:"command"`
				} `json:"preflight"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(yamlBlock(t, page)), &nodeOp); err != nil {
			t.Fatal(err)
		}
		if nodeOp.Kind != "NodeOp" || len(nodeOp.Spec.Preflight.Command) == 0 {
			t.Fatalf("the page's NodeOp: %+v", nodeOp)
		}
		out, code := pod.exec(nodeOp.Spec.Preflight.Command...)
		if code != 3 || !strings.Contains(out, "level=ERROR msg=preflight outcome=refused code=ControlPlaneUpgrading role=controlplane pin=v1.37.2 bundled=v1.37.2 node=v1.36.3 cluster=v1.37.2") {
			t.Fatalf("the NodeOp's preflight while cp1 upgrades: exit %d\n%s", code, out)
		}

		// By hand: exactly the page's command, printing what the page shows.
		out, code = pod.doc(p, "provider-kubernetes preflight --host-root /host")
		if code != 3 || !strings.Contains(out, "Why:      control plane cp1 (published Upgrading 1m3") {
			t.Fatalf("exit %d\n%s", code, out)
		}
		if want := example(t, p, "provider-kubernetes preflight --host-root /host"); !sameShape(out, want) {
			t.Fatalf("docs/fleet-upgrade.md shows the preflight printing:\n%s\nit prints:\n%s", want, out)
		}

		// cp1 done: the upgrade may go on.
		published(status.PhaseConverged, 0)
		out, code = pod.exec(nodeOp.Spec.Preflight.Command...)
		if code != 0 || !strings.Contains(out, "level=INFO msg=preflight outcome=proceed ") || !strings.Contains(out, "Preflight: proceed") {
			t.Fatalf("after cp1: exit %d\n%s", code, out)
		}
		if after := testutil.Digest(t, host.Root, "/proc", "/sys", "/dev", "/usr", "/var/lib/etcd"); after != before {
			t.Fatalf("the preflight changed the node:\n%s\n%s", before, after)
		}
		if strings.Contains(out, testutil.Token) {
			t.Fatal("the preflight printed the cluster token")
		}
	})
}
