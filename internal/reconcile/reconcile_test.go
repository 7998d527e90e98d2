package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// env is one sandbox node, its API endpoint and a kubeadm/systemctl that
// behave like the real ones as far as the files and the API go.
type env struct {
	t       *testing.T
	node    *testutil.Node
	api     *testutil.API
	rec     *runner.Recorder
	clock   *testutil.Clock
	logBuf  *testutil.SyncBuffer
	cp      bool
	bundled string
	// fail makes the command line with this prefix fail.
	fail string
	// etcd is one attempt of the etcd health check (nil: healthy, unless
	// realEtcd, when the pass checks the etcd its manifest names).
	etcd     func(ctx context.Context) error
	realEtcd bool
}

// newEnv: a member node at nodeV in a cluster at clusterV, booted into an
// image bundling bundled, with pin in its cluster file.
func newEnv(t *testing.T, role, pin, bundled, nodeV, clusterV string, extraConfig string) *env {
	e := &env{t: t, node: testutil.NewNode(t, "n1"), clock: testutil.NewClock(), logBuf: &testutil.SyncBuffer{}, bundled: bundled}
	e.api = testutil.NewAPI(t, clusterV)
	e.api.Clock = e.clock
	e.node.ClusterFile(role, pin, extraConfig)
	if bundled != "" {
		e.node.Bundle(bundled)
	}
	if nodeV != "" {
		e.node.Member(e.api)
		// The provider's record of the version this node was last verified at.
		e.node.Write(paths.VerifiedRecord, nodeV+"\n", 0o644)
		e.api.SetNode("n1", nodeV, true)
		if role != "worker" {
			e.cp = true
			e.node.ControlPlane(nodeV)
			e.node.Admin(e.api)
			// Mirror pods show what the manifests on disk say, running and ready.
			e.api.Pod = func(name string) (*corev1.Pod, bool) {
				for _, c := range testutil.ControlPlaneComponents {
					if name == c+"-n1" {
						b, err := os.ReadFile(e.node.Path(paths.ManifestsDir + "/" + c + ".yaml"))
						if err != nil {
							return nil, false
						}
						img, err := observe.ManifestImage(b, c)
						if err != nil {
							return nil, false
						}
						return testutil.StaticPod(name, c, img), true
					}
				}
				return nil, false
			}
		} else {
			// The provider's own record of this worker's version.
			if err := status.Write(e.node.R(), status.Document{Phase: status.PhaseConverged, Member: true, NodeVersion: nodeV}); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.rec = &runner.Recorder{Reply: e.reply}
	return e
}

// reply plays kubeadm and systemctl: an upgrade rewrites what the real one
// rewrites (the apiserver manifest, kubeadm-config), a kubelet restart makes
// the Node report the bundled kubelet.
func (e *env) reply(ctx context.Context, c runner.Cmd) (runner.Result, error) {
	line := c.String()
	if e.fail != "" && strings.HasPrefix(line, e.fail) {
		return runner.Result{ExitCode: 1, Stderr: []byte("[ERROR CreateJob]: boom --token abcdef.0123456789abcdef")},
			&runner.ExitError{Cmd: line, Code: 1, Tail: runner.Sanitize("[ERROR CreateJob]: boom --token abcdef.0123456789abcdef", 300)}
	}
	switch {
	case strings.HasPrefix(line, "/usr/bin/kubeadm upgrade apply "):
		v := c.Args[2]
		e.node.ControlPlane(v)
		e.api.SetClusterVersion(v)
	case line == "/usr/bin/kubeadm upgrade node" || strings.HasPrefix(line, "/usr/bin/kubeadm upgrade node "):
		if e.cp {
			e.node.ControlPlane(e.api.ClusterVersion())
		}
	case line == "/usr/bin/systemctl restart kubelet":
		e.api.SetNode("n1", e.bundled, true)
	case line == "/usr/bin/kubeadm version -o short":
		return runner.Result{Stdout: []byte(e.bundled + "\n")}, nil
	}
	return runner.Result{}, nil
}

func (e *env) logger() *slog.Logger { return slog.New(slog.NewTextHandler(e.logBuf, nil)) }

func (e *env) obsv() *observe.Observer { return &observe.Observer{Root: e.node.R()} }

func (e *env) run(steps Steps) Result {
	e.t.Helper()
	log := e.logger()
	etcd := e.etcd
	if etcd == nil && !e.realEtcd {
		etcd = func(context.Context) error { return nil }
	}
	return Run(context.Background(), Options{Root: e.node.R(), Runner: e.rec, Clock: e.clock, Log: log, Steps: steps, EtcdHealthy: etcd})
}

func (e *env) lines() []string { return e.rec.Lines() }

func (e *env) logHas(t *testing.T, subs ...string) {
	t.Helper()
	for _, l := range strings.Split(e.logBuf.String(), "\n") {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			return
		}
	}
	t.Fatalf("no log line with %q in:\n%s", subs, e.logBuf.String())
}

func (e *env) status(t *testing.T) status.Document {
	t.Helper()
	d, err := status.Read(e.node.R(), paths.StatusFile)
	if err != nil {
		t.Fatal(err)
	}
	m, err := status.Read(e.node.R(), paths.StatusMirror)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d, m) {
		t.Fatalf("mirror differs from run status:\n%+v\n%+v", d, m)
	}
	return d
}

