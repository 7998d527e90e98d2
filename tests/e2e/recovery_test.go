package e2e

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Issue 15: recovery as the operator docs tell it, run from the pages' own
// text on the three-control-plane cluster of TestHAUpgrade.

// storage36 is a 3.6 storage version in etcdutl's status table.
var storage36 = regexp.MustCompile(`\|\s*3\.6\.0\s*\|`)

const snapshotCopy = "/root/etcd-pre-upgrade.db" // where the operator copied the snapshot to a node

// ownBackup is backups.md's "Your own backup" on hn (a healthy control
// plane, to tmpfs), the file copied off the node and removed from it. It
// returns the snapshot.
func ownBackup(t testing.TB, hn *haNode) []byte {
	t.Helper()
	var lines []string
	for _, prefix := range []string{"install -d -m 0700 /run/etcd-backup", "/usr/bin/etcdctl --endpoints=https://127.0.0.1:2379", "/usr/bin/etcdutl snapshot status"} {
		c, err := docs.Command("backups.md", prefix)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, c)
	}
	for _, l := range lines {
		out, code := runLine(t, hn, l)
		if code != 0 {
			t.Fatalf("%s: docs/backups.md: %s: exit %d\n%s", hn.name, l, code, out)
		}
		if strings.HasPrefix(l, "/usr/bin/etcdutl") && !storage36.MatchString(out) {
			t.Fatalf("%s: the snapshot's status is not a 3.6 snapshot's:\n%s", hn.name, out)
		}
	}
	snap, err := hn.n.ReadFile("/run/etcd-backup/etcd-pre-upgrade.db")
	if err != nil || len(snap) < 1<<16 {
		t.Fatalf("%s: the snapshot (%d bytes): %v", hn.name, len(snap), err)
	}
	rm, err := docs.Command("backups.md", "rm /run/etcd-backup/etcd-pre-upgrade.db")
	if err != nil {
		t.Fatal(err)
	}
	if out, code := runLine(t, hn, rm); code != 0 {
		t.Fatalf("%s: %s: %s", hn.name, rm, out)
	}
	progress(t, "%s: your own backup taken as docs/backups.md says (%d KiB), copied off the node", hn.name, len(snap)>>10)
	return snap
}

// marker creates a ConfigMap in default; markerExists looks for one.
func marker(t testing.TB, via *haNode, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := kubectlVia(ctx, via, "-n", "default", "create", "configmap", name, "--from-literal=at="+time.Now().UTC().Format(time.RFC3339)); err != nil {
		t.Fatalf("create %s: %v %s", name, err, out)
	}
}

func markerExists(t testing.TB, via *haNode, name string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := kubectlVia(ctx, via, "-n", "default", "get", "configmap", name, "-o", "name")
	switch {
	case err == nil && out == "configmap/"+name:
		return true
	case err != nil && strings.Contains(out+err.Error(), "NotFound"):
		return false
	}
	t.Fatalf("get configmap %s: %v %s", name, err, out)
	return false
}

// joinSection is the cluster section an operator pastes into hn's
// cloud-config from join-config's output (printed): the printed section,
// with hn's own nodeRegistration and, for a control plane, its
// localAPIEndpoint added to joinConfiguration, and its own
// upgradeConfiguration.
func joinSection(t testing.TB, printed []byte, hn *haNode) []byte {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(printed, &doc); err != nil {
		t.Fatal(err)
	}
	section, ok := doc["cluster"].(map[string]any)
	if !ok {
		t.Fatalf("join-config printed no cluster: section:\n%s", printed)
	}
	var cfg, own, mine map[string]any
	if err := yaml.Unmarshal([]byte(section["config"].(string)), &cfg); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(clusterSection("unused-token-unused-token-unused", hn.node, "10.0.0.11", "v0.0.0"), &mine); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(mine["config"].(string)), &own); err != nil {
		t.Fatal(err)
	}
	join := cfg["joinConfiguration"].(map[string]any)
	ownJoin := own["joinConfiguration"].(map[string]any)
	join["nodeRegistration"] = ownJoin["nodeRegistration"]
	if cp, ok := join["controlPlane"].(map[string]any); ok {
		cp["localAPIEndpoint"] = ownJoin["controlPlane"].(map[string]any)["localAPIEndpoint"]
	}
	// join-config cannot know how this node is upgraded later.
	cfg["upgradeConfiguration"] = own["upgradeConfiguration"]
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	section["config"] = string(b)
	out, err := yaml.Marshal(section)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// withCmd selects the page's end-to-end command that starts with prefix
