package docs_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
)

// etcdOn136 is the etcd kubeadm 1.36 deploys, and the etcdctl and etcdutl
// the 1.36 image bundles.
const etcdOn136 = "v3.6.8"

// docs/backups.md on a control plane of a cluster at 1.36.3 with a real
// etcd 3.6.8 on 127.0.0.1:2379 (the sandbox's own loopback), as kubeadm
// runs it: your own backup, the provider's snapshot step, kubeadm's copies.
func TestBackupsPage(t *testing.T) {
	inSandbox(t, func(t *testing.T, s *sandbox) {
		p := open(t, "backups.md")
		api := testutil.NewAPI(t, "v1.36.3")
		n := s.node("cp1")
		n.clusterFile("init", "v1.36.3", "")
		n.image("v1.36.3")
		n.controlPlane(api, "v1.36.3")
		n.install(testbin.Etcdctl(t, etcdOn136), paths.Etcdctl)
		n.install(testbin.Etcdutl(t, etcdOn136), paths.Etcdutl)
		keys := startEtcd(t, n, testbin.Etcd(t, etcdOn136))

		// Your own backup: exactly the page's commands, in order.
		n.docOK(p, "install -d -m 0700 /run/etcd-backup")
		n.docOK(p, "/usr/bin/etcdctl ", "Snapshot saved at /run/etcd-backup/etcd-pre-upgrade.db")
		dir, err := os.Stat(n.Path("/run/etcd-backup"))
		if err != nil || !dir.IsDir() || dir.Mode().Perm() != 0o700 {
			t.Fatalf("the backup directory: %v %v", dir, err)
		}
		if f, err := os.Stat(n.Path("/run/etcd-backup/etcd-pre-upgrade.db")); err != nil || f.Mode().Perm() != 0o600 || f.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Fatalf("the snapshot: %v %v", f, err)
		}
		out := n.docOK(p, "/usr/bin/etcdutl snapshot status", "|   HASH   | REVISION | TOTAL KEYS | TOTAL SIZE | VERSION |")
		row := regexp.MustCompile(`\| +[0-9a-f]{8} \| +\d+ \| +(\d+) \| +[0-9.]+ [kMG]?B \| +(3\.6\.0) \|`).FindStringSubmatch(out)
		if row == nil {
			t.Fatalf("no snapshot row in:\n%s", out)
		}
		if got, _ := strconv.Atoi(row[1]); got < keys {
			t.Fatalf("the snapshot holds %d keys, etcd had at least %d", got, keys)
		}
		if !sameShape(out, example(t, p, "/usr/bin/etcdutl snapshot status")) {
			t.Fatalf("docs/backups.md shows a table not shaped like etcdutl's:\n%s", out)
		}
		n.docOK(p, "rm /run/etcd-backup/etcd-pre-upgrade.db")
		if n.Exists("/run/etcd-backup/etcd-pre-upgrade.db") {
			t.Fatal("the local copy is still there")
		}

		// The provider's step on this (unencrypted) node: skipped, nothing
		// written, the etcd 3.7 warning for the 3.6.8 member.
		out = n.docOK(p, "provider-kubernetes etcd-snapshot --target v1.37.2", "msg=etcd-snapshot outcome=skipped-encryption-unconfirmed target=v1.37.2 detail=")
		if n.Exists(paths.EtcdBackupDir) {
			t.Fatalf("%s was made on unconfirmed storage", paths.EtcdBackupDir)
		}
		logLines(t, out, example(t, p, "provider-kubernetes etcd-snapshot --target v1.37.2"))
		n.docOK(p, "grep 'etcd-snapshot outcome='", "msg=etcd-snapshot outcome=skipped-encryption-unconfirmed target=v1.37.2")
		n.docOK(p, "grep 'msg=etcd-version-warning '", `members="cp1\x3d3.6.8"`, "minimum=3.6.11", "target=v1.37.2")

		// kubeadm's copies from the two earlier upgrades of this node.
		old, newer := "kubeadm-backup-etcd-2026-10-02-09-14-51", "kubeadm-backup-etcd-2026-11-29-11-02-13"
		for _, b := range []string{old, newer} {
			n.Write(paths.KubeadmTmpDir+"/"+b+"/etcd/member/snap/db", strings.Repeat("etcd data ", 100000), 0o600)
		}
		out = n.docOK(p, "ls -1d /etc/kubernetes/tmp/kubeadm-backup-etcd-*")
		if want := paths.KubeadmTmpDir + "/" + old + "\n" + paths.KubeadmTmpDir + "/" + newer + "\n"; out != want {
			t.Fatalf("ls: %q, want %q", out, want)
		}
		// Not verified (its kubelet still reports 1.35.4): nothing removed.
		api.SetNode("cp1", "v1.35.4", true)
		if out, code := n.doc(p, "provider-kubernetes prune-kubeadm-backups"); code != 3 || !strings.Contains(out, "refusing to remove anything") {
			t.Fatalf("prune on an unverified node: exit %d\n%s", code, out)
		}
		if !n.Exists(paths.KubeadmTmpDir+"/"+old) || !n.Exists(paths.KubeadmTmpDir+"/"+newer) {
			t.Fatal("a refused prune removed a copy")
		}
		api.SetNode("cp1", "v1.36.3", true)
		out = n.docOK(p, "provider-kubernetes prune-kubeadm-backups", "removed "+paths.KubeadmTmpDir+"/"+old+" (", "kept 1, freed ", "this node is at the cluster's version v1.36.3")
		if n.Exists(paths.KubeadmTmpDir+"/"+old) || !n.Exists(paths.KubeadmTmpDir+"/"+newer) {
			t.Fatal("prune did not keep exactly the newest copy")
		}
		if !sameShape(out, example(t, p, "provider-kubernetes prune-kubeadm-backups")) {
			t.Fatalf("docs/backups.md shows prune printing lines it does not print:\n%s", out)
		}
	})
}

// sameShape reports whether got and the page's example have the same lines
// once every digit and hex run is blanked and a node's names replaced: the
// example may show other numbers, not other words.
func sameShape(got, example string) bool {
	blank := regexp.MustCompile(`[0-9.]+ ?[kKMGT]?i?B\b|[0-9a-f]*[0-9][0-9a-f]*`)
	norm := func(s string) string {
		s = blank.ReplaceAllString(strings.TrimSpace(s), "N")
		return regexp.MustCompile(` +`).ReplaceAllString(s, " ")
	}
	return example != "" && norm(got) == norm(example)
}

// startEtcd runs bin as the node's stacked etcd member the way kubeadm's
// manifest does (the manifest written to match), on 127.0.0.1:2379 and
// 2380, and writes keys; it returns how many.
func startEtcd(t *testing.T, n *node, bin string) int {
	t.Helper()
	const keys = 500
	etcdtest.StartBinaryOn(t, n.Node, bin, "registry.k8s.io/etcd:3.6.8-0", 2379, 2380).PutKeys("/registry/secrets/default/s", keys, 512)
	return keys
}
