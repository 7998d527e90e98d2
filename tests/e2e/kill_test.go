package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/tests/e2e/harness"
)

// A real kill (issue 17): the node is cut like a power cut (SIGKILL to the
// container's PID 1: every process dies, /run is lost with the tmpfs) the
// moment an observed state says the upgrade reached a point, never on a
// timer. The state is read on the host from the node's persistent layer
// (the overlay's upper dir), polled every 10 ms.

// killPoint is a state of the node worth cutting the power at.
type killPoint struct {
	name string
	// reached reads the node's persistent state and the reconcile log of
	// this boot's pass.
	reached func(u upper, pass string) bool
	// landed checks, after the kill, the state the cut must have left
	// (read from the persistent layer): only facts that cannot have moved
	// on between the trigger and the kill, so a failure is a kill that
	// fired at the wrong place, not a race.
	landed func(u upper, pass string) error
}

// upper is a node's persistent layer, read on the host.
type upper string

// file reads a node path ("" when absent).
func (u upper) file(p string) string {
	b, err := os.ReadFile(filepath.Join(string(u), p))
	if err != nil {
		return ""
	}
	return string(b)
}

// glob matches a node path pattern.
func (u upper) glob(p string) []string {
	m, _ := filepath.Glob(filepath.Join(string(u), p))
	return m
}

// killAt boots n and cuts it when kp is reached; it returns what had
// changed when the kill landed (the node's manifests' images, the pass's
// last log lines), for the record.
func killAt(t testing.TB, n *harness.Node, kp killPoint) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	before := passCount(n)
	progress(t, "%s: booting, to be cut %s", n.Name, kp.name)
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	u := upper(n.Upper())
	for {
		log := u.file(paths.ReconcileLog)
		pass := ""
		if strings.Count(log, "msg=reconcile-start") > before {
			pass = lastPass(log)
		}
		if pass != "" && kp.reached(u, pass) {
			break
		}
		if strings.Contains(pass, "msg=reconcile-done") {
			t.Fatalf("%s: the pass ended before %s:\n%s", n.Name, kp.name, pass)
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: never reached %s:\n%s", n.Name, kp.name, pass)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := n.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	// What the kill cut: read after, from the persistent layer.
	var rec []string
	for _, c := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if img := manifestImage(u.file(paths.ManifestsDir + "/" + c + ".yaml")); img != "" {
			rec = append(rec, c+"="+img)
		}
	}
	pass := lastPass(u.file(paths.ReconcileLog))
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(pass), "\n") {
		if i := strings.Index(l, "msg="); i >= 0 {
			lines = append(lines, strings.Fields(l[i:])[0])
		}
	}
	what := "manifests " + strings.Join(rec, " ") + "; the pass had logged " + strings.Join(lines, ",")
	progress(t, "%s: cut %s: %s", n.Name, kp.name, what)
	if strings.Contains(pass, "msg=reconcile-done") {
		t.Fatalf("%s: cut %s, but the pass had already ended: %s", n.Name, kp.name, what)
	}
	if err := kp.landed(u, pass); err != nil {
		t.Fatalf("%s: cut %s landed elsewhere: %v (%s)", n.Name, kp.name, err, what)
	}
	return what
}

// imageOf is the image tag of a control-plane manifest on the persistent
// layer ("" when absent).
func (u upper) imageOf(component string) string {
	img := manifestImage(u.file(paths.ManifestsDir + "/" + component + ".yaml"))
	if i := strings.LastIndex(img, ":"); i >= 0 {
		return img[i+1:]
	}
	return ""
}

