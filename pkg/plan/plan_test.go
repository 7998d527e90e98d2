package plan

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

var window = version.Window{{Major: 1, Minor: 35}, {Major: 1, Minor: 36}, {Major: 1, Minor: 37}}

func v(s string) version.Version {
	if s == "" {
		return version.Version{}
	}
	return version.MustParse(s)
}

func TestCompiledWindowIsTheTestedOne(t *testing.T) {
	if got := images.Window(); !reflect.DeepEqual(got, window) {
		t.Fatalf("images/versions.yaml window %v, decision table tested against %v: update the table", got, window)
	}
}

func TestDecide(t *testing.T) {
	apply := []Action{ActionEtcdSnapshot, ActionUpgradeApply, ActionRestartKubelet, ActionVerify}
	node := []Action{ActionUpgradeNode, ActionRestartKubelet, ActionVerify}
	waitNode := []Action{ActionWaitForClusterUpgrade, ActionUpgradeNode, ActionRestartKubelet, ActionVerify}
	type row struct {
		name                       string
		member                     bool
		role                       Role
		pin, bundled, node, clustr string
		verdict                    Verdict
		actions                    []Action
		refusal                    Code
		reason                     string
		redecide                   bool
		warnings                   int
		window                     version.Window
		configErr                  string
	}
	rows := []row{
		// 1. pin and image
		{name: "empty pin", member: true, role: RoleControlPlane, pin: "", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: InvalidPin, reason: ReasonUpgradeRefused},
		{name: "pin without patch", member: true, role: RoleControlPlane, pin: "1.37", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: InvalidPin, reason: ReasonUpgradeRefused},
		{name: "pin v without patch", member: true, role: RoleWorker, pin: "v1.37", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: InvalidPin, reason: ReasonUpgradeRefused},
		{name: "pin latest", member: false, role: RoleInit, pin: "latest", bundled: "v1.37.2", verdict: VerdictRefuse, refusal: InvalidPin, reason: ReasonBootstrapRefused},
		{name: "pin pre-release", member: true, role: RoleControlPlane, pin: "v1.37.0-rc.1", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: InvalidPin, reason: ReasonUpgradeRefused},
		{name: "pin whitespace", member: true, role: RoleControlPlane, pin: " v1.37.2 ", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: InvalidPin, reason: ReasonUpgradeRefused},
		{name: "pin only whitespace", member: false, role: RoleWorker, pin: "  ", bundled: "v1.37.2", verdict: VerdictRefuse, refusal: InvalidPin, reason: ReasonBootstrapRefused},
		{name: "pin without v", member: false, role: RoleInit, pin: "1.37.2", bundled: "v1.37.2", verdict: VerdictRefuse, refusal: InvalidPin, reason: ReasonBootstrapRefused},
		{name: "unreadable cluster file", member: true, role: RoleWorker, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.36.3", configErr: "cluster file does not exist", verdict: VerdictRefuse, refusal: InvalidPin, reason: ReasonUpgradeRefused},
		{name: "invalid pin wins over unknown bundle", member: true, role: RoleWorker, pin: "v1.37", bundled: "", node: "v1.36.3", verdict: VerdictRefuse, refusal: InvalidPin, reason: ReasonUpgradeRefused},
		{name: "bundle unknown", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: BundledVersionUnknown, reason: ReasonUpgradeRefused},
		{name: "bundle unknown non-member", member: false, role: RoleInit, pin: "v1.37.2", bundled: "", verdict: VerdictRefuse, refusal: BundledVersionUnknown, reason: ReasonBootstrapRefused},
		{name: "bundle out of window (old)", member: true, role: RoleControlPlane, pin: "v1.34.5", bundled: "v1.34.5", node: "v1.34.5", clustr: "v1.34.5", verdict: VerdictRefuse, refusal: BundleOutOfWindow, reason: ReasonUpgradeRefused},
		{name: "bundle out of window (new)", member: false, role: RoleInit, pin: "v1.38.0", bundled: "v1.38.0", verdict: VerdictRefuse, refusal: BundleOutOfWindow, reason: ReasonBootstrapRefused},

		// 2. not a member
		{name: "init", member: false, role: RoleInit, pin: "v1.37.2", bundled: "v1.37.2", verdict: VerdictAct, actions: []Action{ActionInit}},
		{name: "join controlplane", member: false, role: RoleControlPlane, pin: "v1.36.3", bundled: "v1.36.3", verdict: VerdictAct, actions: []Action{ActionJoin}},
		{name: "join worker", member: false, role: RoleWorker, pin: "v1.35.4", bundled: "v1.35.4", verdict: VerdictAct, actions: []Action{ActionJoin}},
		{name: "bootstrap pin newer patch", member: false, role: RoleInit, pin: "v1.37.3", bundled: "v1.37.2", verdict: VerdictRefuse, refusal: PinNewerThanImage, reason: ReasonBootstrapRefused},
		{name: "bootstrap pin newer minor", member: false, role: RoleWorker, pin: "v1.37.2", bundled: "v1.36.3", verdict: VerdictRefuse, refusal: PinNewerThanImage, reason: ReasonBootstrapRefused},
		{name: "bootstrap pin older patch", member: false, role: RoleControlPlane, pin: "v1.37.1", bundled: "v1.37.2", verdict: VerdictRefuse, refusal: PinImageMismatch, reason: ReasonBootstrapRefused},
		{name: "bootstrap pin older minor", member: false, role: RoleInit, pin: "v1.36.3", bundled: "v1.37.2", verdict: VerdictRefuse, refusal: PinImageMismatch, reason: ReasonBootstrapRefused},
		{name: "bootstrap without role", member: false, role: "", pin: "v1.37.2", bundled: "v1.37.2", verdict: VerdictRefuse, refusal: InvalidRole, reason: ReasonBootstrapRefused},

		// 3. converged
		{name: "converged cp", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.37.2", clustr: "v1.37.2", verdict: VerdictNone},
		{name: "converged worker", member: true, role: RoleWorker, pin: "v1.36.3", bundled: "v1.36.3", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictNone},
		{name: "converged init role counts as cp", member: true, role: RoleInit, pin: "v1.36.3", bundled: "v1.36.3", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictNone},
		{name: "newer image old pin is a no-op with a skew warning", member: true, role: RoleControlPlane, pin: "v1.36.3", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictNone, warnings: 1},
		{name: "newer patch image old pin no warning", member: true, role: RoleWorker, pin: "v1.37.1", bundled: "v1.37.2", node: "v1.37.1", clustr: "v1.37.1", verdict: VerdictNone},
		{name: "converged cluster ahead warns", member: true, role: RoleWorker, pin: "v1.36.3", bundled: "v1.36.3", node: "v1.36.3", clustr: "v1.37.2", verdict: VerdictNone, warnings: 1},
		{name: "converged cluster unknown", member: true, role: RoleWorker, pin: "v1.36.3", bundled: "v1.36.3", node: "v1.36.3", clustr: "", verdict: VerdictNone},
		{name: "converged both warnings", member: true, role: RoleWorker, pin: "v1.36.3", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.37.2", verdict: VerdictNone, warnings: 2},
		// An OS rollback of a node already at the pin: a newer pin than the image is a hard error.
		{name: "rollback: node at the pin, image a minor older", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.36.3", node: "v1.37.2", clustr: "v1.37.2", verdict: VerdictRefuse, refusal: PinNewerThanImage, reason: ReasonUpgradeRefused},
		{name: "rollback: worker at the pin, image a minor older", member: true, role: RoleWorker, pin: "v1.37.2", bundled: "v1.36.3", node: "v1.37.2", clustr: "v1.37.2", verdict: VerdictRefuse, refusal: PinNewerThanImage, reason: ReasonUpgradeRefused},
		{name: "rollback: node at the pin, image a patch older", member: true, role: RoleWorker, pin: "v1.37.2", bundled: "v1.37.1", node: "v1.37.2", clustr: "v1.37.2", verdict: VerdictRefuse, refusal: PinNewerThanImage, reason: ReasonUpgradeRefused},
		{name: "converged 1.34 node on a 1.35 image, old pin", member: true, role: RoleControlPlane, pin: "v1.34.5", bundled: "v1.35.4", node: "v1.34.5", clustr: "v1.34.5", verdict: VerdictNone, warnings: 1},

		{name: "interrupted apply resumes", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.37.2", clustr: "v1.36.3", verdict: VerdictAct, actions: apply},
		{name: "interrupted apply, image rolled back: refused, no resume", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.36.3", node: "v1.37.2", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: PinNewerThanImage, reason: ReasonUpgradeRefused},
		{name: "worker at pin, cluster behind: nothing", member: true, role: RoleWorker, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.37.2", clustr: "v1.36.3", verdict: VerdictNone},

		// 4. refusals of a change
		{name: "member pin newer patch than image", member: true, role: RoleControlPlane, pin: "v1.37.3", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: PinNewerThanImage, reason: ReasonUpgradeRefused},
		{name: "member pin newer minor than image", member: true, role: RoleWorker, pin: "v1.37.2", bundled: "v1.36.3", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: PinNewerThanImage, reason: ReasonUpgradeRefused},
		{name: "pin newer than image wins over skip-level", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.36.3", node: "v1.35.4", clustr: "v1.35.4", verdict: VerdictRefuse, refusal: PinNewerThanImage, reason: ReasonUpgradeRefused},
		{name: "downgrade minor", member: true, role: RoleControlPlane, pin: "v1.36.3", bundled: "v1.37.2", node: "v1.37.2", clustr: "v1.37.2", verdict: VerdictRefuse, refusal: Downgrade, reason: ReasonUpgradeRefused},
		{name: "downgrade patch", member: true, role: RoleWorker, pin: "v1.37.1", bundled: "v1.37.2", node: "v1.37.2", clustr: "v1.37.2", verdict: VerdictRefuse, refusal: Downgrade, reason: ReasonUpgradeRefused},
		{name: "downgrade on an older image", member: true, role: RoleControlPlane, pin: "v1.36.3", bundled: "v1.36.3", node: "v1.37.2", clustr: "v1.37.2", verdict: VerdictRefuse, refusal: Downgrade, reason: ReasonUpgradeRefused},
		{name: "major change", member: true, role: RoleControlPlane, pin: "v2.0.0", bundled: "v2.0.0", node: "v1.37.2", clustr: "v1.37.2", verdict: VerdictRefuse, refusal: MajorChange, reason: ReasonUpgradeRefused,
			window: version.Window{{Major: 1, Minor: 37}, {Major: 2, Minor: 0}}},
		{name: "skip level 1.35 to 1.37", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.35.4", clustr: "v1.35.4", verdict: VerdictRefuse, refusal: SkipLevel, reason: ReasonUpgradeRefused},
		{name: "skip level worker", member: true, role: RoleWorker, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.35.4", clustr: "v1.37.2", verdict: VerdictRefuse, refusal: SkipLevel, reason: ReasonUpgradeRefused},
		{name: "out-of-window source may leave: 1.34 to 1.35", member: true, role: RoleControlPlane, pin: "v1.35.4", bundled: "v1.35.4", node: "v1.34.5", clustr: "v1.34.5", verdict: VerdictAct, actions: apply},
		// A target below the window, one minor up, on an in-window image: OutOfWindow is the first check that fails.
		{name: "out-of-window target 1.33 to 1.34", member: true, role: RoleWorker, pin: "v1.34.5", bundled: "v1.35.4", node: "v1.33.8", clustr: "v1.34.5", verdict: VerdictRefuse, refusal: OutOfWindow, reason: ReasonUpgradeRefused},
		{name: "out-of-window source skip 1.34 to 1.36", member: true, role: RoleControlPlane, pin: "v1.36.3", bundled: "v1.36.3", node: "v1.34.5", clustr: "v1.34.5", verdict: VerdictRefuse, refusal: SkipLevel, reason: ReasonUpgradeRefused},
		{name: "pin older patch than image", member: true, role: RoleControlPlane, pin: "v1.37.1", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: PinImageMismatch, reason: ReasonUpgradeRefused},
		{name: "patch pin older than image patch", member: true, role: RoleWorker, pin: "v1.37.1", bundled: "v1.37.2", node: "v1.37.0", clustr: "v1.37.1", verdict: VerdictRefuse, refusal: PinImageMismatch, reason: ReasonUpgradeRefused},
		{name: "node version unknown", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.37.2", node: "", clustr: "v1.36.3", verdict: VerdictRefuse, refusal: NodeVersionUnknown, reason: ReasonUpgradeRefused},

		// 5. upgrade due
		{name: "first control plane applies", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictAct, actions: apply},
		{name: "init role member applies", member: true, role: RoleInit, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictAct, actions: apply},
		{name: "patch upgrade applies", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.37.0", clustr: "v1.37.0", verdict: VerdictAct, actions: apply},
		{name: "follower control plane upgrades node", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.37.2", verdict: VerdictAct, actions: node},
		{name: "cp pin behind cluster", member: true, role: RoleControlPlane, pin: "v1.37.1", bundled: "v1.37.1", node: "v1.36.3", clustr: "v1.37.2", verdict: VerdictRefuse, refusal: PinBehindCluster, reason: ReasonUpgradeRefused},
		{name: "cp cluster two minors behind", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.35.4", verdict: VerdictRefuse, refusal: SkipLevel, reason: ReasonUpgradeRefused},
		{name: "cp cluster unknown repairs then redecides", member: true, role: RoleControlPlane, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.36.3", clustr: "", verdict: VerdictAct, actions: []Action{ActionRepairKubelet}, redecide: true},
		{name: "worker cluster upgraded", member: true, role: RoleWorker, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.37.2", verdict: VerdictAct, actions: waitNode},
		{name: "worker patch upgrade", member: true, role: RoleWorker, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.37.1", clustr: "v1.37.2", verdict: VerdictAct, actions: waitNode},
		{name: "worker before control planes waits", member: true, role: RoleWorker, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.36.3", clustr: "v1.36.3", verdict: VerdictAct, actions: waitNode},
		{name: "worker pin behind cluster", member: true, role: RoleWorker, pin: "v1.36.3", bundled: "v1.36.3", node: "v1.35.4", clustr: "v1.37.2", verdict: VerdictRefuse, refusal: PinBehindCluster, reason: ReasonUpgradeRefused},
		{name: "worker cluster unknown repairs then redecides", member: true, role: RoleWorker, pin: "v1.37.2", bundled: "v1.37.2", node: "v1.36.3", clustr: "", verdict: VerdictAct, actions: []Action{ActionRepairKubelet}, redecide: true},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			w := window
			if r.window != nil {
				w = r.window
			}
			p := Decide(w, Facts{Member: r.member, Role: r.role, Pin: r.pin, Bundled: v(r.bundled), Node: v(r.node), Cluster: v(r.clustr), ConfigError: r.configErr})
			if p.Verdict != r.verdict {
				t.Fatalf("verdict %q, want %q (plan %+v)", p.Verdict, r.verdict, p)
			}
			if p.Refusal != r.refusal || p.Reason != r.reason {
				t.Fatalf("refusal %q reason %q, want %q %q: %s", p.Refusal, p.Reason, r.refusal, r.reason, p.Message)
			}
			want := r.actions
			if want == nil {
				want = []Action{}
			}
			if !reflect.DeepEqual(p.Actions, want) {
				t.Fatalf("actions %v, want %v", p.Actions, want)
			}
			if p.Redecide != r.redecide {
				t.Fatalf("redecide %v, want %v", p.Redecide, r.redecide)
			}
			if len(p.Warnings) != r.warnings {
				t.Fatalf("warnings %q, want %d", p.Warnings, r.warnings)
			}
			if p.Message == "" {
				t.Fatal("empty message")
			}
			if p.Refused() {
				// A refusal names what it compared so an operator can act on the line alone.
				for _, s := range []string{r.pin, r.bundled, r.node} {
					if s != "" && strings.TrimSpace(s) != "" && r.refusal != InvalidPin && r.refusal != BundledVersionUnknown && !strings.Contains(p.Message, s) {
						t.Errorf("message %q does not name %s", p.Message, s)
					}
				}
			}
		})
	}
}

// Every refusal is total: a refusal never carries an action, whatever the facts.
func TestRefusalCarriesNoAction(t *testing.T) {
	vs := []string{"", "v1.34.5", "v1.35.4", "v1.36.3", "v1.37.1", "v1.37.2", "v1.38.0"}
	pins := append(append([]string{}, vs...), "1.37", "latest")
	for _, member := range []bool{false, true} {
		for _, role := range []Role{"", RoleInit, RoleControlPlane, RoleWorker} {
			for _, p := range pins {
				for _, b := range vs {
					for _, n := range vs {
						for _, c := range vs {
							pl := Decide(window, Facts{Member: member, Role: role, Pin: p, Bundled: v(b), Node: v(n), Cluster: v(c)})
							if pl.Refused() && (len(pl.Actions) != 0 || pl.Refusal == "" || pl.Reason == "") {
								t.Fatalf("%v %s p=%s b=%s n=%s c=%s: %+v", member, role, p, b, n, c, pl)
							}
							if !pl.Refused() && pl.Refusal != "" {
								t.Fatalf("non-refusal with a code: %+v", pl)
							}
							// Nothing mutating unless the pin equals the image exactly.
							if pl.Verdict == VerdictAct && p != b {
								t.Fatalf("acts with pin %s != image %s: %+v", p, b, pl)
							}
						}
					}
				}
			}
		}
	}
}

// A refusal decided with the cluster version unknown is exactly the one
// decided with any cluster version (every refusal that needs it comes after
// the ones that do not), whatever the verified record: so the pass may
// refuse before reading the cluster, rather than wait on an API that is
// down by design (a control plane booted back into an older image).
func TestARefusalWithoutTheClusterVersionHoldsWithAny(t *testing.T) {
	vs := []string{"", "v1.34.5", "v1.35.4", "v1.36.3", "v1.37.1", "v1.37.2", "v1.38.0"}
	pins := append(append([]string{}, vs...), "1.37", "latest")
	refusals := 0
	for _, member := range []bool{false, true} {
		for _, role := range []Role{"", RoleInit, RoleControlPlane, RoleWorker} {
			for _, p := range pins {
				for _, b := range vs {
					for _, n := range vs {
						for _, ver := range vs {
							f := Facts{Member: member, Role: role, Pin: p, Bundled: v(b), Node: v(n), Verified: v(ver)}
							unknown := Decide(window, f)
							if !unknown.Refused() {
								continue
							}
							refusals++
							for _, c := range vs[1:] {
								f.Cluster = v(c)
								if known := Decide(window, f); !reflect.DeepEqual(known, unknown) {
									t.Fatalf("%+v: refused %s with the cluster unknown, %s %s with it at %s", f, unknown.Refusal, known.Verdict, known.Refusal, c)
								}
							}
						}
					}
				}
			}
		}
	}
	if refusals == 0 {
		t.Fatal("no refusal in the grid")
	}
}

// upgrades.md: "A newer pin than the image ships is a hard error, refused
// before anything runs" — for every member, whatever its version, the
// cluster's or its role, including one already at the pin (an OS rollback
// to the other slot), whose message names the rollback and what to do.
func TestPinNewerThanImageIsAlwaysRefused(t *testing.T) {
	vs := []string{"", "v1.35.4", "v1.36.3", "v1.37.1", "v1.37.2"}
	for _, member := range []bool{false, true} {
		for _, role := range []Role{RoleInit, RoleControlPlane, RoleWorker} {
			for _, p := range vs[1:] {
				for _, b := range vs[1:] {
					for _, n := range vs[1:] {
						for _, c := range vs {
							if v(p).Compare(v(b)) <= 0 {
								continue
							}
							pl := Decide(window, Facts{Member: member, Role: role, Pin: p, Bundled: v(b), Node: v(n), Cluster: v(c)})
							if pl.Refusal != PinNewerThanImage || len(pl.Actions) != 0 {
								t.Fatalf("member=%v %s p=%s b=%s n=%s c=%s: %s %s", member, role, p, b, n, c, pl.Refusal, pl.Message)
							}
							if member && p == n && (!strings.Contains(pl.Message, "OS rollback") || !strings.Contains(pl.Message, "boot the image for "+v(p).MinorOf().String())) {
								t.Fatalf("rollback message %q", pl.Message)
							}
						}
					}
				}
			}
		}
	}
}

// A node at the pin whose last verified version is older was interrupted
// between kubeadm and the end of its upgrade (the kubelet restart and the
// verification): finish those, nothing else. Without a record, or on an
// image that does not ship the pin, nothing changes.
func TestUnverifiedUpgradeIsFinished(t *testing.T) {
	finish := []Action{ActionRestartKubelet, ActionVerify}
	for _, r := range []struct {
		name                                  string
		role                                  Role
		pin, bundled, node, cluster, verified string
		verdict                               Verdict
		actions                               []Action
	}{
		{"control plane after apply, before the kubelet restart", RoleControlPlane, "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "v1.36.3", VerdictAct, finish},
		{"follower after upgrade node", RoleControlPlane, "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "v1.36.3", VerdictAct, finish},
		{"a patch upgrade", RoleWorker, "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.1", VerdictAct, finish},
		{"verified at the pin", RoleControlPlane, "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", VerdictNone, []Action{}},
		{"no record (an older release bootstrapped it)", RoleControlPlane, "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "", VerdictNone, []Action{}},
		{"a newer image with the old pin: the kubelet on disk is not the pin's", RoleControlPlane, "v1.36.3", "v1.37.2", "v1.36.3", "v1.36.3", "v1.35.4", VerdictNone, []Action{}},
		{"interrupted apply (cluster behind): resumed, not just finished", RoleControlPlane, "v1.37.2", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", VerdictAct,
			[]Action{ActionEtcdSnapshot, ActionUpgradeApply, ActionRestartKubelet, ActionVerify}},
		{"control plane, cluster version unknown: decide again after the repair, never finish on doubt", RoleControlPlane, "v1.37.2", "v1.37.2", "v1.37.2", "", "v1.36.3", VerdictAct,
			[]Action{ActionRepairKubelet}},
		{"worker, cluster version unknown: its own record decides", RoleWorker, "v1.37.2", "v1.37.2", "v1.37.2", "", "v1.36.3", VerdictAct, finish},
	} {
		t.Run(r.name, func(t *testing.T) {
			pl := Decide(window, Facts{Member: true, Role: r.role, Pin: r.pin, Bundled: v(r.bundled), Node: v(r.node), Cluster: v(r.cluster), Verified: v(r.verified)})
			if pl.Verdict != r.verdict || !reflect.DeepEqual(pl.Actions, r.actions) {
				t.Fatalf("%s %v (%s), want %s %v", pl.Verdict, pl.Actions, pl.Message, r.verdict, r.actions)
			}
			if r.verdict == VerdictAct && reflect.DeepEqual(r.actions, finish) && !strings.Contains(pl.Message, "was last verified at "+r.verified) {
				t.Fatalf("message %q", pl.Message)
			}
		})
	}
}

// The opt-in certificate renewal is decided here, on a control plane that
// is otherwise converged, and nowhere else.
func TestDecideCertificateRenewal(t *testing.T) {
	converged := Facts{Member: true, Role: RoleControlPlane, Pin: "v1.37.2", Bundled: v("v1.37.2"), Node: v("v1.37.2"), Cluster: v("v1.37.2"), Verified: v("v1.37.2")}
	due := Certificates{RenewBefore: 72 * time.Hour, Soonest: "apiserver", Left: 40 * time.Hour}
	renew := []Action{ActionRenewCertificates, ActionRestartControlPlane}
	for _, tc := range []struct {
		name    string
		edit    func(f *Facts)
		verdict Verdict
		actions []Action
	}{
		{"due", func(f *Facts) { f.Certificates = due }, VerdictAct, renew},
		{"init role", func(f *Facts) { f.Role, f.Certificates = RoleInit, due }, VerdictAct, renew},
		{"expired", func(f *Facts) { f.Certificates = due; f.Certificates.Left = -time.Hour }, VerdictAct, renew},
		{"not yet due", func(f *Facts) { f.Certificates = due; f.Certificates.Left = 73 * time.Hour }, VerdictNone, []Action{}},
		{"exactly at the threshold", func(f *Facts) { f.Certificates = due; f.Certificates.Left = 72 * time.Hour }, VerdictNone, []Action{}},
		{"renewal off", func(f *Facts) { f.Certificates = due; f.Certificates.RenewBefore = 0 }, VerdictNone, []Action{}},
		{"nothing read", func(f *Facts) { f.Certificates = due; f.Certificates.Soonest = "" }, VerdictNone, []Action{}},
		{"worker", func(f *Facts) { f.Role, f.Certificates = RoleWorker, due }, VerdictNone, []Action{}},
		// An upgrade renews the certificates itself: it is the plan.
		{"upgrade due", func(f *Facts) {
			f.Node, f.Cluster, f.Verified, f.Certificates = v("v1.36.3"), v("v1.36.3"), v("v1.36.3"), due
		}, VerdictAct,
			[]Action{ActionEtcdSnapshot, ActionUpgradeApply, ActionRestartKubelet, ActionVerify}},
		{"upgrade unfinished", func(f *Facts) { f.Verified, f.Certificates = v("v1.36.3"), due }, VerdictAct, []Action{ActionRestartKubelet, ActionVerify}},
		{"refused", func(f *Facts) { f.Pin, f.Certificates = "v1.36.3", due }, VerdictRefuse, []Action{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := converged
			tc.edit(&f)
			pl := Decide(window, f)
			if pl.Verdict != tc.verdict || !reflect.DeepEqual(pl.Actions, tc.actions) {
				t.Fatalf("%s %v, want %s %v (%s)", pl.Verdict, pl.Actions, tc.verdict, tc.actions, pl.Message)
			}
			if pl.Has(ActionRenewCertificates) && (!strings.Contains(pl.Message, "apiserver") || !strings.Contains(pl.Message, "72h0m0s") || pl.Redecide) {
				t.Fatalf("message %q", pl.Message)
			}
		})
	}
}