// and contains has (and not hasNot, when given), for pages that show two
// forms of one command.
func (d *docPage) withCmd(prefix, has, hasNot string) string {
	d.t.Helper()
	var found []string
	for _, c := range d.p.E2E() {
		if strings.HasPrefix(c, prefix) && strings.Contains(c, has) && (hasNot == "" || !strings.Contains(c, hasNot)) {
			found = append(found, c)
		}
	}
	if len(found) == 0 {
		d.t.Fatalf("docs/%s shows no command starting with %q with %q", d.p.Name, prefix, has)
	}
	return found[0]
}

// rejoin is reset-and-rejoin.md on hn, through the healthy control plane
// via, with the page's image (its minor: the cluster's) unless img, another
// page, gives the image to boot. It returns the join's wall time.
func rejoin(t testing.TB, rj, img *docPage, via, hn *haNode, role string, trees map[string]string) time.Duration {
	t.Helper()
	start := time.Now()
	if role == "controlplane" {
		// 1. The member. As the page says: refused while the member has
		// been connected for less than 5 s; run again a few seconds later.
		// An attempt that timed out may still have been applied: "member
		// not found" then, and member list shows it gone.
		list := rj.withCmd("/usr/bin/etcdctl", "member list", "")
		ids, _ := memberList(t, rj.run(via, list))
		if ids[hn.name] == "" {
			t.Fatalf("%s is no etcd member: %v", hn.name, ids)
		}
		rj.untilExit(via, rj.withCmd("/usr/bin/etcdctl", "member remove", ""), 2*time.Minute, func(out string, code int) bool {
			if code == 0 && strings.Contains(out, "Member "+ids[hn.name]+" removed") {
				return true
			}
			if code == 0 || !strings.Contains(out, "etcdserver: member not found") {
				return false
			}
			now, _ := memberList(t, rj.run(via, list))
			return now[hn.name] == ""
		}, "MEMBER_ID="+ids[hn.name])
	}
	// 2. The reset, before the Node's deletion: it stops the kubelet,
	// which would otherwise register the Node again.
	rj.run(hn, "provider-kubernetes reset --yes")
	// 3. The Node, the join material.
	rj.run(via, "kubectl --kubeconfig /etc/kubernetes/admin.conf delete node", "NODE="+hn.name)
	rj.run(via, "sh -c \"umask 077; provider-kubernetes join-config", "ROLE="+role)
	printed, err := via.n.ReadFile("/root/join.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := via.n.Output(ctx, "stat", "-c", "%a %U %F", "/root/join.yaml"); err != nil || out != "600 root regular file" {
		t.Fatalf("/root/join.yaml: %q %v, want 600 root", out, err)
	}
	// The operator's edit: the printed section, with this node's own settings.
	writeCloudConfig(t, hn.n, joinSection(t, printed, hn))
	if img == nil {
		img = rj
	}
	if code := img.bootImage(hn, trees, "reset and rejoined as a "+role); code != 0 {
		t.Fatalf("%s rejoin: exit %d\n%s\nkubeadm:\n%s", hn.name, code, lastPass(reconcileLog(t, hn.n)), kubeadmLog(hn.n))
	}
	if pass := lastPass(reconcileLog(t, hn.n)); !strings.Contains(pass, "msg=join outcome=ok") || !strings.Contains(pass, "msg=reconcile-done outcome=converged") {
		t.Fatalf("%s did not join:\n%s", hn.name, pass)
	}
	if out := rj.run(hn, "provider-kubernetes status"); !strings.Contains(out, "Converged") {
		t.Fatalf("%s status after the rejoin:\n%s", hn.name, out)
	}
	if role == "controlplane" {
		rj.until(via, rj.withCmd("/usr/bin/etcdctl", "endpoint health", ""), 3*time.Minute, healthy(3))
	}
	took := time.Since(start).Round(time.Second)
	progress(t, "%s: reset and rejoined as a %s in %s", hn.name, role, took)
	return took
}