func (e *env) noSecrets(t *testing.T) {
	t.Helper()
	for what, s := range map[string]string{"log": e.logBuf.String(), "status": e.node.Read(paths.StatusFile),
		"commands": strings.Join(e.lines(), "\n")} {
		for _, secret := range []string{testutil.Token, "0123456789abcdef"} {
			if strings.Contains(s, secret) {
				t.Fatalf("%s carries a secret:\n%s", what, s)
			}
		}
	}
}

var (
	applyLines = []string{"/usr/bin/kubeadm upgrade apply v1.37.2 --yes", "/usr/bin/systemctl daemon-reload", "/usr/bin/systemctl restart kubelet"}
	nodeLines  = []string{"/usr/bin/kubeadm upgrade node", "/usr/bin/systemctl daemon-reload", "/usr/bin/systemctl restart kubelet"}
	// finishLines finish an upgrade interrupted after kubeadm: the kubelet restart (then verify).
	finishLines = []string{"/usr/bin/systemctl daemon-reload", "/usr/bin/systemctl restart kubelet"}
)

func TestConvergedRunsNothing(t *testing.T) {
	for _, role := range []string{"init", "controlplane", "worker"} {
		t.Run(role, func(t *testing.T) {
			e := newEnv(t, role, "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
			res := e.run(Steps{})
			if res.ExitCode != ExitOK || res.Plan.Verdict != plan.VerdictNone {
				t.Fatalf("exit %d plan %+v err %v", res.ExitCode, res.Plan, res.Err)
			}
			if len(e.lines()) != 0 {
				t.Fatalf("a converged pass ran %q", e.lines())
			}
			st := e.status(t)
			if st.Phase != status.PhaseConverged || st.NodeVersion != "v1.37.2" || st.BootID == "" {
				t.Fatalf("status %+v", st)
			}
			e.logHas(t, "msg="+EventStart)
			e.logHas(t, "msg="+EventPlan, "verdict=none")
			e.logHas(t, "msg="+EventDone, "outcome=converged")
			e.noSecrets(t)
		})
	}
}

func TestNewerImageOldPinIsANoOpWithWarning(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.36.3", "v1.37.2", "v1.36.3", "v1.36.3", "")
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || len(e.lines()) != 0 {
		t.Fatalf("exit %d lines %q", res.ExitCode, e.lines())
	}
	st := e.status(t)
	if len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "skew") {
		t.Fatalf("warnings %q", st.Warnings)
	}
	e.logHas(t, "msg="+EventWarning, "skew")
}

