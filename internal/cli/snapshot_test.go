package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/cryptgate"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

func withGate(t *testing.T, fs cryptgate.FS) {
	old := gateFS
	gateFS = fs
	t.Cleanup(func() { gateFS = old })
}

func snapshotLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "etcd-snapshot outcome=") {
			out = append(out, l)
		}
	}
	return out
}

func TestEtcdSnapshotCommandTakesOnceAndLogs(t *testing.T) {
	testutil.RequireRoot(t)
	n := testutil.NewNode(t, "cp1")
	etcdtest.BundleEtcdTools(t, n)
	withGate(t, etcdtest.EncryptedPersistent(t, n))
	e := etcdtest.Start(t, n, etcdtest.Config{})
	e.PutKeys("/registry/configmaps/default/c", 20, 100)

	code, out, errOut := run("etcd-snapshot", "--root", n.Root, "--target", "v1.37.2")
	if code != reconcile.ExitOK {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	if out != "" {
		t.Fatalf("stdout %q: the command's output is its one log line", out)
	}
	l := snapshotLines(errOut)
	if len(l) != 1 || !strings.Contains(l[0], "outcome=taken") || !strings.Contains(l[0], "path="+paths.EtcdBackupDir+"/etcd-") {
		t.Fatalf("stderr:\n%s", errOut)
	}
	if got := snapshotLines(n.Read(paths.ReconcileLog)); len(got) != 1 || got[0] != l[0] {
		t.Fatalf("reconcile log %q, want the same line", got)
	}
	code, _, errOut = run("etcd-snapshot", "--root", n.Root, "--target", "v1.37.0")
	if code != reconcile.ExitOK || !strings.Contains(errOut, "outcome=skipped-already-taken") {
		t.Fatalf("second run exit %d\n%s", code, errOut)
	}
	if got := snapshotLines(n.Read(paths.ReconcileLog)); len(got) != 2 {
		t.Fatalf("reconcile log holds %d lines, want one per attempt", len(got))
	}
}

func TestEtcdSnapshotCommandExitCodes(t *testing.T) {
	t.Run("external etcd: 0", func(t *testing.T) {
		n := testutil.NewNode(t, "cp1")
		code, _, errOut := run("etcd-snapshot", "--root", n.Root, "--target", "v1.37.2")
		if code != reconcile.ExitOK || len(snapshotLines(errOut)) != 1 || !strings.Contains(errOut, "outcome=skipped-external-etcd") {
			t.Fatalf("exit %d\n%s", code, errOut)
		}
	})
	t.Run("default install: 0, nothing written", func(t *testing.T) {
		n := testutil.NewNode(t, "cp1")
		etcdtest.BundleEtcdTools(t, n)
		withGate(t, etcdtest.PlainPersistent(t, n))
		etcdtest.Start(t, n, etcdtest.Config{})
		code, _, errOut := run("etcd-snapshot", "--root", n.Root, "--target", "v1.37.2")
		if code != reconcile.ExitOK || !strings.Contains(errOut, "outcome=skipped-encryption-unconfirmed") {
			t.Fatalf("exit %d\n%s", code, errOut)
		}
		if n.Exists(paths.EtcdBackupDir) {
			t.Fatal("created the backup dir on unencrypted storage")
		}
	})
	t.Run("unusable manifest: 1", func(t *testing.T) {
		n := testutil.NewNode(t, "cp1")
		n.Write(paths.EtcdManifest, "spec:\n  containers:\n  - name: etcd\n    command: [etcd, --listen-client-urls=http://127.0.0.1:2379]\n", 0o600)
		code, _, errOut := run("etcd-snapshot", "--root", n.Root, "--target", "v1.37.2")
		if code != reconcile.ExitFailed || !strings.Contains(errOut, "outcome=failed") || !strings.Contains(errOut, "reason=") {
			t.Fatalf("exit %d\n%s", code, errOut)
		}
	})
	for _, args := range [][]string{{}, {"--target", "1.37"}, {"--target", "v1.37"}, {"--target", "v1.37.2", "--root", "rel"}, {"--target", "v1.37.2", "extra"}} {
		if code, _, _ := run(append([]string{"etcd-snapshot"}, args...)...); code != reconcile.ExitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, reconcile.ExitUsage)
		}
	}
}

