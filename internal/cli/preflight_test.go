package cli

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/preflight"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// fleet is the Kairos operator's preflight Pod in a sandbox: the image
// being upgraded to (its root, this binary's) and the node mounted at
// /host (its own root), with the API the node's kubeconfigs point at.
type fleet struct {
	t     *testing.T
	image *testutil.Node
	host  *testutil.Node
	api   *testutil.API
}

// newFleet: node cp2, a control plane at nodeV (or a worker), whose
// current boot pinned nodeV (its cluster file) and whose cloud-config in
// /oem now pins pin; the cluster at cluster; the image bundles v1.37.2.
func newFleet(t *testing.T, role, nodeV, pin, cluster string) *fleet {
	f := &fleet{t: t, image: testutil.NewNode(t, "image"), host: testutil.NewNode(t, "cp2"), api: testutil.NewAPI(t, cluster)}
	f.image.Bundle("v1.37.2")
	// The node runs the previous image: its own bundle, its cluster file.
	f.host.Bundle(nodeV)
	f.host.ClusterFile(role, nodeV, "")
	f.host.Write("/oem/90_custom.yaml", testutil.CloudConfig(role, pin), 0o600)
	f.host.Member(f.api)
	f.host.Write(paths.VerifiedRecord, nodeV+"\n", 0o644)
	if role == "worker" {
		f.host.Write(paths.StatusMirror, "phase: Converged\nmember: true\nrole: worker\nnodeVersion: "+nodeV+"\ntime: \"2026-11-29T12:00:00Z\"\n", 0o644)
		f.api.SetNode("cp2", nodeV, true)
		return f
	}
	f.host.ControlPlane(nodeV)
	f.host.Admin(f.api)
	for _, n := range []string{"cp1", "cp2", "cp3"} {
		f.api.SetNode(n, "v1.37.2", true)
		f.api.SetControlPlaneNode(n, "127.0.0.1")
	}
	return f
}

// run runs `provider-kubernetes preflight` as the operator's Pod would,
// with --host-root and --image-root for the sandbox, and checks it wrote
// nothing anywhere.
func (f *fleet) run(args ...string) (int, string, string) {
	f.t.Helper()
	before := testutil.Digest(f.t, f.host.Root, "/var/lib/etcd") + testutil.Digest(f.t, f.image.Root)
	code, out, errOut := run(append([]string{"preflight", "--host-root", f.host.Root, "--image-root", f.image.Root}, args...)...)
	if after := testutil.Digest(f.t, f.host.Root, "/var/lib/etcd") + testutil.Digest(f.t, f.image.Root); after != before {
		f.t.Fatalf("preflight changed the node or the image:\nbefore %s\nafter  %s", before, after)
	}
	return code, out, errOut
}

func (f *fleet) publishes(name, phase string, ago time.Duration) {
	f.api.SetNodeAnnotations(name, map[string]string{status.AnnotationPrefix + status.KeyPhase: phase,
		status.AnnotationPrefix + status.KeyTime: time.Now().Add(-ago).UTC().Format(time.RFC3339)})
}

// fails: name's last pass failed with reason, as its publish shows it.
func (f *fleet) fails(name, reason string) {
	f.api.SetNodeAnnotations(name, map[string]string{status.AnnotationPrefix + status.KeyPhase: status.PhaseFailed,
		status.AnnotationPrefix + status.KeyReason: reason,
		status.AnnotationPrefix + status.KeyTime:   time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)})
}

func wantLine(t *testing.T, errOut string, want ...string) {
	t.Helper()
	if n := strings.Count(errOut, "msg=preflight "); n != 1 {
		t.Fatalf("%d preflight lines on stderr, want one:\n%s", n, errOut)
	}
	for _, w := range want {
		if !strings.Contains(errOut, w) {
			t.Fatalf("no %q in the structured line:\n%s", w, errOut)
		}
	}
}

