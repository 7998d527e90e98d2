package etcdsnap

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// EtcdOnKubeadm136 is the etcd kubeadm 1.36.x deploys: below the 3.6.11 etcd
// 3.7's upgrade guide asks for.
const EtcdOnKubeadm136 = "v3.6.8"

// binaryFixture runs the real etcd 3.6.8 binary as the node's member.
func binaryFixture(t *testing.T) *fixture {
	f := &fixture{t: t, node: testutil.NewNode(t, "cp1"), log: &testutil.SyncBuffer{}, now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
	bin := testbin.Etcd(t, EtcdOnKubeadm136)
	etcdtest.BundleEtcdTools(t, f.node)
	f.fs = etcdtest.EncryptedPersistent(t, f.node)
	f.etcd = etcdtest.StartBinary(t, f.node, bin, "registry.k8s.io/etcd:3.6.8-0")
	f.run = &recRunner{inner: runner.Exec{Root: f.node.Root}}
	return f
}

func TestVersionWarningBeforeEtcd37(t *testing.T) {
	testutil.RequireRoot(t)
	f := binaryFixture(t)
	res := f.take(version.MustParse("v1.37.2"))
	// A warning, not a refusal: the snapshot is still taken.
	if res.Outcome != Taken {
		t.Fatalf("%s %s\n%s", res.Outcome, res.Reason, f.log.String())
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "cp1=3.6.8") || !strings.Contains(res.Warnings[0], "3.6.11") {
		t.Fatalf("warnings %q", res.Warnings)
	}
	log := f.log.String()
	if strings.Count(log, "msg="+EventVersionWarning) != 1 || !strings.Contains(log, `members="cp1=3.6.8" minimum=3.6.11`) {
		t.Fatalf("log:\n%s", log)
	}
	f.oneLine(1, Taken)

	// Before an upgrade to 1.36 (etcd stays on 3.6) there is nothing to warn about.
	f.log = &testutil.SyncBuffer{}
	f.before(version.MustParse("v1.36.3"))
	res = f.take(version.MustParse("v1.36.3"))
	if len(res.Warnings) != 0 || strings.Contains(f.log.String(), EventVersionWarning) {
		t.Fatalf("1.36 target warned: %q\n%s", res.Warnings, f.log.String())
	}
}

func TestVersionWarningNotForCurrentMembers(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t) // embedded etcd 3.7.x
	res := f.take(version.MustParse("v1.37.2"))
	if res.Outcome != Taken || len(res.Warnings) != 0 || strings.Contains(f.log.String(), EventVersionWarning) {
		t.Fatalf("%+v\n%s", res, f.log.String())
	}
}

// A frozen etcd (SIGSTOP: connections are accepted, nothing answers) from
// the start: every request times out, the attempt fails within its bound.
func TestHungEtcdFailsWithinItsBound(t *testing.T) {
	f := binaryFixture(t)
	f.etcd.Pause()
	t.Cleanup(f.etcd.Resume)
	o := f.opts()
	o.Total, o.Request = 8*time.Second, 2*time.Second
	start := time.Now()
	res := Take(t.Context(), o, version.MustParse("v1.37.2"))
	took := time.Since(start)
	if res.Outcome != Failed || !strings.Contains(res.Reason, "etcd status") {
		t.Fatalf("%+v\n%s", res, f.log.String())
	}
	if took > o.Total+5*time.Second {
		t.Fatalf("took %s with a %s bound", took, o.Total)
	}
	// The member versions could not be read either: that is a warning too.
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "unreadable") {
		t.Fatalf("warnings %q", res.Warnings)
	}
	f.oneLine(1, Failed, "reason=")
	if len(f.run.cmds) != 0 {
		t.Fatalf("ran %v", f.run.cmds)
	}
}

// etcd freezes just as etcdctl starts: the runner kills etcdctl at its
// budget, nothing partial stays, the attempt fails within its bound.
func TestEtcdHangingDuringTheSnapshot(t *testing.T) {
	f := binaryFixture(t)
	f.etcd.PutKeys("/registry/x/", 100, 1000)
	f.run.before = func(runner.Cmd) { f.etcd.Pause() }
	t.Cleanup(f.etcd.Resume)
	o := f.opts()
	o.Total, o.Request = 10*time.Second, 2*time.Second
	o.Log = slog.New(slog.NewTextHandler(f.log, nil))
	f.before(version.MustParse("v1.36.3"))
	start := time.Now()
	res := Take(t.Context(), o, version.MustParse("v1.36.3"))
	took := time.Since(start)
	if res.Outcome != Failed || !strings.Contains(res.Reason, "etcdctl snapshot save") {
		t.Fatalf("%+v\n%s", res, f.log.String())
	}
	if took > o.Total+5*time.Second {
		t.Fatalf("took %s with a %s bound", took, o.Total)
	}
	if got := f.snapshots(); len(got) != 0 {
		t.Fatalf("left %q behind", got)
	}
	l := f.oneLine(1, Failed, "reason=")
	if strings.Contains(l, "--key") || strings.Contains(l, "--cacert") || strings.Contains(l, "snapshot save /") {
		t.Fatalf("the reason carries the command line: %s", l)
	}
}

// An etcdutl that never answers: the runner kills it at what is left of the
// attempt's bound, the .part goes, nothing counts and a later attempt can
// still take the snapshot.
func TestHungEtcdutlFailsWithinTheBound(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	f.etcd.PutKeys("/registry/x/", 100, 1000)
	if err := os.Remove(f.node.Path(paths.Etcdutl)); err != nil {
		t.Fatal(err)
	}
	f.node.Write(paths.Etcdutl, "#!/bin/sh\nexec sleep 600\n", 0o755)
	o := f.opts()
	o.Total = 8 * time.Second
	start := time.Now()
	res := Take(t.Context(), o, v1372)
	took := time.Since(start)
	if res.Outcome != Failed || !strings.Contains(res.Reason, "etcdutl snapshot status") || !strings.Contains(res.Reason, "killed at its time budget") {
		t.Fatalf("%+v\n%s", res, f.log.String())
	}
	if took > o.Total+5*time.Second {
		t.Fatalf("took %s with a %s bound", took, o.Total)
	}
	if got := f.snapshots(); len(got) != 0 {
		t.Fatalf("left %q behind", got)
	}
	f.oneLine(1, Failed, "reason=")

	// The bundled etcdutl back: the next attempt takes it.
	os.Remove(f.node.Path(paths.Etcdutl))
	if err := os.Symlink(testbin.Etcdutl(t, etcdtest.EtcdctlVersion), f.node.Path(paths.Etcdutl)); err != nil {
		t.Fatal(err)
	}
	if res := f.take(v1372); res.Outcome != Taken {
		t.Fatalf("after etcdutl came back: %+v", res)
	}
}
