package publish

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/metrics"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

func doc(phase string) status.Document {
	return status.Document{Phase: phase, Role: "worker", Member: true, Pin: "v1.37.2", Bundled: "v1.37.2", NodeVersion: "v1.37.2",
		ClusterVersion: "v1.37.2", Time: "2026-11-29T12:00:00Z", BootID: "b-1"}
}

type env struct {
	node *testutil.Node
	api  *testutil.API
	log  *testutil.SyncBuffer
}

func newEnv(t *testing.T) *env {
	e := &env{node: testutil.NewNode(t, "n1"), api: testutil.NewAPI(t, "v1.37.2"), log: &testutil.SyncBuffer{}}
	e.node.Member(e.api)
	e.api.SetNode("n1", "v1.37.2", true)
	return e
}

func (e *env) run(t *testing.T, budget time.Duration) error {
	t.Helper()
	return e.runAt(t, budget, testutil.NewClock())
}

// runAt is run with the clock given.
func (e *env) runAt(t *testing.T, budget time.Duration, clk *testutil.Clock) error {
	t.Helper()
	return Run(context.Background(), Options{Root: e.node.R(), Budget: budget, APIRequest: time.Second, Clock: clk,
		Log: slog.New(slog.NewTextHandler(e.log, nil))})
}

// A pass's annotations and events land on the node's own Node, through
// its own credentials; the events once per pass, however often publish runs.
func TestPublishOnTheNodesOwnNode(t *testing.T) {
	e := newEnv(t)
	d := doc(status.PhaseConverged)
	d.Events = []status.Event{
		{Type: "Normal", Reason: status.EventUpgradeStarted, Message: "v1.36.3 -> v1.37.2", Time: "2026-11-29T11:55:00Z"},
		{Type: "Normal", Reason: status.EventUpgradeFinished, Message: "upgraded to v1.37.2", Time: "2026-11-29T12:00:00Z"},
	}
	if err := status.Write(e.node.R(), d); err != nil {
		t.Fatal(err)
	}
	if err := e.run(t, time.Minute); err != nil {
		t.Fatal(err)
	}
	a := e.api.NodeAnnotations("n1")
	if a[status.AnnotationPrefix+"phase"] != "Converged" || a[status.AnnotationPrefix+"node-version"] != "v1.37.2" {
		t.Fatalf("annotations %v", a)
	}
	evs := e.api.Events()
	if len(evs) != 2 || evs[0].Reason != status.EventUpgradeStarted || evs[1].Reason != status.EventUpgradeFinished ||
		evs[0].InvolvedObject.Kind != "Node" || evs[0].InvolvedObject.Name != "n1" || evs[1].Source.Component != "provider-kubernetes" ||
		!evs[0].FirstTimestamp.Time.Equal(time.Date(2026, 11, 29, 11, 55, 0, 0, time.UTC)) {
		t.Fatalf("events %+v", evs)
	}
	// Again for the same pass: the annotations again, no second event.
	if err := e.run(t, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := len(e.api.Events()); n != 2 {
		t.Fatalf("%d events after publishing the same pass twice", n)
	}
	if !strings.Contains(e.log.String(), "msg=node-publish outcome=ok node=n1") {
		t.Fatalf("log %s", e.log.String())
	}
}

// Issue 16: a converged pass verified at its pin reads nothing from the
// API at boot, so its document has no cluster version. Publish reads it:
// the annotation carries it, and a cluster ahead of the node is a Warning
// Event and a cluster-ahead line, once per pass; a node at the cluster's
// version gets neither.
func TestPublishTellsAClusterAheadOfAConvergedNode(t *testing.T) {
	e := newEnv(t)
	d := doc(status.PhaseConverged)
	d.Pin, d.Bundled, d.NodeVersion, d.ClusterVersion = "v1.36.3", "v1.36.3", "v1.36.3", ""
	if err := status.Write(e.node.R(), d); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := e.run(t, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if a := e.api.NodeAnnotations("n1"); a[status.AnnotationPrefix+"cluster-version"] != "v1.37.2" {
		t.Fatalf("cluster-version annotation %q", a[status.AnnotationPrefix+"cluster-version"])
	}
	evs := e.api.Events()
	if len(evs) != 1 || evs[0].Type != "Warning" || evs[0].Reason != ReasonClusterAhead || !strings.Contains(evs[0].Message, "the cluster is at v1.37.2, ahead of this node's v1.36.3") {
		t.Fatalf("events after publishing one pass twice: %+v", evs)
	}
	if n := strings.Count(e.log.String(), "msg=cluster-ahead node=n1 node_version=v1.36.3 cluster_version=v1.37.2"); n != 1 {
		t.Fatalf("%d cluster-ahead lines:\n%s", n, e.log.String())
	}

	// A control plane's apiserver just started forbids the node's read of
	// kubeadm-config for a while (its RBAC cache is not synced) but lets it
	// annotate its Node: publish keeps trying for the cluster version.
	e = newEnv(t)
	forbidden := 0
	e.api.Forbid = func(method, path string) bool {
		if strings.HasSuffix(path, "/configmaps/kubeadm-config") && forbidden < 3 {
			forbidden++
			return true
		}
		return false
	}
	if err := status.Write(e.node.R(), d); err != nil {
		t.Fatal(err)
	}
	if err := e.run(t, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	if evs := e.api.Events(); forbidden != 3 || len(evs) != 1 || evs[0].Reason != ReasonClusterAhead {
		t.Fatalf("after %d forbidden reads: events %+v\n%s", forbidden, evs, e.log.String())
	}
	// Forbidden for good: published all the same, the reason in the line.
	e = newEnv(t)
	e.api.Forbid = func(method, path string) bool { return strings.HasSuffix(path, "/configmaps/kubeadm-config") }
	if err := status.Write(e.node.R(), d); err != nil {
		t.Fatal(err)
	}
	if err := e.run(t, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	if a := e.api.NodeAnnotations("n1"); a[status.AnnotationPrefix+"phase"] != "Converged" || len(e.api.Events()) != 0 ||
		!strings.Contains(e.log.String(), `msg=node-publish outcome=ok node=n1`) || !strings.Contains(e.log.String(), `detail="cluster version not read: `) {
		t.Fatalf("forbidden for good: annotations %v events %+v\n%s", a, e.api.Events(), e.log.String())
	}

	// At the cluster's version: the annotation, no warning.
	e = newEnv(t)
	d.Pin, d.Bundled, d.NodeVersion, d.BootID = "v1.37.2", "v1.37.2", "v1.37.2", "b-2"
	if err := status.Write(e.node.R(), d); err != nil {
		t.Fatal(err)
	}
	if err := e.run(t, time.Minute); err != nil {
		t.Fatal(err)
	}
	if a := e.api.NodeAnnotations("n1"); a[status.AnnotationPrefix+"cluster-version"] != "v1.37.2" || len(e.api.Events()) != 0 || strings.Contains(e.log.String(), "cluster-ahead") {
		t.Fatalf("at the cluster's version: annotation %q, events %+v\n%s", a[status.AnnotationPrefix+"cluster-version"], e.api.Events(), e.log.String())
	}
}

// The API down: publish keeps trying within its budget, then fails; the
// pass itself never waited on it (it is not part of the pass).
func TestPublishIsBounded(t *testing.T) {
	e := newEnv(t)
	if err := status.Write(e.node.R(), doc(status.PhaseConverged)); err != nil {
		t.Fatal(err)
	}
	e.api.SetDown(true)
	// The retries end when --budget does (reference.md: "exit 1 when the
	// budget ran out"), on the clock publish is given, reporting the last
	// real error (the apiserver answering 503, shutting down), not just that time ran out.
	clk := testutil.NewClock()
	start := clk.Now()
	err := e.runAt(t, 30*time.Second, clk)
	if err == nil || !strings.Contains(err.Error(), "budget exhausted (30s, ") || !strings.Contains(err.Error(), "apiserver is shutting down") {
		t.Fatalf("%v", err)
	}
	if took := clk.Now().Sub(start); took != 30*time.Second {
		t.Fatalf("publish gave up after %s of a 30s budget", took)
	}
	if n := e.api.Requests(); n < 10 {
		t.Fatalf("%d requests in a 30s budget: publish did not keep trying", n)
	}
	if !strings.Contains(e.log.String(), "msg=node-publish outcome=failed") {
		t.Fatalf("log %s", e.log.String())
	}
	// It comes up: the next run publishes.
	e.api.SetDown(false)
	if err := e.run(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestNothingToPublish(t *testing.T) {
	e := newEnv(t)
	if err := e.run(t, time.Minute); !errors.Is(err, ErrNothing) {
		t.Fatalf("no status: %v", err)
	}
	d := doc(status.PhaseRefused)
	d.Member = false
	if err := status.Write(e.node.R(), d); err != nil {
		t.Fatal(err)
	}
	if err := e.run(t, time.Minute); !errors.Is(err, ErrNothing) {
		t.Fatalf("not a member: %v", err)
	}
	if e.api.Requests() != 0 {
		t.Fatalf("%d API requests with nothing to publish", e.api.Requests())
	}
	if e.node.Exists(paths.PublishedMarker) {
		t.Fatal("marker written")
	}
}

// Issue 23: the node name comes from the hostname when no node client
// certificate names it; a hostname that is not an RFC 1123 name (one
// that would step to another object in the URL path, with admin.conf's
// rights) is refused before any request, and not quoted.
func TestAHostnameThatIsNoNodeNameIsRefused(t *testing.T) {
	for _, host := range []string{"../namespaces/kube-system/configmaps/kubeadm-config", "a/b", "-x", "x\x1b[2J"} {
		n := testutil.NewNode(t, "n1")
		api := testutil.NewAPI(t, "v1.37.2")
		n.Admin(api)
		api.SetNode("n1", "v1.37.2", true)
		n.Write(paths.Hostname, host+"\n", 0o644)
		if err := status.Write(n.R(), doc(status.PhaseConverged)); err != nil {
			t.Fatal(err)
		}
		log := &testutil.SyncBuffer{}
		before := api.Requests()
		err := Run(context.Background(), Options{Root: n.R(), Budget: time.Minute, APIRequest: time.Second, Clock: testutil.NewClock(),
			Log: slog.New(slog.NewTextHandler(log, nil))})
		if err == nil || !strings.Contains(err.Error(), "not an RFC 1123 name") || strings.Contains(err.Error(), host) || strings.Contains(log.String(), "kubeadm-config") {
			t.Errorf("%q: %v\n%s", host, err, log.String())
		}
		if got := api.Requests() - before; got != 0 {
			t.Errorf("%q: %d requests sent: %v", host, got, api.Paths())
		}
	}
	// The kubelet registers a mixed-case hostname lower-cased; so does publish.
	n := testutil.NewNode(t, "n1")
	api := testutil.NewAPI(t, "v1.37.2")
	n.Admin(api)
	api.SetNode("n1", "v1.37.2", true)
	n.Write(paths.Hostname, "N1\n", 0o644)
	if err := status.Write(n.R(), doc(status.PhaseConverged)); err != nil {
		t.Fatal(err)
	}
	if err := Run(context.Background(), Options{Root: n.R(), Budget: time.Minute, APIRequest: time.Second, Clock: testutil.NewClock(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		t.Fatal(err)
	}
	if a := api.NodeAnnotations("n1"); a[status.AnnotationPrefix+"phase"] != "Converged" {
		t.Fatalf("annotations %v", a)
	}
}

// The published marker is written under the pass's lock: while a pass (or
// a reset, a restore) holds it, publish leaves /run/provider-kubernetes alone.
func TestPublishWritesTheMarkerUnderThePassLock(t *testing.T) {
	e := newEnv(t)
	if err := status.Write(e.node.R(), doc(status.PhaseConverged)); err != nil {
		t.Fatal(err)
	}
	unlock, err := reconcile.Lock(e.node.R())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.run(t, time.Minute); err != nil {
		t.Fatal(err)
	}
	if e.node.Exists(paths.PublishedMarker) {
		t.Fatal("the marker was written while the lock was held")
	}
	if !strings.Contains(e.log.String(), "marker=\"not written: ") {
		t.Fatalf("log %s", e.log.String())
	}
	unlock()
	if err := e.run(t, time.Minute); err != nil {
		t.Fatal(err)
	}
	if !e.node.Exists(paths.PublishedMarker) {
		t.Fatal("no marker once the lock was free")
	}
	e.node.DocumentedFile(paths.PublishedMarker)
}

// Publish writes the metrics textfile from the last pass's document, API
// or not, where the cluster file's providerConfig says.
func TestPublishWritesMetrics(t *testing.T) {
	e := newEnv(t)
	d := doc(status.PhaseRefused)
	d.Member = false
	if err := status.Write(e.node.R(), d); err != nil {
		t.Fatal(err)
	}
	e.node.ClusterFile("worker", "v1.37.2", "providerConfig:\n  metrics.textfileDir: /srv/metrics\n")
	if err := e.run(t, time.Minute); !errors.Is(err, ErrNothing) {
		t.Fatalf("not a member: %v", err)
	}
	got := e.node.Read("/srv/metrics/" + metrics.File)
	for _, want := range []string{`provider_kubernetes_phase{phase="Refused"} 1`, `provider_kubernetes_outcome{outcome="refused"} 1`, "provider_kubernetes_outcome_timestamp_seconds 1795953600"} {
		if !strings.Contains(got, want) {
			t.Fatalf("no %q in:\n%s", want, got)
		}
	}
}
