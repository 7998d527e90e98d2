package reconcile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A follower waits for the cluster endpoint and etcd, and never asks about
// any scheduler or controller-manager before its own upgrade node.
func TestFollowerGateWaitsForEtcdAndNeverForSchedulers(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	attempts := 0
	e.etcd = func(context.Context) error {
		attempts++
		if attempts < 10 {
			return errors.New("etcd member cp3 (https://10.0.0.13:2379): context deadline exceeded")
		}
		return nil
	}
	var before []string
	inner := e.rec.Reply
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if strings.HasPrefix(c.String(), "/usr/bin/kubeadm upgrade node") {
			before = e.api.Paths()
		}
		return inner(ctx, c)
	}
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v lines %q", res.ExitCode, res.Err, e.lines())
	}
	if attempts != 10 {
		t.Fatalf("etcd checked %d times", attempts)
	}
	if !contains(before, "/readyz") {
		t.Fatalf("the cluster endpoint's /readyz was not checked before upgrade node: %q", before)
	}
	for _, p := range before {
		if strings.Contains(p, "scheduler") || strings.Contains(p, "controller-manager") {
			t.Fatalf("a follower looked at %s before its upgrade", p)
		}
	}
	e.logHas(t, "msg="+EventControlPlaneHealth, "outcome=ok", "checks=cluster-endpoint-readyz,control-plane-nodes-ready,etcd-members")
}

func TestFollowerGateGivesUpWithinItsBudget(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	e.etcd = func(context.Context) error { return errors.New("etcd members unhealthy: cp1: connection refused") }
	start := e.clock.Now()
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed || len(e.lines()) != 0 {
		t.Fatalf("exit %d lines %q", res.ExitCode, e.lines())
	}
	spent := e.clock.Now().Sub(start)
	if b := DefaultBudgets().ControlPlaneHealth; spent < b || spent > b+5*time.Second {
		t.Fatalf("spent %s, budget %s", spent, b)
	}
	st := e.status(t)
	if st.Reason != ReasonHealthGateTimeout || st.LastAction != "upgrade-node" || !strings.Contains(st.Message, "cp1: connection refused") {
		t.Fatalf("status %+v", st)
	}
	e.logHas(t, "msg="+EventControlPlaneHealth, "outcome=failed", "connection refused")
}

func TestVerifyReportsNoCNIInsteadOfHanging(t *testing.T) {
	e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	inner := e.rec.Reply
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if c.String() == "/usr/bin/systemctl restart kubelet" {
			e.api.SetNodeCondition("n1", "v1.37.2", false, "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized")
			return runner.Result{}, nil
		}
		return inner(ctx, c)
	}
	start := e.clock.Now()
	res := e.run(Steps{})
	if res.ExitCode != ExitOK {
		t.Fatalf("exit %d %v", res.ExitCode, res.Err)
	}
	if spent := e.clock.Now().Sub(start); spent > 10*time.Second {
		t.Fatalf("waited %s on a known state", spent)
	}
	st := e.status(t)
	if st.Phase != status.PhaseConverged || len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "no CNI") {
		t.Fatalf("status %+v", st)
	}
	e.logHas(t, "msg=node-not-ready-no-cni")
}

func TestVerifyWaitsForNotReadyThatIsNotCNI(t *testing.T) {
	e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	inner := e.rec.Reply
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if c.String() == "/usr/bin/systemctl restart kubelet" {
			e.api.SetNodeCondition("n1", "v1.37.2", false, "PLEG is not healthy")
			return runner.Result{}, nil
		}
		return inner(ctx, c)
	}
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed || !strings.Contains(res.Status.Message, "PLEG is not healthy") || res.Status.Reason != ReasonHealthGateTimeout {
		t.Fatalf("exit %d %+v", res.ExitCode, res.Status)
	}
}

func TestVerifyChecksThisNodesStaticPods(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
	pods := e.api.Pod
	e.api.Pod = func(name string) (*corev1.Pod, bool) {
		p, ok := pods(name)
		if ok && strings.HasPrefix(name, "kube-scheduler") {
			p.Status.ContainerStatuses[0].State.Running = nil // crash-looping on the new version
		}
		return p, ok
	}
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed || !strings.Contains(res.Status.Message, "static pod kube-scheduler-n1 not running yet") {
		t.Fatalf("exit %d %+v", res.ExitCode, res.Status)
	}
}

