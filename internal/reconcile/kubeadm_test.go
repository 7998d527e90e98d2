package reconcile

import (
	"context"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// The bundled-version fallback execs the real kubeadm 1.37.2 through the
// real runner, from the sandbox root, when the image has no bundle manifest.
func TestRealKubeadmBundledVersionFallback(t *testing.T) {
	kubeadm := testbin.Kubeadm(t, "v1.37.2")
	n := testutil.NewNode(t, "n1")
	n.Write(paths.Kubeadm, "", 0o755)
	if err := os.Remove(n.Path(paths.Kubeadm)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(kubeadm, n.Path(paths.Kubeadm)); err != nil {
		t.Fatal(err)
	}
	rec := &runner.Recorder{Reply: runner.Exec{Root: n.Root}.Run}
	o := &observe.Observer{Root: n.R(), Runner: rec}
	v, src, err := o.Bundled(context.Background())
	if err != nil || v != version.MustParse("v1.37.2") || src != paths.Kubeadm {
		t.Fatalf("bundled %v from %s: %v", v, src, err)
	}
	if got := rec.Lines(); !reflect.DeepEqual(got, []string{"/usr/bin/kubeadm version -o short"}) {
		t.Fatalf("ran %q", got)
	}
	// With a manifest the binary is never exec'd.
	n.Bundle("v1.37.2")
	rec2 := &runner.Recorder{Reply: runner.Exec{Root: n.Root}.Run}
	o.Runner = rec2
	if v, src, err := o.Bundled(context.Background()); err != nil || v != version.MustParse("v1.37.2") || src != paths.BundleManifest || len(rec2.Lines()) != 0 {
		t.Fatalf("manifest: %v %s %v, ran %q", v, src, err, rec2.Lines())
	}
}

// The exact command lines the pass runs for upgrade apply and upgrade node
// are handed to the real kubeadm 1.37.2 (with --dry-run appended, its
// dry-run directory in the test's temp dir): real flag parsing, real config
// loading of the operator's UpgradeConfiguration, exit 0.
func TestRealKubeadmAcceptsTheUpgradeCommandLines(t *testing.T) {
	kubeadm := testbin.Kubeadm(t, "v1.37.2")
	// The operator's preflight choice travels in upgradeConfiguration, never as a hard-coded flag.
	extra := "  upgradeConfiguration:\n    apply:\n      ignorePreflightErrors: [all]\n    node:\n      ignorePreflightErrors: [all]\n"
	for _, tc := range []struct{ name, cluster, want string }{
		{"apply", "v1.36.3", "/usr/bin/kubeadm upgrade apply v1.37.2 --yes --config "},
		{"node", "v1.37.2", "/usr/bin/kubeadm upgrade node --config "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", tc.cluster, extra)
			simulate := e.rec.Reply
			ran := 0
			e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
				if c.Path == paths.Kubeadm {
					// The exact arguments: the config's path is already
					// re-based on the sandbox root.
					args := append(append([]string{}, c.Args...), "--dry-run")
					cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
					defer cancel()
					cmd := exec.CommandContext(cctx, kubeadm, args...)
					cmd.Env = append(append([]string{}, runner.BaseEnv...), "KUBEADM_UPGRADE_DRYRUN_DIR="+t.TempDir())
					out, err := cmd.CombinedOutput()
					if err != nil {
						t.Fatalf("real kubeadm refused %q: %v\n%s", c.String(), err, tail(string(out), 15))
					}
					if !strings.Contains(string(out), "Finished dryrunning successfully") {
						t.Fatalf("kubeadm did not finish the dry run:\n%s", tail(string(out), 15))
					}
					ran++
				}
				return simulate(ctx, c)
			}
			res := e.run(Steps{})
			if res.ExitCode != ExitOK || ran != 1 {
				t.Fatalf("exit %d, kubeadm ran %d: %v", res.ExitCode, ran, res.Err)
			}
			if got, want := e.lines()[0], tc.want+e.node.Path(UpgradeConfigPath); got != want {
				t.Fatalf("command %q, want %q", got, want)
			}
		})
	}
}

// Without an operator config the same command line is accepted by kubeadm's
// flag parsing and fails only where it should without a cluster: preflight.
func TestRealKubeadmParsesTheBareApplyLine(t *testing.T) {
	kubeadm := testbin.Kubeadm(t, "v1.37.2")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubeadm, append(strings.Fields(applyLines[0])[1:], "--dry-run")...)
	cmd.Env = append(append([]string{}, runner.BaseEnv...), "KUBEADM_UPGRADE_DRYRUN_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatal("a bare dry-run apply passed preflight on a host without a kubelet")
	}
	s := string(out)
	for _, bad := range []string{"unknown flag", "unknown command", "accepts", "can not mix", "Usage:"} {
		if strings.Contains(s, bad) {
			t.Fatalf("kubeadm rejected the command line (%q):\n%s", bad, tail(s, 10))
		}
	}
	if !strings.Contains(s, "preflight") {
		t.Fatalf("failed somewhere other than preflight:\n%s", tail(s, 10))
	}
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
