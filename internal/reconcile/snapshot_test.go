package reconcile

import (
	"context"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/etcdsnap"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// A frozen stacked etcd (the real 3.6.8 binary under SIGSTOP) in front of
// the 1.36 -> 1.37 apply: the snapshot step fails within its bound, logs its
// one line, puts its outcome and the member-version warning in the status,
// and the apply still runs.
func TestHungEtcdNeverBlocksTheApply(t *testing.T) {
	bin := testbin.Etcd(t, "v3.6.8")
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	fs := etcdtest.EncryptedPersistent(t, e.node)
	member := etcdtest.StartBinary(t, e.node, bin, "registry.k8s.io/etcd:3.6.8-0")
	member.Pause()
	t.Cleanup(member.Resume)
	for _, tool := range []string{paths.Etcdctl, paths.Etcdutl} {
		e.node.Write(tool, "#!/bin/sh\nexit 0\n", 0o755) // present; never reached
	}

	log := slog.New(slog.NewTextHandler(e.logBuf, nil))
	var took time.Duration
	res := e.run(Steps{EtcdSnapshot: func(ctx context.Context, target version.Version) SnapshotReport {
		start := time.Now()
		r := etcdsnap.Take(ctx, etcdsnap.Options{Root: e.node.R(), Runner: runner.Exec{Root: e.node.Root}, Log: log, FS: fs,
			Total: 6 * time.Second, Request: 2 * time.Second}, target)
		took = time.Since(start)
		return SnapshotReport{Outcome: string(r.Outcome), Warnings: r.Warnings}
	}})
	if res.ExitCode != ExitOK {
		t.Fatalf("exit %d: %v\n%s", res.ExitCode, res.Err, e.logBuf.String())
	}
	if took > 11*time.Second {
		t.Fatalf("the snapshot step took %s with a 6s bound", took)
	}
	if got := e.lines(); !reflect.DeepEqual(got, applyLines) {
		t.Fatalf("commands %q, want %q", got, applyLines)
	}
	n := strings.Count(e.logBuf.String(), "etcd-snapshot outcome=")
	if n != 1 {
		t.Fatalf("%d etcd-snapshot outcome lines, want exactly one:\n%s", n, e.logBuf.String())
	}
	e.logHas(t, "msg=etcd-snapshot", "outcome=failed", "reason=")
	e.logHas(t, "msg="+etcdsnap.EventVersionWarning)
	e.logHas(t, "msg=upgrade-apply", "outcome=ok")
	st := e.status(t)
	if st.EtcdSnapshot != "failed" || st.NodeVersion != "v1.37.2" {
		t.Fatalf("status %+v", st)
	}
	if len(st.Warnings) == 0 || !strings.Contains(strings.Join(st.Warnings, "\n"), "3.6.11") {
		t.Fatalf("status warnings %q", st.Warnings)
	}
	e.noSecrets(t)
}

// kubeadm's own copies are counted in every status document, with a
// warning once they accumulate.
func TestStatusReportsKubeadmBackups(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
	e.node.Write(paths.KubeadmTmpDir+"/kubeadm-backup-etcd-2026-05-01-10-00-00/etcd/member/snap/db", strings.Repeat("x", 3000), 0o600)
	if res := e.run(Steps{}); res.ExitCode != ExitOK {
		t.Fatal(res.Err)
	}
	st := e.status(t)
	if b := st.KubeadmEtcdBackups; b == nil || b.Count != 1 || b.Bytes != 3000 || b.Dir != paths.KubeadmTmpDir {
		t.Fatalf("backups %+v", b)
	}
	if len(st.Warnings) != 0 {
		t.Fatalf("one copy is expected after an upgrade, no warning: %q", st.Warnings)
	}
	e.node.Write(paths.KubeadmTmpDir+"/kubeadm-backup-etcd-2026-11-30-10-05-00/etcd/member/snap/db", strings.Repeat("x", 5000), 0o600)
	if res := e.run(Steps{}); res.ExitCode != ExitOK {
		t.Fatal(res.Err)
	}
	st = e.status(t)
	if b := st.KubeadmEtcdBackups; b == nil || b.Count != 2 || b.Bytes != 8000 {
		t.Fatalf("backups %+v", b)
	}
	if len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "prune-kubeadm-backups") {
		t.Fatalf("warnings %q", st.Warnings)
	}
	var text strings.Builder
	if err := status.Print(&text, st, "text"); err != nil || !strings.Contains(text.String(), "kubeadm backups: 2 etcd copies, 7.8 KiB, in /etc/kubernetes/tmp") {
		t.Fatalf("%v\n%s", err, text.String())
	}
}

