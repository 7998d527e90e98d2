package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestJoinConfigUsage(t *testing.T) {
	for _, args := range [][]string{
		{"join-config"},
		{"join-config", "--role", "init"},
		{"join-config", "--role", "worker", "--ttl", "0s"},
		{"join-config", "--role", "worker", "--ttl", "720h"},
	} {
		if code, _, errOut := run(args...); code != reconcile.ExitUsage || errOut == "" {
			t.Fatalf("%v: exit %d %q", args, code, errOut)
		}
	}
}

// join-config prints the cloud-config on stdout (the secret output, by
// design) and only the token's public id on stderr.
func TestJoinConfigPrintsAReadyToPasteSection(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	api := testutil.NewAPI(t, "v1.37.2")
	n.Write(paths.ClusterFile, "cluster_token: "+pluginToken+"\ncontrol_plane_host: 10.0.0.11\nrole: init\nconfig: |\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n", 0o600)
	n.Admin(api)
	ca, _ := testutil.ClientCert(t, "kubernetes")
	n.Write(paths.CACert, string(ca), 0o644)
	code, out, errOut := run("join-config", "--root", n.Root, "--role", "worker", "--ttl", "1h")
	if code != reconcile.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "#cloud-config\n") || !strings.Contains(out, "role: worker") || !strings.Contains(out, "caCertHashes:") {
		t.Fatalf("stdout:\n%s", out)
	}
	if !strings.Contains(errOut, "minted join material for a worker: bootstrap token id ") || strings.Contains(errOut, pluginToken) {
		t.Fatalf("stderr %q", errOut)
	}
	// The secret half of the token is on stdout only.
	i := strings.Index(errOut, "token id ")
	id := errOut[i+9 : i+15]
	if !strings.Contains(out, "token: "+id+".") || strings.Contains(errOut, id+".") {
		t.Fatalf("token id %q", id)
	}
}

// status --cluster shows a control plane's apiserver from its mirror pod,
// but not from one its kubelet created for an earlier Node of that name
// (reset and joined again, the old pod not replaced yet): that one shows
// what ran before the reset, so the column says it does not know.
func TestStatusClusterIgnoresAMirrorPodOfAnEarlierNode(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	api := testutil.NewAPI(t, "v1.37.2")
	n.Admin(api)
	for i, name := range []string{"cp1", "cp2"} {
		api.SetNode(name, "v1.37.2", true)
		api.SetControlPlaneNode(name, fmt.Sprintf("10.0.0.1%d", i+1))
	}
	api.Pod = func(name string) (*corev1.Pod, bool) {
		node := strings.TrimPrefix(name, "kube-apiserver-")
		p := testutil.StaticPod(name, "kube-apiserver", "registry.k8s.io/kube-apiserver:v1.37.2")
		owner := testutil.NodeUID(node)
		if node == "cp2" {
			p = testutil.StaticPod(name, "kube-apiserver", "registry.k8s.io/kube-apiserver:v1.36.3")
			owner = "uid-of-the-deleted-cp2"
		}
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: owner}}
		return p, true
	}
	_, out, errOut := run("status", "--cluster", "--root", n.Root, "-o", "json")
	var v struct {
		Nodes []struct{ Name, APIServer string }
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v: %q %q", err, out, errOut)
	}
	got := map[string]string{}
	for _, r := range v.Nodes {
		got[r.Name] = r.APIServer
	}
	if want := map[string]string{"cp1": "v1.37.2", "cp2": ""}; !reflect.DeepEqual(got, want) {
		t.Fatalf("apiservers %v, want %v\n%s", got, want, out)
	}
}

func TestResetNeedsYes(t *testing.T) {
	root := t.TempDir()
	if code, _, errOut := run("reset", "--root", root); code != reconcile.ExitUsage || !strings.Contains(errOut, "--yes") {
		t.Fatalf("exit %d %q", code, errOut)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("wrote %v", entries)
	}
}

