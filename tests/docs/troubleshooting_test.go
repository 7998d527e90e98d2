package docs_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	pluggable "github.com/mudler/go-pluggable"
	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
)

// refusal is a node state a real pass refuses, and what the page's
// commands must then show.
type refusal struct {
	code, reason string
	setup        func(s *sandbox) *node
	// message is a part of the status message the page quotes.
	message string
}

// docs/troubleshooting.md: every refusal a real pass can reach in a
// sandbox, failures, a refused reset and restore, and the plugin's record,
// each shown by exactly the page's commands.
func TestTroubleshootingPage(t *testing.T) {
	inSandbox(t, func(t *testing.T, s *sandbox) {
		p := open(t, "troubleshooting.md")
		page := read(t, "troubleshooting.md")

		for _, r := range refusals() {
			if !strings.Contains(page, "### `"+r.code+"`") {
				t.Fatalf("docs/troubleshooting.md has no section for %s", r.code)
			}
			if r.message != "" && !strings.Contains(oneLine(page), r.message) {
				t.Fatalf("docs/troubleshooting.md does not quote %q", r.message)
			}
			n := r.setup(s)
			if out, code := n.provider("reconcile"); code != 3 {
				t.Fatalf("%s: reconcile exit %d, want 3 (refused)\n%s", r.code, code, out)
			}
			n.docOK(p, "provider-kubernetes status", "Phase:           Refused\n", "Reason:          "+r.reason+"\n", "Refusal:         "+r.code+"\n", r.message)
			n.docOK(p, "grep 'msg=reconcile-done'", "msg=reconcile-done outcome=refused code="+r.code+"\n")
			ev := "msg=refuse-upgrade code="
			if r.reason == "BootstrapRefused" {
				ev = "msg=refuse-bootstrap code="
			}
			n.docOK(p, "grep -E 'level=(WARN|ERROR)'", "level=ERROR "+ev+r.code+" ")
			if out, code := n.doc(p, "provider-kubernetes plan"); code != 3 || !strings.Contains(out, "Verdict:  REFUSE "+r.code+" ("+r.reason+")\n") {
				t.Fatalf("%s: plan exit %d, want 3 and the same refusal\n%s", r.code, code, out)
			}
		}

		// The plugin refuses a section at boot: the record, and the pass
		// that refuses rather than run the previous section.
		api := testutil.NewAPI(t, "v1.37.2")
		n := s.node("edited")
		n.clusterFile("controlplane", "v1.37.2", "")
		n.image("v1.37.2")
		n.controlPlane(api, "v1.37.2")
		ev, err := pluggable.NewEvent("agent.boot", map[string]string{"config": "#cloud-config\ncluster:\n  cluster_token: " + testutil.Token +
			"\n  control_plane_host: 10.0.0.11\n  role: master\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: v1.37.2\n"})
		if err != nil {
			t.Fatal(err)
		}
		in, _ := json.Marshal(ev)
		// As kairos-agent runs it: the event on stdin, the response (with
		// the refusal in its error) on stdout.
		out, code := n.execIn(in, paths.ProviderBin, "agent.boot")
		var resp pluggable.EventResponse
		if err := json.Unmarshal([]byte(out), &resp); err != nil || code != 0 || !strings.HasPrefix(resp.Error, "agent.boot: cluster: ") || strings.Contains(out, testutil.Token) {
			t.Fatalf("the plugin on a bad section: exit %d %v\n%s", code, err, out)
		}
		rec := n.docOK(p, "cat /run/provider-kubernetes/agent-boot-error", "agent.boot: cluster: ", "role")
		if out, code := n.provider("reconcile"); code != 3 {
			t.Fatalf("the pass after a refused section: exit %d\n%s", code, out)
		}
		n.docOK(p, "provider-kubernetes status", "Refusal:         InvalidPin\n", "the cloud-config's cluster: section was refused at boot ("+strings.TrimSpace(rec)+")")

		// Failures.
		for _, f := range []struct {
			reason, step string
			setup        func() *node
		}{
			{"ConfigInvalid", "", func() *node {
				n := s.node("budgets")
				n.clusterFile("init", "v1.37.2", "providerConfig:\n  budget.kubeadmBootstrap: 60m\n")
				n.image("v1.37.2")
				return n
			}},
			// The real kubeadm init, on a node without a default route.
			{"BootstrapFailed", "init", func() *node {
				n := s.node("noroute")
				n.clusterFile("init", "v1.37.2", "")
				n.image("v1.37.2")
				n.install(testbin.Kubeadm(t, "v1.37.2"), paths.Kubeadm)
				return n
			}},
			// The real kubeadm upgrade node, against an API that does not
			// serve what it reads.
			{"KubeadmFailed", "upgrade-node", func() *node { return kubeadmFails(t, s) }},
		} {
			n := f.setup()
			if out, code := n.provider("reconcile"); code != 1 {
				t.Fatalf("%s: reconcile exit %d, want 1\n%s", f.reason, code, out)
			}
			if !strings.Contains(page, "### `"+f.reason+"`") {
				t.Fatalf("docs/troubleshooting.md has no section for %s", f.reason)
			}
			n.docOK(p, "provider-kubernetes status", "Phase:           Failed\n", "Reason:          "+f.reason+"\n")
			action := f.step
			if action == "" {
				action = `""`
			}
			n.docOK(p, "grep 'msg=reconcile-done'", "msg=reconcile-done outcome=failed reason="+f.reason+" action="+action+" error=")
			if f.step != "" {
				n.docOK(p, "grep -E 'level=(WARN|ERROR)'", "level=ERROR msg="+f.step+" outcome=failed ", "reason="+f.reason)
			}
			if f.reason == "KubeadmFailed" {
				n.docOK(p, "tail -n 30 /var/log/provider-kubernetes-kubeadm.log", "/usr/bin/kubeadm upgrade node (boot ", "[upgrade] Reading configuration")
			}
		}

		// Another pass holds the node's lock: the pass and a reset refuse.
		n = s.node("locked")
		n.clusterFile("init", "v1.37.2", "")
		n.image("v1.37.2")
		if err := os.MkdirAll(n.Path(paths.RunDir), 0o755); err != nil {
			t.Fatal(err)
		}
		lock, err := os.OpenFile(n.Path(paths.LockFile), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer lock.Close()
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
			t.Fatal(err)
		}
		if out, code := n.provider("reconcile"); code != 1 {
			t.Fatalf("a second pass: exit %d\n%s", code, out)
		}
		if !strings.Contains(page, "`outcome=locked`") {
			t.Fatal("docs/troubleshooting.md does not name outcome=locked")
		}
		n.docOK(p, "grep 'msg=reconcile-done'", "msg=reconcile-done outcome=locked ")
		if out, code := n.provider("reset", "--yes"); code != 3 {
			t.Fatalf("a reset while a pass runs: exit %d, want 3 (refused)\n%s", code, out)
		}
		n.docOK(p, "grep 'msg=reset '", "msg=reset outcome=refused reason=Locked ")

		// restore-etcd on a control plane that still runs: refused, every
		// reason at once, nothing changed.
		n = s.node("running")
		n.ControlPlane("v1.37.2")
		n.Write("/root/etcd-pre-upgrade.db", "not a snapshot", 0o600)
		if out, code := n.provider("restore-etcd", "--snapshot", "/root/etcd-pre-upgrade.db", "--manifests", "/root/manifests",
			"--initial-cluster", "running=https://127.0.0.1:2380", "--yes"); code != 3 || !strings.Contains(out, "refused, nothing changed") {
			t.Fatalf("restore-etcd on a running control plane: exit %d\n%s", code, out)
		}
		out = n.docOK(p, "grep 'msg=restore-etcd '", "msg=restore-etcd outcome=refused reason=")
		for _, reason := range []string{"the static control plane is not stopped", "etcd manifest"} {
			if !strings.Contains(out, reason) || !strings.Contains(page, "| `"+reason+"` |") {
				t.Fatalf("the refusal %q: not in the line, or not in the page's table:\n%s", reason, out)
			}
		}
	})
}

