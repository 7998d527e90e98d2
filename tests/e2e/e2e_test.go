package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/imagetree"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/tests/e2e/harness"
)

// Budgets of the suite: a reconcile pass on these nodes takes a few minutes
// (an upgrade apply ~3 min on two cores); the provider's own bound is 50.
const (
	reconcileBudget = 20 * time.Minute
	apiBudget       = 5 * time.Minute
)

// progress prints what a person following the run wants to see, as it
// happens (t.Log only shows at the end).
func progress(t *testing.T, format string, a ...any) {
	t.Helper()
	fmt.Fprintf(os.Stderr, "e2e %s | %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

var (
	treesMu  sync.Mutex
	treesDir string
	trees    = map[string]string{}
)

// osTrees builds (from the cache, seconds when warm) the OS image trees of
// the given minors (default 1.36 and 1.37): the A/B images the nodes boot.
// The provider in them is built from this checkout.
func osTrees(t *testing.T, minors ...string) map[string]string {
	if len(minors) == 0 {
		minors = []string{"1.36", "1.37"}
	}
	treesMu.Lock()
	defer treesMu.Unlock()
	if treesDir == "" {
		dir, err := os.MkdirTemp("", "pk-e2e-trees-")
		if err != nil {
			t.Fatal(err)
		}
		treesDir = dir
	}
	for _, minor := range minors {
		if trees[minor] != "" {
			continue
		}
		progress(t, "building the %s OS image tree (cold: ~10-15 min of Kubernetes builds; warm: seconds)", minor)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
		res, err := imagetree.Build(ctx, minor, filepath.Join(treesDir, minor), imagetree.Options{Log: progressWriter{t}, Replace: true, ProviderVersion: "e2e"})
		cancel()
		if err != nil {
			t.Fatalf("build the %s tree: %v", minor, err)
		}
		// The OS image carries containerd's config with its own pause as the
		// sandbox image (as the Earthfile lays it on the Kairos base): 1.35
		// bundles pause 3.10.1, 1.36 and 1.37 pause 3.10.2.
		cfg := strings.Replace(harness.ContainerdConfig, `sandbox_image = "registry.k8s.io/pause:3.10.2"`,
			`sandbox_image = "registry.k8s.io/pause:`+res.Entry.Pause+`"`, 1)
		if err := os.MkdirAll(filepath.Join(res.Dir, "etc/containerd"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(res.Dir, "etc/containerd/config.toml"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		progress(t, "tree %s ready in %s: %s", minor, res.Took.Round(time.Second), res.Dir)
		trees[minor] = res.Dir
	}
	return trees
}

func TestMain(m *testing.M) {
	code := m.Run()
	if treesDir != "" {
		os.RemoveAll(treesDir)
	}
	os.Exit(code)
}

type progressWriter struct{ t *testing.T }

func (p progressWriter) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		progress(p.t, "  %s", l)
	}
	return len(b), nil
}

func base(t *testing.T) harness.Base {
	progress(t, "preparing the Debian node base (cold: debootstrap, ~2 min)")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	b, err := harness.EnsureBase(ctx, harness.BaseOptions{Log: progressWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// clusterSection is the cloud-config cluster: section of one node, as an
// operator writes it. Choices this host needs (cgroup v1: failCgroupV1 false
// and SystemVerification ignored; no registry: imagePullPolicy Never; no
// conntrack sysctls from inside a container) travel in the kubeadm config,
// never as flags of the provider.
type node struct {
	name, ip, role string
}

func clusterSection(token string, n node, endpoint, pin string) []byte {
	reg := fmt.Sprintf(`    name: %s
    criSocket: unix:///run/containerd/containerd.sock
    imagePullPolicy: Never
    ignorePreflightErrors: [SystemVerification]
    kubeletExtraArgs:
    - {name: node-ip, value: %s}
`, n.name, n.ip)
	cfg := fmt.Sprintf(`clusterConfiguration:
  kubernetesVersion: %s
  clusterName: e2e
  controlPlaneEndpoint: %s:6443
  networking:
    podSubnet: 10.244.0.0/16
    serviceSubnet: 10.96.0.0/12
initConfiguration:
  localAPIEndpoint: {advertiseAddress: %s, bindPort: 6443}
  nodeRegistration:
%sjoinConfiguration:
  nodeRegistration:
%s`, pin, endpoint, n.ip, reg, reg)
	if n.role == "controlplane" {
		cfg += fmt.Sprintf("  controlPlane:\n    localAPIEndpoint: {advertiseAddress: %s, bindPort: 6443}\n", n.ip)
	}
	cfg += `upgradeConfiguration:
  apply: {ignorePreflightErrors: [SystemVerification]}
  node: {ignorePreflightErrors: [SystemVerification]}
kubeletConfiguration:
  cgroupDriver: cgroupfs
  failCgroupV1: false
  failSwapOn: false
  imageGCHighThresholdPercent: 100
  evictionHard: {nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
kubeProxyConfiguration:
  mode: iptables
  conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`
	section := map[string]any{"cluster_token": token, "control_plane_host": endpoint, "role": n.role, "config": cfg}
	b, err := yaml.Marshal(section)
	if err != nil {
		panic(err)
	}
	return b
}

func newToken(t *testing.T) string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// setPin writes the node's cluster section with a new pin (the operator's
// half of an upgrade), after checking it is a section the plugin accepts.
func setPin(t *testing.T, n *harness.Node, section []byte) {
	t.Helper()
	c, err := clusterconfig.Parse(section)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Validate(); err != nil {
		t.Fatalf("the test's cluster section is invalid: %v", err)
	}
	if err := n.WriteClusterFile(section); err != nil {
		t.Fatal(err)
	}
}

// bootNode starts a stopped node, waits for this boot's reconcile pass and
// returns its exit code, printing what the provider decided.
func bootNode(t *testing.T, n *harness.Node, what string) int {
	t.Helper()
	progress(t, "%s: booting (%s)", n.Name, what)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	code := reconcileExit(t, n)
	st := nodeStatus(t, n)
	progress(t, "%s: the provider decided %v -> exit %d, status %s %s %s", n.Name, st.Actions, code, st.Phase, st.Reason, st.Refusal)
	return code
}

// reconcile waits for this boot's reconcile pass and returns its exit code.
func reconcileExit(t *testing.T, n *harness.Node) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), reconcileBudget+time.Minute)
	defer cancel()
	st, err := n.WaitUnit(ctx, "provider-kubernetes-reconcile.service", reconcileBudget)
	if err != nil {
		t.Fatalf("%s: reconcile did not finish: %v\n%s", n.Name, err, n.Diagnostics(ctx))
	}
	return st.ExecMainStatus
}

func nodeStatus(t *testing.T, n *harness.Node) status.Document {
	t.Helper()
	b, err := n.ReadFile(paths.StatusMirror)
	if err != nil {
		t.Fatal(err)
	}
	var d status.Document
	if err := yaml.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

func reconcileLog(t *testing.T, n *harness.Node) string {
	t.Helper()
	b, err := n.ReadFile(paths.ReconcileLog)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// kubeadmLog is kubeadm's own output the provider keeps, for failures.
func kubeadmLog(n *harness.Node) string {
	b, err := n.ReadFile(paths.KubeadmLog)
	if err != nil {
		return "(no kubeadm log: " + err.Error() + ")"
	}
	s := string(b)
	if len(s) > 6000 {
		s = s[len(s)-6000:]
	}
	return s
}

// lastPass is the log of the last reconcile pass.
func lastPass(log string) string {
	i := strings.LastIndex(log, "msg=reconcile-start")
	if i < 0 {
		return ""
	}
	return log[strings.LastIndex(log[:i], "\n")+1:]
}

func kubectl(t *testing.T, n *harness.Node, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := n.Output(ctx, append([]string{"/usr/bin/kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf", "--request-timeout=20s"}, args...)...)
	if err != nil {
		t.Fatalf("kubectl %v on %s: %v\n%s", args, n.Name, err, out)
	}
	return []byte(out)
}

// waitNodes polls until the named nodes (all when none) are Ready at version v.
func waitNodes(t *testing.T, via *harness.Node, v string, names ...string) {
	t.Helper()
	deadline := time.Now().Add(apiBudget)
	var last string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := via.Output(ctx, "/usr/bin/kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf", "--request-timeout=20s", "get", "nodes", "-o", "json")
		cancel()
		if err != nil {
			last = err.Error()
		} else if ok, why := nodesAt([]byte(out), v, names); ok {
			return
		} else {
			last = why
		}
		time.Sleep(2 * time.Second)
	}
	t.Fatalf("nodes %v not Ready at %s within %s: %s", names, v, apiBudget, last)
}

func nodesAt(js []byte, v string, names []string) (bool, string) {
	var list struct {
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
			Status   struct {
				NodeInfo   struct{ KubeletVersion string } `json:"nodeInfo"`
				Conditions []struct{ Type, Status string } `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal(js, &list); err != nil {
		return false, err.Error()
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	seen := map[string]bool{}
	for _, it := range list.Items {
		if len(want) > 0 && !want[it.Metadata.Name] {
			continue
		}
		ready := false
		for _, c := range it.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				ready = true
			}
		}
		if it.Status.NodeInfo.KubeletVersion != v || !ready {
			return false, fmt.Sprintf("%s kubelet %s ready=%v", it.Metadata.Name, it.Status.NodeInfo.KubeletVersion, ready)
		}
		seen[it.Metadata.Name] = true
	}
	for _, n := range names {
		if !seen[n] {
			return false, n + " not registered"
		}
	}
	return true, ""
}

func serverVersion(t *testing.T, n *harness.Node) string {
	var v struct {
		ServerVersion struct{ GitVersion string } `json:"serverVersion"`
	}
	if err := json.Unmarshal(kubectl(t, n, "version", "-o", "json"), &v); err != nil {
		t.Fatal(err)
	}
	return v.ServerVersion.GitVersion
}

func manifests(t *testing.T, n *harness.Node) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"} {
		b, err := n.ReadFile(paths.ManifestsDir + "/" + c + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		out[c] = b
	}
	return out
}

// mutating are the log events of actions that change the node or cluster.
var mutating = []string{"msg=init", "msg=join", "msg=upgrade-apply", "msg=upgrade-node", "msg=restart-kubelet", "msg=repair-kubelet", "msg=kubelet-start", "msg=etcd-snapshot"}

// Scenarios 1 and 2 of issue 7 on one control plane: bootstrap at 1.36.3
// through the provider, refusals on the running cluster, the upgrade to
// 1.37.2, and a downgrade refused afterwards. Only the provider's units
// drive kubeadm: the test writes cloud-config, swaps the OS tree and reboots.
func TestSingleControlPlaneUpgrade(t *testing.T) {
	harness.Require(t)
	start := time.Now()
	tr := osTrees(t)
	c := harness.New(t, harness.Options{Base: base(t)})
	token := newToken(t)
	cp1 := node{name: "cp1", ip: "10.0.0.11", role: "init"}
	n, err := c.AddNode(context.Background(), harness.NodeSpec{Name: "cp1", Tree: tr["1.36"]})
	if err != nil {
		t.Fatal(err)
	}
	boot := func(what string) int { t.Helper(); return bootNode(t, n, what) }
	stop := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := n.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Bootstrap at 1.36.3.
	setPin(t, n, clusterSection(token, cp1, cp1.ip, "v1.36.3"))
	if code := boot("1.36 image, pin v1.36.3: init"); code != 0 {
		t.Fatalf("init failed: exit %d\n%s", code, reconcileLog(t, n))
	}
	waitNodes(t, n, "v1.36.3", "cp1")
	if v := serverVersion(t, n); v != "v1.36.3" {
		t.Fatalf("apiserver %s", v)
	}
	progress(t, "cp1: cluster up at v1.36.3 after %s", time.Since(start).Round(time.Second))
	t.Logf("bootstrap: %s, peak memory %d MiB", time.Since(start).Round(time.Second), n.PeakMemory()>>20)

	// Refusal on the running cluster: the pin bumped, the image not.
	before := manifests(t, n)
	stop()
	setPin(t, n, clusterSection(token, cp1, cp1.ip, "v1.37.2"))
	refused(t, n, boot("1.36 image, pin v1.37.2: pin newer than image"), "PinNewerThanImage", before)

	// The upgrade: the 1.37 image and the 1.37 pin.
	upStart := time.Now()
	stop()
	if err := n.SetTree(tr["1.37"]); err != nil {
		t.Fatal(err)
	}
	if code := boot("1.37 image, pin v1.37.2: upgrade apply"); code != 0 {
		t.Fatalf("upgrade failed: exit %d\n%s\nkubeadm:\n%s", code, lastPass(reconcileLog(t, n)), kubeadmLog(n))
	}
	if v := serverVersion(t, n); v != "v1.37.2" {
		t.Fatalf("apiserver %s after the upgrade", v)
	}
	waitNodes(t, n, "v1.37.2", "cp1")
	st := nodeStatus(t, n)
	if st.Phase != status.PhaseConverged || st.NodeVersion != "v1.37.2" {
		t.Fatalf("status %+v", st)
	}
	log := reconcileLog(t, n)
	if k := strings.Count(log, "etcd-snapshot outcome="); k != 1 || !strings.Contains(log, "etcd-snapshot outcome=skipped-encryption-unconfirmed") {
		t.Fatalf("want exactly one etcd-snapshot outcome=skipped-encryption-unconfirmed line, got %d:\n%s", k, log)
	}
	pass := lastPass(log)
	for _, want := range []string{"msg=upgrade-apply outcome=ok", "msg=restart-kubelet outcome=ok", "msg=verify outcome=ok", "msg=reconcile-done outcome=converged"} {
		if !strings.Contains(pass, want) {
			t.Fatalf("upgrade pass lacks %q:\n%s", want, pass)
		}
	}
	progress(t, "cp1: upgraded to v1.37.2 in %s", time.Since(upStart).Round(time.Second))
	t.Logf("upgrade: %s, peak memory %d MiB", time.Since(upStart).Round(time.Second), n.PeakMemory()>>20)

	// Refusals on the upgraded cluster: a downgrade (the older image with the
	// older pin) and, again, a pin newer than the image.
	before = manifests(t, n)
	stop()
	if err := n.SetTree(tr["1.36"]); err != nil {
		t.Fatal(err)
	}
	setPin(t, n, clusterSection(token, cp1, cp1.ip, "v1.36.3"))
	refused(t, n, boot("1.36 image, pin v1.36.3: downgrade"), "Downgrade", before)

	// Back on the 1.37 image with the 1.37 pin: converged, nothing runs.
	stop()
	if err := n.SetTree(tr["1.37"]); err != nil {
		t.Fatal(err)
	}
	setPin(t, n, clusterSection(token, cp1, cp1.ip, "v1.37.2"))
	if code := boot("1.37 image, pin v1.37.2: converged"); code != 0 {
		t.Fatalf("converged boot: exit %d", code)
	}
	pass = lastPass(reconcileLog(t, n))
	for _, m := range mutating {
		if strings.Contains(pass, m+" ") {
			t.Fatalf("a converged boot ran %s:\n%s", m, pass)
		}
	}
	t.Logf("whole scenario: %s, cp1 peak memory %d MiB", time.Since(start).Round(time.Second), n.PeakMemory()>>20)
}

// refused asserts a refusal boot: exit 3, UpgradeRefused with the code, a
// refuse-upgrade line, no mutating action in that pass, manifests unchanged.
func refused(t *testing.T, n *harness.Node, code int, want string, before map[string][]byte) {
	t.Helper()
	if code != 3 {
		t.Fatalf("exit %d, want 3 (refused)\n%s", code, lastPass(reconcileLog(t, n)))
	}
	st := nodeStatus(t, n)
	if st.Reason != "UpgradeRefused" || st.Refusal != want {
		t.Fatalf("status %+v, want UpgradeRefused %s", st, want)
	}
	pass := lastPass(reconcileLog(t, n))
	if !strings.Contains(pass, "msg=refuse-upgrade code="+want) {
		t.Fatalf("no refuse-upgrade line for %s:\n%s", want, pass)
	}
	for _, m := range mutating {
		if strings.Contains(pass, m+" ") {
			t.Fatalf("a refused pass ran %s:\n%s", m, pass)
		}
	}
	after := manifests(t, n)
	for k, b := range before {
		if !bytes.Equal(b, after[k]) {
			t.Fatalf("%s manifest changed by a refused pass", k)
		}
	}
}

// The skip-level refusal of issue 7's scenario 2 on a running cluster: a
// control plane at 1.35.4 booted into the 1.37 image with the pin at
// v1.37.2 is refused before anything runs (one minor at a time).
func TestSkipLevelRefusal(t *testing.T) {
	harness.Require(t)
	tr := osTrees(t, "1.35", "1.37")
	c := harness.New(t, harness.Options{Base: base(t)})
	token := newToken(t)
	cp1 := node{name: "cp1", ip: "10.0.0.11", role: "init"}
	n, err := c.AddNode(context.Background(), harness.NodeSpec{Name: "cp1", Tree: tr["1.35"]})
	if err != nil {
		t.Fatal(err)
	}
	boot := func(what string) int { t.Helper(); return bootNode(t, n, what) }
	setPin(t, n, clusterSection(token, cp1, cp1.ip, "v1.35.4"))
	if code := boot("1.35 image, pin v1.35.4: init"); code != 0 {
		t.Fatalf("init at 1.35: exit %d\n%s", code, reconcileLog(t, n))
	}
	waitNodes(t, n, "v1.35.4", "cp1")
	before := manifests(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.SetTree(tr["1.37"]); err != nil {
		t.Fatal(err)
	}
	setPin(t, n, clusterSection(token, cp1, cp1.ip, "v1.37.2"))
	refused(t, n, boot("1.37 image, pin v1.37.2: skip-level"), "SkipLevel", before)
}
