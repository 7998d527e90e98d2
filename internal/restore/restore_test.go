package restore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/cli"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/restore"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

var tokenLine = regexp.MustCompile(`--cluster-token (etcd-restore-[0-9a-f]{16}) --yes`)

// The whole recovery on real etcd: three members with a marker, the
// operator's snapshot, a second key written after it, every member
// stopped and restored by the command from its own kubeadm manifest (the
// first one run makes the token, the others are given it), then started
// from the restored data: one healthy three-member cluster, a new cluster
// id, the first key there and the second not, and every old member
// directory intact under its moved-aside name.
func TestRestoreThreeMembers(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("real etcd: not in -short mode")
	}
	ms := newMembers(t, 3, etcdVersion)
	ic := initialCluster(ms)
	for _, m := range ms {
		m.start(ic)
	}
	for _, m := range ms {
		m.ready()
	}
	ms[0].put("/registry/configmaps/default/first", "before the snapshot")
	ms[0].saveSnapshot()
	ms[1].put("/registry/configmaps/default/second", "after the snapshot")
	oldCluster := clusterID(t, ms[2])
	for _, m := range ms {
		m.stop()
	}
	before := map[string]string{}
	for _, m := range ms[1:] {
		copySnapshot(t, ms[0].n, m.n)
	}
	for _, m := range ms {
		before[m.name()] = testutil.Digest(t, m.memberDir())
		m.moveManifestsOut()
	}

	// cp2 first (its manifest lists only cp1 and cp2): the command makes
	// the token and says what to run on the others.
	start := time.Now()
	code, out, errOut := ms[1].restoreEtcd("--initial-cluster", ic, "--yes")
	if code != reconcile.ExitOK {
		t.Fatalf("cp2: exit %d\n%s\n%s", code, out, errOut)
	}
	tok := tokenLine.FindStringSubmatch(out)
	if tok == nil {
		t.Fatalf("no --cluster-token for the next member in:\n%s", out)
	}
	for _, want := range []string{
		"etcd member cp2 restored from " + snapshotFile,
		"cluster token:   " + tok[1] + " (new)",
		"Next, on each other member (cp1, cp3)",
		"provider-kubernetes restore-etcd --snapshot " + snapshotFile + " --manifests " + stopped,
		"--initial-cluster '" + ic + "'",
		"When every member is restored, put the manifests back on every control plane:",
		"mv " + stopped + "/etcd.yaml " + paths.ManifestsDir + "/",
		"mv " + stopped + "/kube-apiserver.yaml " + paths.ManifestsDir + "/",
		"endpoint health --cluster",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("cp2's output lacks %q:\n%s", want, out)
		}
	}
	for _, m := range []int{0, 2} {
		if code, out, errOut := ms[m].restoreEtcd("--initial-cluster", ic, "--cluster-token", tok[1], "--yes"); code != reconcile.ExitOK {
			t.Fatalf("%s: exit %d\n%s\n%s", ms[m].name(), code, out, errOut)
		} else if !strings.Contains(out, "cluster token:   "+tok[1]+"\n") {
			t.Fatalf("%s: output:\n%s", ms[m].name(), out)
		}
	}
	t.Logf("three restores in %s", time.Since(start).Round(time.Millisecond))

	for _, m := range ms {
		// The old member directory, untouched, under its moved-aside name;
		// the restored one in place, 0700 in a 0700 data dir; nothing else.
		var aside []string
		for _, e := range names(t, m.dataDir()) {
			switch {
			case e == "member":
			case strings.HasPrefix(e, "member.pre-restore-"):
				aside = append(aside, e)
			default:
				t.Errorf("%s: %s left in the data dir", m.name(), e)
			}
		}
		if len(aside) != 1 || testutil.Digest(t, filepath.Join(m.dataDir(), aside[0])) != before[m.name()] {
			t.Fatalf("%s: moved-aside %v is not the old member directory", m.name(), aside)
		}
		for _, d := range []string{m.dataDir(), m.memberDir()} {
			if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
				t.Fatalf("%s: %v %v, want 0700", d, st.Mode(), err)
			}
		}
		// The persistent status says what this node will run once the
		// manifests are back, not the version the restore undid.
		d, err := status.Read(m.n.R(), paths.StatusMirror)
		if err != nil || d.Phase != restore.PhaseRestored || !d.Member || d.NodeVersion != k8sVersion || !strings.Contains(d.Message, tok[1]) {
			t.Fatalf("%s: status mirror %+v %v", m.name(), d, err)
		}
		if m.n.Exists(paths.VerifiedRecord) {
			t.Fatalf("%s: a verified-version record made where there was none", m.name())
		}
		if log := m.n.Read(paths.ReconcileLog); !strings.Contains(log, "msg=restore-etcd outcome=restored member="+m.name()) {
			t.Fatalf("%s: reconcile log:\n%s", m.name(), log)
		}
	}

	// The manifests go back; the kubelet would start etcd from them. The
	// processes run with the manifests' flags and their own initial
	// cluster (ignored: the data dir holds the member now).
	for _, m := range ms {
		for _, f := range []string{"etcd.yaml", "kube-apiserver.yaml"} {
			if err := os.Rename(m.n.Path(stopped+"/"+f), m.n.Path(paths.ManifestsDir+"/"+f)); err != nil {
				t.Fatal(err)
			}
		}
		m.start(m.entry())
	}
	for _, m := range ms {
		m.ready()
	}
	c := ms[2].clientv3()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := c.Get(ctx, "/registry/configmaps/default/first")
	if err != nil || len(first.Kvs) != 1 || string(first.Kvs[0].Value) != "before the snapshot" {
		t.Fatalf("first key: %v %v", first, err)
	}
	second, err := c.Get(ctx, "/registry/configmaps/default/second")
	if err != nil || len(second.Kvs) != 0 {
		t.Fatalf("second key after the restore: %v %v", second, err)
	}
	if first.Header.Revision < 1_000_000_000 {
		t.Fatalf("revision %d: not raised past every revision the old cluster served", first.Header.Revision)
	}
	ml, err := c.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mb := range ml.Members {
		got = append(got, mb.Name+"="+strings.Join(mb.PeerURLs, ","))
	}
	slices.Sort(got)
	if strings.Join(got, ",") != ic {
		t.Fatalf("members %v, want %s", got, ic)
	}
	newCluster := ml.Header.ClusterId
	if newCluster == oldCluster {
		t.Fatalf("cluster id %x unchanged: the new token must make a new cluster", newCluster)
	}
	leaders := map[uint64]bool{}
	for _, m := range ms {
		st, err := c.Status(ctx, m.clientURL())
		if err != nil {
			t.Fatalf("%s: %v", m.name(), err)
		}
		if st.Header.ClusterId != newCluster || len(st.Errors) != 0 {
			t.Fatalf("%s: cluster %x errors %v", m.name(), st.Header.ClusterId, st.Errors)
		}
		leaders[st.Leader] = true
	}
	if len(leaders) != 1 || leaders[0] {
		t.Fatalf("leaders seen: %v", leaders)
	}
	// Writable with quorum.
	ms[0].put("/registry/configmaps/default/third", "after the restore")
}

