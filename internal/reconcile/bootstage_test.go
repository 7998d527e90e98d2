package reconcile

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// The reconcile unit runs when either the cluster file or the plugin's
// cluster.kairos.yaml exists. With the plugin's file but no cluster file,
// Kairos's boot stage did not do its part: the pass says so, once, and
// runs nothing.
func TestBootStageFailureIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		yipFile bool
		want    string
	}{
		{"the plugin's file without the cluster file", true, "although the plugin's " + paths.ClusterYipFile + " does: Kairos's boot stage did not run it or failed (journalctl -b -u cos-setup-boot.service)"},
		{"neither file", false, "Kairos's boot stage writes it from the cloud-config's cluster: section (none was found at the last boot)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
			if err := os.Remove(e.node.Path(paths.ClusterFile)); err != nil {
				t.Fatal(err)
			}
			if tc.yipFile {
				e.node.Write(paths.ClusterYipFile, "#cloud-config\nname: provider-kubernetes\n", 0o600)
			}
			res := e.run(Steps{})
			if res.ExitCode != ExitRefused || res.Plan.Refusal != plan.InvalidPin || !strings.Contains(res.Plan.Message, tc.want) {
				t.Fatalf("exit %d %+v", res.ExitCode, res.Plan)
			}
			if len(e.lines()) != 0 {
				t.Fatalf("ran %q", e.lines())
			}
			if st := e.status(t); !strings.Contains(st.Message, tc.want) {
				t.Fatalf("status message %q", st.Message)
			}
		})
	}
}

// The plugin refused this boot's section (agent.boot failed) and the boot
// stage wrote the previous one: the pass refuses, quoting the plugin's
// error, and runs nothing.
func TestRefusedSectionIsReported(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	const plugin = "agent.boot: cluster: invalid cluster config: role is not init, controlplane or worker"
	e.node.Write(paths.PluginError, plugin+"\n", 0o600)
	res := e.run(Steps{})
	if res.ExitCode != ExitRefused || res.Plan.Refusal != plan.InvalidPin ||
		!strings.Contains(res.Plan.Message, "the cloud-config's cluster: section was refused at boot ("+plugin+"); the cluster file holds the previous section, so nothing runs") {
		t.Fatalf("exit %d %+v", res.ExitCode, res.Plan)
	}
	if len(e.lines()) != 0 {
		t.Fatalf("ran %q", e.lines())
	}
}

// The cluster file decides what runs: one another user owns, or one others
// can write, is refused rather than acted on (the boot stage writes it 0600
// root).
func TestUntrustedClusterFileIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, p string)
	}{
		{"group-writable", func(t *testing.T, p string) {
			if err := os.Chmod(p, 0o620); err != nil {
				t.Fatal(err)
			}
		}},
		{"world-writable", func(t *testing.T, p string) {
			if err := os.Chmod(p, 0o602); err != nil {
				t.Fatal(err)
			}
		}},
		{"another owner", func(t *testing.T, p string) {
			testutil.RequireRoot(t)
			if err := os.Chown(p, 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
			tc.setup(t, e.node.Path(paths.ClusterFile))
			res := e.run(Steps{})
			if res.ExitCode != ExitRefused || res.Plan.Refusal != plan.InvalidPin || !strings.Contains(res.Plan.Message, "refusing to act on a file someone else could have written") {
				t.Fatalf("exit %d %+v", res.ExitCode, res.Plan)
			}
			if len(e.lines()) != 0 {
				t.Fatalf("ran %q", e.lines())
			}
		})
	}
}

// The verified-version record is written by a pass that verified or
// bootstrapped the node, never by one that only observed it.
func TestVerifiedRecordIsWrittenOnlyAfterVerifyOrBootstrap(t *testing.T) {
	// A bootstrap writes it.
	e := newEnv(t, "init", "v1.37.2", "v1.37.2", "", "", "")
	res := e.run(Steps{Bootstrap: func(context.Context, plan.Action, Observation) error { return nil }})
	if res.ExitCode != ExitOK || strings.TrimSpace(e.node.Read(paths.VerifiedRecord)) != "v1.37.2" || res.Status.VerifiedVersion != "v1.37.2" {
		t.Fatalf("after init: exit %d, record %q, status %q", res.ExitCode, e.node.Read(paths.VerifiedRecord), res.Status.VerifiedVersion)
	}
	// Its mode is the one docs/reference.md's Files table gives it, and
	// "every one is root:root".
	e.node.DocumentedFile(paths.VerifiedRecord)
	// A converged pass on a node without a record writes none.
	e = newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
	if err := os.Remove(e.node.Path(paths.VerifiedRecord)); err != nil {
		t.Fatal(err)
	}
	res = e.run(Steps{})
	if res.ExitCode != ExitOK || len(e.lines()) != 0 || e.node.Exists(paths.VerifiedRecord) {
		t.Fatalf("a converged pass: exit %d, ran %q, record written %v", res.ExitCode, e.lines(), e.node.Exists(paths.VerifiedRecord))
	}
	// A failed verification leaves the old record: the next boot tries again.
	e = newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
	e.node.Write(paths.VerifiedRecord, "v1.36.3\n", 0o644)
	e.fail = "/usr/bin/systemctl restart kubelet"
	res = e.run(Steps{})
	if res.ExitCode != ExitFailed || strings.TrimSpace(e.node.Read(paths.VerifiedRecord)) != "v1.36.3" {
		t.Fatalf("a failed finish: exit %d, record %q", res.ExitCode, e.node.Read(paths.VerifiedRecord))
	}
}
