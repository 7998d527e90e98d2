package reconcile

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// Each kubeadm action (init, join, upgrade apply, upgrade node) is preceded
// by the bundled images' step, right before kubeadm: when it names an
// image not in containerd, kubeadm does not run and the pass fails
// BundledImagesMissing, naming it.
func TestKubeadmRunsOnlyWithTheBundledImages(t *testing.T) {
	const lost = "bundled images not in containerd: registry.k8s.io/etcd:3.7.0-0"
	cases := []struct {
		name                  string
		role, nodeV, clusterV string // the pin and the image at v1.37.2
		action                string
		want                  []string // the commands when the images are there
	}{
		{"init", "init", "", "", "init", nil},
		{"join", "controlplane", "", "", "join", nil},
		{"upgrade apply", "controlplane", "v1.36.3", "v1.36.3", "upgrade-apply", applyLines},
		{"upgrade node, a follower", "controlplane", "v1.36.3", "v1.37.2", "upgrade-node", nodeLines},
		{"upgrade node, a worker", "worker", "v1.36.3", "v1.37.2", "upgrade-node", nodeLines},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, missing := range []bool{false, true} {
				e := newEnv(t, c.role, "v1.37.2", "v1.37.2", c.nodeV, c.clusterV, "")
				if c.role == "worker" {
					e.api.SetNode("n1", c.nodeV, true)
				}
				var checked, bootstrapped int
				var before []string // the commands run when the images were checked
				res := e.run(Steps{
					Images: func(_ context.Context, pin bool) error {
						if !pin {
							t.Errorf("pins off without images.pin: \"false\"")
						}
						checked++
						before = e.lines()
						if missing {
							return errors.New(lost)
						}
						return nil
					},
					Bootstrap: func(context.Context, plan.Action, Observation) error {
						if checked != 1 {
							t.Errorf("bootstrap before the images were checked")
						}
						bootstrapped++
						return nil
					},
				})
				if checked != 1 || len(before) != 0 {
					t.Fatalf("missing=%v: the images checked %d times, after %q", missing, checked, before)
				}
				if !missing {
					wantBoot := 0 // init and join are the bootstrap step's, which runs no command here
					if c.want == nil {
						wantBoot = 1
					}
					if res.ExitCode != ExitOK || len(e.lines()) != len(c.want) || c.want != nil && !reflect.DeepEqual(e.lines(), c.want) || bootstrapped != wantBoot {
						t.Fatalf("exit %d %v, ran %q, bootstrapped %d\n%s", res.ExitCode, res.Err, e.lines(), bootstrapped, e.logBuf.String())
					}
					continue
				}
				st := e.status(t)
				if res.ExitCode != ExitFailed || len(e.lines()) != 0 || bootstrapped != 0 || st.Phase != status.PhaseFailed ||
					st.Reason != ReasonImagesMissing || st.LastAction != c.action || !strings.Contains(st.Message, "registry.k8s.io/etcd:3.7.0-0") {
					t.Fatalf("exit %d, ran %q, bootstrapped %d, status %+v", res.ExitCode, e.lines(), bootstrapped, st)
				}
				e.logHas(t, "msg="+c.action, "outcome=failed", "reason=BundledImagesMissing", "registry.k8s.io/etcd:3.7.0-0")
			}
		})
	}
}

// providerConfig images.pin: "false": every pass, a converged one too,
// first takes off the pins the boot's import-images set (it cannot read
// the setting), and the images step before kubeadm pins nothing. Without
// the key, nothing is released and the step pins.
func TestPinsOffAreTakenOffEveryPass(t *testing.T) {
	for _, off := range []bool{false, true} {
		for _, c := range []struct {
			name         string
			nodeV        string
			wantImages   int
			wantCommands []string
		}{
			{"converged", "v1.37.2", 0, nil},
			{"upgrade node", "v1.36.3", 1, nodeLines},
		} {
			e := newEnv(t, "worker", "v1.37.2", "v1.37.2", c.nodeV, "v1.37.2", "")
			e.api.SetNode("n1", c.nodeV, true)
			if off {
				e.node.Write(paths.ClusterFile, e.node.Read(paths.ClusterFile)+"providerConfig:\n  images.pin: \"false\"\n", 0o600)
			}
			var released, imaged int
			var order []string
			res := e.run(Steps{
				ReleasePins: func(context.Context) { released++; order = append(order, "release") },
				Images: func(_ context.Context, pin bool) error {
					imaged++
					order = append(order, "images")
					if pin == off {
						t.Errorf("off=%v %s: the images step asked to pin=%v", off, c.name, pin)
					}
					return nil
				},
			})
			wantReleased := 0
			if off {
				wantReleased = 1
			}
			if res.ExitCode != ExitOK || released != wantReleased || imaged != c.wantImages ||
				len(e.lines()) != len(c.wantCommands) || c.wantCommands != nil && !reflect.DeepEqual(e.lines(), c.wantCommands) {
				t.Fatalf("off=%v %s: exit %d %v, released %d, images %d, ran %q\n%s", off, c.name, res.ExitCode, res.Err, released, imaged, e.lines(), e.logBuf.String())
			}
			if off && order[0] != "release" {
				t.Fatalf("off %s: %v", c.name, order)
			}
		}
	}
}
