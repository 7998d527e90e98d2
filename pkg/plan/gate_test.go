package plan

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

const expiry = time.Hour

func up(name string, age time.Duration) Peer {
	return Peer{Name: name, Ready: true, Upgrading: true, Age: age, AgeKnown: true}
}

func down(name string) Peer { return Peer{Name: name, Ready: true} }

func TestDecideTurn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      TurnFacts
		want   TurnVerdict
		code   Code
		reason string
	}{
		{"alone", TurnFacts{Self: "cp2", Peers: []Peer{down("cp2")}}, TurnRaise, "", "no other control plane is upgrading"},
		{"nobody else up", TurnFacts{Self: "cp2", Peers: []Peer{down("cp1"), down("cp2"), down("cp3")}}, TurnRaise, "", ""},
		{"another up: wait, flag down", TurnFacts{Self: "cp2", Peers: []Peer{down("cp1"), down("cp2"), up("cp3", 90*time.Second)}},
			TurnWait, ControlPlaneUpgrading, "control plane cp3 (published Upgrading 1m30s ago) is upgrading: one control plane at a time"},
		{"a smaller name up: wait too", TurnFacts{Self: "cp2", Peers: []Peer{up("cp1", time.Second)}}, TurnWait, ControlPlaneUpgrading, "cp1 (published Upgrading 1s ago)"},
		{"its own stale flag is not another's", TurnFacts{Self: "cp2", Peers: []Peer{up("cp2", time.Minute)}}, TurnRaise, "", ""},
		{"a flag as old as the expiry is not counted", TurnFacts{Self: "cp2", Peers: []Peer{up("cp1", expiry)}}, TurnRaise, "", ""},
		{"just younger than the expiry counts", TurnFacts{Self: "cp2", Peers: []Peer{up("cp1", expiry-time.Second)}}, TurnWait, ControlPlaneUpgrading, ""},
		{"a flag whose time cannot be read counts", TurnFacts{Self: "cp2", Peers: []Peer{{Name: "cp3", Ready: true, Upgrading: true}}},
			TurnWait, ControlPlaneUpgrading, "cp3 (published Upgrading at a time that cannot be read)"},
		{"raised, alone: go", TurnFacts{Self: "cp2", Raised: true, Peers: []Peer{down("cp1"), up("cp2", 0), down("cp3")}}, TurnGo, "", ""},
		{"raised, a smaller name raised too: withdraw", TurnFacts{Self: "cp2", Raised: true, Peers: []Peer{up("cp1", 0), up("cp2", 0), up("cp3", 0)}},
			TurnWithdraw, ControlPlaneUpgrading, "control plane cp1 (published Upgrading 0s ago) also started: the smaller Node name goes first"},
		{"raised, a larger name up: hold", TurnFacts{Self: "cp2", Raised: true, Peers: []Peer{up("cp3", 4*time.Minute)}},
			TurnHold, ControlPlaneUpgrading, "control plane cp3 (published Upgrading 4m0s ago) started first: waiting for it to finish or withdraw"},
		{"raised, a larger name's stale flag: go", TurnFacts{Self: "cp2", Raised: true, Peers: []Peer{up("cp3", 2*expiry)}}, TurnGo, "", ""},
		{"unreadable, flag down: wait", TurnFacts{Self: "cp2", PeersErr: "list nodes: 403"}, TurnWait, ClusterStateUnknown, "the control planes cannot be read: list nodes: 403"},
		{"unreadable, flag up: hold it", TurnFacts{Self: "cp2", Raised: true, PeersErr: "timeout"}, TurnHold, ClusterStateUnknown, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.f.Expiry = expiry
			got := DecideTurn(tc.f)
			if got.Verdict != tc.want || got.Code != tc.code || !strings.Contains(got.Reason, tc.reason) {
				t.Fatalf("%+v, want %s %q %q", got, tc.want, tc.code, tc.reason)
			}
			if got.Verdict != TurnGo && got.Reason == "" {
				t.Fatal("no reason given")
			}
		})
	}
}

