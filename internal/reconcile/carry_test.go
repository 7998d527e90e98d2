package reconcile

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// Hostile host, round 2, class 9: a read that fails never erases what the
// node knew. A worker without a verified-version record boots into the
// new image while the API is down: the kubelet-repair path (with or
// without the repair step) rewrote the mirror without member and
// nodeVersion, the pass refused NodeVersionUnknown, and the next boot,
// with the API back and the Node reporting the swapped kubelet, found
// nothing to do: kubeadm upgrade node never ran. Across two passes the
// second still knows the node version (carried from the status mirror,
// saying so and since when) and runs the upgrade.
func TestFailedReadsCarryTheLastKnownNodeVersionForward(t *testing.T) {
	for name, repair := range map[string]func(context.Context, Observation) ([]string, error){
		"repair-step":    func(context.Context, Observation) ([]string, error) { return nil, nil },
		"no-repair-step": nil,
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
			if err := os.Remove(e.node.Path(paths.VerifiedRecord)); err != nil {
				t.Fatal(err)
			}
			e.api.SetDown(true)
			res := e.run(Steps{RepairKubelet: repair})
			if res.ExitCode == ExitOK || len(e.lines()) != 0 {
				t.Fatalf("pass 1 with the API down: exit %d ran %q", res.ExitCode, e.lines())
			}
			m, err := status.Read(e.node.R(), paths.StatusMirror)
			if err != nil {
				t.Fatal(err)
			}
			if !m.Member || m.NodeVersion != "v1.36.3" {
				t.Fatalf("pass 1 left the mirror %+v: want member and nodeVersion v1.36.3 kept", m)
			}
			e.logHas(t, "node version from "+paths.StatusMirror, "last known")
			if res.Plan.Refusal == plan.NodeVersionUnknown {
				t.Fatalf("pass 1 refused NodeVersionUnknown although the mirror knew v1.36.3")
			}

			// The next boot: the API is back and the Node reports the
			// swapped kubelet, already the bundled one.
			e.api.SetDown(false)
			e.api.SetNode("n1", "v1.37.2", true)
			res = e.run(Steps{RepairKubelet: repair})
			if res.ExitCode != ExitOK || !res.Plan.Has(plan.ActionUpgradeNode) || !hasLine(e.lines(), "/usr/bin/kubeadm upgrade node") {
				t.Fatalf("pass 2: exit %d plan %v %s ran %q: want kubeadm upgrade node", res.ExitCode, res.Plan.Actions, res.Plan.Message, e.lines())
			}
			if st := e.status(t); st.Phase != status.PhaseConverged || st.NodeVersion != "v1.37.2" {
				t.Fatalf("pass 2 status %+v", st)
			}
		})
	}
}

// A control plane whose manifests cannot be read (here one is not YAML)
// refuses NodeVersionUnknown, as before, but its status keeps the last
// known nodeVersion and says it is carried, from where and since when,
// instead of writing "unknown" over it; a second such pass keeps the
// original time.
func TestUnreadableVersionKeepsTheLastKnownInTheStatus(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	if err := status.Write(e.node.R(), status.Document{Phase: status.PhaseConverged, Member: true, Role: "controlplane",
		NodeVersion: "v1.36.3", Time: "2026-11-01T10:00:00Z"}); err != nil {
		t.Fatal(err)
	}
	e.node.Write(paths.APIServerManifest, "{not yaml", 0o600)
	for i := range 2 {
		res := e.run(Steps{})
		if res.Plan.Refusal != plan.NodeVersionUnknown || len(e.lines()) != 0 {
			t.Fatalf("pass %d: exit %d plan %+v ran %q", i, res.ExitCode, res.Plan, e.lines())
		}
		st := e.status(t)
		if !st.Member || st.NodeVersion != "v1.36.3" || st.Carried == nil || st.Carried.From != paths.StatusMirror ||
			st.Carried.Since != "2026-11-01T10:00:00Z" || !slices.Contains(st.Carried.Fields, "nodeVersion") {
			t.Fatalf("pass %d status %+v carried %+v: want nodeVersion v1.36.3 carried from the mirror since 2026-11-01T10:00:00Z", i, st, st.Carried)
		}
	}
}

func hasLine(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}
