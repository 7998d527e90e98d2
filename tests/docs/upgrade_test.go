package docs_test

import (
	"os"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// docs/upgrade.md: the preview before the reboot, the pin bump, and every
// way of watching a pass, over what real passes of the provider wrote.
func TestUpgradePage(t *testing.T) {
	inSandbox(t, func(t *testing.T, s *sandbox) {
		p := open(t, "upgrade.md")

		// Before: the init control plane of a cluster at 1.36.3 (role: init,
		// as examples/cloud-config/init.yaml boots it) on the 1.36 image,
		// asking what its boot on the 1.37 image with the 1.37 pin would do.
		api := testutil.NewAPI(t, "v1.36.3")
		cp := s.node("cp1")
		cp.clusterFile("init", "v1.36.3", "")
		cp.image("v1.36.3")
		cp.controlPlane(api, "v1.36.3")
		out := cp.docOK(p, "provider-kubernetes plan --pin v1.37.2")
		if want := example(t, p, "provider-kubernetes plan --pin v1.37.2"); out != want {
			t.Fatalf("docs/upgrade.md shows the preview printing:\n%s\nit prints:\n%s", want, out)
		}
		if st := cp.Read(paths.ClusterFile); !strings.Contains(st, "kubernetesVersion: v1.36.3") || cp.Exists(paths.StatusFile) {
			t.Fatal("the preview changed the node")
		}

		// The pin bump, on the operator's cloud-config: the pin's
		// characters change, nothing else (its comments, its quoting, the
		// old version elsewhere in the file, its mode).
		const cc = "#cloud-config\n# cp1, pinned with its image (was v1.36.3)\nhostname: cp1\ncluster:\n  cluster_token: " + testutil.Token + "\n  control_plane_host: 10.0.0.11\n" +
			"  role: init\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: 'v1.36.3' # the pin\n" +
			"    initConfiguration:\n      nodeRegistration:\n        name: cp1\n  providerConfig:\n    budget.kubeadmUpgrade: 20m\n" +
			"write_files:\n- path: /etc/motd\n  content: |\n    kubernetesVersion: v1.36.3\n"
		cp.Write("/oem/90_custom.yaml", cc, 0o640)
		out = cp.docOK(p, "provider-kubernetes pin set")
		if want := example(t, p, "provider-kubernetes pin set"); out != want {
			t.Fatalf("docs/upgrade.md shows the pin bump printing:\n%s\nit prints:\n%s", want, out)
		}
		if got, want := cp.Read("/oem/90_custom.yaml"), strings.Replace(cc, "'v1.36.3'", "'v1.37.2'", 1); got != want {
			t.Fatalf("the pin bump left:\n%s", got)
		}
		if fi, err := os.Lstat(cp.Path("/oem/90_custom.yaml")); err != nil || fi.Mode() != 0o640 {
			t.Fatalf("the pin bump left the file %v %v", fi.Mode(), err)
		}
		if ents, err := os.ReadDir(cp.Path("/oem")); err != nil || len(ents) != 1 {
			t.Fatalf("the pin bump left in /oem: %v %v", ents, err)
		}
		// The edited file, checked as the boot will check it.
		out = cp.docOK(p, "provider-kubernetes validate")
		if want := example(t, p, "provider-kubernetes validate"); out != want {
			t.Fatalf("docs/upgrade.md shows the check printing:\n%s\nit prints:\n%s", want, out)
		}
		if cp.Read("/oem/90_custom.yaml") != strings.Replace(cc, "'v1.36.3'", "'v1.37.2'", 1) || cp.Exists(paths.StatusFile) {
			t.Fatal("the check changed the node")
		}

		// After: a control plane whose passes converged at 1.37.2, twice.
		api2 := testutil.NewAPI(t, "v1.37.2")
		done := s.node("cp2")
		done.clusterFile("init", "v1.37.2", "")
		done.image("v1.37.2")
		done.controlPlane(api2, "v1.37.2")
		for range 2 {
			if out, code := done.provider("reconcile"); code != 0 {
				t.Fatalf("reconcile: exit %d\n%s", code, out)
			}
		}
		done.docOK(p, "provider-kubernetes status", "Phase:           Converged\n", "Node version:    v1.37.2\n", "Pin:             v1.37.2\n")
		statusShape(t, example(t, p, "provider-kubernetes status"))
		out = done.docOK(p, "grep -E 'msg=(plan|reconcile-done) '", "msg=plan verdict=none", "msg=reconcile-done outcome=converged node=v1.37.2")
		if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.Contains(lines[0], "msg=plan ") || !strings.Contains(lines[1], "msg=reconcile-done ") {
			t.Fatalf("the last pass's plan and outcome: %q", lines)
		}
		out = done.docOK(p, "awk ", "msg=reconcile-start ", "msg=plan ", "msg=reconcile-done outcome=converged")
		if n := strings.Count(out, "msg=reconcile-start "); n != 1 || !strings.HasPrefix(out, "time=") {
			t.Fatalf("the last pass printed %d pass starts:\n%s", n, out)
		}
		if all := done.Read(paths.ReconcileLog); strings.Count(all, "msg=reconcile-start ") != 2 || !strings.HasSuffix(all, out) {
			t.Fatalf("the last pass is not the log's tail:\n%s", all)
		}

		// A worker booted into 1.37 while two control planes still serve
		// 1.36.3: its gate names them.
		api3 := testutil.NewAPI(t, "v1.37.2")
		behind1, behind2 := testutil.NewAPI(t, "v1.37.2"), testutil.NewAPI(t, "v1.37.2")
		behind1.SetServerVersion("v1.36.3")
		behind2.SetServerVersion("v1.36.3")
		api3.SetAPIServers(api3.Addr(), behind1.Addr(), behind2.Addr())
		w := s.node("w1")
		w.clusterFile("worker", "v1.37.2", "providerConfig:\n  budget.waitForCluster: 3s\n")
		w.image("v1.37.2")
		w.worker(api3, "v1.36.3")
		if out, code := w.provider("reconcile"); code != 1 {
			t.Fatalf("an early worker: exit %d\n%s", code, out)
		}
		out = w.docOK(p, "grep 'msg=control-planes-at-target ", "level=ERROR msg=control-planes-at-target outcome=failed target=v1.37.2",
			"control planes still behind v1.37.2: ", behind1.Addr()+" at v1.36.3", behind2.Addr()+" at v1.36.3")
		logLines(t, out, example(t, p, "grep 'msg=control-planes-at-target "))

		// kubeadm's own words: the real kubeadm upgrade node of a worker
		// whose control planes are done fails here (the test API serves
		// no kubelet-config), and its output is kept.
		kubelet(t)
		w2 := s.node("w2")
		w2.clusterFile("worker", "v1.37.2", "")
		w2.image("v1.37.2")
		w2.worker(api2, "v1.36.3")
		w2.install(testbin.Kubeadm(t, "v1.37.2"), paths.Kubeadm)
		if out, code := w2.provider("reconcile"); code != 1 || !strings.Contains(out, "reason=KubeadmFailed") {
			t.Fatalf("kubeadm upgrade node on the sandbox: exit %d\n%s", code, out)
		}
		w2.docOK(p, "tail -n 30 /var/log/provider-kubernetes-kubeadm.log", "/usr/bin/kubeadm upgrade node (boot ", "[upgrade] Reading configuration from the \"kubeadm-config\" ConfigMap")
	})
}

// statusShape checks a page's example of `provider-kubernetes status`
// against the real printer: its lines are the printer's labels, in the
// printer's order and layout.
func statusShape(t *testing.T, example string) {
	t.Helper()
	full := status.Document{Phase: "P", Reason: "R", Refusal: "C", Message: "M", Warnings: []string{"W"}, Role: "r", Member: true, Pin: "p",
		Bundled: "b", NodeVersion: "n", ClusterVersion: "c", Actions: []string{"a"}, LastAction: "l", EtcdSnapshot: "e",
		KubeadmEtcdBackups: &status.Backups{Count: 1, Bytes: 1, Dir: "d"}, Time: "t", BootID: "i"}
	var b strings.Builder
	if err := status.Print(&b, full, "text"); err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		labels = append(labels, l[:17])
	}
	i := 0
	for _, l := range strings.Split(strings.TrimSpace(example), "\n") {
		for i < len(labels) && !strings.HasPrefix(l, labels[i]) {
			i++
		}
		if i == len(labels) {
			t.Fatalf("the page's status example line %q is not what status prints, or not in its order (%q)", l, labels)
		}
	}
}
