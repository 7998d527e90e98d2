package e2e

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/system"
	"github.com/kairos-io/provider-kubernetes/tests/e2e/harness"
)

// BenchmarkConvergedReboot is the boot a user feels (issue 16): a
// converged single control plane (1.37, its images already in containerd)
// rebooted, measured from the container's start to (a) the kubelet started
// and (b) the Node Ready again (a kubelet heartbeat after the reboot with
// Ready true), first with the provider's units as shipped, then with them
// masked (the floor: the same node without the provider). It reports the
// medians of both and their ratios; it is a benchmark (make bench), never a
// timed test.
func BenchmarkConvergedReboot(b *testing.B) {
	harness.Require(b)
	tr := osTrees(b, "1.37")
	c := harness.New(b, harness.Options{Base: base(b)})
	nd := node{name: "cp1", ip: "10.0.0.11", role: "init"}
	n, err := c.AddNode(context.Background(), harness.NodeSpec{Name: nd.name, Tree: tr["1.37"]})
	if err != nil {
		b.Fatal(err)
	}
	writeCloudConfig(b, n, clusterSection(newToken(b), nd, nd.ip, "v1.37.2"))
	if code := bootNode(b, n, "init at v1.37.2"); code != 0 {
		b.Fatalf("init: exit %d\n%s", code, reconcileLog(b, n))
	}
	waitNodes(b, n, "v1.37.2", "cp1")

	// b.Loop runs this function once: the cluster above is set up once.
	// Each iteration reboots the node with the provider's units, then with
	// them masked (the floor), then unmasks them.
	units := []string{system.UnitMigrate, system.ImageImport, system.Reconcile, system.Publish}
	systemctl := func(verb string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := n.Output(ctx, append([]string{"systemctl", verb}, units...)...); err != nil {
			b.Fatal(err)
		}
	}
	var withK, withR, floorK, floorR []float64 // seconds
	i := 0
	for b.Loop() {
		i++
		k, r := rebootTimes(b, n)
		withK, withR = append(withK, k.Seconds()), append(withR, r.Seconds())
		progress(b, "reboot %d with the provider: kubelet started after %s, Node Ready after %s", i, k.Round(time.Millisecond), r.Round(time.Millisecond))
		systemctl("mask")
		k, r = rebootTimes(b, n)
		floorK, floorR = append(floorK, k.Seconds()), append(floorR, r.Seconds())
		progress(b, "reboot %d, the floor (provider units masked): kubelet started after %s, Node Ready after %s", i, k.Round(time.Millisecond), r.Round(time.Millisecond))
		systemctl("unmask")
	}
	mk, mr, fk, fr := testutil.Median(withK), testutil.Median(withR), testutil.Median(floorK), testutil.Median(floorR)
	b.ReportMetric(mk, "s-to-kubelet")
	b.ReportMetric(mr, "s-to-ready")
	b.ReportMetric(fk, "floor-s-to-kubelet")
	b.ReportMetric(fr, "floor-s-to-ready")
	b.ReportMetric(mk/fk, "kubelet-ratio")
	b.ReportMetric(mr/fr, "ready-ratio")
	const f = "%.2f s"
	b.Logf("kubelet started (min / median / max): with %s, floor %s; Node Ready: with %s, floor %s",
		testutil.MinMedianMax(withK, f), testutil.MinMedianMax(floorK, f), testutil.MinMedianMax(withR, f), testutil.MinMedianMax(floorR, f))
}

// rebootTimes stops and starts n, and returns how long after the start
// (CLOCK_MONOTONIC, which the container shares with the host) its kubelet
// became active and its Node reported Ready with a heartbeat after the start.
func rebootTimes(b testing.TB, n *harness.Node) (kubelet, ready time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := n.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		b.Fatal(err)
	}
	t0 := time.Duration(ts.Nano())
	wall0 := time.Now()
	if err := n.Start(ctx); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(8 * time.Minute)
	for kubelet == 0 || ready == 0 {
		if time.Now().After(deadline) {
			b.Fatalf("%s: kubelet %s, ready %s after 8 minutes\n%s", n.Name, kubelet, ready, n.Diagnostics(ctx))
		}
		if kubelet == 0 {
			out, _ := n.Output(ctx, "systemctl", "show", "-p", "ActiveEnterTimestampMonotonic", "--value", "kubelet.service")
			if us, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64); err == nil && us > 0 {
				if at := time.Duration(us) * time.Microsecond; at > t0 {
					kubelet = at - t0
				}
			}
		}
		if ready == 0 {
			out, err := n.Output(ctx, "/usr/bin/kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf", "--request-timeout=5s",
				"get", "node", n.Name, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")]}")
			var cond struct {
				Status            string
				LastHeartbeatTime time.Time
			}
			if err == nil && json.Unmarshal([]byte(out), &cond) == nil && cond.Status == "True" && cond.LastHeartbeatTime.After(wall0) {
				ready = time.Since(wall0)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return kubelet, ready
}