// A follower whose turn it is: the image's bundle (not the node's), the
// pin of the node's cloud-config (not this boot's cluster file), the node
// and cluster versions give the pass's own plan; no other control plane
// is upgrading, every one is Ready, etcd (real, embedded) is healthy.
// After the swap, the pass on the node decides the same.
func TestPreflightProceedsWhenTheNextBootWouldUpgradeNow(t *testing.T) {
	f := newFleet(t, "controlplane", "v1.36.3", "v1.37.2", "v1.37.2")
	etcdtest.Start(t, f.host, etcdtest.Config{})
	f.publishes("cp1", status.PhaseConverged, time.Minute)
	code, out, errOut := f.run()
	if code != reconcile.ExitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	wantLine(t, errOut, "level=INFO msg=preflight outcome=proceed code=\"\" role=controlplane pin=v1.37.2 bundled=v1.37.2 node=v1.36.3 cluster=v1.37.2 actions=upgrade-node,restart-kubelet,verify host_root="+f.host.Root)
	for _, w := range []string{"Preflight: proceed: the upgrade may swap the image\n", "Facts:    member=true role=controlplane pin=v1.37.2 bundled=v1.37.2 node=v1.36.3 cluster=v1.37.2 verified=v1.36.3\n",
		"Actions:  1. upgrade-node  2. restart-kubelet  3. verify\n", "Observed: the next boot's cluster: section from /oem/90_custom.yaml\n"} {
		if !strings.Contains(out, w) {
			t.Fatalf("no %q in:\n%s", w, out)
		}
	}
	// The swap: the new image's bundle, the boot stage's cluster file from
	// the section. The pass's preview decides the same.
	f.host.Bundle("v1.37.2")
	f.host.ClusterFile("controlplane", "v1.37.2", "")
	pcode, pout, _ := run("plan", "--root", f.host.Root, "-o", "json")
	var after plan.Plan
	if err := json.Unmarshal([]byte(pout), &after); err != nil || pcode != reconcile.ExitOK {
		t.Fatalf("plan after the swap: exit %d %v\n%s", pcode, err, pout)
	}
	jcode, jout, _ := run("preflight", "--host-root", f.host.Root, "--image-root", f.image.Root, "-o", "json")
	var r preflight.Result
	if err := json.Unmarshal([]byte(jout), &r); err != nil || jcode != reconcile.ExitOK {
		t.Fatalf("-o json: exit %d %v\n%s", jcode, err, jout)
	}
	if strings.Join(actions(after), ",") != strings.Join(actions(r.Plan), ",") || after.Verdict != r.Plan.Verdict {
		t.Fatalf("preflight decided %+v, the pass after the swap %+v", r.Plan, after)
	}
	if r.Outcome != preflight.OutcomeProceed || r.Facts.Bundled != "v1.37.2" || r.Facts.Node != "v1.36.3" {
		t.Fatalf("json %+v", r)
	}
}

func actions(p plan.Plan) []string {
	var out []string
	for _, a := range p.Actions {
		out = append(out, string(a))
	}
	return out
}

// What the gate or a worker's wait would hold the upgrade on, the
// preflight refuses: exit 3, the code on the line and in the text.
func TestPreflightRefusesWhatTheGateWouldWaitOn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(f *fleet)
		code  plan.Code
		why   string
	}{
		{"another control plane upgrading", func(f *fleet) {
			etcdtest.Start(t, f.host, etcdtest.Config{})
			f.publishes("cp1", status.PhaseUpgrading, 90*time.Second)
		}, plan.ControlPlaneUpgrading, "control plane cp1 (published Upgrading 1m3"},
		{"its Upgrading is older than the pass bound", func(f *fleet) {
			etcdtest.Start(t, f.host, etcdtest.Config{})
			f.publishes("cp1", status.PhaseUpgrading, reconcile.PassBound+time.Minute)
		}, "", ""},
		{"another control plane's last pass failed", func(f *fleet) {
			etcdtest.Start(t, f.host, etcdtest.Config{})
			f.fails("cp3", "KubeadmFailed")
		}, plan.ControlPlaneFailed, "the last pass of control plane cp3 (KubeadmFailed) failed"},
		{"a failed peer's reason that is not a code is not repeated", func(f *fleet) {
			etcdtest.Start(t, f.host, etcdtest.Config{})
			f.fails("cp1", "\x1b[2J$(reboot)")
		}, plan.ControlPlaneFailed, "the last pass of control plane cp1 (no reason code published) failed"},
		{"this node's own failed pass does not hold it", func(f *fleet) {
			etcdtest.Start(t, f.host, etcdtest.Config{})
			f.fails("cp2", "HealthGateTimeout")
		}, "", ""},
		{"a control plane not Ready", func(f *fleet) {
			etcdtest.Start(t, f.host, etcdtest.Config{})
			f.api.SetNodeCondition("cp3", "v1.36.3", false, "PLEG is not healthy")
			f.api.SetControlPlaneNode("cp3", "127.0.0.1")
		}, plan.ControlPlaneNotReady, "control-plane Node not Ready: cp3 (PLEG is not healthy)"},
		{"etcd down", func(f *fleet) {
			etcdtest.Start(t, f.host, etcdtest.Config{}).Stop()
		}, plan.EtcdUnhealthy, "etcd member list via https://127.0.0.1:"},
		{"the endpoint not ready", func(f *fleet) {
			etcdtest.Start(t, f.host, etcdtest.Config{})
			f.api.SetNotReady(true)
		}, plan.ControlPlaneNotReady, "the cluster endpoint is not ready: /readyz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, "controlplane", "v1.36.3", "v1.37.2", "v1.37.2")
			tc.setup(f)
			code, out, errOut := f.run()
			if tc.code == "" {
				if code != reconcile.ExitOK {
					t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
				}
				return
			}
			if code != reconcile.ExitRefused {
				t.Fatalf("exit %d, want 3\n%s\n%s", code, out, errOut)
			}
			wantLine(t, errOut, "level=ERROR msg=preflight outcome=refused code="+string(tc.code)+" role=controlplane pin=v1.37.2", tc.why)
			if tc.code == plan.ControlPlaneUpgrading && !strings.Contains(out, "ago) is upgrading: one control plane at a time\n") {
				t.Fatalf("stdout:\n%s", out)
			}
			if strings.Contains(out+errOut, "reboot)") {
				t.Fatalf("a peer's published text was repeated:\n%s\n%s", out, errOut)
			}
			if !strings.HasPrefix(out, "Preflight: REFUSE "+string(tc.code)+": nothing was swapped\nWhy:      ") || !strings.Contains(out, tc.why) {
				t.Fatalf("stdout:\n%s", out)
			}
		})
	}
}