func pruneNode(t *testing.T, nodeV, kubeletV, clusterV string) *testutil.Node {
	n := testutil.NewNode(t, "cp1")
	api := testutil.NewAPI(t, clusterV)
	n.Member(api)
	n.ControlPlane(nodeV)
	api.SetNode("cp1", kubeletV, true)
	for _, stamp := range []string{"2026-05-01-10-00-00", "2026-08-01-10-00-00", "2026-11-30-10-05-00"} {
		n.Write(paths.KubeadmTmpDir+"/kubeadm-backup-etcd-"+stamp+"/etcd/member/snap/db", strings.Repeat("x", 2048), 0o600)
	}
	return n
}

func TestPruneKubeadmBackups(t *testing.T) {
	n := pruneNode(t, "v1.37.2", "v1.37.2", "v1.37.2")
	code, out, errOut := run("prune-kubeadm-backups", "--root", n.Root)
	if code != reconcile.ExitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, gone := range []string{"2026-05-01-10-00-00", "2026-08-01-10-00-00"} {
		if n.Exists(paths.KubeadmTmpDir + "/kubeadm-backup-etcd-" + gone) {
			t.Fatalf("%s not removed", gone)
		}
		if !strings.Contains(out, "removed "+paths.KubeadmTmpDir+"/kubeadm-backup-etcd-"+gone+" (2.0 KiB)") {
			t.Fatalf("stdout:\n%s", out)
		}
	}
	if !n.Exists(paths.KubeadmTmpDir + "/kubeadm-backup-etcd-2026-11-30-10-05-00") {
		t.Fatal("the newest copy was removed")
	}
	if !strings.Contains(n.Read(paths.ReconcileLog), "msg=prune-kubeadm-backups outcome=removed removed=2 kept=1") {
		t.Fatalf("log:\n%s", n.Read(paths.ReconcileLog))
	}
	// Nothing left to remove: no API needed.
	if err := os.Remove(n.Path(paths.KubeletConf)); err != nil {
		t.Fatal(err)
	}
	code, out, _ = run("prune-kubeadm-backups", "--root", n.Root)
	if code != reconcile.ExitOK || !strings.Contains(out, "nothing to remove: 1 kubeadm etcd backup(s)") {
		t.Fatalf("exit %d %s", code, out)
	}
}

// docs/backups.md: "`--keep N` keeps the newest N (default 1; 0 removes
// all)" on a verified node.
func TestPruneKubeadmBackupsKeepsTheNewestN(t *testing.T) {
	stamps := []string{"2026-05-01-10-00-00", "2026-08-01-10-00-00", "2026-11-30-10-05-00"} // oldest first, as pruneNode writes them
	for _, keep := range []int{2, 0} {
		n := pruneNode(t, "v1.37.2", "v1.37.2", "v1.37.2")
		code, out, errOut := run("prune-kubeadm-backups", "--root", n.Root, "--keep", strconv.Itoa(keep))
		if code != 0 {
			t.Fatalf("--keep %d: exit %d\n%s%s", keep, code, out, errOut)
		}
		for i, s := range stamps {
			kept := i >= len(stamps)-keep
			if got := n.Exists(paths.KubeadmTmpDir + "/kubeadm-backup-etcd-" + s); got != kept {
				t.Errorf("--keep %d: %s kept %v, want %v\n%s", keep, s, got, kept, out)
			}
		}
		if !strings.Contains(out, fmt.Sprintf("kept %d, freed ", keep)) {
			t.Errorf("--keep %d: stdout\n%s", keep, out)
		}
	}
}