func TestFirstControlPlaneApplies(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	var snapshotTarget version.Version
	res := e.run(Steps{EtcdSnapshot: func(ctx context.Context, target version.Version) SnapshotReport {
		snapshotTarget = target
		if len(e.lines()) != 0 {
			t.Errorf("snapshot after %q: it must come before apply", e.lines())
		}
		return SnapshotReport{Outcome: "skipped-encryption-unconfirmed"}
	}})
	if res.ExitCode != ExitOK {
		t.Fatalf("exit %d: %v\n%s", res.ExitCode, res.Err, e.logBuf.String())
	}
	if got := e.lines(); !reflect.DeepEqual(got, applyLines) {
		t.Fatalf("commands\n%q\nwant\n%q", got, applyLines)
	}
	if snapshotTarget != version.MustParse("v1.37.2") {
		t.Fatalf("snapshot target %v", snapshotTarget)
	}
	st := e.status(t)
	if st.Phase != status.PhaseConverged || st.NodeVersion != "v1.37.2" || st.EtcdSnapshot != "skipped-encryption-unconfirmed" || st.LastAction != "verify" {
		t.Fatalf("status %+v", st)
	}
	e.logHas(t, "msg="+EventPlan, "verdict=act", "actions=etcd-snapshot,upgrade-apply,restart-kubelet,verify", "pin=v1.37.2", "node=v1.36.3", "cluster=v1.36.3")
	e.logHas(t, "msg=upgrade-apply", "outcome=ok", "target=v1.37.2")
	e.logHas(t, "msg=verify", "outcome=ok")
	e.logHas(t, "msg="+EventDone, "outcome=converged")
	e.noSecrets(t)
}

func TestUpgradeConfigurationIsHandedToKubeadm(t *testing.T) {
	extra := "  upgradeConfiguration:\n    apply:\n      ignorePreflightErrors: [SystemVerification]\n    node:\n      ignorePreflightErrors: [SystemVerification]\n"
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", extra)
	var seen string
	inner := e.rec.Reply
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if strings.HasPrefix(c.String(), "/usr/bin/kubeadm upgrade") {
			full := c.Args[len(c.Args)-1] // the path kubeadm is handed
			st, err := os.Stat(full)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("config file %v mode %v", err, st)
			}
			b, _ := os.ReadFile(full)
			seen = string(b)
		}
		return inner(ctx, c)
	}
	if res := e.run(Steps{}); res.ExitCode != ExitOK {
		t.Fatalf("exit %d %v", res.ExitCode, res.Err)
	}
	want := "/usr/bin/kubeadm upgrade apply v1.37.2 --yes --config " + e.node.Path(UpgradeConfigPath)
	if got := e.lines(); got[0] != want {
		t.Fatalf("command %q, want %q", got[0], want)
	}
	for _, s := range []string{"apiVersion: kubeadm.k8s.io/v1beta4", "kind: UpgradeConfiguration", "SystemVerification"} {
		if !strings.Contains(seen, s) {
			t.Fatalf("config handed to kubeadm lacks %q:\n%s", s, seen)
		}
	}
	if e.node.Exists(UpgradeConfigPath) {
		t.Fatal("config file left behind")
	}
}

func TestFollowerControlPlaneUpgradesNode(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	res := e.run(Steps{EtcdSnapshot: func(context.Context, version.Version) SnapshotReport {
		t.Error("a follower must not snapshot")
		return SnapshotReport{}
	}})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v lines %q", res.ExitCode, res.Err, e.lines())
	}
	e.logHas(t, "msg=upgrade-node", "outcome=ok")
}