// restoreCluster is rollback-and-restore.md on the upgraded cluster: every
// control plane restored from snap (taken at 1.36, before the upgrade)
// and booted back into the 1.36 image, the worker reset and rejoined at
// 1.36, late (joined after the snapshot) left off. It returns the wall time.
func restoreCluster(t testing.TB, trees map[string]string, cps []*haNode, worker *haNode, late []*haNode, snap []byte) time.Duration {
	t.Helper()
	start := time.Now()
	rb := openDoc(t, "rollback-and-restore.md")
	rj := openDoc(t, "reset-and-rejoin.md")
	cp1 := cps[0]
	_, members := memberList(t, rb.run(cp1, rb.withCmd("/usr/bin/etcdctl", "member list", "")))
	for _, hn := range late {
		stopNode(t, hn)
	}
	// 1. Stop the static control plane everywhere, the workers' kubelets.
	for _, hn := range cps {
		rb.run(hn, "install -d -m 0700 /etc/kubernetes/manifests-stopped")
		rb.run(hn, "sh -c 'mv /etc/kubernetes/manifests/*.yaml")
	}
	rb.run(worker, "systemctl stop kubelet.service")
	// 2. The previous image and pin: the pass refuses the downgrade.
	for _, hn := range cps {
		if out := rb.run(hn, "provider-kubernetes pin set v1.36.3"); !strings.Contains(out, "pin v1.37.2 -> v1.36.3") {
			t.Fatalf("%s: pin set printed:\n%s", hn.name, out)
		}
		if code := rb.bootImage(hn, trees, "restore: the previous image and pin"); code != 3 {
			t.Fatalf("%s on the previous image: exit %d, want 3 (refused)\n%s", hn.name, code, lastPass(reconcileLog(t, hn.n)))
		}
		if st := nodeStatus(t, hn.n); st.Refusal != "Downgrade" {
			t.Fatalf("%s on the previous image: status %+v, want a Downgrade refusal as the page says", hn.name, st)
		}
	}
	// 3. The snapshot on each, the manifests gathered, one restore each.
	var token string
	for i, hn := range cps {
		if err := hn.n.WriteFile(snapshotCopy, snap, 0o600); err != nil {
			t.Fatal(err)
		}
		rb.run(hn, "install -d -m 0700 /run/etcd-backup")
		rb.run(hn, "install -m 0600 -o root -g root \"$COPY\"", "COPY="+snapshotCopy)
		rb.run(hn, "provider-kubernetes collect-manifests --to")
		if i == 0 {
			out := rb.run(hn, rb.withCmd("provider-kubernetes restore-etcd", "--initial-cluster", "--cluster-token"), "MEMBERS="+members)
			for _, l := range strings.Split(out, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "cluster token:"); ok {
					token = strings.Fields(v)[0]
				}
			}
			if token == "" || !strings.Contains(out, "restored from /run/etcd-backup/etcd-pre-upgrade.db") {
				t.Fatalf("%s: the first restore-etcd printed no token:\n%s", hn.name, out)
			}
			continue
		}
		rb.run(hn, rb.withCmd("provider-kubernetes restore-etcd", "--cluster-token", ""), "MEMBERS="+members, "TOKEN="+token)
	}
	// 4. The manifests back; etcd healthy; a reboot each: converged at 1.36.3.
	for _, hn := range cps {
		rb.run(hn, "sh -c 'mv /etc/kubernetes/tmp/restore-v1.36.3/*.yaml")
	}
	rb.until(cp1, rb.withCmd("/usr/bin/etcdctl", "endpoint health", ""), 5*time.Minute, healthy(3))
	for _, hn := range cps {
		if code := rb.reboot(hn, "restored: converge at v1.36.3"); code != 0 {
			t.Fatalf("%s after the restore: exit %d\n%s", hn.name, code, lastPass(reconcileLog(t, hn.n)))
		}
		if out := rb.run(hn, "provider-kubernetes status"); !strings.Contains(out, "Converged") || !strings.Contains(out, "v1.36.3") {
			t.Fatalf("%s status after the restore:\n%s", hn.name, out)
		}
		// As the page says: every member healthy before the next reboot.
		rb.until(hn, rb.withCmd("/usr/bin/etcdctl", "endpoint health", ""), 5*time.Minute, healthy(3))
	}
	rb.until(cp1, "kubectl --kubeconfig /etc/kubernetes/admin.conf get --raw /readyz", 3*time.Minute, func(out string) bool { return strings.TrimSpace(out) == "ok" })
	// 5. The worker: reset and rejoined at 1.36 with the 1.36 image.
	rejoin(t, rj, rb, cp1, worker, "worker", trees)
	rb.done()
	took := time.Since(start).Round(time.Second)
	progress(t, "cluster restored from the 1.36 snapshot in %s", took)
	return took
}