// landedChecks builds a landed function from expected manifest tags
// (component -> tag prefix) and lines the pass must and must not have
// logged.
func landedChecks(tags map[string]string, logged, notLogged []string) func(u upper, pass string) error {
	return func(u upper, pass string) error {
		for c, want := range tags {
			if got := u.imageOf(c); !strings.HasPrefix(got, want) {
				return fmt.Errorf("%s manifest at %q, want %s", c, got, want)
			}
		}
		for _, l := range logged {
			if !strings.Contains(pass, l) {
				return fmt.Errorf("the pass had not logged %q", l)
			}
		}
		for _, l := range notLogged {
			if strings.Contains(pass, l) {
				return fmt.Errorf("the pass had already logged %q", l)
			}
		}
		return nil
	}
}

// manifestImage is the image of a static pod manifest's first container.
func manifestImage(m string) string {
	for _, l := range strings.Split(m, "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "image: "); ok {
			return s
		}
	}
	return ""
}

// Kill points of the first control plane's apply, a follower's and a
// worker's upgrade node. Each landed check holds what kubeadm cannot have
// changed within the few milliseconds between the trigger and the kill:
// after it replaces a manifest it waits for that static pod to restart
// (seconds) before it touches the next one.
var (
	killEtcdManifestReplaced = killPoint{name: "after kubeadm upgrade apply replaced the etcd manifest", reached: func(u upper, pass string) bool {
		return strings.Contains(pass, "msg=etcd-snapshot") && strings.Contains(u.file(paths.EtcdManifest), "etcd:3.7.")
	}, landed: landedChecks(map[string]string{"etcd": "3.7.", "kube-apiserver": "v1.36.3", "kube-controller-manager": "v1.36.3", "kube-scheduler": "v1.36.3"},
		[]string{"msg=etcd-snapshot outcome="}, []string{"msg=upgrade-apply outcome="})}
	killAPIServerManifestReplaced = killPoint{name: "after kubeadm upgrade apply replaced the apiserver manifest", reached: func(u upper, pass string) bool {
		return strings.Contains(u.file(paths.APIServerManifest), "kube-apiserver:v1.37.2")
	}, landed: landedChecks(map[string]string{"etcd": "3.7.", "kube-apiserver": "v1.37.2", "kube-controller-manager": "v1.36.3", "kube-scheduler": "v1.36.3"},
		nil, []string{"msg=upgrade-apply outcome="})}
	killApplyReturned = killPoint{name: "after upgrade apply returned, before the kubelet restart", reached: func(_ upper, pass string) bool {
		return strings.Contains(pass, "msg=upgrade-apply outcome=ok")
	}, landed: landedChecks(map[string]string{"etcd": "3.7.", "kube-apiserver": "v1.37.2", "kube-controller-manager": "v1.37.2", "kube-scheduler": "v1.37.2"},
		[]string{"msg=upgrade-apply outcome=ok"}, []string{"msg=verify outcome="})}
	killFollowerManifestsMoved = killPoint{name: "during a follower's upgrade node, after its apiserver manifest moved", reached: func(u upper, pass string) bool {
		return strings.Contains(pass, "msg=control-plane-health outcome=ok") && strings.Contains(u.file(paths.APIServerManifest), "kube-apiserver:v1.37.2")
	}, landed: landedChecks(map[string]string{"kube-apiserver": "v1.37.2", "kube-controller-manager": "v1.36.3", "kube-scheduler": "v1.36.3"},
		[]string{"msg=control-plane-health outcome=ok"}, []string{"msg=upgrade-node outcome="})}
	// kubeadm's worker upgrade node ends milliseconds after this backup
	// (it writes config.yaml and exits), so whether the provider had logged
	// its outcome is a race: only the gate before it is held.
	killWorkerUpgradeNode = killPoint{name: "during a worker's upgrade node, after kubeadm backed up its kubelet config", reached: func(u upper, pass string) bool {
		return strings.Contains(pass, "msg=control-planes-at-target outcome=ok") && len(u.glob(paths.KubeadmTmpDir+"/kubeadm-kubelet-config*")) > 0
	}, landed: landedChecks(nil, []string{"msg=control-planes-at-target outcome=ok"}, nil)}
)
