package reconcile

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	corev1 "k8s.io/api/core/v1"
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
	e.logHas(t, "msg="+EventControlPlaneHealth, "outcome=ok", "checks=cluster-endpoint-readyz,etcd-members")
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

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
