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
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/imagelock"
	"github.com/kairos-io/provider-kubernetes/internal/imagetree"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/kairos"
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
func progress(t testing.TB, format string, a ...any) {
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
func osTrees(t testing.TB, minors ...string) map[string]string {
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
		const sandbox = `sandbox = "registry.k8s.io/pause:3.10.2"`
		if !strings.Contains(harness.ContainerdConfig, sandbox) {
			t.Fatalf("harness.ContainerdConfig names no %s", sandbox)
		}
		cfg := strings.Replace(harness.ContainerdConfig, sandbox, `sandbox = "registry.k8s.io/pause:`+res.Entry.Pause+`"`, 1)
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
	// The Kairos VM test (tests/kairosvm) and this suite take turns: both
	// keep the two cores busy with budgets of their own.
	release, err := testutil.Heavy()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: the heavy-test lock: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	release()
	if treesDir != "" {
		os.RemoveAll(treesDir)
	}
	os.Exit(code)
}

type progressWriter struct{ t testing.TB }

func (p progressWriter) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		progress(p.t, "  %s", l)
	}
	return len(b), nil
}

func base(t testing.TB) harness.Base {
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
	// clusterExtra is more of clusterConfiguration (lines indented by
	// two spaces), for one scenario's cluster.
	clusterExtra string
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
%sinitConfiguration:
  localAPIEndpoint: {advertiseAddress: %s, bindPort: 6443}
  nodeRegistration:
%sjoinConfiguration:
  nodeRegistration:
%s`, pin, endpoint, n.clusterExtra, n.ip, reg, reg)
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

func newToken(t testing.TB) string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// cloudConfig is the operator's /oem cloud-config holding a cluster section.
func cloudConfig(section []byte) []byte {
	var b bytes.Buffer
	b.WriteString("#cloud-config\n# The operator's cloud-config: on every boot Kairos's initramfs stage sends it\n# to the provider's plugin (agent.boot), and the boot stage runs what that wrote.\ncluster:\n")
	for _, l := range strings.Split(strings.TrimRight(string(section), "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.Bytes()
}

// accepted checks that the plugin would accept cc: Kairos's schema, the
// section's validation and its providerConfig.
func accepted(t testing.TB, cc []byte) {
	t.Helper()
	c, _, err := clusterconfig.ParseCloudConfig(cc)
	if err == nil && c == nil {
		err = fmt.Errorf("no cluster: section")
	}
	if err == nil {
		_, err = c.Validate()
	}
	if err == nil {
		_, err = reconcile.DefaultBudgets().WithOverrides(c.ProviderConfig)
	}
	if err != nil {
		t.Fatalf("the test's cloud-config would be refused: %v\n%s", err, cc)
	}
}

// writeCloudConfig writes the node's /oem cloud-config with this cluster
// section, as an operator installs a node.
func writeCloudConfig(t testing.TB, n *harness.Node, section []byte) {
	t.Helper()
	cc := cloudConfig(section)
	accepted(t, cc)
	if err := n.WriteCloudConfig(cc); err != nil {
		t.Fatal(err)
	}
}

var pinLine = regexp.MustCompile(`(kubernetesVersion: )v[0-9]+\.[0-9]+\.[0-9]+`)

// bumpPin is the operator's half of an upgrade (upgrades.md: "Bump the pin
// in the node's cloud-config, which on an installed node is under /oem"):
// an edit of the one kubernetesVersion line of /oem/90_custom.yaml.
func bumpPin(t testing.TB, n *harness.Node, pin string) {
	t.Helper()
	err := n.EditCloudConfig(func(b []byte) ([]byte, error) {
		if k := len(pinLine.FindAll(b, -1)); k != 1 {
			return nil, fmt.Errorf("%d kubernetesVersion lines, want 1", k)
		}
		out := pinLine.ReplaceAll(b, []byte("${1}"+pin))
		accepted(t, out)
		return out, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// setBudget adds (or, with value "", removes) one budget key of the
// section's providerConfig (a flat map of strings in Kairos's schema).
func setBudget(t testing.TB, n *harness.Node, name, value string) {
	t.Helper()
	setProviderKey(t, n, "budget."+name, value)
}

// setProviderKey adds (or, with value "", removes) one key of the
// section's providerConfig.
func setProviderKey(t testing.TB, n *harness.Node, key, value string) {
	t.Helper()
	block := "  providerConfig:\n    " + key + ": "
	err := n.EditCloudConfig(func(b []byte) ([]byte, error) {
		s := string(b)
		if i := strings.Index(s, block); i >= 0 {
			j := i + len(block) + strings.IndexByte(s[i+len(block):], '\n') + 1
			s = s[:i] + s[j:]
		}
		if value != "" {
			s += block + value + "\n"
		}
		accepted(t, []byte(s))
		return []byte(s), nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// bootNode starts a stopped node, waits for this boot's reconcile pass and
// returns its exit code, printing what the provider decided. Every boot
// checks the Kairos chain: Kairos's initramfs stage ran, the plugin's yip
// config is 0600 root, Kairos's boot stage wrote the cluster file from the
// /oem cloud-config and finished before the pass started, and the boot ran
// exactly one pass.
func bootNode(t testing.TB, n *harness.Node, what string) int {
	t.Helper()
	progress(t, "%s: booting (%s)", n.Name, what)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	before := passCount(n)
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	st := reconcileUnit(t, n)
	if st.Skipped {
		t.Fatalf("%s: the reconcile unit was skipped: no cluster file and no plugin output\n%s", n.Name, n.Diagnostics(ctx))
	}
	kairosChain(t, n, st)
	if k := passCount(n) - before; k != 1 {
		t.Fatalf("%s: this boot ran %d reconcile passes, want exactly 1\n%s", n.Name, k, lastPass(reconcileLog(t, n)))
	}
	ds := nodeStatus(t, n)
	progress(t, "%s: the provider decided %v -> exit %d, status %s %s %s", n.Name, ds.Actions, st.ExecMainStatus, ds.Phase, ds.Reason, ds.Refusal)
	return st.ExecMainStatus
}

// passCount is the number of passes in the node's reconcile log.
func passCount(n *harness.Node) int {
	b, err := n.ReadFile(paths.ReconcileLog)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "msg=reconcile-start")
}

// kairosChain checks, in the running node, what Kairos's own agent did
// this boot before the provider's pass (st, the reconcile unit's state).
func kairosChain(t testing.TB, n *harness.Node, st harness.UnitState) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, u := range []string{kairos.InitramfsUnitName, kairos.CosSetupBoot} {
		us, err := n.UnitState(ctx, u)
		if err != nil || us.Result != "success" || us.ExitedUS == 0 {
			t.Fatalf("%s: %s: %v %v\n%s", n.Name, u, us, err, n.Diagnostics(ctx))
		}
		if u == kairos.CosSetupBoot && st.StartedUS < us.ExitedUS {
			t.Fatalf("%s: the pass started at %dus, before Kairos's boot stage finished at %dus", n.Name, st.StartedUS, us.ExitedUS)
		}
	}
	for _, p := range []string{paths.ClusterYipFile, paths.ClusterFile} {
		out, err := n.Output(ctx, "stat", "-c", "%a %u %g %F", p)
		if err != nil || out != "600 0 0 regular file" {
			t.Fatalf("%s: %s: %q %v, want a regular 0600 root:root file", n.Name, p, out, err)
		}
	}
	cc, err := n.ReadFile(kairos.OEMCloudConfig)
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := clusterconfig.ParseCloudConfig(cc)
	if err != nil || want == nil {
		t.Fatalf("%s: %s: %v", n.Name, kairos.OEMCloudConfig, err)
	}
	b, err := n.ReadFile(paths.ClusterFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := clusterconfig.Parse(b)
	if err != nil || fmt.Sprint(*got) != fmt.Sprint(*want) {
		t.Fatalf("%s: the boot stage's cluster file is not the /oem section: %v", n.Name, err)
	}
	// One start of the unit in this boot's journal (a second start,
	// merged or not, would show).
	if k := unitStarts(t, n); k != 1 {
		t.Fatalf("%s: the reconcile unit started %d times this boot", n.Name, k)
	}
}

// unitStarts counts this boot's starts of the reconcile unit in its journal.
func unitStarts(t testing.TB, n *harness.Node) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	j, err := n.UnitJournal(ctx, paths.ReconcileUnit)
	if err != nil {
		t.Fatal(err)
	}
	k := 0
	for _, l := range strings.Split(j, "\n") {
		if strings.HasPrefix(l, "Starting ") {
			k++
		}
	}
	return k
}

// reconcileUnit waits for this boot's reconcile unit to finish (or be
// skipped by its conditions) and returns its state.
func reconcileUnit(t testing.TB, n *harness.Node) harness.UnitState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), reconcileBudget+time.Minute)
	defer cancel()
	st, err := n.WaitUnit(ctx, paths.ReconcileUnit, reconcileBudget)
	if err != nil {
		t.Fatalf("%s: reconcile did not finish: %v\n%s", n.Name, err, n.Diagnostics(ctx))
	}
	return st
}

func nodeStatus(t testing.TB, n *harness.Node) status.Document {
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

func reconcileLog(t testing.TB, n *harness.Node) string {
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

func kubectl(t testing.TB, n *harness.Node, args ...string) []byte {
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
func waitNodes(t testing.TB, via *harness.Node, v string, names ...string) {
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

func serverVersion(t testing.TB, n *harness.Node) string {
	var v struct {
		ServerVersion struct{ GitVersion string } `json:"serverVersion"`
	}
	if err := json.Unmarshal(kubectl(t, n, "version", "-o", "json"), &v); err != nil {
		t.Fatal(err)
	}
	return v.ServerVersion.GitVersion
}

func manifests(t testing.TB, n *harness.Node) map[string][]byte {
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
	tr := osTrees(t, "1.35", "1.36", "1.37")
	c := harness.New(t, harness.Options{Base: base(t)})
	token := newToken(t)
	// Certificates short-lived (kubeadm v1beta4's certificateValidityPeriod)
	// for the renewal at the end.
	cp1 := node{name: "cp1", ip: "10.0.0.11", role: "init", clusterExtra: fmt.Sprintf("  certificateValidityPeriod: %s\n", certValidity)}
	n, err := c.AddNode(context.Background(), harness.NodeSpec{Name: "cp1", Tree: tr["1.35"]})
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
	setTree := func(minor string) {
		t.Helper()
		if err := n.SetTree(tr[minor]); err != nil {
			t.Fatal(err)
		}
	}

	// Bootstrap at 1.35.4, the oldest minor of the window.
	writeCloudConfig(t, n, clusterSection(token, cp1, cp1.ip, "v1.35.4"))
	if code := boot("1.35 image, pin v1.35.4: init"); code != 0 {
		t.Fatalf("init at 1.35: exit %d\n%s", code, reconcileLog(t, n))
	}
	waitNodes(t, n, "v1.35.4", "cp1")
	progress(t, "cp1: cluster up at v1.35.4 after %s", time.Since(start).Round(time.Second))

	// Skip-level (issue 7's scenario 2): the 1.37 image with the 1.37 pin on
	// a 1.35 cluster is refused before anything runs, one minor at a time.
	before := manifests(t, n)
	stop()
	setTree("1.37")
	bumpPin(t, n, "v1.37.2")
	refused(t, n, boot("1.37 image, pin v1.37.2: skip-level"), "SkipLevel", before)

	// As troubleshooting.md says to go on: the next minor first, the real
	// 1.35 -> 1.36 edge (etcd 3.6.6 -> 3.6.8, CoreDNS moved by kubeadm).
	upStart := time.Now()
	stop()
	setTree("1.36")
	bumpPin(t, n, "v1.36.3")
	if code := boot("1.36 image, pin v1.36.3: upgrade apply from 1.35"); code != 0 {
		t.Fatalf("1.35 -> 1.36 upgrade failed: exit %d\n%s\nkubeadm:\n%s", code, lastPass(reconcileLog(t, n)), kubeadmLog(n))
	}
	if v := serverVersion(t, n); v != "v1.36.3" {
		t.Fatalf("apiserver %s after the 1.36 upgrade", v)
	}
	waitNodes(t, n, "v1.36.3", "cp1")
	upgraded(t, n, "v1.36.3")
	progress(t, "cp1: upgraded to v1.36.3 in %s", time.Since(upStart).Round(time.Second))
	t.Logf("1.35 -> 1.36: %s, peak memory %d MiB", time.Since(upStart).Round(time.Second), n.PeakMemory()>>20)

	// Refusal on the running cluster: the pin bumped, the image not.
	before = manifests(t, n)
	stop()
	bumpPin(t, n, "v1.37.2")
	refused(t, n, boot("1.36 image, pin v1.37.2: pin newer than image"), "PinNewerThanImage", before)

	// The upgrade: the 1.37 image and the 1.37 pin, the node rebooted as an
	// operator does (issue 26 item 2: a pod with a preStop hook is
	// terminated gracefully on the way down).
	startGracefulPod(t, n, "1.36")
	startOperatorRebootPod(t, n, tr["1.36"])
	upStart = time.Now()
	down := rebootByOperator(t, n)
	progress(t, "cp1: rebooted by kairos-operator's reboot Pod; from its sentinel to the node down: %s", down.Round(100*time.Millisecond))
	setTree("1.37")
	if code := boot("1.37 image, pin v1.37.2: upgrade apply"); code != 0 {
		t.Fatalf("upgrade failed: exit %d\n%s\nkubeadm:\n%s", code, lastPass(reconcileLog(t, n)), kubeadmLog(n))
	}
	if v := serverVersion(t, n); v != "v1.37.2" {
		t.Fatalf("apiserver %s after the upgrade", v)
	}
	waitNodes(t, n, "v1.37.2", "cp1")
	upgraded(t, n, "v1.37.2")
	terminatedGracefully(t, n)
	operatorCountedRebooted(t, n)
	kubectl(t, n, "delete", "pod", gracefulPod, "--wait=false")
	if k := strings.Count(reconcileLog(t, n), "etcd-snapshot outcome="); k != 2 {
		t.Fatalf("want one etcd-snapshot line per upgrade (two), got %d:\n%s", k, reconcileLog(t, n))
	}
	progress(t, "cp1: upgraded to v1.37.2 in %s", time.Since(upStart).Round(time.Second))
	t.Logf("upgrade: %s, peak memory %d MiB", time.Since(upStart).Round(time.Second), n.PeakMemory()>>20)

	// Refusals on the upgraded cluster: a downgrade (the older image with the
	// older pin) and, again, a pin newer than the image.
	before = manifests(t, n)
	stop()
	setTree("1.36")
	bumpPin(t, n, "v1.36.3")
	refused(t, n, boot("1.36 image, pin v1.36.3: downgrade"), "Downgrade", before)

	// Back on the 1.37 image with the 1.37 pin: converged, nothing runs.
	stop()
	setTree("1.37")
	bumpPin(t, n, "v1.37.2")
	if code := boot("1.37 image, pin v1.37.2: converged"); code != 0 {
		t.Fatalf("converged boot: exit %d", code)
	}
	pass := lastPass(reconcileLog(t, n))
	for _, m := range mutating {
		if strings.Contains(pass, m+" ") {
			t.Fatalf("a converged boot ran %s:\n%s", m, pass)
		}
	}

	// Boot order on real systemd: five boots in a row of the converged
	// node, each exactly one pass, after Kairos's boot stage, no refusal.
	for i := 1; i <= 5; i++ {
		stop()
		refusalsBefore := strings.Count(reconcileLog(t, n), "msg=refuse-")
		if code := boot(fmt.Sprintf("converged, boot %d of 5", i)); code != 0 {
			t.Fatalf("converged boot %d: exit %d\n%s", i, code, lastPass(reconcileLog(t, n)))
		}
		if k := strings.Count(reconcileLog(t, n), "msg=refuse-") - refusalsBefore; k != 0 {
			t.Fatalf("converged boot %d logged %d refusal lines", i, k)
		}
		kubeletRanThrough(t, n, fmt.Sprintf("converged boot %d", i))
	}

	// Issue 26 item 1: the opt-in renewal on the running control plane.
	renewOnRunningControlPlane(t, c, n, cp1.ip, "v1.37.2", boot, stop)
	t.Logf("whole scenario: %s, cp1 peak memory %d MiB", time.Since(start).Round(time.Second), n.PeakMemory()>>20)
}

// kubeletRanThrough waits for the boot's last job (publish, after the pass)
// and asserts the kubelet started once and is still that process: on a
// converged boot nothing stops or restarts it (issue 16: a restart costs
// the node 10 s of Ready; the harness once made the console getty's
// hangup kill it when the boot ended after the kubelet started).
func kubeletRanThrough(t testing.TB, n *harness.Node, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	if st, err := n.WaitUnit(ctx, "provider-kubernetes-publish.service", 6*time.Minute); err != nil {
		t.Fatalf("%s: publish %v %v", what, st, err)
	}
	state, _ := n.Output(ctx, "systemctl", "is-system-running", "--wait")
	time.Sleep(2 * time.Second) // a process killed at the boot's end is gone by now
	out, err := n.Output(ctx, "systemctl", "show", "-p", "NRestarts", "-p", "ActiveState", "-p", "SubState", "kubelet.service")
	props := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(l, "=")
		props[k] = v
	}
	if err != nil || props["NRestarts"] != "0" || props["ActiveState"] != "active" || props["SubState"] != "running" {
		j, _ := n.Output(ctx, "journalctl", "-b", "--no-pager", "-o", "short-monotonic", "-u", "kubelet.service", "-n", "15")
		t.Fatalf("%s (system %s): kubelet %q %v, want started once and running\n%s", what, state, out, err, j)
	}
	j, _ := n.Output(ctx, "journalctl", "-b", "--no-pager", "-o", "cat", "-u", "kubelet.service")
	if k := strings.Count(j, "Started kubelet.service"); k != 1 || strings.Contains(j, "Deactivated successfully") {
		t.Fatalf("%s: the kubelet started %d times or exited in this boot:\n%s", what, k, j)
	}
}

// refused asserts a refusal boot: exit 3, UpgradeRefused with the code, a
// refuse-upgrade line, no mutating action in that pass, manifests unchanged.
func refused(t testing.TB, n *harness.Node, code int, want string, before map[string][]byte) {
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

// upgraded asserts the pass that just ran upgraded this first control plane
// to want: status Converged at want, and exactly one of each step's
// outcome lines in that pass, the pre-upgrade snapshot's being
// skipped-encryption-unconfirmed (the nodes' /usr/local is not on dm-crypt)
// and the bundled images' check before kubeadm finding them all present and
// pinned; and that containerd holds exactly the booted image's bundled
// images pinned (the boot's import-images released the previous minor's).
func upgraded(t testing.TB, n *harness.Node, want string) {
	t.Helper()
	st := nodeStatus(t, n)
	if st.Phase != status.PhaseConverged || st.NodeVersion != want {
		t.Fatalf("status %+v, want Converged at %s", st, want)
	}
	pass := lastPass(reconcileLog(t, n))
	// The bundled images, imported by the boot's import-images, are only
	// listed again before kubeadm.
	for _, line := range []string{"msg=etcd-snapshot outcome=skipped-encryption-unconfirmed",
		"msg=import-images outcome=ok imported=0 present=7 refused=0 failed=0 pinned=0 released=0 pin_failed=0", "msg=upgrade-apply outcome=ok",
		"msg=restart-kubelet outcome=ok", "msg=verify outcome=ok", "msg=reconcile-done outcome=converged"} {
		if k := strings.Count(pass, line); k != 1 {
			t.Fatalf("the upgrade pass to %s has %d %q lines, want 1:\n%s", want, k, line, pass)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw, err := n.Output(ctx, "cat", paths.ImageLock)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := imagelock.Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	var bundled []string
	for _, im := range lock.Images {
		bundled = append(bundled, im.Ref)
	}
	out, err := n.Output(ctx, "ctr", "-n", "k8s.io", "images", "ls", "-q", `labels."io.cri-containerd.pinned"==pinned`)
	if err != nil {
		t.Fatal(err)
	}
	// Names "sha256:..." are the CRI's own image-ID references: it pins
	// those of its sandbox image itself (pinned_images.sandbox), and the
	// provider leaves them alone.
	pinned := slices.DeleteFunc(strings.Fields(out), func(n string) bool { return strings.HasPrefix(n, "sha256:") })
	sort.Strings(bundled)
	sort.Strings(pinned)
	if !slices.Equal(pinned, bundled) {
		t.Fatalf("containerd has %v pinned, the booted image bundles %v", pinned, bundled)
	}
}