func TestWorkerUpgradesAndRecordsItsVersion(t *testing.T) {
	e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	// After the A/B swap the worker's kubelet already reports the new version:
	// the provider's record, not the Node, says the node still needs upgrade node.
	e.api.SetNode("n1", "v1.37.2", true)
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v lines %q\n%s", res.ExitCode, res.Err, e.lines(), e.logBuf.String())
	}
	if st := e.status(t); st.NodeVersion != "v1.37.2" || st.Phase != status.PhaseConverged {
		t.Fatalf("status %+v", st)
	}
	// The next boot is converged and runs nothing.
	e2 := &env{t: t, node: e.node, api: e.api, rec: &runner.Recorder{}, clock: e.clock, logBuf: &testutil.SyncBuffer{}}
	if res := e2.run(Steps{}); res.ExitCode != ExitOK || len(e2.lines()) != 0 {
		t.Fatalf("second boot exit %d lines %q", res.ExitCode, e2.lines())
	}
}

func TestWorkerWaitsForTheControlPlanes(t *testing.T) {
	e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	e.api.OnRequest = func(n int) {
		if n == 8 {
			e.api.SetClusterVersion("v1.37.2")
		}
	}
	start := e.clock.Now()
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v lines %q\n%s", res.ExitCode, res.Err, e.lines(), e.logBuf.String())
	}
	if waited := e.clock.Now().Sub(start); waited > DefaultBudgets().WaitForCluster {
		t.Fatalf("waited %s", waited)
	}
	e.logHas(t, "msg=wait-for-cluster-upgrade", "outcome=ok")
}

func TestWorkerGivesUpWithinItsBudget(t *testing.T) {
	e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	start := e.clock.Now()
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed {
		t.Fatalf("exit %d", res.ExitCode)
	}
	if len(e.lines()) != 0 {
		t.Fatalf("ran %q while the control planes were not upgraded", e.lines())
	}
	waited := e.clock.Now().Sub(start)
	if b := DefaultBudgets().WaitForCluster; waited < b || waited > b+10*time.Second {
		t.Fatalf("waited %s, budget %s", waited, b)
	}
	st := e.status(t)
	if st.Phase != status.PhaseFailed || st.Reason != ReasonControlPlaneNotUpgraded || !strings.Contains(st.Message, "cluster at v1.36.3, waiting for v1.37.2") {
		t.Fatalf("status %+v", st)
	}
	e.logHas(t, "msg=wait-for-cluster-upgrade", "outcome=failed", "reason=ControlPlaneNotUpgraded")
}

func TestRefusalsRunNothingAndTouchNothing(t *testing.T) {
	cases := []struct {
		name, role, pin, bundled, node, cluster string
		code                                    plan.Code
	}{
		{"skip-level", "controlplane", "v1.37.2", "v1.37.2", "v1.35.4", "v1.35.4", plan.SkipLevel},
		{"downgrade", "controlplane", "v1.36.3", "v1.37.2", "v1.37.2", "v1.37.2", plan.Downgrade},
		{"pin newer than image", "controlplane", "v1.37.2", "v1.36.3", "v1.36.3", "v1.36.3", plan.PinNewerThanImage},
		{"pin newer than image, worker", "worker", "v1.37.2", "v1.36.3", "v1.36.3", "v1.36.3", plan.PinNewerThanImage},
		{"malformed pin", "controlplane", "v1.37", "v1.37.2", "v1.36.3", "v1.36.3", plan.InvalidPin},
		{"pin behind cluster", "controlplane", "v1.37.1", "v1.37.1", "v1.36.3", "v1.37.2", plan.PinBehindCluster},
		{"no bundle, kubeadm answers", "controlplane", "v1.37.2", "", "v1.35.4", "v1.35.4", plan.SkipLevel},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.role, c.pin, c.bundled, c.node, c.cluster, "")
			if c.bundled == "" {
				e.bundled = "v1.37.2" // what the fallback kubeadm version answers
			}
			var before string
			if e.cp {
				before = e.node.Read(paths.APIServerManifest)
			}
			res := e.run(Steps{
				EtcdSnapshot: func(context.Context, version.Version) SnapshotReport {
					t.Error("snapshot on a refusal")
					return SnapshotReport{}
				},
				RepairKubelet: func(context.Context, Observation) ([]string, error) { t.Error("repair on a refusal"); return nil, nil },
			})
			if res.ExitCode != ExitRefused || res.Plan.Refusal != c.code {
				t.Fatalf("exit %d refusal %q: %s", res.ExitCode, res.Plan.Refusal, res.Plan.Message)
			}
			for _, l := range e.lines() {
				if l != "/usr/bin/kubeadm version -o short" {
					t.Fatalf("a refusal ran %q", l)
				}
			}
			if c.bundled == "" && !reflect.DeepEqual(e.lines(), []string{"/usr/bin/kubeadm version -o short"}) {
				t.Fatalf("bundled fallback: %q", e.lines())
			}
			if e.cp && e.node.Read(paths.APIServerManifest) != before {
				t.Fatal("manifest changed")
			}
			st := e.status(t)
			if st.Phase != status.PhaseRefused || st.Reason != plan.ReasonUpgradeRefused || st.Refusal != string(c.code) {
				t.Fatalf("status %+v", st)
			}
			wantPin := "pin=" + c.pin
			if c.code == plan.InvalidPin {
				wantPin = `pin="<a value of 5 characters, not shown>"` // a malformed pin is described
			}
			e.logHas(t, "msg="+EventRefuseUpgrade, "code="+string(c.code), wantPin, "node="+c.node)
			e.noSecrets(t)
		})
	}
}