// A control plane's apiserver mirror pod owned by an earlier Node of its
// name (as after a reset and join, before the new kubelet replaces it), at
// the target image, running and Ready: verify does not take it for this
// kubelet's pod, waits, and fails at its budget naming it. The same pods
// owned by the current Node pass.
func TestVerifyIgnoresAMirrorPodOfAnEarlierNode(t *testing.T) {
	for _, stale := range []bool{true, false} {
		t.Run(fmt.Sprintf("stale=%v", stale), func(t *testing.T) {
			e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
			pods := e.api.Pod
			e.api.Pod = func(name string) (*corev1.Pod, bool) {
				p, ok := pods(name)
				if ok {
					owner := testutil.NodeUID("n1")
					if stale && strings.HasPrefix(name, "kube-apiserver") {
						owner = "uid-of-the-deleted-node"
					}
					p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "n1", UID: owner}}
				}
				return p, ok
			}
			res := e.run(Steps{})
			if !stale {
				if res.ExitCode != ExitOK || res.Status.Phase != status.PhaseConverged {
					t.Fatalf("mirror pods of the current Node: exit %d %+v", res.ExitCode, res.Status)
				}
				return
			}
			want := "static pod kube-apiserver-n1 is the mirror pod of an earlier Node n1 (uid uid-of-the-deleted-node, now uid-node-n1)"
			if res.ExitCode != ExitFailed || !strings.Contains(res.Status.Message, want) {
				t.Fatalf("exit %d %+v, want %q", res.ExitCode, res.Status, want)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// The follower gate on a real etcd: endpoint and TLS files read from the
// kubeadm etcd manifest on the node, client-certificate TLS, a real member
// list and status. Nothing faked but the apiserver.
func TestFollowerGateOnRealEtcd(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	e.realEtcd = true
	etcdtest.Start(t, e.node, etcdtest.Config{})
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v lines %q\n%s", res.ExitCode, res.Err, e.lines(), e.logBuf.String())
	}
	e.logHas(t, "msg="+EventControlPlaneHealth, "outcome=ok", "checks=cluster-endpoint-readyz,control-plane-nodes-ready,etcd-members")
}

// External etcd (no etcd manifest on the node): the gate checks the cluster
// endpoint only, whose /readyz carries the apiserver's own etcd check.
func TestFollowerGateWithExternalEtcd(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	e.realEtcd = true
	if err := os.Remove(e.node.Path(paths.EtcdManifest)); err != nil {
		t.Fatal(err)
	}
	res := e.run(Steps{})
	if res.ExitCode != ExitOK || !reflect.DeepEqual(e.lines(), nodeLines) {
		t.Fatalf("exit %d %v lines %q\n%s", res.ExitCode, res.Err, e.lines(), e.logBuf.String())
	}
	e.logHas(t, "msg="+EventControlPlaneHealth, "outcome=ok", "checks=cluster-endpoint-readyz,control-plane-nodes-ready ")
}

// A stacked etcd whose manifest names TLS files that are not there: the
// gate fails within its budget and names the missing file.
func TestFollowerGateNamesABrokenEtcdManifest(t *testing.T) {
	e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	e.realEtcd = true
	e.node.Write(paths.EtcdManifest, etcdtest.Manifest("etcd", "registry.k8s.io/etcd:3.6.8-0", 2379, 2380), 0o600)
	res := e.run(Steps{})
	if res.ExitCode != ExitFailed || res.Status.Reason != ReasonHealthGateTimeout || !strings.Contains(res.Status.Message, "healthcheck-client") && !strings.Contains(res.Status.Message, "etcd ca") {
		t.Fatalf("exit %d %+v", res.ExitCode, res.Status)
	}
	if len(e.lines()) != 0 {
		t.Fatalf("ran %q", e.lines())
	}
}

// The previous kubelet's Ready is not this restart's: with the Node left as
// the old kubelet posted it (Ready, at the target version) and the clock
// past it, verify waits for a post from after the restart and fails at its
// budget naming why; once the restarted kubelet posts, it passes.
func TestVerifyTrustsOnlyAReadyPostedAfterTheKubeletRestart(t *testing.T) {
	for _, posts := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarted kubelet posts %v", posts), func(t *testing.T) {
			e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
			// The old kubelet's last post, already at the target version
			// (a worker whose upgrade node ran in an earlier, cut pass).
			e.api.SetNode("n1", "v1.37.2", true)
			restartAt := time.Time{}
			inner := e.rec.Reply
			e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
				switch c.String() {
				case "/usr/bin/kubeadm upgrade node":
					e.clock.After(3 * time.Second) // kubeadm's run: the restart is later than that post
				case "/usr/bin/systemctl restart kubelet":
					restartAt = e.clock.Now()
					return runner.Result{}, nil
				}
				return inner(ctx, c)
			}
			if posts {
				var once sync.Once
				e.api.OnRequest = func(int) {
					if !restartAt.IsZero() && e.clock.Now().Sub(restartAt) > 10*time.Second {
						once.Do(func() { e.api.SetNode("n1", "v1.37.2", true) })
					}
				}
			}
			res := e.run(Steps{})
			if posts {
				if res.ExitCode != ExitOK {
					t.Fatalf("exit %d %+v", res.ExitCode, res.Status)
				}
				if waited := e.clock.Now().Sub(restartAt); waited < 10*time.Second {
					t.Fatalf("verify passed %s after the restart, before the restarted kubelet posted", waited)
				}
				return
			}
			if res.ExitCode != ExitFailed || res.Status.Reason != ReasonHealthGateTimeout || !strings.Contains(res.Status.Message, "before the kubelet's restart") {
				t.Fatalf("exit %d %+v", res.ExitCode, res.Status)
			}
		})
	}
}
