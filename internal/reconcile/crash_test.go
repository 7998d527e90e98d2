package reconcile

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// crashPoint kills the pass at one step boundary.
type crashPoint struct {
	name string
	// at is the command line (prefix) where the kill lands, or "snapshot".
	at string
	// effects run before the kill: what the interrupted command had already done.
	effects func(e *env)
}

// snapshots emulates the once-per-cluster-and-minor rule on the node's disk.
type snapshots struct {
	e     *env
	taken int
	lines []string
}

func (s *snapshots) step(ctx context.Context, target version.Version) SnapshotReport {
	marker := "/usr/local/provider-kubernetes/etcd-backup/cluster-1-" + target.MinorOf().String() + ".db"
	if s.e.node.Exists(marker) {
		s.lines = append(s.lines, "skipped-already-taken")
		return SnapshotReport{Outcome: "skipped-already-taken"}
	}
	s.e.node.Write(marker, "snapshot", 0o600)
	s.taken++
	s.lines = append(s.lines, "taken")
	return SnapshotReport{Outcome: "taken"}
}

// crashRun runs a pass that is killed at cp; it returns the command lines
// that ran before the kill.
func crashRun(t *testing.T, e *env, cp crashPoint, snaps *snapshots) []string {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	crashed := false
	var ran []string
	simulate := e.rec.Reply
	e.rec.Reply = func(c context.Context, cmd runner.Cmd) (runner.Result, error) {
		if crashed {
			return runner.Result{}, context.Canceled // the process is gone
		}
		if cp.at != "snapshot" && strings.HasPrefix(cmd.String(), cp.at) {
			if cp.effects != nil {
				cp.effects(e)
			}
			crashed = true
			cancel()
			return runner.Result{}, context.Canceled
		}
		ran = append(ran, cmd.String())
		return simulate(c, cmd)
	}
	steps := Steps{EtcdSnapshot: func(c context.Context, target version.Version) SnapshotReport {
		if cp.at == "snapshot" {
			crashed = true
			cancel()
			return SnapshotReport{Outcome: "failed"}
		}
		return snaps.step(c, target)
	}}
	log := e.logger()
	etcd := func(context.Context) error { return nil }
	_ = Run(ctx, Options{Root: e.node.R(), Runner: e.rec, Clock: e.clock, Log: log, Steps: steps, EtcdHealthy: etcd})
	if !crashed {
		t.Fatalf("crash point %q never reached; ran %q", cp.name, ran)
	}
	e.rec.Reply = simulate
	return ran
}

// reboot: the node comes back on the booted image; the kubelet on disk is
// the image's, and it registers its version.
func reboot(e *env) *env {
	e.api.SetNode("n1", e.bundled, true)
	e2 := &env{t: e.t, node: e.node, api: e.api, clock: e.clock, logBuf: &testutil.SyncBuffer{}, cp: e.cp, bundled: e.bundled}
	e2.rec = &runner.Recorder{Reply: e2.reply}
	return e2
}