func clusterID(t *testing.T, m *member) uint64 {
	t.Helper()
	c := m.clientv3()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx, m.clientURL())
	if err != nil {
		t.Fatal(err)
	}
	return st.Header.ClusterId
}

// stoppedMember is one member with data, its snapshot taken, stopped and
// its manifests moved out: ready to restore, unless a case changes that.
func stoppedMember(t *testing.T) *member {
	t.Helper()
	m := newMembers(t, 1, etcdVersion)[0]
	m.start(m.entry())
	m.ready()
	m.put("/registry/configmaps/default/first", "1")
	m.saveSnapshot()
	m.put("/registry/configmaps/default/second", "2")
	m.stop()
	m.moveManifestsOut()
	return m
}

// Every refusal on real files and a real etcd: exit 3 (missing --yes: 2),
// the reason on stderr, and nothing changed: the data dir as it was, no
// status written.
func TestRestoreRefusesAndChangesNothing(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("real etcd: not in -short mode")
	}
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, m *member) (cleanup func())
		args  []string
		code  int
		says  []string
		lines int // refusals on stderr, when it matters
		// live: etcd runs and writes its own database meanwhile, so only
		// the data dir's entries are compared, not their content.
		live bool
	}{
		{name: "without --yes: only what it would do", code: reconcile.ExitUsage,
			says: []string{"would restore etcd member cp1", "Run it again with --yes", "nothing changed"}},
		{name: "the manifests still in place", code: reconcile.ExitRefused, args: []string{"--yes"},
			setup: func(t *testing.T, m *member) func() {
				// Copied back: both places hold them, as when the operator copied instead of moving.
				for _, f := range []string{"etcd.yaml", "kube-apiserver.yaml"} {
					m.n.Write(paths.ManifestsDir+"/"+f, m.n.Read(stopped+"/"+f), 0o600)
				}
				return nil
			},
			says: []string{"the static control plane is not stopped: /etc/kubernetes/manifests/etcd.yaml and /etc/kubernetes/manifests/kube-apiserver.yaml still in /etc/kubernetes/manifests",
				"move the static pod manifests out of it (docs/rollback-and-restore, step 1)"}},
		{name: "etcd still running", code: reconcile.ExitRefused, args: []string{"--yes"},
			setup: func(t *testing.T, m *member) func() {
				m.start(m.entry())
				m.ready()
				return m.stop
			},
			says: []string{"something still listens on 127.0.0.1:", "(--listen-client-urls)", "(--listen-peer-urls)", "(--listen-metrics-urls)",
				"/var/lib/etcd/member/snap/db is held open by a running etcd"}, lines: 4, live: true},
		{name: "a corrupted snapshot (only its sha256 shows it)", code: reconcile.ExitRefused, args: []string{"--yes"},
			setup: func(t *testing.T, m *member) func() {
				f, err := os.OpenFile(m.n.Path(snapshotFile), os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				// The last byte of the sha256 trailer etcdctl appends:
				// etcdutl snapshot status reads the database and passes,
				// only the restore's hash check sees it (a byte in the
				// middle may land in a page status reads, or in a free one).
				st, _ := f.Stat()
				b := []byte{0}
				if _, err := f.ReadAt(b, st.Size()-1); err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt([]byte{^b[0]}, st.Size()-1); err != nil {
					t.Fatal(err)
				}
				return nil
			},
			says: []string{"the snapshot does not verify: " + snapshotFile, "sha256", "(nothing changed)"}},
		{name: "a truncated snapshot", code: reconcile.ExitRefused, args: []string{"--yes"},
			setup: func(t *testing.T, m *member) func() {
				st, _ := os.Stat(m.n.Path(snapshotFile))
				if err := os.Truncate(m.n.Path(snapshotFile), st.Size()-512); err != nil {
					t.Fatal(err)
				}
				return nil
			},
			says: []string{"the snapshot does not verify: " + snapshotFile}},
		{name: "a snapshot others can read", code: reconcile.ExitRefused, args: []string{"--yes"},
			setup: func(t *testing.T, m *member) func() {
				if err := os.Chmod(m.n.Path(snapshotFile), 0o644); err != nil {
					t.Fatal(err)
				}
				return nil
			},
			says: []string{"mode 0644", "chmod 0600"}},
		// troubleshooting.md, Restore refusals: "the snapshot does not
		// verify": "not root's, readable by others" (the group included:
		// it holds every Secret of the cluster).
		{name: "a snapshot another user owns", code: 3, args: []string{"--yes"},
			setup: func(t *testing.T, m *member) func() {
				if err := os.Chown(m.n.Path(snapshotFile), 4242, 0); err != nil {
					t.Fatal(err)
				}
				return nil
			},
			says: []string{"the snapshot does not verify: " + snapshotFile, "not root"}},
		{name: "a snapshot its group can read", code: 3, args: []string{"--yes"},
			setup: func(t *testing.T, m *member) func() {
				if err := os.Chmod(m.n.Path(snapshotFile), 0o640); err != nil {
					t.Fatal(err)
				}
				return nil
			},
			says: []string{"the snapshot does not verify: " + snapshotFile, "mode 0640"}},
		{name: "the etcdutl of another etcd", code: reconcile.ExitRefused, args: []string{"--yes"},
			setup: func(t *testing.T, m *member) func() {
				bundle(t, m.n, "v3.7.0") // the 1.37 image's, with the 1.36 manifests to put back
				return nil
			},
			says: []string{"etcd version mismatch: the bundled /usr/bin/etcdutl is 3.7.0 but the manifest to put back runs etcd 3.6 (" + etcdImage + ")",
				"boot the image that bundles etcd 3.6"}},
		{name: "a symlinked data dir", code: reconcile.ExitRefused, args: []string{"--yes"},
			setup: func(t *testing.T, m *member) func() {
				real := m.n.Path("/var/lib/etcd-real")
				if err := os.Rename(m.dataDir(), real); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("etcd-real", m.dataDir()); err != nil {
					t.Fatal(err)
				}
				return nil
			},
			says: []string{"unsafe path: data dir /var/lib/etcd", "symlink not followed"}},
		{name: "a reconcile pass running", code: reconcile.ExitRefused, args: []string{"--yes"},
			setup: func(t *testing.T, m *member) func() {
				unlock, err := reconcile.Lock(m.n.R())
				if err != nil {
					t.Fatal(err)
				}
				return unlock
			},
			says: []string{"a reconcile pass is running"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := stoppedMember(t)
			if c.setup != nil {
				if cleanup := c.setup(t, m); cleanup != nil {
					defer cleanup()
				}
			}
			// Resolved, so the symlink case compares what it points at.
			dataDir, err := filepath.EvalSymlinks(m.dataDir())
			if err != nil {
				t.Fatal(err)
			}
			before := testutil.Digest(t, dataDir)
			if c.live {
				before = strings.Join(names(t, dataDir), " ")
			}
			code, out, errOut := m.restoreEtcd(append([]string{"--initial-cluster", m.entry()}, c.args...)...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, c.code, out, errOut)
			}
			for _, s := range c.says {
				if !strings.Contains(out+errOut, s) {
					t.Errorf("output does not say %q:\nstdout:\n%s\nstderr:\n%s", s, out, errOut)
				}
			}
			if n := strings.Count(errOut, "\n  - "); c.lines > 0 && n != c.lines {
				t.Errorf("%d refusals, want %d (one per address):\n%s", n, c.lines, errOut)
			}
			after := testutil.Digest(t, dataDir)
			if c.live {
				after = strings.Join(names(t, dataDir), " ")
			}
			if after != before {
				t.Fatalf("the data dir changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			for _, p := range []string{paths.StatusMirror, paths.StatusFile} {
				if m.n.Exists(p) {
					t.Fatalf("%s written by a run that changed nothing", p)
				}
			}
			if code == reconcile.ExitRefused && !strings.Contains(m.n.Read(paths.ReconcileLog), "msg=restore-etcd outcome=refused") {
				t.Fatalf("reconcile log:\n%s", m.n.Read(paths.ReconcileLog))
			}
		})
	}
}