// versionsAt fails unless every apiserver is at k and every etcd at e.
func versionsAt(t testing.TB, v versions, cps []*haNode, k, e string) {
	t.Helper()
	for _, hn := range cps {
		if a := v.apiservers[hn.name]; a != version.MustParse(k) {
			t.Fatalf("apiserver on %s at %s, want %s (%s)", hn.name, a, k, v)
		}
		if v.etcd[hn.name] != e {
			t.Fatalf("etcd on %s at %s, want %s (%s)", hn.name, v.etcd[hn.name], e, v)
		}
	}
}

// wedge cuts hn at kp during its upgrade to 1.37 (its image and pin
// bumped) and boots it back into the 1.36 image with the pin left at
// v1.37.2, as an operator's half-done rollback: the pass refuses
// PinNewerThanImage and the unit fails. ts, when given, is
// troubleshooting.md, whose journal commands are run there.
func wedge(t testing.TB, hn *haNode, kp killPoint, trees map[string]string, ts *docPage) {
	t.Helper()
	stopNode(t, hn)
	if err := hn.n.SetTree(trees["1.37"]); err != nil {
		t.Fatal(err)
	}
	bumpPin(t, hn.n, "v1.37.2")
	cut := killAt(t, hn.n, kp)
	if err := hn.n.SetTree(trees["1.36"]); err != nil {
		t.Fatal(err)
	}
	if code := bootNode(t, hn.n, "wedged: cut "+kp.name+", back on the 1.36 image with pin v1.37.2"); code != 3 {
		t.Fatalf("%s wedged: exit %d, want 3\n%s", hn.name, code, lastPass(reconcileLog(t, hn.n)))
	}
	if st := nodeStatus(t, hn.n); st.Refusal != "PinNewerThanImage" {
		t.Fatalf("%s wedged: status %+v, want PinNewerThanImage", hn.name, st)
	}
	if ts != nil {
		if out := ts.run(hn, "journalctl -b -u provider-kubernetes-reconcile.service"); !strings.Contains(out, "status=3/") {
			t.Fatalf("%s: the journal does not show the refused pass:\n%s", hn.name, out)
		}
		if out := ts.run(hn, "systemctl --failed"); !strings.Contains(out, "provider-kubernetes-reconcile.service") {
			t.Fatalf("%s: systemctl --failed does not list the reconcile unit:\n%s", hn.name, out)
		}
		if out := ts.run(hn, "journalctl -b -u cos-setup-boot.service"); !strings.Contains(out, "cos-setup-boot.service") && !strings.Contains(out, "cOS system configuration") {
			t.Fatalf("%s: no boot-stage journal:\n%s", hn.name, out)
		}
	}
	progress(t, "%s: wedged (%s), refused PinNewerThanImage", hn.name, cut)
}