func TestBootstrapRefusal(t *testing.T) {
	e := newEnv(t, "init", "v1.37.3", "v1.37.2", "", "", "")
	res := e.run(Steps{Bootstrap: func(context.Context, plan.Action, Observation) error { t.Error("bootstrap ran"); return nil }})
	if res.ExitCode != ExitRefused || res.Plan.Refusal != plan.PinNewerThanImage {
		t.Fatalf("%d %+v", res.ExitCode, res.Plan)
	}
	st := e.status(t)
	if st.Reason != plan.ReasonBootstrapRefused || st.Member {
		t.Fatalf("status %+v", st)
	}
	e.logHas(t, "msg="+EventRefuseBoot, "code=PinNewerThanImage")
}

func TestMissingClusterFileIsAnInvalidPin(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	if err := os.Remove(e.node.Path(paths.ClusterFile)); err != nil {
		t.Fatal(err)
	}
	res := e.run(Steps{})
	if res.ExitCode != ExitRefused || res.Plan.Refusal != plan.InvalidPin || !strings.Contains(res.Plan.Message, "does not exist") {
		t.Fatalf("%d %+v", res.ExitCode, res.Plan)
	}
	if len(e.lines()) != 0 {
		t.Fatalf("ran %q", e.lines())
	}
}

func TestKubeadmFailureStopsThePass(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	e.fail = "/usr/bin/kubeadm upgrade apply"
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed {
		t.Fatalf("exit %d", res.ExitCode)
	}
	if got := e.lines(); !reflect.DeepEqual(got, applyLines[:1]) {
		t.Fatalf("ran %q after a failed apply", got)
	}
	st := e.status(t)
	if st.Phase != status.PhaseFailed || st.Reason != ReasonKubeadmFailed || st.LastAction != "upgrade-apply" || !strings.Contains(st.Message, "CreateJob") {
		t.Fatalf("status %+v", st)
	}
	e.logHas(t, "msg=upgrade-apply", "outcome=failed", "reason=KubeadmFailed", "CreateJob")
	e.noSecrets(t)
	// kubeadm's own output is kept for the operator, sanitized, 0600.
	st2, err := os.Stat(e.node.Path(paths.KubeadmLog))
	if err != nil || st2.Mode().Perm() != 0o600 {
		t.Fatalf("kubeadm log %v %v", st2, err)
	}
	kl := e.node.Read(paths.KubeadmLog)
	if !strings.Contains(kl, "/usr/bin/kubeadm upgrade apply") || !strings.Contains(kl, "[ERROR CreateJob]") || strings.Contains(kl, "0123456789abcdef") {
		t.Fatalf("kubeadm log:\n%s", kl)
	}
}