func TestDecideHealth(t *testing.T) {
	ready := []Peer{down("cp1"), down("cp2"), down("cp3")}
	for _, tc := range []struct {
		name   string
		f      HealthFacts
		code   Code
		reason string
	}{
		{"healthy", HealthFacts{Peers: ready, EtcdChecked: true}, "", ""},
		{"external etcd is not checked", HealthFacts{Peers: ready, EtcdErr: "not stacked"}, "", ""},
		{"a control plane not ready", HealthFacts{Peers: []Peer{down("cp1"), {Name: "cp3", NotReady: "KubeletNotReady: PLEG is not healthy"}}},
			ControlPlaneNotReady, "control-plane Node not Ready: cp3 (KubeletNotReady: PLEG is not healthy)"},
		{"no CNI yet is not waited on", HealthFacts{Peers: []Peer{{Name: "cp1", NoCNI: true, NotReady: "cni plugin not initialized"}}}, "", ""},
		{"endpoint", HealthFacts{Peers: ready, EndpointErr: "/readyz: 500"}, ControlPlaneNotReady, "the cluster endpoint is not ready: /readyz: 500"},
		{"etcd", HealthFacts{Peers: ready, EtcdChecked: true, EtcdErr: "etcd members unhealthy: cp3: connection refused"}, EtcdUnhealthy, "etcd members unhealthy: cp3: connection refused"},
		{"apiservers behind", HealthFacts{Peers: ready, Needs: "the cluster's v1.36.3", Behind: []string{"cp2 (10.0.0.12:6443) at v1.35.4"}},
			ControlPlanesBehind, "control planes not at the cluster's v1.36.3: cp2 (10.0.0.12:6443) at v1.35.4"},
		{"another control plane failed", HealthFacts{Self: "cp2", Peers: []Peer{down("cp1"), down("cp2"), {Name: "cp3", Ready: true, Failed: true, FailedReason: "KubeadmFailed"}}},
			ControlPlaneFailed, "the last pass of control plane cp3 (KubeadmFailed) failed: it may have stopped part-way through its own upgrade"},
		{"a failed peer without a code", HealthFacts{Self: "cp2", Peers: []Peer{{Name: "cp1", Ready: true, Failed: true}}},
			ControlPlaneFailed, "cp1 (no reason code published)"},
		{"this node's own failed pass is not held against it", HealthFacts{Self: "cp2", Peers: []Peer{down("cp1"), {Name: "cp2", Ready: true, Failed: true, FailedReason: "HealthGateTimeout"}}}, "", ""},
		{"nodes unreadable", HealthFacts{PeersErr: "403"}, ClusterStateUnknown, "the control-plane Nodes cannot be read: 403"},
		{"apiservers unreadable", HealthFacts{Peers: ready, BehindErr: "endpoints: 403"}, ClusterStateUnknown, "the apiservers cannot be asked: endpoints: 403"},
		// Every blocker is named; the first one's code is the refusal.
		{"several", HealthFacts{Peers: []Peer{{Name: "cp3", NotReady: "NodeStatusUnknown"}}, EtcdChecked: true, EtcdErr: "etcd alarm raised: NOSPACE"},
			ControlPlaneNotReady, "control-plane Node not Ready: cp3 (NodeStatusUnknown); etcd alarm raised: NOSPACE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, reason := DecideHealth(tc.f)
			if code != tc.code || !strings.Contains(reason, tc.reason) || (code == "") != (reason == "") {
				t.Fatalf("%q %q, want %q %q", code, reason, tc.code, tc.reason)
			}
		})
	}
}

