package cli

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// docs/reference.md, Commands: `publish` "exit 1 when the budget ran out";
// Exit codes: 0 "done, or nothing to do". The codes are the page's, written
// as it writes them.
func TestPublishExitsAsDocumented(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	api := testutil.NewAPI(t, "v1.37.2")
	n.Member(api)
	api.SetNode("n1", "v1.37.2", true)
	if code, _, errOut := run("publish", "--root", n.Root, "--budget", "2s"); code != 0 {
		t.Fatalf("no pass to publish: exit %d, want 0 (nothing to do)\n%s", code, errOut)
	}
	if err := status.Write(n.R(), status.Document{Phase: status.PhaseConverged, Role: "worker", Member: true, Pin: "v1.37.2",
		Bundled: "v1.37.2", NodeVersion: "v1.37.2", ClusterVersion: "v1.37.2", Time: "2026-12-03T12:00:00Z", BootID: "b-1"}); err != nil {
		t.Fatal(err)
	}
	api.SetDown(true)
	start := time.Now()
	code, _, errOut := run("publish", "--root", n.Root, "--budget", "2s")
	if code != 1 || !strings.Contains(errOut, "budget exhausted") {
		t.Fatalf("the API down for the whole budget: exit %d, want 1\n%s", code, errOut)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("a 2s --budget ran %s", took)
	}
	api.SetDown(false)
	if code, _, errOut := run("publish", "--root", n.Root, "--budget", "2s"); code != 0 {
		t.Fatalf("published: exit %d, want 0\n%s", code, errOut)
	}
	if a := api.NodeAnnotations("n1"); a[status.AnnotationPrefix+"phase"] != "Converged" {
		t.Fatalf("exit 0 but the Node's annotations are %v", a)
	}
}

// docs/reference.md: "`status --cluster` exits 0 only when every node is
// converged at one version" (docs/upgrade.md: "exits 0 and says `nothing:
// every node is converged at v1.36.3`"); anything short of it exits 1.
func TestStatusClusterExitsZeroOnlyWhenConverged(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	api := testutil.NewAPI(t, "v1.37.2")
	n.Admin(api)
	api.SetNode("cp1", "v1.37.2", true)
	api.SetControlPlaneNode("cp1", "10.0.0.11")
	api.SetNode("w1", "v1.37.2", true)
	apiserver := "v1.37.2"
	api.Pod = func(name string) (*corev1.Pod, bool) {
		node := strings.TrimPrefix(name, "kube-apiserver-")
		p := testutil.StaticPod(name, "kube-apiserver", "registry.k8s.io/kube-apiserver:"+apiserver)
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: testutil.NodeUID(node)}}
		return p, true
	}
	code, out, errOut := run("status", "--cluster", "--root", n.Root)
	if code != 0 || !strings.Contains(out, "nothing: every node is converged at v1.37.2") {
		t.Fatalf("every node converged: exit %d, want 0\n%s%s", code, out, errOut)
	}
	// A worker not Ready, at the version all the same: not converged.
	api.SetNode("w1", "v1.37.2", false)
	if code, out, _ := run("status", "--cluster", "--root", n.Root); code != 1 {
		t.Fatalf("a worker NotReady: exit %d, want 1\n%s", code, out)
	}
	api.SetNode("w1", "v1.37.2", true)
	// The control plane's apiserver behind its kubelet: not one version.
	apiserver = "v1.36.3"
	if code, out, _ := run("status", "--cluster", "--root", n.Root); code != 1 {
		t.Fatalf("an apiserver at v1.36.3: exit %d, want 1\n%s", code, out)
	}
	apiserver = "v1.37.2"
	// Its kubelet behind its apiserver: not one version either.
	api.SetNode("cp1", "v1.36.3", true)
	api.SetControlPlaneNode("cp1", "10.0.0.11")
	if code, out, _ := run("status", "--cluster", "--root", n.Root); code != 1 {
		t.Fatalf("a control plane's kubelet at v1.36.3: exit %d, want 1\n%s", code, out)
	}
	api.SetNode("cp1", "v1.37.2", true)
	api.SetControlPlaneNode("cp1", "10.0.0.11")
	// A node's last pass failed: not converged, though every version is one.
	api.SetNodeAnnotations("w1", map[string]string{status.AnnotationPrefix + "phase": "Failed", status.AnnotationPrefix + "outcome": "failed"})
	if code, out, _ := run("status", "--cluster", "--root", n.Root); code != 1 {
		t.Fatalf("a worker whose pass failed: exit %d, want 1\n%s", code, out)
	}
}

// docs/reference.md, Log events: "A value holding a space, `=` or `"` is
// quoted, and each `=` inside the quotes is written `\x3d` (as Go's
// `strconv.Unquote` reads it), so a grep for `name=` only matches a field".
// The reconcile log and its stderr copy both.
func TestLogValuesCannotForgeAField(t *testing.T) {
	r := paths.Root(t.TempDir())
	var stderr strings.Builder
	log, f, err := reconcileLogger(r, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	value := `etcd said "outcome=taken path=/x"`
	log.Warn("etcd-snapshot", "outcome", "failed", "error", value)
	f.Close()
	for where, got := range map[string]string{"the reconcile log": readFile(t, r.Path(paths.ReconcileLog)), "stderr": stderr.String()} {
		if strings.Count(got, "outcome=") != 1 || strings.Contains(got, "path=") {
			t.Errorf("%s: a value forged a field:\n%s", where, got)
		}
		i := strings.Index(got, "error=")
		if i < 0 {
			t.Fatalf("%s: no error field:\n%s", where, got)
		}
		q := strings.TrimSpace(got[i+len("error="):])
		if back, err := strconv.Unquote(q); err != nil || back != value {
			t.Errorf("%s: strconv.Unquote(%s) = %q, %v; want the value back", where, q, back, err)
		}
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