// The next boot's own refusals come first, decided by the pass's plan: a
// node two minors behind the pin in its cloud-config (the cluster file of
// this boot still pins its version) is SkipLevel, whatever the cluster.
func TestPreflightRefusesWhatTheNextBootWouldRefuse(t *testing.T) {
	f := newFleet(t, "controlplane", "v1.35.4", "v1.37.2", "v1.35.4")
	code, out, errOut := f.run()
	if code != reconcile.ExitRefused || !strings.Contains(out, "Verdict:  REFUSE SkipLevel (UpgradeRefused)\n") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	wantLine(t, errOut, "outcome=refused code=SkipLevel role=controlplane pin=v1.37.2 bundled=v1.37.2 node=v1.35.4")
	// The image is not the node's: a pin newer than the image is refused
	// as the boot into it would refuse it.
	f = newFleet(t, "controlplane", "v1.36.3", "v1.37.3", "v1.36.3")
	if code, out, errOut := f.run(); code != reconcile.ExitRefused || !strings.Contains(errOut, "code=PinNewerThanImage") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
}

// A worker goes once every apiserver serves the pin (its kubelet is never
// newer than one), with its own credentials; before that it is refused.
func TestPreflightOnAWorker(t *testing.T) {
	f := newFleet(t, "worker", "v1.36.3", "v1.37.2", "v1.37.2")
	behind := testutil.NewAPI(t, "v1.37.2")
	behind.SetServerVersion("v1.36.3")
	f.api.SetAPIServers(f.api.Addr(), behind.Addr())
	code, out, errOut := f.run()
	if code != reconcile.ExitRefused {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	wantLine(t, errOut, "code=ControlPlanesBehind role=worker", "control planes still behind v1.37.2: "+behind.Addr()+" at v1.36.3")
	behind.SetServerVersion("")
	if code, out, errOut := f.run(); code != reconcile.ExitOK || !strings.Contains(errOut, "outcome=proceed") ||
		!strings.Contains(out, "Actions:  1. wait-for-cluster-upgrade  2. upgrade-node") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	// Before the first control plane's apply: the cluster still at 1.36.
	f.api.SetClusterVersion("v1.36.3")
	behind.SetClusterVersion("v1.36.3")
	if code, _, errOut := f.run(); code != reconcile.ExitRefused || !strings.Contains(errOut, "cluster at v1.36.3, waiting for v1.37.2") {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
}

// What it cannot read as the boot will, it refuses; a node without a
// cluster section has nothing for the provider to check.
func TestPreflightOnTheNodesCloudConfig(t *testing.T) {
	f := newFleet(t, "worker", "v1.37.2", "v1.37.2", "v1.37.2")
	f.host.Write("/oem/91_pin.yaml", testutil.CloudConfig("worker", "v1.37.2"), 0o600)
	code, out, errOut := f.run()
	if code != reconcile.ExitRefused || !strings.Contains(errOut, "code=InvalidPin") ||
		!strings.Contains(out, "the cluster: section is in 2 cloud-config files (/oem/90_custom.yaml, /oem/91_pin.yaml)") {
		t.Fatalf("two sections: exit %d\n%s\n%s", code, out, errOut)
	}
	// Without the header kairos-agent reads no file: one section again.
	f.host.Write("/oem/91_pin.yaml", strings.TrimPrefix(testutil.CloudConfig("worker", "v1.37.2"), "#cloud-config\n"), 0o600)
	if code, out, errOut := f.run(); code != reconcile.ExitOK || !strings.Contains(out, "Verdict:  nothing to do\n") {
		t.Fatalf("a file without the header: exit %d\n%s\n%s", code, out, errOut)
	}
	if err := os.Symlink("/etc/passwd", f.host.Path("/oem/92_link.yaml")); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := f.run(); code != reconcile.ExitRefused || !strings.Contains(out, "cloud-config /oem/92_link.yaml is a symlink, not a regular file") {
		t.Fatalf("a symlink: exit %d\n%s\n%s", code, out, errOut)
	}
	os.Remove(f.host.Path("/oem/92_link.yaml"))
	// A section the plugin refuses at boot is refused now, with its reason.
	f.host.Write("/oem/90_custom.yaml", strings.Replace(testutil.CloudConfig("worker", "v1.37.2"), "role: worker", "role: master", 1), 0o600)
	if code, out, errOut := f.run(); code != reconcile.ExitRefused || !strings.Contains(out, "would be refused at boot (agent.boot: cluster: ") ||
		strings.Contains(out+errOut, testutil.Token) {
		t.Fatalf("a refused section: exit %d\n%s\n%s", code, out, errOut)
	}
	// No section at all: the next boot runs no pass.
	f.host.Write("/oem/90_custom.yaml", "#cloud-config\nhostname: w1\n", 0o600)
	if code, out, errOut := f.run(); code != reconcile.ExitOK || !strings.Contains(out, "Message:  no cluster: section in the cloud-config (/oem, /usr/local/cloud-config): the next boot runs no reconcile pass") {
		t.Fatalf("no section: exit %d\n%s\n%s", code, out, errOut)
	}
}

// The operator sets HOST_DIR to where it mounts the node; under
// Kubernetes without it, /host, as kairos-agent does. Roots are absolute.
func TestPreflightRoots(t *testing.T) {
	f := newFleet(t, "worker", "v1.37.2", "v1.37.2", "v1.37.2")
	t.Setenv("HOST_DIR", f.host.Root)
	code, _, errOut := run("preflight", "--image-root", f.image.Root)
	if code != reconcile.ExitOK || !strings.Contains(errOut, "host_root="+f.host.Root+" ") {
		t.Fatalf("HOST_DIR: exit %d\n%s", code, errOut)
	}
	t.Setenv("HOST_DIR", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	if got := defaultHostRoot(); got != "/host" {
		t.Fatalf("in a Pod without HOST_DIR: %q", got)
	}
	for _, args := range [][]string{{"--host-root", "host"}, {"--image-root", "img"}, {"-o", "xml"}, {"extra"}} {
		if code, out, errOut := run(append([]string{"preflight"}, args...)...); code != reconcile.ExitUsage || out != "" {
			t.Fatalf("%v: exit %d %q %q", args, code, out, errOut)
		}
	}
}

// The rollout's one trap: the image swapped before the pin was bumped. The
// boot into it would do nothing (a warning), so every node would report
// done and none upgrade: the preflight refuses it (PinBehindImage) and
// names the pin to set. An image of the pin's own minor (a patch or an
// OS-only image) passes.
func TestPreflightRefusesAnImageAheadOfThePin(t *testing.T) {
	for _, role := range []string{"controlplane", "worker"} {
		t.Run(role, func(t *testing.T) {
			f := newFleet(t, role, "v1.36.3", "v1.36.3", "v1.36.3")
			code, out, errOut := f.run()
			if code != reconcile.ExitRefused || !strings.Contains(out, "Preflight: REFUSE PinBehindImage") ||
				!strings.Contains(out, "provider-kubernetes pin set v1.37.2") {
				t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
			}
			wantLine(t, errOut, "outcome=refused code=PinBehindImage")
		})
	}
	// The image of the pin's minor: the boot would have nothing to do, and
	// nothing to refuse either.
	f := newFleet(t, "controlplane", "v1.37.2", "v1.37.2", "v1.37.2")
	if code, out, errOut := f.run(); code != reconcile.ExitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
}