func TestUnknownClusterRepairsThenDecidesAgain(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	e.api.SetDown(true)
	repaired := 0
	res := e.run(Steps{RepairKubelet: func(ctx context.Context, obs Observation) ([]string, error) {
		repaired++
		if !obs.Facts.Cluster.IsZero() {
			t.Errorf("repair with a known cluster version %v", obs.Facts.Cluster)
		}
		e.api.SetDown(false) // the kubelet is back, so is the local apiserver
		return nil, nil
	}})
	if res.ExitCode != ExitOK || repaired != 1 || !reflect.DeepEqual(e.lines(), applyLines) {
		t.Fatalf("exit %d repaired %d lines %q: %v\n%s", res.ExitCode, repaired, e.lines(), res.Err, e.logBuf.String())
	}
	e.logHas(t, "msg=repair-kubelet", "outcome=ok")
}

func TestClusterStillUnknownAfterRepairFails(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	e.api.SetDown(true)
	start := e.clock.Now()
	res := e.run(Steps{RepairKubelet: func(context.Context, Observation) ([]string, error) { return nil, nil }})
	if res.ExitCode != ExitFailed || len(e.lines()) != 0 {
		t.Fatalf("exit %d lines %q", res.ExitCode, e.lines())
	}
	st := e.status(t)
	if st.Reason != ReasonClusterVersionUnknown || !strings.Contains(st.Message, "apiserver is shutting down") {
		t.Fatalf("status %+v: the last real error must be named", st)
	}
	if spent := e.clock.Now().Sub(start); spent > 2*DefaultBudgets().ClusterVersion+10*time.Second {
		t.Fatalf("spent %s", spent)
	}
}

func TestVerifyTimesOut(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	inner := e.rec.Reply
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if c.String() == "/usr/bin/systemctl restart kubelet" {
			return runner.Result{}, nil // the kubelet never comes back at the new version
		}
		return inner(ctx, c)
	}
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed {
		t.Fatalf("exit %d", res.ExitCode)
	}
	st := e.status(t)
	if st.Reason != ReasonHealthGateTimeout || !strings.Contains(st.Message, "node n1 kubelet at v1.36.3") {
		t.Fatalf("status %+v", st)
	}
}

func TestBudgetsFromProviderConfig(t *testing.T) {
	e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	e.node.Write(paths.ClusterFile, e.node.Read(paths.ClusterFile)+"providerConfig:\n  budget.waitForCluster: 30s\n", 0o600)
	start := e.clock.Now()
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed || res.Status.Reason != ReasonControlPlaneNotUpgraded {
		t.Fatalf("exit %d %+v", res.ExitCode, res.Status)
	}
	if waited := e.clock.Now().Sub(start); waited > 45*time.Second {
		t.Fatalf("waited %s with a 30s budget", waited)
	}

	e.node.Write(paths.ClusterFile, e.node.Read(paths.ClusterFile)+"  budget.bogus: 1s\n", 0o600)
	res = e.run(Steps{})
	if res.ExitCode != ExitFailed || res.Status.Reason != ReasonConfigFailed || len(e.lines()) != 0 {
		t.Fatalf("bad budget: exit %d %+v %q", res.ExitCode, res.Status, e.lines())
	}
}

// A nested providerConfig (the budgets: map of earlier releases) in a
// cluster file fails the pass as a bad budget does, ConfigInvalid before
// any command, with the keys to write instead; not an InvalidPin refusal
// (reference.md "providerConfig").
func TestNestedProviderConfigIsConfigInvalid(t *testing.T) {
	e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	e.node.Write(paths.ClusterFile, e.node.Read(paths.ClusterFile)+"providerConfig:\n  budgets:\n    verify: 6m\n", 0o600)
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed || res.Status.Reason != ReasonConfigFailed || len(e.lines()) != 0 ||
		!strings.Contains(res.Status.Message, "budget.<name>: <duration>") {
		t.Fatalf("exit %d %+v %q", res.ExitCode, res.Status, e.lines())
	}
}