// kubeadmFails is a worker whose control planes are done, running the real
// kubeadm 1.37.2 upgrade node; the test API does not serve its
// kubelet-config, so kubeadm fails and its output is kept.
func kubeadmFails(t *testing.T, s *sandbox) *node {
	t.Helper()
	kubelet(t)
	api := testutil.NewAPI(t, "v1.37.2")
	n := s.node("kubeadm")
	n.clusterFile("worker", "v1.37.2", "")
	n.image("v1.37.2")
	n.worker(api, "v1.36.3")
	n.install(testbin.Kubeadm(t, "v1.37.2"), paths.Kubeadm)
	return n
}

func refusals() []refusal {
	member := func(name, role, pin, image, nodeV, cluster string) func(s *sandbox) *node {
		return func(s *sandbox) *node {
			api := testutil.NewAPI(s.t, cluster)
			n := s.node(name)
			n.clusterFile(role, pin, "")
			n.image(image)
			if role == "worker" {
				n.worker(api, nodeV)
			} else {
				n.controlPlane(api, nodeV)
			}
			return n
		}
	}
	newNode := func(name, role, pin, image string) func(s *sandbox) *node {
		return func(s *sandbox) *node {
			n := s.node(name)
			n.clusterFile(role, pin, "")
			if image != "" {
				n.image(image)
			}
			return n
		}
	}
	return []refusal{
		{code: "InvalidPin", reason: "BootstrapRefused", setup: newNode("inexact", "init", "v1.37", "v1.37.2")},
		{code: "InvalidPin", reason: "BootstrapRefused", message: "Kairos's boot stage did not run it or failed", setup: func(s *sandbox) *node {
			n := newNode("nobootstage", "init", "v1.37.2", "v1.37.2")(s)
			if err := os.Remove(n.Path(paths.ClusterFile)); err != nil {
				s.t.Fatal(err)
			}
			return n
		}},
		{code: "BundledVersionUnknown", reason: "BootstrapRefused", setup: newNode("nobundle", "init", "v1.37.2", "")},
		{code: "BundleOutOfWindow", reason: "BootstrapRefused", setup: newNode("old-image", "init", "v1.34.2", "v1.34.2")},
		{code: "InvalidRole", reason: "BootstrapRefused", setup: newNode("master", "master", "v1.37.2", "v1.37.2")},
		{code: "PinNewerThanImage", reason: "UpgradeRefused", message: "pin v1.37.2 is newer than the kubeadm v1.36.3 this image bundles",
			setup: member("bumped", "controlplane", "v1.37.2", "v1.36.3", "v1.36.3", "v1.36.3")},
		{code: "PinNewerThanImage", reason: "UpgradeRefused", message: "this node already runs the pin v1.37.2 but the image bundles kubeadm v1.36.3: an OS rollback to an older image?",
			setup: member("rolledback", "controlplane", "v1.37.2", "v1.36.3", "v1.37.2", "v1.37.2")},
		{code: "PinImageMismatch", reason: "BootstrapRefused", setup: newNode("close", "init", "v1.37.1", "v1.37.2")},
		{code: "NodeVersionUnknown", reason: "UpgradeRefused", setup: func(s *sandbox) *node {
			api := testutil.NewAPI(s.t, "v1.37.2")
			n := s.node("lost")
			n.clusterFile("worker", "v1.37.2", "")
			n.image("v1.37.2")
			n.Member(api) // no record of its version, and no Node
			return n
		}},
		{code: "Downgrade", reason: "UpgradeRefused", setup: member("down", "controlplane", "v1.36.3", "v1.36.3", "v1.37.2", "v1.37.2")},
		{code: "OutOfWindow", reason: "UpgradeRefused", setup: member("ancient", "controlplane", "v1.34.2", "v1.35.4", "v1.33.5", "v1.33.5")},
		{code: "SkipLevel", reason: "UpgradeRefused", setup: member("skip", "controlplane", "v1.37.2", "v1.37.2", "v1.35.4", "v1.35.4")},
		{code: "PinBehindCluster", reason: "UpgradeRefused", setup: member("behind", "worker", "v1.36.3", "v1.36.3", "v1.36.2", "v1.37.2")},
	}
}

// read returns a page's text.
func read(t *testing.T, page string) string {
	t.Helper()
	b, err := os.ReadFile(docs.Dir() + "/" + page)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// oneLine joins a page's wrapped lines, so a quoted message found in the
// page may span lines there.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