// rolloutWithWedges is the upgrade to 1.37 again from the restored
// cluster: cp1's apply booted as upgrade.md says; cp3 and then the worker
// each wedged in the middle of kubeadm upgrade node and brought back by
// reset-and-rejoin.md at the cluster's version; cp2 last of the control
// planes. It returns the two rejoins' wall times.
func rolloutWithWedges(t testing.TB, trees map[string]string, cp1, cp2, cp3, w1 *haNode, check func(string, *haNode) versions) (cpRejoin, workerRejoin time.Duration) {
	t.Helper()
	up := openDoc(t, "upgrade.md")
	rj := openDoc(t, "reset-and-rejoin.md")
	ts := openDoc(t, "troubleshooting.md")
	bumpPin(t, cp1.n, "v1.37.2")
	if code := up.bootImage(cp1, trees, "upgrade apply again, after the restore"); code != 0 {
		t.Fatalf("cp1 apply after the restore: exit %d\n%s", code, lastPass(reconcileLog(t, cp1.n)))
	}
	waitNodes(t, cp2.n, "v1.37.2", "cp1")
	check("cp1 upgrade apply after the restore", cp2)

	wedge(t, cp3, killFollowerManifestsMoved, trees, ts)
	cpRejoin = rejoin(t, rj, nil, cp1, cp3, "controlplane", trees)
	waitNodes(t, cp1.n, "v1.37.2", "cp3")
	check("cp3 reset and rejoined", cp1)

	stopNode(t, cp2)
	if err := cp2.n.SetTree(trees["1.37"]); err != nil {
		t.Fatal(err)
	}
	bumpPin(t, cp2.n, "v1.37.2")
	if code := bootNode(t, cp2.n, "1.37 image: upgrade node, the last control plane"); code != 0 {
		t.Fatalf("cp2 upgrade node: exit %d\n%s", code, lastPass(reconcileLog(t, cp2.n)))
	}
	if pass := lastPass(reconcileLog(t, cp2.n)); !strings.Contains(pass, "msg=addons outcome=ok last_control_plane=true") {
		t.Fatalf("cp2, the last control plane, did not verify the add-ons:\n%s", pass)
	}
	check("cp2 upgrade node", cp1)

	wedge(t, w1, killWorkerUpgradeNode, trees, nil)
	workerRejoin = rejoin(t, rj, nil, cp1, w1, "worker", trees)
	waitNodes(t, cp1.n, "v1.37.2", "cp1", "cp2", "cp3", "w1")
	check("w1 reset and rejoined", cp1)
	for _, hn := range []*haNode{cp1, cp2, cp3, w1} {
		published(t, hn, cp1)
	}
	rollout(t, "the rejoins", cp1, 0, "nothing: every node is converged at v1.37.2")

	// upgrade.md's "watch it" commands, on a control plane.
	if out := up.run(cp1, "provider-kubernetes status --cluster"); !strings.Contains(out, "nothing: every node is converged at v1.37.2") {
		t.Fatalf("status --cluster:\n%s", out)
	}
	if out := up.run(cp1, "kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes"); strings.Count(out, " Ready ") != 4 {
		t.Fatalf("get nodes:\n%s", out)
	}
	if out := up.run(cp1, "kubectl --kubeconfig /etc/kubernetes/admin.conf describe node cp2"); !strings.Contains(out, "UpgradeFinished") {
		t.Fatalf("describe node cp2 does not tell its upgrade:\n%s", out)
	}
	up.done()
	rj.done()
	ts.done()
	return cpRejoin, workerRejoin
}