// The turn, run by several control planes at once against one shared
// record of their published phases (the API: a write is seen by every read
// that starts after it, each read a snapshot of every Node), in random
// interleavings: never two in their upgrade at the same time, and every
// one gets its turn. A rule with the obvious tie-break ("when both raised,
// the smaller name goes") fails this: the smaller name can go on having
// seen the larger's flag while the larger went on without seeing its own.
func TestTurnIsMutuallyExclusiveWithoutALock(t *testing.T) {
	type proc struct {
		name    string
		raised  bool
		pending *bool // a write decided on, not yet done
		inCS    int   // steps left in its upgrade; -1 done
	}
	for seed := uint64(0); seed < 20000; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		n := 2 + int(seed%3)
		published := map[string]bool{}
		var ps []*proc
		for i := range n {
			ps = append(ps, &proc{name: fmt.Sprintf("cp%d", n-i)}) // names in any order
		}
		var trace []string
		done := 0
		for step := 0; done < n; step++ {
			if step > 5000 {
				t.Fatalf("seed %d: no progress after %d steps (deadlock?):\n%s", seed, step, strings.Join(trace, "\n"))
			}
			p := ps[rng.IntN(n)]
			switch {
			case p.inCS < 0:
				continue
			case p.inCS > 0:
				p.inCS--
				if p.inCS == 0 {
					published[p.name] = false // finished: the publish after the pass
					p.inCS = -1
					done++
					trace = append(trace, p.name+" done")
				}
				continue
			case p.pending != nil:
				published[p.name] = *p.pending
				p.raised = *p.pending
				p.pending = nil
				trace = append(trace, fmt.Sprintf("%s publishes up=%v", p.name, p.raised))
				continue
			}
			// One read: a snapshot of every control plane's phase.
			var peers []Peer
			for _, q := range ps {
				peers = append(peers, Peer{Name: q.name, Ready: true, Upgrading: published[q.name], AgeKnown: true})
			}
			turn := DecideTurn(TurnFacts{Self: p.name, Raised: p.raised, Peers: peers, Expiry: expiry})
			trace = append(trace, fmt.Sprintf("%s reads %v: %s", p.name, published, turn.Verdict))
			switch turn.Verdict {
			case TurnRaise, TurnWithdraw:
				raise := turn.Verdict == TurnRaise
				p.pending = &raise
			case TurnGo:
				for _, q := range ps {
					if q != p && q.inCS > 0 {
						t.Fatalf("seed %d: %s and %s upgrade at the same time:\n%s", seed, p.name, q.name, strings.Join(trace, "\n"))
					}
				}
				p.inCS = 1 + rng.IntN(4)
				trace = append(trace, p.name+" upgrades")
			}
		}
	}
}

// The preflight's rule beyond the boot's: an image of a newer minor than
// the pin is refused before the swap; the pin's own minor passes, and so
// does anything the boot itself acts on or refuses.
func TestBehindImage(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		pin, bundled, node, cl string
		want                   Code
	}{
		{"image a minor ahead of the pin", "v1.36.3", "v1.37.2", "v1.36.3", "v1.36.3", PinBehindImage},
		{"image two minors ahead", "v1.35.4", "v1.37.2", "v1.35.4", "v1.35.4", PinBehindImage},
		{"a patch image of the pin's minor", "v1.37.1", "v1.37.2", "v1.37.1", "v1.37.1", ""},
		{"the pin's own image (OS-only)", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", ""},
		{"an upgrade the boot runs", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Facts{Member: true, Role: RoleControlPlane, Pin: tc.pin, Bundled: version.MustParse(tc.bundled),
				Node: version.MustParse(tc.node), Cluster: version.MustParse(tc.cl), Verified: version.MustParse(tc.node)}
			pl := Decide(window, f)
			got, why := BehindImage(pl, f.Bundled)
			if got != tc.want {
				t.Fatalf("%s (%q), want %q; plan %+v", got, why, tc.want, pl)
			}
			if got != "" && !strings.Contains(why, "pin set "+tc.bundled) {
				t.Fatalf("the reason does not name the pin to set: %s", why)
			}
		})
	}
	if c, _ := BehindImage(Plan{Verdict: VerdictNone, Pin: version.MustParse("v1.36.3")}, version.Version{}); c != "" {
		t.Fatalf("an unknown bundle refused as %s", c)
	}
}