func TestResetCommand(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	n.Write(paths.Kubeadm, "#!/bin/sh\nexit 0\n", 0o755)
	n.Write(paths.KubeletConf, "kubelet\n", 0o600)
	n.Write(paths.KubeletDir+"/config.yaml", "x\n", 0o600)
	code, out, errOut := run("reset", "--yes", "--root", n.Root)
	if code != reconcile.ExitOK || !strings.Contains(out, "Phase:           Reset") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	for _, d := range []string{paths.KubernetesDir, paths.KubeletDir} {
		if entries, err := os.ReadDir(filepath.Join(n.Root, d)); err != nil || len(entries) != 0 {
			t.Fatalf("%s: %v %v", d, entries, err)
		}
	}
	if !strings.Contains(n.Read(paths.ReconcileLog), "msg=reset outcome=reset") {
		t.Fatal("no reset line in the reconcile log")
	}
}

// TestStatusClusterFindsItsKubeconfigAsKubectl: --kubeconfig, else the
// KUBECONFIG list merged (the first file to name a context wins it, a
// relative path is its file's directory's), else the node's own;
// --context picks a context of the merged list.
func TestStatusClusterFindsItsKubeconfigAsKubectl(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	one, two := testutil.NewAPI(t, "v1.37.2"), testutil.NewAPI(t, "v1.37.2")
	one.SetNode("from-one", "v1.37.2", true)
	two.SetNode("from-two", "v1.37.2", true)
	cert, key := testutil.ClientCert(t, "operator")
	n.Write("/home/op/.kube/pki/op.pem", string(cert)+string(key), 0o600)
	n.Write("/home/op/.kube/one", testutil.Kubeconfig(one, "/home/op/.kube/pki/op.pem"), 0o600)
	// The second file names the same context (the first file keeps it)
	// and one of its own, with a relative certificate path.
	second := strings.ReplaceAll(testutil.Kubeconfig(two, "pki/op.pem"), "default-", "second-")
	second = strings.Replace(second, "contexts:\n", "contexts:\n- context: {cluster: second-cluster, user: second-auth}\n  name: default-context\n", 1)
	n.Write("/home/op/.kube/two", second, 0o600)
	names := func(args ...string) string {
		t.Helper()
		code, out, errOut := run(append([]string{"status", "--cluster", "--root", n.Root, "-o", "json"}, args...)...)
		var v struct{ Nodes []struct{ Name string } }
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			return fmt.Sprintf("exit %d: %s", code, errOut)
		}
		var got []string
		for _, r := range v.Nodes {
			got = append(got, r.Name)
		}
		return strings.Join(got, ",")
	}
	t.Setenv("KUBECONFIG", "/home/op/.kube/one:/home/op/.kube/missing:/home/op/.kube/two")
	if got := names(); got != "from-one" {
		t.Errorf("KUBECONFIG list: %s", got)
	}
	if got := names("--context", "second-context"); got != "from-two" {
		t.Errorf("--context of the second file: %s", got)
	}
	if got := names("--kubeconfig", "/home/op/.kube/two"); got != "from-two" {
		t.Errorf("--kubeconfig over KUBECONFIG: %s", got)
	}
	t.Setenv("KUBECONFIG", "/home/op/.kube/two:/home/op/.kube/one")
	if got := names(); got != "from-two" {
		t.Errorf("the second file first: %s", got)
	}
	// No KUBECONFIG: the node's own admin.conf.
	t.Setenv("KUBECONFIG", "")
	n.Admin(one)
	if got := names(); got != "from-one" {
		t.Errorf("the node's admin.conf: %s", got)
	}
	if got := names("--context", "nope"); !strings.Contains(got, "exit 1") || !strings.Contains(got, "not found") {
		t.Errorf("an unknown context: %s", got)
	}
}

// A reset refused (a pass holds the lock) changes nothing and exits 3,
// saying so, without printing a status document that would show a member
// as Member: false.
func TestRefusedResetExits3(t *testing.T) {
	root := t.TempDir()
	unlock, err := reconcile.Lock(paths.Root(root))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	code, out, errOut := run("reset", "--yes", "--root", root)
	if code != reconcile.ExitRefused || out != "" || !strings.Contains(errOut, "reset: refused (Locked), nothing changed: ") {
		t.Fatalf("exit %d %q %q", code, out, errOut)
	}
}
