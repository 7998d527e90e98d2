package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
	"github.com/kairos-io/provider-kubernetes/tests/e2e/harness"
)

// haNode is one node of the HA cluster with its harness handle.
type haNode struct {
	node
	n *harness.Node
}

// withCA adds the cluster CA (read from the first control plane after its
// init) to a joining node's section: the CA pin an operator gets from
// provider-kubernetes join-config.
func withCA(t testing.TB, section []byte, ca string) []byte {
	var m map[string]any
	if err := yaml.Unmarshal(section, &m); err != nil {
		t.Fatal(err)
	}
	m["ca_certs"] = []string{ca}
	b, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// kubectlVia runs kubectl on node n against its own apiserver (not the
// cluster endpoint, which is cp1's and goes away while cp1 upgrades).
func kubectlVia(ctx context.Context, n *haNode, args ...string) (string, error) {
	return n.n.Output(ctx, append([]string{"/usr/bin/kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf",
		"--server", "https://" + n.ip + ":6443", "--request-timeout=20s"}, args...)...)
}

// componentVersions reads every control-plane static pod's image version and
// every kubelet's version through node via.
type versions struct {
	apiservers, schedulers, controllerManagers, kubelets map[string]version.Version
	etcd                                                 map[string]string
}

func readVersions(ctx context.Context, via *haNode) (versions, error) {
	v := versions{apiservers: map[string]version.Version{}, schedulers: map[string]version.Version{},
		controllerManagers: map[string]version.Version{}, kubelets: map[string]version.Version{}, etcd: map[string]string{}}
	out, err := kubectlVia(ctx, via, "get", "nodes", "-o", "json")
	if err != nil {
		return v, fmt.Errorf("nodes: %w", err)
	}
	var nodes struct {
		Items []struct {
			Metadata struct {
				Name   string            `json:"name"`
				UID    string            `json:"uid"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Status struct {
				NodeInfo struct{ KubeletVersion string } `json:"nodeInfo"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		return v, err
	}
	uids := map[string]string{}
	var controlPlanes []string
	for _, n := range nodes.Items {
		kv, err := version.ParseReported(n.Status.NodeInfo.KubeletVersion)
		if err != nil {
			return v, err
		}
		v.kubelets[n.Metadata.Name] = kv
		uids[n.Metadata.Name] = n.Metadata.UID
		if _, ok := n.Metadata.Labels["node-role.kubernetes.io/control-plane"]; ok {
			controlPlanes = append(controlPlanes, n.Metadata.Name)
		}
	}
	out, err = kubectlVia(ctx, via, "-n", "kube-system", "get", "pods", "-l", "tier=control-plane", "-o", "json")
	if err != nil {
		return v, fmt.Errorf("pods: %w: %s", err, out)
	}
	var pods struct {
		Items []struct {
			Metadata struct {
				Name            string `json:"name"`
				OwnerReferences []struct {
					Kind string `json:"kind"`
					UID  string `json:"uid"`
				} `json:"ownerReferences"`
			} `json:"metadata"`
			Spec struct {
				NodeName   string `json:"nodeName"`
				Containers []struct{ Name, Image string }
			} `json:"spec"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &pods); err != nil {
		return v, err
	}
	stale := map[string][]string{}
	for _, p := range pods.Items {
		// A mirror pod is owned by the Node object its kubelet registered.
		// One owned by an earlier Node of that name (a node reset and
		// joined again) shows what ran before the reset until the garbage
		// collector or the new kubelet replaces it: not a running component.
		owner := ""
		for _, o := range p.Metadata.OwnerReferences {
			if o.Kind == "Node" {
				owner = o.UID
			}
		}
		if owner != uids[p.Spec.NodeName] {
			stale[p.Spec.NodeName] = append(stale[p.Spec.NodeName], p.Metadata.Name)
			continue
		}
		c := p.Spec.Containers[0]
		tag := observe.ImageTag(c.Image)
		if c.Name == "etcd" {
			v.etcd[p.Spec.NodeName] = tag
			continue
		}
		pv, err := version.ParseReported(tag)
		if err != nil {
			return v, fmt.Errorf("%s on %s: %w", c.Name, p.Spec.NodeName, err)
		}
		switch c.Name {
		case "kube-apiserver":
			v.apiservers[p.Spec.NodeName] = pv
		case "kube-scheduler":
			v.schedulers[p.Spec.NodeName] = pv
		case "kube-controller-manager":
			v.controllerManagers[p.Spec.NodeName] = pv
		}
	}
	for _, cp := range controlPlanes {
		if _, ok := v.apiservers[cp]; !ok {
			return v, fmt.Errorf("no kube-apiserver mirror pod of %s's current Node yet (left from an earlier Node: %v)", cp, stale[cp])
		}
	}
	return v, nil
}

// skewOK checks the version-skew policy as it applies to a kubeadm cluster:
// a control plane's controller-manager, scheduler and kubelet talk only to
// the apiserver on the same node (localAPI, checked from their kubeconfigs
// by the caller), so none may be newer than that apiserver; a worker's
// kubelet may reach any apiserver, so it may not be newer than any of them.
func (v versions) skewOK(workers map[string]bool) error {
	if len(v.apiservers) == 0 {
		return fmt.Errorf("no apiserver seen")
	}
	var oldest version.Version
	for _, a := range v.apiservers {
		if oldest.IsZero() || a.Less(oldest) {
			oldest = a
		}
	}
	for what, m := range map[string]map[string]version.Version{"kubelet": v.kubelets, "kube-scheduler": v.schedulers, "kube-controller-manager": v.controllerManagers} {
		for node, x := range m {
			bound, where := oldest, "the oldest apiserver"
			if !workers[node] {
				a, ok := v.apiservers[node]
				if !ok {
					return fmt.Errorf("%s on %s: no apiserver on that control plane", what, node)
				}
				bound, where = a, "its node's apiserver"
			}
			if bound.Less(x) {
				return fmt.Errorf("%s on %s is %s, newer than %s %s", what, node, x, where, bound)
			}
		}
	}
	return nil
}

func (v versions) String() string {
	var parts []string
	for _, m := range []struct {
		n string
		m map[string]version.Version
	}{{"apiserver", v.apiservers}, {"cm", v.controllerManagers}, {"sched", v.schedulers}, {"kubelet", v.kubelets}} {
		var keys []string
		for k := range m.m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s/%s=%s", m.n, k, m.m[k]))
		}
	}
	var ek []string
	for k := range v.etcd {
		ek = append(ek, k)
	}
	sort.Strings(ek)
	for _, k := range ek {
		parts = append(parts, fmt.Sprintf("etcd/%s=%s", k, v.etcd[k]))
	}
	return strings.Join(parts, " ")
}

// Issue 8: three control planes with stacked etcd and one worker, 1.36.3 to
// 1.37.2 across etcd 3.6.8 to 3.7.0, node by node as an operator would:
// a worker rebooted into 1.37 before the control planes (waits, fails with
// ControlPlaneNotUpgraded), the first control plane killed in the middle of
// upgrade apply and booted again, a follower with a kubelet flag removed in
// 1.37 planted before its swap (the repair path runs for real), then the
// worker. After every step no kubelet, controller-manager or scheduler is
// newer than any apiserver.
func TestHAUpgrade(t *testing.T) {
	harness.Require(t)
	start := time.Now()
	tr := osTrees(t)
	c := harness.New(t, harness.Options{Base: base(t)})
	token := newToken(t)
	// Issue 27: the cluster's endpoint is a load balancer in front of the
	// three apiservers, as an HA cluster is run, not cp1's own address.
	lbCtx, lbCancel := context.WithTimeout(context.Background(), 2*time.Minute)
	lb, err := c.StartLoadBalancer(lbCtx, 6443, []string{"10.0.0.11:6443", "10.0.0.12:6443", "10.0.0.13:6443"})
	lbCancel()
	if err != nil {
		testutil.SkipUnlessCI(t, err.Error())
		t.Fatal(err)
	}
	endpoint := harness.BridgeIP
	nodes := []*haNode{
		{node: node{name: "cp1", ip: "10.0.0.11", role: "init"}},
		{node: node{name: "cp2", ip: "10.0.0.12", role: "controlplane"}},
		{node: node{name: "cp3", ip: "10.0.0.13", role: "controlplane"}},
		{node: node{name: "w1", ip: "10.0.0.14", role: "worker"}},
	}
	for _, hn := range nodes {
		n, err := c.AddNode(context.Background(), harness.NodeSpec{Name: hn.name, Tree: tr["1.36"]})
		if err != nil {
			t.Fatal(err)
		}
		hn.n = n
	}
	cp1, cp2, cp3, w1 := nodes[0], nodes[1], nodes[2], nodes[3]
	var ca string
	section := func(hn *haNode, pin string) []byte {
		s := clusterSection(token, hn.node, endpoint, pin)
		if hn.role != "init" {
			s = withCA(t, s, ca)
		}
		return s
	}
	boot := func(hn *haNode, what string) int { t.Helper(); return bootNode(t, hn.n, what) }
	stop := func(hn *haNode) { t.Helper(); stopNode(t, hn) }
	check := func(step string, via *haNode) versions {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		var v versions
		var err error
		for i := 0; i < 30; i++ {
			if v, err = readVersions(ctx, via); err == nil {
				break
			}
			time.Sleep(2 * time.Second)
		}
		if err != nil {
			t.Fatalf("%s: read versions via %s: %v", step, via.name, err)
		}
		if err := v.skewOK(map[string]bool{"w1": true}); err != nil {
			t.Fatalf("%s: skew policy broken: %v (%s)", step, err, v)
		}
		progress(t, "after %s: %s", step, v)
		return v
	}

	// Bootstrap at 1.36.3: cp1 init, then one join at a time.
	writeCloudConfig(t, cp1.n, section(cp1, "v1.36.3"))
	if code := boot(cp1, "init at v1.36.3"); code != 0 {
		t.Fatalf("init: exit %d\n%s", code, reconcileLog(t, cp1.n))
	}
	caPEM, err := cp1.n.ReadFile("/etc/kubernetes/pki/ca.crt")
	if err != nil {
		t.Fatal(err)
	}
	ca = string(caPEM)
	for _, hn := range []*haNode{cp2, cp3, w1} {
		writeCloudConfig(t, hn.n, section(hn, "v1.36.3"))
		if code := boot(hn, "join at v1.36.3"); code != 0 {
			t.Fatalf("%s join: exit %d\n%s", hn.name, code, reconcileLog(t, hn.n))
		}
	}
	waitNodes(t, cp2.n, "v1.36.3", "cp1", "cp2", "cp3", "w1")
	check("bootstrap", cp2)
	// What makes the per-node skew rule the right one: on every control
	// plane kubeadm points the scheduler, the controller-manager and the
	// kubelet at that node's own apiserver.
	for _, hn := range []*haNode{cp1, cp2, cp3} {
		for _, kc := range []string{"/etc/kubernetes/scheduler.conf", "/etc/kubernetes/controller-manager.conf", "/etc/kubernetes/kubelet.conf"} {
			b, err := hn.n.ReadFile(kc)
			if err != nil {
				t.Fatal(err)
			}
			local := false
			for _, s := range []string{"server: https://" + hn.ip + ":6443", "server: https://127.0.0.1:6443", "server: https://localhost:6443"} {
				local = local || strings.Contains(string(b), s)
			}
			if !local {
				t.Fatalf("%s %s does not point at its own apiserver:\n%s", hn.name, kc, b)
			}
		}
	}
	progress(t, "cluster of 3 control planes and a worker up at v1.36.3 after %s", time.Since(start).Round(time.Second))
	t.Logf("bootstrap of 4 nodes: %s", time.Since(start).Round(time.Second))
	adminConf, err := cp1.n.ReadFile("/etc/kubernetes/admin.conf")
	if err != nil {
		t.Fatal(err)
	}
	probe := startProbe(t, c, adminConf, lb.Addr, "converged at v1.36.3")

	rollout(t, "bootstrap", cp1, 0, "nothing: every node is converged at v1.36.3")
	for _, hn := range nodes {
		published(t, hn, cp1)
	}
	// Issue 15: a first marker object, then the operator's own backup
	// before the upgrade, as backups.md says.
	marker(t, cp2, "pk-marker-before-upgrade")
	snap := ownBackup(t, cp2)

	// Scenario 3 and the first control plane, cut three times by real kills
	// (issue 17), each when an observed state says kubeadm got that far:
	// after apply replaced the etcd manifest, after it replaced the
	// apiserver manifest, and after apply returned but before the kubelet
	// restart. Each next boot picks up from what is on disk; the last one
	// finishes with the kubelet restart and verify.
	const cp1Phase = "cp1 upgrade apply (killed 3 times)"
	probe.setPhase(cp1Phase)
	stop(cp1)
	if err := cp1.n.SetTree(tr["1.37"]); err != nil {
		t.Fatal(err)
	}
	bumpPin(t, cp1.n, "v1.37.2")
	var cut []string
	for _, kp := range []killPoint{killEtcdManifestReplaced, killAPIServerManifestReplaced, killApplyReturned} {
		cut = append(cut, kp.name+": "+killAt(t, cp1.n, kp))
	}
	if code := boot(cp1, "after three cuts"); code != 0 {
		t.Fatalf("cp1 after the kills: exit %d\n%s\nkubeadm:\n%s", code, reconcileLog(t, cp1.n), kubeadmLog(cp1.n))
	}
	afterKills(t, cp1.n, "v1.37.2")
	// While cp1 was down, cut and upgraded, the API answered through the
	// load balancer (cp2's and cp3's apiservers).
	if probe.ok(cp1Phase) == 0 {
		t.Fatalf("no good answer through the load balancer while cp1 was down:\n%s", probe.report())
	}
	probe.setPhase("after cp1")
	t.Logf("cp1's cuts:\n%s", strings.Join(cut, "\n"))
	log1 := reconcileLog(t, cp1.n)
	// At most one snapshot attempt outcome per boot, never a second snapshot.
	for i, pass := range strings.Split(log1, "msg=reconcile-start")[1:] {
		if k := strings.Count(pass, "etcd-snapshot outcome="); k > 1 {
			t.Fatalf("boot %d logged %d snapshot outcomes", i+1, k)
		}
	}
	if strings.Count(log1, "etcd-snapshot outcome=taken") > 1 {
		t.Fatal("re-snapshotted")
	}
	if !strings.Contains(log1, "etcd-version-warning") {
		t.Fatalf("no etcd-version-warning before crossing 3.6.8 -> 3.7.0:\n%s", log1)
	}
	waitNodes(t, cp2.n, "v1.37.2", "cp1")
	check("cp1 upgrade apply (killed and resumed)", cp2)
	published(t, cp1, cp1)
	rollout(t, "cp1 upgrade apply", cp1, 1, "next: boot cp2 into the 1.37 image with pin v1.37.2; then cp3; workers after (w1)")

	// Scenario 4 (issue 14): the worker rebooted into 1.37 right after the
	// first control plane's apply, when kubeadm-config already reads
	// v1.37.2 but cp2 and cp3 still serve v1.36.3. With its own credentials
	// (kubelet.conf) it asks every apiserver and waits; it fails in budget
	// naming the two behind, and the operator takes it back to 1.36.
	stop(w1)
	if err := w1.n.SetTree(tr["1.37"]); err != nil {
		t.Fatal(err)
	}
	bumpPin(t, w1.n, "v1.37.2")
	setBudget(t, w1.n, "waitForCluster", "60s")
	waitStart := time.Now()
	if code := boot(w1, "1.37 image right after cp1's apply"); code != 1 {
		t.Fatalf("early worker: exit %d, want 1\n%s", code, lastPass(reconcileLog(t, w1.n)))
	}
	st := nodeStatus(t, w1.n)
	for _, want := range []string{"control planes still behind v1.37.2: ", "10.0.0.12:6443 at v1.36.3", "10.0.0.13:6443 at v1.36.3"} {
		if st.Reason != "ControlPlaneNotUpgraded" || !strings.Contains(st.Message, want) {
			t.Fatalf("early worker status %+v, want %q", st, want)
		}
	}
	if strings.Contains(st.Message, "10.0.0.11:6443 at") {
		t.Fatalf("the early worker names cp1, which is at v1.37.2: %s", st.Message)
	}
	if took := time.Since(waitStart); took > 5*time.Minute {
		t.Fatalf("the early worker's pass took %s with a 60s wait budget", took)
	}
	if pass := lastPass(reconcileLog(t, w1.n)); strings.Contains(pass, "msg=upgrade-node") {
		t.Fatalf("the early worker ran upgrade node:\n%s", pass)
	}
	published(t, w1, cp1)
	// The operator takes it back to the 1.36 image until the control planes are done.
	stop(w1)
	if err := w1.n.SetTree(tr["1.36"]); err != nil {
		t.Fatal(err)
	}
	bumpPin(t, w1.n, "v1.36.3")
	setBudget(t, w1.n, "waitForCluster", "")
	if code := boot(w1, "back on 1.36"); code != 0 {
		t.Fatalf("w1 back on 1.36: exit %d", code)
	}
	waitNodes(t, cp1.n, "v1.36.3", "w1")
	check("early worker", cp1)
	// Issue 16: converged and verified at 1.36 while the cluster reads
	// 1.37, its pass read nothing from the API; publish, with the worker's
	// own kubelet.conf, tells: the cluster-version annotation, a
	// cluster-ahead line and a ClusterAhead Event.
	published(t, w1, cp1)
	if log := reconcileLog(t, w1.n); !strings.Contains(log, "msg=cluster-ahead node=w1 node_version=v1.36.3 cluster_version=v1.37.2") {
		t.Fatalf("w1 back on 1.36 behind the cluster: no cluster-ahead line\n%s", lastPass(log))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	desc, err := kubectlVia(ctx, cp1, "describe", "node", "w1")
	cancel()
	if err != nil || !strings.Contains(desc, "ClusterAhead") || !strings.Contains(desc, "provider-kubernetes.kairos.io/cluster-version: v1.37.2") {
		t.Fatalf("kubectl describe node w1 does not tell the cluster is ahead (%v):\n%s", err, desc)
	}

	// The followers, one at a time. On cp2, a kubelet flag 1.37 removed is
	// planted in kubeadm-flags.env before the swap: its new kubelet
	// crash-loops until the repair rewrites the file.
	for _, hn := range []*haNode{cp2, cp3} {
		probe.setPhase(hn.name + " upgrade node")
		stop(hn)
		if hn == cp2 {
			flags, err := hn.n.ReadFile("/var/lib/kubelet/kubeadm-flags.env")
			if err != nil {
				t.Fatal(err)
			}
			planted := strings.Replace(string(flags), `KUBELET_KUBEADM_ARGS="`, `KUBELET_KUBEADM_ARGS="--containerd=/run/containerd/containerd.sock `, 1)
			if planted == string(flags) {
				t.Fatalf("unexpected kubeadm-flags.env: %s", flags)
			}
			if err := hn.n.WriteFile("/var/lib/kubelet/kubeadm-flags.env", []byte(planted), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := hn.n.SetTree(tr["1.37"]); err != nil {
			t.Fatal(err)
		}
		bumpPin(t, hn.n, "v1.37.2")
		if hn == cp3 {
			// A real kill during a follower's upgrade node, after its
			// manifests moved; the next boot finishes.
			killAt(t, hn.n, killFollowerManifestsMoved)
		}
		if code := boot(hn, "1.37 image: upgrade node"); code != 0 {
			t.Fatalf("%s upgrade node: exit %d\n%s\nkubeadm:\n%s", hn.name, code, lastPass(reconcileLog(t, hn.n)), kubeadmLog(hn.n))
		}
		if hn == cp3 {
			afterKills(t, hn.n, "v1.37.2")
		}
		pass := lastPass(reconcileLog(t, hn.n))
		for _, want := range []string{"msg=control-plane-health outcome=ok checks=cluster-endpoint-readyz,control-plane-nodes-ready,etcd-members", "msg=upgrade-node outcome=ok"} {
			if !strings.Contains(pass, want) {
				t.Fatalf("%s pass lacks %q:\n%s", hn.name, want, pass)
			}
		}
		if strings.Contains(pass, "scheduler") {
			t.Fatalf("%s waited on a scheduler:\n%s", hn.name, pass)
		}
		// kube-proxy and CoreDNS move with the last control plane: only
		// cp3's verification waits for them.
		addons := "msg=addons outcome=not-last last_control_plane=false"
		if hn == cp3 {
			addons = "msg=addons outcome=ok last_control_plane=true kube_proxy=v1.37.2 coredns=v1.14.6"
		}
		if !strings.Contains(pass, addons) {
			t.Fatalf("%s pass lacks %q:\n%s", hn.name, addons, pass)
		}
		if hn == cp2 {
			for _, want := range []string{"msg=kubelet-flags-removed flag=--containerd file=/var/lib/kubelet/kubeadm-flags.env", "msg=kubelet-start outcome=ok"} {
				if !strings.Contains(pass, want) {
					t.Fatalf("cp2's repair did not run for real (%q missing):\n%s", want, pass)
				}
			}
		}
		check(hn.name+" upgrade node", cp1)
		published(t, hn, cp1)
		if hn == cp2 {
			rollout(t, "cp2 upgrade node", cp1, 1, "next: boot cp3 into the 1.37 image with pin v1.37.2; workers after (w1)")
		} else {
			rollout(t, "cp3 upgrade node", cp1, 1, "next: boot w1 into the 1.37 image with pin v1.37.2")
		}
	}

	// The worker last, on a later boot now that the control planes are done.
	probe.setPhase("w1 upgrade node")
	stop(w1)
	if err := w1.n.SetTree(tr["1.37"]); err != nil {
		t.Fatal(err)
	}
	bumpPin(t, w1.n, "v1.37.2")
	// A real kill during the worker's upgrade node; the next boot finishes.
	// The kill lands as kubeadm backs up the kubelet's config.yaml and
	// rewrites it (os.WriteFile: truncate, then write); a power cut inside
	// that write leaves it empty, as CI once caught. SIGKILL keeps the page
	// cache, so the write is either whole or not begun: the harness puts
	// the torn state there itself, the worst the kill can leave, every run.
	killAt(t, w1.n, killWorkerUpgradeNode)
	if err := w1.n.WriteFile(paths.KubeletDir+"/config.yaml", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := boot(w1, "1.37 image: upgrade node"); code != 0 {
		t.Fatalf("w1 upgrade node: exit %d\n%s\nkubeadm:\n%s", code, lastPass(reconcileLog(t, w1.n)), kubeadmLog(w1.n))
	}
	// The torn config.yaml kept the kubelet down: the repair ran for real
	// on a worker (kubelet-start, handed an empty certificates directory).
	if pass := lastPass(reconcileLog(t, w1.n)); !strings.Contains(pass, "msg=kubelet-start outcome=ok target=v1.37.2 trigger=kubelet-down") {
		t.Fatalf("w1's repair of its torn kubelet config did not run:\n%s", pass)
	}
	afterKills(t, w1.n, "v1.37.2")
	waitNodes(t, cp1.n, "v1.37.2", "cp1", "cp2", "cp3", "w1")
	v := check("worker upgrade node", cp1)
	published(t, w1, cp1)
	rollout(t, "worker upgrade node", cp1, 0, "nothing: every node is converged at v1.37.2")
	// kubectl describe node tells the story of cp2's upgrade.
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	desc, err = cp1.n.Output(ctx, "/usr/bin/kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf", "describe", "node", "cp2")
	cancel()
	if err != nil || !strings.Contains(desc, "UpgradeStarted") || !strings.Contains(desc, "UpgradeFinished") || !strings.Contains(desc, "provider-kubernetes.kairos.io/phase: Converged") {
		t.Fatalf("kubectl describe node cp2 does not tell the upgrade (%v):\n%s", err, desc)
	}
	for _, hn := range []*haNode{cp1, cp2, cp3} {
		if !strings.HasPrefix(v.etcd[hn.name], "3.7.") {
			t.Fatalf("etcd on %s runs %s", hn.name, v.etcd[hn.name])
		}
		if a := v.apiservers[hn.name]; a != version.MustParse("v1.37.2") {
			t.Fatalf("apiserver on %s at %s", hn.name, a)
		}
	}
	// etcd's own word: every member reports 3.7 and the cluster version moved.
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := cp1.n.Output(ctx, "/usr/bin/etcdctl", "--endpoints=https://10.0.0.11:2379,https://10.0.0.12:2379,https://10.0.0.13:2379",
		"--cacert=/etc/kubernetes/pki/etcd/ca.crt", "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
		"--key=/etc/kubernetes/pki/etcd/healthcheck-client.key", "--command-timeout=10s", "endpoint", "status", "-w", "json")
	if err != nil {
		t.Fatalf("etcdctl endpoint status: %v\n%s", err, out)
	}
	var eps []struct {
		Endpoint string
		Status   struct{ Version string } `json:"Status"`
	}
	if err := json.Unmarshal([]byte(out), &eps); err != nil || len(eps) != 3 {
		t.Fatalf("endpoint status: %v %s", err, out)
	}
	for _, ep := range eps {
		if !strings.HasPrefix(ep.Status.Version, "3.7.") {
			t.Fatalf("etcd member %s at %s", ep.Endpoint, ep.Status.Version)
		}
	}
	progress(t, "all four nodes at v1.37.2, etcd 3.7 on every member, after %s", time.Since(start).Round(time.Second))
	probeReport := probe.report()
	progress(t, "the API through the load balancer %s during the rolling upgrade:\n%s", lb.Addr, probeReport)
	t.Logf("API availability through the load balancer:\n%s", probeReport)

	// Issue 17: a new worker joins with join-config's output, as an operator
	// pastes it into the next node's cloud-config and adds the node's own
	// documents (its nodeRegistration).
	w2 := &haNode{node: node{name: "w2", ip: "10.0.0.15", role: "worker"}}
	joinWithJoinConfig(t, c, cp1, w2, tr["1.37"])
	waitNodes(t, cp1.n, "v1.37.2", "w2")
	progress(t, "w2 joined at v1.37.2 with join-config's output")
	upgraded := time.Since(start).Round(time.Second)

	// Issue 15: a second marker after the upgrade, then the restore from
	// the backup (rollback-and-restore.md) back to 1.36: the first marker
	// is there, the second is not, every node Ready at v1.36.3 and
	// converged.
	marker(t, cp1, "pk-marker-after-upgrade")
	cps := []*haNode{cp1, cp2, cp3}
	restoreTook := restoreCluster(t, tr, cps, w1, []*haNode{w2}, snap)
	waitNodes(t, cp1.n, "v1.36.3", "cp1", "cp2", "cp3", "w1")
	versionsAt(t, check("the restore", cp1), cps, "v1.36.3", "3.6.8-0")
	if !markerExists(t, cp1, "pk-marker-before-upgrade") {
		t.Fatal("the restored cluster lacks the marker created before the backup")
	}
	if markerExists(t, cp1, "pk-marker-after-upgrade") {
		t.Fatal("the restored cluster has the marker created after the backup")
	}
	for _, hn := range []*haNode{cp1, cp2, cp3, w1} {
		published(t, hn, cp1)
	}
	rollout(t, "the restore", cp1, 0, "nothing: every node is converged at v1.36.3")
	// Issue 15: upgraded again, with a follower and the worker wedged and
	// reset and rejoined.
	cpRejoin, wRejoin := rolloutWithWedges(t, tr, cp1, cp2, cp3, w1, check)
	t.Logf("HA scenario: bootstrap and upgrade with kills %s; restore %s; control plane rejoin %s; worker rejoin %s", upgraded, restoreTook, cpRejoin, wRejoin)

	var peak []string
	for _, hn := range nodes {
		peak = append(peak, fmt.Sprintf("%s %d MiB", hn.name, hn.n.PeakMemory()>>20))
	}
	t.Logf("whole HA scenario: %s; peak memory %s", time.Since(start).Round(time.Second), strings.Join(peak, ", "))
}

// published waits for the node's publish unit after its pass and checks its
// Node carries the pass (read through via, a control plane with admin.conf).
func published(t testing.TB, hn, via *haNode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	st, err := hn.n.WaitUnit(ctx, "provider-kubernetes-publish.service", 6*time.Minute)
	if err != nil || st.ExecMainStatus != 0 {
		j, _ := hn.n.UnitJournal(ctx, "provider-kubernetes-publish.service")
		t.Fatalf("%s: publish %v %v\n%s", hn.name, st, err, j)
	}
	doc := nodeStatus(t, hn.n)
	out, err := kubectlVia(ctx, via, "get", "node", hn.name, "-o", "jsonpath={.metadata.annotations}")
	if err != nil {
		t.Fatalf("%s annotations: %v %s", hn.name, err, out)
	}
	var a map[string]string
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		t.Fatalf("%s annotations %q: %v", hn.name, out, err)
	}
	const p = "provider-kubernetes.kairos.io/"
	for k, want := range map[string]string{"phase": doc.Phase, "node-version": doc.NodeVersion, "pin": doc.Pin, "time": doc.Time,
		"boot-id": doc.BootID, "refusal": doc.Refusal, "reason": doc.Reason, "bundled": doc.Bundled} {
		if a[p+k] != want {
			t.Fatalf("%s annotation %s = %q, the status says %q", hn.name, k, a[p+k], want)
		}
	}
}

// rollout runs provider-kubernetes status --cluster on via (a control
// plane: admin.conf by default), prints the table and checks its exit code
// and next step.
func rollout(t testing.TB, step string, via *haNode, wantExit int, wantNext string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := via.n.Exec(ctx, "/usr/bin/provider-kubernetes", "status", "--cluster")
	// A kubelet the pass just restarted reports NotReady for a moment
	// (PLEG not yet run) after its Node already read Ready: status
	// --cluster then says to wait for the nodes to be Ready, and an
	// operator waits, as this does, for a minute at most.
	for i := 0; i < 30 && res.ExitCode == 1 && strings.Contains(string(res.Stdout), "wait for the nodes to be Ready") && ctx.Err() == nil; i++ {
		time.Sleep(2 * time.Second)
		res, err = via.n.Exec(ctx, "/usr/bin/provider-kubernetes", "status", "--cluster")
	}
	out := string(res.Stdout)
	progress(t, "status --cluster after %s (exit %d):\n%s", step, res.ExitCode, out)
	if res.ExitCode != wantExit || !strings.Contains(out, wantNext) {
		t.Fatalf("status --cluster after %s: exit %d (want %d), %v\n%s%s\nwant %q", step, res.ExitCode, wantExit, err, out, res.Stderr, wantNext)
	}
	for _, n := range []string{"cp1", "cp2", "cp3", "w1"} {
		if !strings.Contains(out, n) {
			t.Fatalf("status --cluster lacks %s:\n%s", n, out)
		}
	}
}

// joinWithJoinConfig adds node hn, runs `provider-kubernetes join-config
// --role worker` on cp, writes the section as an operator pastes it
// (joinSection: the node's own settings kept) as hn's /oem cloud-config
// and boots hn: its pass must join with the minted token and converge.
func joinWithJoinConfig(t testing.TB, c *harness.Cluster, cp, hn *haNode, tree string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := c.AddNode(ctx, harness.NodeSpec{Name: hn.name, Tree: tree})
	if err != nil {
		t.Fatal(err)
	}
	if n.IP != hn.ip {
		t.Fatalf("%s got %s, the test expects %s", hn.name, n.IP, hn.ip)
	}
	hn.n = n
	res, err := cp.n.Exec(ctx, "/usr/bin/provider-kubernetes", "join-config", "--role", "worker")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("join-config on %s: exit %d %v\n%s", cp.name, res.ExitCode, err, res.Stderr)
	}
	writeCloudConfig(t, n, joinSection(t, res.Stdout, hn))
	if code := bootNode(t, n, "join with join-config's output"); code != 0 {
		t.Fatalf("%s join: exit %d\n%s", hn.name, code, reconcileLog(t, n))
	}
	if pass := lastPass(reconcileLog(t, n)); !strings.Contains(pass, "msg=join outcome=ok") || !strings.Contains(pass, "token=explicit") {
		t.Fatalf("%s did not join with the minted token:\n%s", hn.name, pass)
	}
}

// afterKills checks the boot after real kills: it converged, restarted the
// kubelet and verified, recorded the verified version, and no pass took a
// snapshot after the first (the first, clean, pre-upgrade one only).
func afterKills(t testing.TB, n *harness.Node, v string) {
	t.Helper()
	log := reconcileLog(t, n)
	pass := lastPass(log)
	for _, want := range []string{"msg=restart-kubelet outcome=ok", "msg=verify outcome=ok", "msg=reconcile-done outcome=converged"} {
		if !strings.Contains(pass, want) {
			t.Fatalf("%s: the boot after the kill lacks %q:\n%s", n.Name, want, pass)
		}
	}
	if b, err := n.ReadFile(paths.VerifiedRecord); err != nil || strings.TrimSpace(string(b)) != v {
		t.Fatalf("%s: verified-version record %q %v after the kills", n.Name, b, err)
	}
	passes := strings.Split(log, "msg=reconcile-start")[1:]
	for i, p := range passes {
		if k := strings.Count(p, "etcd-snapshot outcome="); k > 1 {
			t.Fatalf("%s: pass %d logged %d snapshot outcomes", n.Name, i+1, k)
		}
		if i > 0 && strings.Contains(p, "etcd-snapshot outcome=taken") {
			t.Fatalf("%s: pass %d took a snapshot after the apply had begun:\n%s", n.Name, i+1, p)
		}
	}
}
