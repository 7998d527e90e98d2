package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(context.Background(), args, nil, &out, &errb)
	return code, out.String(), errb.String()
}

func TestPlanJSONFromFlagsReadsNothing(t *testing.T) {
	// A root that does not exist: every fact comes from flags.
	root := t.TempDir() + "/nowhere"
	code, out, errOut := run("plan", "--root", root, "-o", "json", "--pin", "v1.37.2", "--bundled", "v1.37.2",
		"--node-version", "v1.36.3", "--cluster-version", "v1.36.3", "--role", "controlplane", "--member=true")
	if code != reconcile.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, k := range []string{"verdict", "actions", "refusal", "reason", "message"} {
		if _, ok := got[k]; !ok {
			t.Fatalf("json lacks %q: %s", k, out)
		}
	}
	if got["verdict"] != "act" || !reflect.DeepEqual(got["actions"], []any{"etcd-snapshot", "upgrade-apply", "restart-kubelet", "verify"}) {
		t.Fatalf("%s", out)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatal("plan created the root")
	}
}

func TestPlanFlagsOverrideTheNode(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	n.ClusterFile("worker", "v1.36.3", "")
	n.Bundle("v1.36.3")
	// What-if: the pin bumped and the 1.37 image booted, before rebooting.
	code, out, _ := run("plan", "--root", n.Root, "-o", "json", "--pin", "v1.37.2", "--bundled", "v1.37.2", "--member=false")
	var pl plan.Plan
	if err := json.Unmarshal([]byte(out), &pl); err != nil || code != reconcile.ExitOK || strings.Join(actions(pl), ",") != "join" {
		t.Fatalf("exit %d %s", code, out)
	}
	// Read from the node: pin v1.36.3 matches the bundle, a worker joins.
	code, out, _ = run("plan", "--root", n.Root)
	if code != reconcile.ExitOK || !strings.Contains(out, "1. join") || !strings.Contains(out, "pin=v1.36.3") {
		t.Fatalf("exit %d %s", code, out)
	}
}

func TestPlanRefusalAndUsageExitCodes(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--pin", "v1.37.2", "--bundled", "v1.37.2", "--node-version", "v1.35.4", "--cluster-version", "v1.35.4", "--role", "controlplane", "--member"}, reconcile.ExitRefused, "REFUSE SkipLevel (UpgradeRefused)"},
		{[]string{"--pin", "latest", "--bundled", "v1.37.2", "--role", "init", "--member=false"}, reconcile.ExitRefused, "REFUSE InvalidPin (BootstrapRefused)"},
		{[]string{"--pin", "v1.37.2", "--bundled", "unknown", "--role", "init", "--member=false"}, reconcile.ExitRefused, "REFUSE BundledVersionUnknown"},
		{[]string{"--pin", "v1.37.2", "--bundled", "v1.37.2", "--node-version", "v1.37.2", "--cluster-version", "unknown", "--role", "worker", "--member"}, reconcile.ExitOK, "nothing to do"},
		{[]string{"--role", "master", "--pin", "v1.37.2"}, reconcile.ExitUsage, ""},
		{[]string{"--bundled", "1.37"}, reconcile.ExitUsage, ""},
		{[]string{"-o", "xml"}, reconcile.ExitUsage, ""},
		{[]string{"--root", "relative/dir"}, reconcile.ExitUsage, ""},
		{[]string{"extra-arg"}, reconcile.ExitUsage, ""},
	}
	for _, c := range cases {
		code, out, errOut := run(append([]string{"plan", "--root", t.TempDir()}, c.args...)...)
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d (want %d)\n%s%s", c.args, code, c.code, out, errOut)
		}
	}
	if code, _, _ := run("frobnicate"); code != reconcile.ExitUsage {
		t.Fatalf("unknown command exit %d", code)
	}
	if code, _, _ := run(); code != reconcile.ExitUsage {
		t.Fatalf("no command exit %d", code)
	}
}

func TestReconcileCommandWritesLogAndStatus(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	n.ClusterFile("controlplane", "v1.37.2", "")
	n.Bundle("v1.37.2")
	api := testutil.NewAPI(t, "v1.35.4")
	n.Member(api)
	n.ControlPlane("v1.35.4")
	code, _, errOut := run("reconcile", "--root", n.Root)
	if code != reconcile.ExitRefused {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	log := n.Read(paths.ReconcileLog)
	if !strings.Contains(log, "msg=refuse-upgrade") || !strings.Contains(log, "code=SkipLevel") || strings.Contains(log, testutil.Token) {
		t.Fatalf("log:\n%s", log)
	}
	st, err := os.Stat(n.Path(paths.ReconcileLog))
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("log mode %v %v", st, err)
	}
	// The journal (stderr) gets the same lines.
	if !strings.Contains(errOut, "msg=refuse-upgrade") {
		t.Fatalf("stderr: %s", errOut)
	}

	code, out, _ := run("status", "--root", n.Root)
	if code != 0 || !strings.Contains(out, "Phase:           Refused") || !strings.Contains(out, "Refusal:         SkipLevel") {
		t.Fatalf("status text:\n%s", out)
	}
	code, out, _ = run("status", "--root", n.Root, "-o", "json")
	var d status.Document
	if code != 0 || json.Unmarshal([]byte(out), &d) != nil || d.Reason != "UpgradeRefused" || d.Pin != "v1.37.2" || d.NodeVersion != "v1.35.4" {
		t.Fatalf("status json: %s", out)
	}
	code, out, _ = run("status", "--root", n.Root, "-o", "yaml")
	if code != 0 || !strings.Contains(out, "phase: Refused") {
		t.Fatalf("status yaml: %s", out)
	}
}