// The records the next boot reads go back with the data. Rolled back to
// the 1.36 image with the 1.36 pin after a 1.37 upgrade, a control plane
// whose manifests are still out is decided as a worker, from the
// persistent status: at v1.37.2 that is a Downgrade refusal; after the
// restore it is converged. The verified-version record that said v1.37.2
// says v1.36.3, so a crash in the retried upgrade is finished, not taken
// for converged. Decided by the real plan command on the node.
func TestRestoreResetsWhatTheNextBootReads(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("real etcd: not in -short mode")
	}
	m := stoppedMember(t)
	n := m.n
	n.ClusterFile("controlplane", k8sVersion, "")
	n.Write(paths.KubeletConf, "apiVersion: v1\nkind: Config\n", 0o600)
	// What the 1.37 upgrade's last pass left.
	if err := status.Write(n.R(), status.Document{Phase: status.PhaseConverged, Member: true, Role: "controlplane",
		NodeVersion: "v1.37.2", VerifiedVersion: "v1.37.2"}); err != nil {
		t.Fatal(err)
	}
	n.Write(paths.VerifiedRecord, "v1.37.2\n", 0o644)
	plan := func() (int, string) {
		return planJSON(n.Root, k8sVersion)
	}
	if code, out := plan(); code != reconcile.ExitRefused || !strings.Contains(out, "refusal=Downgrade") {
		t.Fatalf("before the restore: exit %d %s", code, out)
	}

	if code, out, errOut := m.restoreEtcd("--initial-cluster", m.entry(), "--yes"); code != reconcile.ExitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if got := n.Read(paths.VerifiedRecord); got != k8sVersion+"\n" {
		t.Fatalf("verified record %q, want %s", got, k8sVersion)
	}
	n.DocumentedFile(paths.VerifiedRecord)
	if code, out := plan(); code != reconcile.ExitOK || !strings.Contains(out, "verdict=none") {
		t.Fatalf("after the restore, manifests still out: exit %d %s", code, out)
	}
	for _, f := range []string{"etcd.yaml", "kube-apiserver.yaml"} {
		if err := os.Rename(n.Path(stopped+"/"+f), n.Path(paths.ManifestsDir+"/"+f)); err != nil {
			t.Fatal(err)
		}
	}
	if code, out := plan(); code != reconcile.ExitOK || !strings.Contains(out, "verdict=none") {
		t.Fatalf("after the restore, manifests back: exit %d %s", code, out)
	}
	// The retried upgrade, interrupted after kubeadm (manifests at the
	// pin): finished, because the record is older than the pin again.
	n.Write(paths.APIServerManifest, testutil.APIServerManifest("v1.37.2"), 0o600)
	n.ClusterFile("controlplane", "v1.37.2", "")
	if code, out := planJSON(n.Root, "v1.37.2"); code != reconcile.ExitOK || !strings.Contains(out, "actions=restart-kubelet,verify ") {
		t.Fatalf("retried upgrade interrupted after kubeadm: exit %d %s", code, out)
	}
}

// planJSON runs plan -o json on root with the bundle and the cluster at
// v and returns its exit code and the decoded plan as
// "verdict=V refusal=R actions=A,B " (or what it printed, undecodable).
func planJSON(root, v string) (int, string) {
	var out, errb bytes.Buffer
	code := cli.Main(context.Background(), []string{"plan", "--root", root, "-o", "json", "--bundled", v, "--cluster-version", v}, nil, &out, &errb)
	var pl plan.Plan
	if err := json.Unmarshal(out.Bytes(), &pl); err != nil {
		return code, fmt.Sprintf("not a plan (%v): %s %s", err, out.String(), errb.String())
	}
	var as []string
	for _, a := range pl.Actions {
		as = append(as, string(a))
	}
	return code, fmt.Sprintf("verdict=%s refusal=%s actions=%s ", pl.Verdict, pl.Refusal, strings.Join(as, ","))
}