func TestSecondPassExitsAtOnce(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
	unlock, err := Lock(e.node.R())
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed || !errors.Is(res.Err, ErrLocked) {
		t.Fatalf("exit %d err %v", res.ExitCode, res.Err)
	}
	if e.node.Exists(paths.StatusFile) {
		t.Fatal("a locked-out pass wrote status")
	}
	// troubleshooting.md, outcome=locked: "`msg=reconcile-done
	// outcome=locked`, exit 1, no status written", and nothing run.
	if res.ExitCode != 1 || !strings.Contains(e.logBuf.String(), "msg=reconcile-done outcome=locked ") || len(e.lines()) != 0 {
		t.Fatalf("exit %d, ran %q, log:\n%s", res.ExitCode, e.lines(), e.logBuf.String())
	}
}

func TestNodeVersionFromManifest(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	o := &observe.Observer{Root: e.node.R()}
	v, err := o.ControlPlaneVersion()
	if err != nil || v != version.MustParse("v1.36.3") {
		t.Fatalf("%v %v", v, err)
	}
	e.node.Write(paths.APIServerManifest, strings.Replace(testutil.APIServerManifest("v1.36.3"), "registry.k8s.io/kube-apiserver:v1.36.3", "localhost:5000/kube-apiserver:v1.36.3@sha256:abc", 1), 0o600)
	if v, err := o.ControlPlaneVersion(); err != nil || v != version.MustParse("v1.36.3") {
		t.Fatalf("registry with a port and a digest: %v %v", v, err)
	}
}

// A hung kubeadm is killed at its budget: a real process under the real
// runner, from the sandbox root, with the budget from providerConfig.
func TestHungKubeadmIsKilledAtItsBudget(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	e.node.Write(paths.ClusterFile, e.node.Read(paths.ClusterFile)+"providerConfig:\n  budget.kubeadmUpgrade: 1s\n", 0o600)
	e.node.Write(paths.Kubeadm, "#!/bin/sh\necho '[upgrade] waiting for etcd' >&2\nsleep 120\n", 0o755)
	start := time.Now()
	res := Run(context.Background(), Options{Root: e.node.R(), Runner: runner.Exec{Root: e.node.Root}, Log: e.logger(),
		EtcdHealthy: func(context.Context) error { return nil }})
	if res.ExitCode != ExitFailed || res.Status.Reason != ReasonKubeadmFailed || !strings.Contains(res.Status.Message, "killed at its time budget") {
		t.Fatalf("exit %d %+v", res.ExitCode, res.Status)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("took %s with a 1s budget", took)
	}
	e.logHas(t, "msg=upgrade-apply", "outcome=failed", "waiting for etcd")
}

// A worker whose API reads work (kubelet.conf is a client certificate) but
// whose kubelet crash-loops after the swap is repaired before upgrade node.
func TestWorkerRepairRunsBeforeUpgradeNode(t *testing.T) {
	e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	var order []string
	inner := e.rec.Reply
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		order = append(order, c.String())
		return inner(ctx, c)
	}
	calls := 0
	res := e.run(Steps{RepairKubelet: func(ctx context.Context, obs Observation) ([]string, error) {
		calls++
		order = append(order, "repair")
		return []string{"kubelet flag --containerd (removed in 1.37) in /etc/default/kubelet"}, nil
	}})
	if res.ExitCode != ExitOK || calls != 1 {
		t.Fatalf("exit %d calls %d %v", res.ExitCode, calls, res.Err)
	}
	if order[0] != "repair" || order[1] != "/usr/bin/kubeadm upgrade node" {
		t.Fatalf("order %q", order)
	}
	if st := e.status(t); len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "--containerd") {
		t.Fatalf("status warnings %q", st.Warnings)
	}
}