// TestSimulatedCrashMatrix is the fast, in-memory crash matrix: a "kill" here
// cancels the context of the recording runner at a command (nothing is
// killed, and the pass still writes its Failed status and lines, which a
// power cut would not); "reboot" builds a new pass over the same sandbox
// files. The real kills (SIGKILL of a whole node, /run lost) are the
// end-to-end suite's (tests/e2e/kill_test.go, TestHAUpgrade).
func TestSimulatedCrashMatrix(t *testing.T) {
	manifests := func(apiserver, others string) func(e *env) {
		return func(e *env) {
			e.node.Write(paths.APIServerManifest, testutil.StaticPodManifest("kube-apiserver", apiserver), 0o600)
			for _, c := range []string{"kube-controller-manager", "kube-scheduler"} {
				e.node.Write(paths.ManifestsDir+"/"+c+".yaml", testutil.StaticPodManifest(c, others), 0o600)
			}
		}
	}
	type flow struct {
		name                string
		role, node, cluster string
		points              []crashPoint
		defaultSecond       []string
		// crash points after kubeadm finished: the next boot only finishes
		// the upgrade (the kubelet restart and verify), the verified-version
		// record being older than the pin.
		finishOnly []string
	}
	flows := []flow{
		{
			name: "first control plane (upgrade apply)", role: "controlplane", node: "v1.36.3", cluster: "v1.36.3",
			points: []crashPoint{
				{name: "in the snapshot", at: "snapshot"},
				{name: "after the snapshot, before apply", at: "/usr/bin/kubeadm upgrade apply"},
				{name: "during apply: etcd upgraded, no manifest yet", at: "/usr/bin/kubeadm upgrade apply"},
				{name: "during apply: apiserver manifest written", at: "/usr/bin/kubeadm upgrade apply", effects: manifests("v1.37.2", "v1.36.3")},
				{name: "during apply: all manifests, kubeadm-config not yet", at: "/usr/bin/kubeadm upgrade apply", effects: manifests("v1.37.2", "v1.37.2")},
				{name: "after apply, before daemon-reload", at: "/usr/bin/systemctl daemon-reload"},
				{name: "after daemon-reload, before kubelet restart", at: "/usr/bin/systemctl restart kubelet"},
				{name: "during the kubelet restart, before verify", at: "/usr/bin/systemctl restart kubelet", effects: func(e *env) { e.api.SetNode("n1", "v1.37.2", true) }},
			},
			defaultSecond: applyLines,
			finishOnly:    []string{"after apply, before daemon-reload", "after daemon-reload, before kubelet restart", "during the kubelet restart, before verify"},
		},
		{
			name: "follower control plane (upgrade node)", role: "controlplane", node: "v1.36.3", cluster: "v1.37.2",
			points: []crashPoint{
				{name: "before upgrade node", at: "/usr/bin/kubeadm upgrade node"},
				{name: "during upgrade node: apiserver manifest written", at: "/usr/bin/kubeadm upgrade node", effects: manifests("v1.37.2", "v1.36.3")},
				{name: "after upgrade node, before kubelet restart", at: "/usr/bin/systemctl daemon-reload"},
			},
			defaultSecond: nodeLines,
			finishOnly:    []string{"after upgrade node, before kubelet restart"},
		},
		{
			name: "worker (upgrade node)", role: "worker", node: "v1.36.3", cluster: "v1.37.2",
			points: []crashPoint{
				{name: "during upgrade node", at: "/usr/bin/kubeadm upgrade node"},
				{name: "after upgrade node, before kubelet restart", at: "/usr/bin/systemctl daemon-reload"},
				{name: "during the kubelet restart, before verify", at: "/usr/bin/systemctl restart kubelet"},
			},
			// The worker's version is the provider's record, written only once
			// verified: every interrupted pass is redone, and upgrade node is idempotent.
			defaultSecond: nodeLines,
		},
	}
	var table []string
	for _, f := range flows {
		for _, cp := range f.points {
			name := f.name + " / " + cp.name
			t.Run(name, func(t *testing.T) {
				e := newEnv(t, f.role, "v1.37.2", "v1.37.2", f.node, f.cluster, "")
				snaps := &snapshots{e: e}
				first := crashRun(t, e, cp, snaps)
				if st, err := status.Read(e.node.R(), paths.StatusFile); err == nil && st.Phase == status.PhaseConverged {
					t.Fatalf("a killed pass reported Converged")
				}
				e2 := reboot(e)
				snaps.e = e2
				res := e2.run(Steps{EtcdSnapshot: snaps.step})
				if res.ExitCode != ExitOK {
					t.Fatalf("second boot: exit %d %v\n%s", res.ExitCode, res.Err, e2.logBuf.String())
				}
				want := f.defaultSecond
				if contains(f.finishOnly, cp.name) {
					want = finishLines
				}
				if got := e2.lines(); !reflect.DeepEqual(got, want) {
					t.Fatalf("second boot ran %q, want %q", got, want)
				}
				if !res.Plan.Has(plan.ActionVerify) || !strings.Contains(e2.logBuf.String(), "msg=verify outcome=ok") {
					t.Fatalf("the next boot did not verify: %v\n%s", res.Plan.Actions, e2.logBuf.String())
				}
				if got := strings.TrimSpace(e2.node.Read(paths.VerifiedRecord)); got != "v1.37.2" {
					t.Fatalf("verified-version record %q after the verified boot", got)
				}
				if e.cp {
					o := e2.obsv()
					if v, err := o.ControlPlaneVersion(); err != nil || v != version.MustParse("v1.37.2") {
						t.Fatalf("control plane at %v %v", v, err)
					}
				}
				if e.api.ClusterVersion() != "v1.37.2" {
					t.Fatalf("cluster at %s", e.api.ClusterVersion())
				}
				st := e2.status(t)
				if st.Phase != status.PhaseConverged || (st.NodeVersion != "v1.37.2") {
					t.Fatalf("status %+v", st)
				}
				if snaps.taken > 1 {
					t.Fatalf("snapshot taken %d times", snaps.taken)
				}
				table = append(table, fmt.Sprintf("%-38s | %-52s | ran before the kill %q, killed at %q | next boot ran %q | snapshot outcomes %q",
					f.name, cp.name, first, cp.at, e2.lines(), snaps.lines))
			})
		}
	}

	// After a kill mid-apply the operator rolls the image back: the next boot
	// refuses and runs nothing at all.
	t.Run("killed mid-apply, then an older image: refusal, nothing runs", func(t *testing.T) {
		e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
		snaps := &snapshots{e: e}
		crashRun(t, e, crashPoint{name: "during apply", at: "/usr/bin/kubeadm upgrade apply", effects: manifests("v1.37.2", "v1.36.3")}, snaps)
		e.node.Bundle("v1.36.3")
		e2 := reboot(e)
		e2.bundled = "v1.36.3"
		before := e.node.Read(paths.APIServerManifest)
		res := e2.run(Steps{EtcdSnapshot: func(context.Context, version.Version) SnapshotReport {
			t.Error("snapshot after a refusal")
			return SnapshotReport{}
		}})
		if res.ExitCode != ExitRefused || res.Plan.Refusal != plan.PinNewerThanImage || len(e2.lines()) != 0 {
			t.Fatalf("exit %d %s ran %q", res.ExitCode, res.Plan.Refusal, e2.lines())
		}
		if e.node.Read(paths.APIServerManifest) != before {
			t.Fatal("manifest changed after a refusal")
		}
		table = append(table, "first control plane / killed mid-apply, image rolled back | next boot: refuse-upgrade PinNewerThanImage, no command")
	})
	t.Log("simulated crash matrix, in memory (flow | kill point | what ran | next boot | snapshots):\n" + strings.Join(table, "\n"))
}
