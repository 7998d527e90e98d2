package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/kairos"
	"github.com/kairos-io/provider-kubernetes/tests/e2e/harness"
)

// Boot order on real systemd with Kairos's own boot chain (issue 12): one
// node of the 1.37 image, never a cluster member, so each pass is short.
// No cluster: section: no pass, no failed unit. The section with Kairos's
// boot stage masked: one pass that names the boot stage. A section the
// plugin refuses: one pass that quotes it. Then five boots in a row with a
// section whose pin the image does not ship and a slow step of the
// operator's own in the boot stage: each boot runs exactly one pass, after
// the boot stage, and logs exactly one refusal (a pass that started before
// the boot stage wrote the cluster file would add an InvalidPin refusal and
// a second pass).
func TestBootOrder(t *testing.T) {
	harness.Require(t)
	tr := osTrees(t, "1.37")
	c := harness.New(t, harness.Options{Base: base(t)})
	nd := node{name: "n1", ip: "10.0.0.11", role: "init"}
	n, err := c.AddNode(context.Background(), harness.NodeSpec{Name: nd.name, Tree: tr["1.37"]})
	if err != nil {
		t.Fatal(err)
	}
	noSectionAndFailedBootStage(t, n, clusterSection(newToken(t), nd, nd.ip, "v1.36.3"))

	// The operator's own boot stage has a slow step, processed before the
	// plugin's file (/oem before /usr/local/cloud-config): the cluster file
	// appears only after it, later than the image import the reconcile unit
	// also waits for (~10 s here). A unit not ordered after the boot stage
	// ran two passes on every such boot (an InvalidPin refusal, then the
	// real pass started by the boot stage): measured with the previous unit,
	// 5 boots of 5.
	if err := n.EditCloudConfig(func(b []byte) ([]byte, error) {
		return append(b, slowBootStep...), nil
	}); err != nil {
		t.Fatal(err)
	}

	var per []string
	for i := 1; i <= 5; i++ {
		refusals := strings.Count(reconcileLogOrEmpty(n), "msg=refuse-")
		code := bootNode(t, n, fmt.Sprintf("pin v1.36.3 on the 1.37 image, boot %d of 5", i))
		if code != 3 {
			t.Fatalf("boot %d: exit %d, want 3 (refused)\n%s", i, code, lastPass(reconcileLog(t, n)))
		}
		pass := lastPass(reconcileLog(t, n))
		if k := strings.Count(reconcileLog(t, n), "msg=refuse-") - refusals; k != 1 || !strings.Contains(pass, "msg=refuse-bootstrap code=PinImageMismatch") {
			t.Fatalf("boot %d: %d refusal lines, want one refuse-bootstrap code=PinImageMismatch:\n%s", i, k, pass)
		}
		per = append(per, fmt.Sprintf("boot %d: 1 pass, 1 refusal (PinImageMismatch)", i))
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		err := n.Stop(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("boot order: %s", strings.Join(per, "; "))
}

// slowBootStep is an operator's boot-stage step that takes 15 s.
const slowBootStep = "stages:\n  boot:\n  - name: the operator's own slow boot step\n    commands:\n    - sleep 15\n"

// reconcileLogOrEmpty is the node's reconcile log, "" before the first pass.
func reconcileLogOrEmpty(n *harness.Node) string {
	b, err := n.ReadFile(paths.ReconcileLog)
	if err != nil {
		return ""
	}
	return string(b)
}

// noSectionAndFailedBootStage boots a new node three times before it has
// a cluster: first with a cloud-config without a cluster: section (no
// pass, no failed unit, nothing written by the plugin), then with its
// section but Kairos's boot stage masked (the plugin's yip config exists,
// the cluster file does not: one pass that refuses and names the boot
// stage), then with a section the plugin refuses (one pass that refuses,
// quoting the plugin). It leaves the node stopped, the boot stage unmasked
// and the section in /oem.
func noSectionAndFailedBootStage(t testing.TB, n *harness.Node, section []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := n.WriteCloudConfig([]byte("#cloud-config\nhostname: " + n.Name + "\n")); err != nil {
		t.Fatal(err)
	}
	progress(t, "%s: booting (no cluster: section)", n.Name)
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st := reconcileUnit(t, n); !st.Skipped {
		t.Fatalf("no cluster: section, yet the reconcile unit ran: %v", st)
	}
	if _, err := n.WaitSystem(ctx, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	if failed, err := n.FailedUnits(ctx); err != nil || len(failed) != 0 {
		t.Fatalf("no cluster: section: failed units %v %v", failed, err)
	}
	for _, p := range []string{paths.ClusterYipFile, paths.ClusterFile, paths.ReconcileLog} {
		if _, err := n.ReadFile(p); err == nil {
			t.Fatalf("no cluster: section, yet %s exists", p)
		}
	}
	progress(t, "%s: no cluster: section: no pass, no failed unit", n.Name)

	// The section in /oem, the boot stage masked (the boot stage "failed").
	writeCloudConfig(t, n, section)
	if _, err := n.Output(ctx, "systemctl", "mask", kairos.CosSetupBoot); err != nil {
		t.Fatal(err)
	}
	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	progress(t, "%s: booting (cluster: section, Kairos's boot stage masked)", n.Name)
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	st := reconcileUnit(t, n)
	if st.Skipped || st.ExecMainStatus != 3 {
		t.Fatalf("boot stage masked: reconcile %v, want refused (exit 3)", st)
	}
	log := reconcileLog(t, n)
	if k := strings.Count(log, "msg=reconcile-start"); k != 1 {
		t.Fatalf("boot stage masked: %d passes, want 1:\n%s", k, log)
	}
	if k := strings.Count(log, "msg=refuse-"); k != 1 || !strings.Contains(log, "msg=refuse-bootstrap code=InvalidPin") {
		t.Fatalf("boot stage masked: want one refuse-bootstrap line:\n%s", log)
	}
	ds := nodeStatus(t, n)
	if !strings.Contains(ds.Message, "Kairos's boot stage did not run it or failed (journalctl -b -u cos-setup-boot.service)") {
		t.Fatalf("boot stage masked: the status does not name the boot stage: %+v", ds)
	}
	if k := unitStarts(t, n); k != 1 {
		t.Fatalf("boot stage masked: the reconcile unit started %d times", k)
	}
	progress(t, "%s: boot stage masked: one pass, refused: %s", n.Name, ds.Message)
	if _, err := n.Output(ctx, "systemctl", "unmask", kairos.CosSetupBoot); err != nil {
		t.Fatal(err)
	}
	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// A section the plugin refuses (a typo in role): kairos-agent's
	// initramfs stage goes on (it only fails with --strict) and the boot
	// stage writes the previous section; the pass refuses, quoting the
	// plugin's error, and runs nothing.
	good, err := n.ReadFile(kairos.OEMCloudConfig)
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(good), "role: init", "role: intt", 1)
	if bad == string(good) {
		t.Fatal("no role line to break")
	}
	if err := n.WriteCloudConfig([]byte(bad)); err != nil {
		t.Fatal(err)
	}
	progress(t, "%s: booting (a cluster: section the plugin refuses)", n.Name)
	before := passCount(n)
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	st = reconcileUnit(t, n)
	if st.ExecMainStatus != 3 || passCount(n)-before != 1 {
		t.Fatalf("refused section: reconcile %v, %d passes", st, passCount(n)-before)
	}
	ds = nodeStatus(t, n)
	if !strings.Contains(ds.Message, "the cloud-config's cluster: section was refused at boot (agent.boot: cluster: invalid cluster config: role is not init, controlplane or worker)") {
		t.Fatalf("refused section: the status does not quote the plugin: %+v", ds)
	}
	progress(t, "%s: refused section: one pass, refused: %s", n.Name, ds.Message)
	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.WriteCloudConfig(good); err != nil {
		t.Fatal(err)
	}
}