func TestStatusBeforeAnyPass(t *testing.T) {
	code, _, errOut := run("status", "--root", t.TempDir())
	if code != reconcile.ExitFailed || !strings.Contains(errOut, "no status document yet") {
		t.Fatalf("exit %d %s", code, errOut)
	}
}

func TestLogIsNotFollowedThroughASymlink(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	target := t.TempDir() + "/planted"
	if err := os.MkdirAll(n.Path("/var/log"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, n.Path(paths.ReconcileLog)); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run("reconcile", "--root", n.Root)
	if code != reconcile.ExitFailed || !strings.Contains(errOut, "open reconcile log") {
		t.Fatalf("exit %d %s", code, errOut)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatal("wrote through the symlink")
	}
}

// Every command that takes --root refuses a relative one before it reads
// or writes anything (paths are re-based under it).
func TestEveryRootedCommandRefusesARelativeRoot(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, cmd := range []string{"reconcile", "plan", "status", "join-config", "reset", "migrate-units", "import-images", "etcd-snapshot", "prune-kubeadm-backups"} {
		code, out, errOut := run(cmd, "--root", "relative")
		if code != reconcile.ExitUsage || out != "" || !strings.Contains(errOut, `--root must be an absolute path, got "relative"`) {
			t.Errorf("%s --root relative: exit %d, stdout %q, stderr %q", cmd, code, out, errOut)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("%s wrote %v under the working directory", cmd, ents)
		}
	}
}

// The nested providerConfig of earlier releases, in a cluster file plan
// reads (--cluster-file), fails as a pass fails it (ConfigInvalid, exit 1,
// as a bad budget value does: reference.md "providerConfig"), with what to
// write instead: the budget.<name> keys. So does a bad budget value.
func TestPlanNamesTheBudgetKeysForANestedProviderConfig(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	n.Write("/old.yaml", "providerConfig:\n  budgets:\n    verify: 6m\n"+testutil.ClusterSection("init", "v1.37.2", ""), 0o600)
	code, out, errOut := run("plan", "--root", n.Root, "--cluster-file", "/old.yaml", "--bundled", "v1.37.2", "--member=false")
	if code != reconcile.ExitFailed || out != "" || !strings.Contains(errOut, "plan: ConfigInvalid: ") ||
		!strings.Contains(errOut, "budget.<name>: <duration> (e.g. budget.verify: 6m)") {
		t.Fatalf("exit %d:\n%s\n%s", code, out, errOut)
	}
	n.Write("/bad.yaml", "providerConfig:\n  budget.verify: soon\n"+testutil.ClusterSection("init", "v1.37.2", ""), 0o600)
	code, out, errOut = run("plan", "--root", n.Root, "--cluster-file", "/bad.yaml", "--bundled", "v1.37.2", "--member=false")
	if code != reconcile.ExitFailed || out != "" || !strings.Contains(errOut, "plan: ConfigInvalid: ") || !strings.Contains(errOut, "budget.verify") {
		t.Fatalf("bad budget: exit %d:\n%s\n%s", code, out, errOut)
	}
	code, out, _ = runStdin("#cloud-config\ncluster:\n  providerConfig:\n    budgets:\n      verify: 6m\n"+indentLines(testutil.ClusterSection("init", "v1.37.2", ""), "  "),
		"validate", "-")
	if code != reconcile.ExitFailed || !strings.Contains(out, "budget.<name>: <duration>") {
		t.Fatalf("validate: exit %d:\n%s", code, out)
	}
}

func indentLines(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

// plan shows the pass's decision on a converged control plane whose
// soonest leaf certificate is within certificates.renewBefore (read from
// the node, as the pass reads it), and nothing to do outside it.
func TestPlanShowsTheCertificateRenewal(t *testing.T) {
	for _, tc := range []struct {
		renewBefore, want string
	}{
		{"72h", "Actions:  1. renew-certificates  2. restart-control-plane\n"},
		{"24h", "Verdict:  nothing to do\n"},
	} {
		n := testutil.NewNode(t, "n1")
		n.Write(paths.ClusterFile, testutil.ClusterSection("init", "v1.37.2", "")+"providerConfig:\n  certificates.renewBefore: "+tc.renewBefore+"\n", 0o600)
		n.Bundle("v1.37.2")
		n.Member(testutil.NewAPI(t, "v1.37.2"))
		n.ControlPlane("v1.37.2")
		n.Write(paths.VerifiedRecord, "v1.37.2\n", 0o644)
		cert, _ := testutil.ClientCertUntil(t, "kube-apiserver", time.Now().Add(40*time.Hour))
		n.Write(paths.PKIDir+"/apiserver.crt", string(cert), 0o644)
		code, out, errOut := run("plan", "--root", n.Root)
		if code != reconcile.ExitOK || !strings.Contains(out, tc.want) {
			t.Fatalf("renewBefore %s: exit %d, want %q:\n%s%s", tc.renewBefore, code, tc.want, out, errOut)
		}
		if tc.renewBefore == "72h" && !strings.Contains(out, "the certificate apiserver expires in 39h") {
			t.Fatalf("the message does not say which certificate and when:\n%s", out)
		}
	}
}