// A cut during the 1.36 -> 1.37 upgrade apply right after kubeadm replaced
// etcd.yaml (its first step: the member already runs etcd 3.7) and before
// the apiserver's: the three control-plane manifests still read 1.36.3, so
// the next boot plans the apply again, snapshot first. upgrades.md: the
// snapshot is taken once, before the apply, so a reboot mid-upgrade never
// replaces it with a partially upgraded one, and it never blocks the
// upgrade. So: no snapshot (etcdctl never runs, nothing written),
// outcome failed naming etcd.yaml, and the resumed apply runs exactly as
// a first one would. The same node before the cut gets its snapshot.
func TestCutAfterTheEtcdManifestTakesNoPreUpgradeSnapshot(t *testing.T) {
	for _, c := range []struct {
		name, etcdImage string
		outcome         etcdsnap.Outcome
		files           int
	}{
		{"before the apply", "registry.k8s.io/etcd:3.6.8-0", etcdsnap.Taken, 1},
		{"cut after etcd.yaml", "registry.k8s.io/etcd:3.7.0-0", etcdsnap.Failed, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
			fs := etcdtest.EncryptedPersistent(t, e.node)
			etcdtest.BundleEtcdTools(t, e.node)
			member := etcdtest.Start(t, e.node, etcdtest.Config{})
			member.PutKeys("/registry/configmaps/default/", 10, 100)
			member.SetImage(c.etcdImage)

			snapRun := &runner.Recorder{Reply: runner.Exec{Root: e.node.Root}.Run}
			var got etcdsnap.Result
			res := e.run(Steps{EtcdSnapshot: func(ctx context.Context, target version.Version) SnapshotReport {
				got = etcdsnap.Take(ctx, etcdsnap.Options{Root: e.node.R(), Runner: snapRun, Log: e.logger(), FS: fs,
					Total: time.Minute, Request: 5 * time.Second}, target)
				return SnapshotReport{Outcome: string(got.Outcome), Warnings: got.Warnings}
			}})
			if res.ExitCode != ExitOK {
				t.Fatalf("exit %d: %v\n%s", res.ExitCode, res.Err, e.logBuf.String())
			}
			if got.Outcome != c.outcome {
				t.Fatalf("snapshot %s (%s), want %s", got.Outcome, got.Reason, c.outcome)
			}
			// The resumed apply is the apply, and nothing else.
			if lines := e.lines(); !reflect.DeepEqual(lines, applyLines) {
				t.Fatalf("commands %q, want %q", lines, applyLines)
			}
			ents, err := os.ReadDir(e.node.Path(paths.EtcdBackupDir))
			if err != nil || len(ents) != c.files {
				t.Fatalf("backup dir: %v %v, want %d file(s)", ents, err, c.files)
			}
			st := e.status(t)
			if st.EtcdSnapshot != string(c.outcome) || st.NodeVersion != "v1.37.2" {
				t.Fatalf("status %+v", st)
			}
			e.logHas(t, "msg=upgrade-apply", "outcome=ok", "target=v1.37.2")
			if c.outcome == etcdsnap.Failed {
				if n := len(snapRun.Lines()); n != 0 {
					t.Fatalf("ran %q on a member already on etcd 3.7", snapRun.Lines())
				}
				e.logHas(t, "msg=etcd-snapshot", "outcome=failed", "upgrade apply had already started", "etcd manifest already runs 3.7.0-0")
			}
			e.noSecrets(t)
		})
	}
}