func TestPruneKubeadmBackupsRefusesUnlessVerified(t *testing.T) {
	for name, vs := range map[string][3]string{
		"control plane not upgraded": {"v1.36.3", "v1.37.2", "v1.37.2"},
		"kubelet not upgraded":       {"v1.37.2", "v1.36.3", "v1.37.2"},
		"cluster not upgraded":       {"v1.37.2", "v1.37.2", "v1.36.3"},
	} {
		t.Run(name, func(t *testing.T) {
			n := pruneNode(t, vs[0], vs[1], vs[2])
			code, _, errOut := run("prune-kubeadm-backups", "--root", n.Root, "--keep", "0")
			if code != reconcile.ExitRefused || !strings.Contains(errOut, "not verified") {
				t.Fatalf("exit %d\n%s", code, errOut)
			}
			ents, _ := os.ReadDir(n.Path(paths.KubeadmTmpDir))
			if len(ents) != 3 {
				t.Fatalf("%d backups left, want all 3", len(ents))
			}
		})
	}
	if code, _, _ := run("prune-kubeadm-backups", "--keep", "-1"); code != reconcile.ExitUsage {
		t.Fatalf("--keep -1: exit %d", code)
	}
	// A symlinked /etc/kubernetes/tmp is never followed.
	n := testutil.NewNode(t, "cp1")
	elsewhere := t.TempDir()
	if err := os.MkdirAll(elsewhere+"/kubeadm-backup-etcd-2026-05-01-10-00-00", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(n.Path(paths.KubernetesDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, n.Path(paths.KubeadmTmpDir)); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run("prune-kubeadm-backups", "--root", n.Root, "--keep", "0"); code != reconcile.ExitFailed || !strings.Contains(errOut, "symlink") {
		t.Fatalf("exit %d %s", code, errOut)
	}
	if _, err := os.Stat(elsewhere + "/kubeadm-backup-etcd-2026-05-01-10-00-00"); err != nil {
		t.Fatal("removed through a symlink")
	}
}

// The reconcile command's step: the outcome and warnings reach the pass.
func TestReconcileSnapshotStepReports(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	var buf strings.Builder
	step := snapshotStep(n.R(), runner.Exec{Root: n.Root}, slog.New(slog.NewTextHandler(&buf, nil)))
	rep := step(context.Background(), version.MustParse("v1.37.2"))
	if rep.Outcome != "skipped-external-etcd" || len(rep.Warnings) != 0 || len(snapshotLines(buf.String())) != 1 {
		t.Fatalf("%+v\n%s", rep, buf.String())
	}
}

// Every command that writes under the provider's directories follows the
// pass's rules: while the lock is held, or with a /run/provider-kubernetes
// another user owns, etcd-snapshot and prune-kubeadm-backups write nothing.
func TestNodeCommandsTakeThePassLock(t *testing.T) {
	testutil.RequireRoot(t)
	for _, held := range []string{"lock held", "run dir owned by uid 1000"} {
		t.Run(held, func(t *testing.T) {
			n := pruneNode(t, "v1.37.2", "v1.37.2", "v1.37.2")
			n.Write(paths.EtcdManifest, "spec:\n  containers:\n  - name: etcd\n    command: [etcd, --listen-client-urls=http://127.0.0.1:2379]\n", 0o600)
			if held == "lock held" {
				unlock, err := reconcile.Lock(n.R())
				if err != nil {
					t.Fatal(err)
				}
				defer unlock()
			} else {
				if err := os.MkdirAll(n.Path(paths.RunDir), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(n.Path(paths.RunDir), 1000, 1000); err != nil {
					t.Fatal(err)
				}
			}
			code, _, errOut := run("etcd-snapshot", "--root", n.Root, "--target", "v1.37.2")
			l := snapshotLines(errOut)
			if code != reconcile.ExitFailed || len(l) != 1 || !strings.Contains(l[0], "outcome=failed") || !strings.Contains(l[0], "reconcile lock") {
				t.Fatalf("etcd-snapshot: exit %d\n%s", code, errOut)
			}
			want := reconcile.ExitRefused
			if held != "lock held" {
				want = reconcile.ExitFailed
			}
			code, _, errOut = run("prune-kubeadm-backups", "--root", n.Root, "--keep", "0")
			if code != want || !strings.Contains(errOut, "refusing to remove anything") {
				t.Fatalf("prune-kubeadm-backups: exit %d\n%s", code, errOut)
			}
			if ents, _ := os.ReadDir(n.Path(paths.KubeadmTmpDir)); len(ents) != 3 {
				t.Fatalf("%d backups left, want all 3", len(ents))
			}
		})
	}
}