// A preflight failure (nothing changed yet) is retried, bounded; the
// attempts and the kubeadm output are kept.
func TestKubeadmPreflightFailureIsRetried(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	inner := e.rec.Reply
	fails := 2
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if strings.HasPrefix(c.String(), "/usr/bin/kubeadm upgrade apply") && fails > 0 {
			fails--
			out := "[ERROR CreateJob]: Job \"upgrade-health-check\" did not complete in 1m0s\nerror: error execution phase preflight: preflight checks failed\n"
			return runner.Result{Stderr: []byte(out), ExitCode: 1}, &runner.ExitError{Cmd: c.Short(), Code: 1, Tail: runner.LastLine(runner.Result{Stderr: []byte(out)})}
		}
		return inner(ctx, c)
	}
	res := e.run(Steps{})
	if res.ExitCode != ExitOK {
		t.Fatalf("exit %d %v", res.ExitCode, res.Err)
	}
	want := append([]string{"/usr/bin/kubeadm upgrade apply v1.37.2 --yes", "/usr/bin/kubeadm upgrade apply v1.37.2 --yes"}, applyLines...)
	if got := e.lines(); !reflect.DeepEqual(got, want) {
		t.Fatalf("ran %q", got)
	}
	e.logHas(t, "msg=kubeadm-preflight-retry", "attempt=2")
	if k := strings.Count(e.node.Read(paths.KubeadmLog), "=== "); k != 3 {
		t.Fatalf("kubeadm log has %d runs", k)
	}

	// Always failing in preflight: PreflightAttempts, then the pass fails.
	e2 := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	e2.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		out := "error: error execution phase preflight: preflight checks failed\n"
		return runner.Result{Stderr: []byte(out), ExitCode: 1}, &runner.ExitError{Cmd: c.Short(), Code: 1}
	}
	if res := e2.run(Steps{}); res.ExitCode != ExitFailed || len(e2.lines()) != PreflightAttempts {
		t.Fatalf("exit %d ran %q", res.ExitCode, e2.lines())
	}
}

// A kubeadm upgrade is not started when the pass's deadline would cut it:
// the waits before it (repair, turn, health) may have spent the pass. With
// less left than budget.kubeadmUpgrade + budget.kubeletRestart (20m + 2m by
// default) nothing runs and the pass fails naming the reason; with enough
// left the same node upgrades.
func TestNoKubeadmUpgradeThePassCannotFinish(t *testing.T) {
	for _, tc := range []struct {
		name string
		left time.Duration
		want []string
	}{
		{"21m left", 21 * time.Minute, nil},
		{"23m left", 23 * time.Minute, nodeLines},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
			ctx, cancel := context.WithTimeout(context.Background(), tc.left)
			defer cancel()
			res := Run(ctx, Options{Root: e.node.R(), Runner: e.rec, Clock: e.clock, Log: e.logger(), Steps: Steps{},
				EtcdHealthy: func(context.Context) error { return nil }})
			if got := e.lines(); len(got) != len(tc.want) || (len(got) > 0 && !reflect.DeepEqual(got, tc.want)) {
				t.Fatalf("ran %q, want %q", got, tc.want)
			}
			st := e.status(t)
			if tc.want == nil {
				if res.ExitCode != ExitFailed || st.Phase != status.PhaseFailed || st.Reason != ReasonNoTimeLeft ||
					!strings.Contains(st.Message, "kubeadm was not started") {
					t.Fatalf("exit %d, status %+v", res.ExitCode, st)
				}
				return
			}
			if res.ExitCode != ExitOK || st.Phase != status.PhaseConverged {
				t.Fatalf("exit %d, status %+v, err %v", res.ExitCode, st, res.Err)
			}
		})
	}
}
