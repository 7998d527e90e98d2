package etcdsnap

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// plantedName is a snapshot name for this cluster and v1.37, an hour
// before the fixture's clock: what a planted or stale file would be called.
func (f *fixture) plantedName() string {
	return fmt.Sprintf("etcd-%016x-v1.37-20261130T090000Z.db", f.etcd.ClusterID())
}

// TestPlantedOrStaleSnapshotNeverCounts: a file with the right name counts
// as skipped-already-taken only when it is a regular root:root 0600 file
// with one link that passes the same verification a new snapshot passes.
// Anything else is removed, a real snapshot is taken, and the outcome
// line's detail says what was removed and why.
func TestPlantedOrStaleSnapshotNeverCounts(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	f.etcd.PutKeys("/registry/a/", 20, 100)

	// A real, verified snapshot to copy from (a snapshot of this very
	// cluster, so only its file properties make it untrustworthy).
	f.before(version.MustParse("v1.36.3"))
	good := f.take(version.MustParse("v1.36.3"))
	if good.Outcome != Taken {
		t.Fatalf("%s %s", good.Outcome, good.Reason)
	}
	f.before(v1372)
	goodBytes, err := os.ReadFile(f.node.Path(good.Path))
	if err != nil {
		t.Fatal(err)
	}
	dir := f.node.Path(paths.EtcdBackupDir)
	elsewhere := t.TempDir()

	cases := []struct {
		name  string
		plant func(p string)
		why   string // in the detail
	}{
		{"five bytes of junk", func(p string) { write(t, p, []byte("junk!"), 0o600, 0) }, "no sha256 trailer"},
		{"a real snapshot, 0644", func(p string) { write(t, p, goodBytes, 0o644, 0) }, "mode 0644"},
		{"a real snapshot owned by another user", func(p string) { write(t, p, goodBytes, 0o600, 65534) }, "owned by 65534:65534"},
		{"a real snapshot with a second hard link", func(p string) {
			write(t, p, goodBytes, 0o600, 0)
			if err := os.Link(p, filepath.Join(elsewhere, "link")); err != nil {
				t.Fatal(err)
			}
		}, "2 hard links"},
		{"a real snapshot with a damaged sha256 trailer", func(p string) {
			b := append([]byte(nil), goodBytes...)
			b[len(b)-1] ^= 0xff
			write(t, p, b, 0o600, 0)
		}, "sha256 trailer does not match"},
		{"a trailer-valid file that is no database", func(p string) {
			b := make([]byte, 4096)
			copy(b, "not a bbolt database")
			write(t, p, withTrailer(b), 0o600, 0)
		}, "etcdutl snapshot status"},
		{"a FIFO", func(p string) { testutil.Plant(t, p, testutil.FIFO) }, "a FIFO, not a regular file"},
		{"a directory", func(p string) { testutil.Plant(t, p, testutil.Directory) }, "a directory, not a regular file"},
		{"a symlink to a real snapshot", func(p string) {
			target := filepath.Join(elsewhere, "real.db")
			write(t, target, goodBytes, 0o600, 0)
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}, "a symlink, not a regular file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.t = t
			// Only the planted file in the directory.
			for _, n := range f.snapshots() {
				if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
					t.Fatal(err)
				}
			}
			planted := filepath.Join(dir, f.plantedName())
			c.plant(planted)
			f.log = &testutil.SyncBuffer{}
			var res Result
			testutil.Within(t, 90*time.Second, "the step", func() { res = f.take(v1372) }, func() { testutil.Unblock(planted) })
			if res.Outcome != Taken {
				t.Fatalf("outcome %s (%s): a planted file must not count\n%s", res.Outcome, res.Reason, f.log.String())
			}
			l := f.oneLine(1, Taken, "detail=", "removed "+f.plantedName(), c.why)
			_ = l
			if got := f.snapshots(); len(got) != 1 || got[0] != filepath.Base(res.Path) {
				t.Fatalf("backup dir holds %q: want only the new snapshot", got)
			}
			if uid, gid, mode := ownerAndMode(t, f.node.Path(res.Path)); uid != 0 || gid != 0 || mode != 0o600 {
				t.Fatalf("new snapshot %d:%d %o", uid, gid, mode)
			}
		})
	}
	// Nothing outside the directory was touched through a link.
	if b, err := os.ReadFile(filepath.Join(elsewhere, "real.db")); err != nil || string(b) != string(goodBytes) {
		t.Fatalf("symlink target changed: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(elsewhere, "link")); err != nil || string(b) != string(goodBytes) {
		t.Fatalf("hard-linked file changed: %v", err)
	}
}

// A snapshot the step itself took and sealed still counts (and is
// verified again, with etcdutl, not trusted on its name).
func TestASealedSnapshotStillCounts(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	first := f.take(v1372)
	if first.Outcome != Taken {
		t.Fatalf("%s %s", first.Outcome, first.Reason)
	}
	f.now = f.now.Add(time.Hour)
	again := f.take(v1372)
	if again.Outcome != SkippedAlreadyTaken || again.Path != first.Path || again.Reason != "" {
		t.Fatalf("%+v", again)
	}
	if got := f.run.paths(); len(got) != 3 || got[2] != paths.Etcdutl {
		t.Fatalf("commands %v: the kept snapshot is verified with etcdutl", got)
	}
}

// A backup directory another user owns, or others can write, is never
// reused: it is moved aside and the snapshot goes into a fresh 0700 one.
func TestUntrustedBackupDirIsReplaced(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range []struct {
		name string
		uid  int
		mode os.FileMode
	}{{"owned by another user", 65534, 0o700}, {"world-writable", 0, 0o777}} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			dir := f.node.Path(paths.EtcdBackupDir)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			planted := filepath.Join(dir, "etcd-0000000000000001-v1.36-20261130T090000Z.db")
			write(t, planted, []byte("planted"), 0o600, 0)
			if err := os.Chmod(dir, c.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, c.uid, c.uid); err != nil {
				t.Fatal(err)
			}
			res := f.take(v1372)
			if res.Outcome != Taken {
				t.Fatalf("%s %s", res.Outcome, res.Reason)
			}
			f.oneLine(1, Taken, "detail=", "moved aside to etcd-backup.untrusted-")
			if uid, gid, mode := ownerAndMode(t, dir); uid != 0 || gid != 0 || mode != 0o700 {
				t.Fatalf("backup dir %d:%d %o", uid, gid, mode)
			}
			if got := f.snapshots(); len(got) != 1 || got[0] != filepath.Base(res.Path) {
				t.Fatalf("backup dir holds %q", got)
			}
		})
	}
}

// TestNoSnapshotOnceTheApplyBegan: a control plane whose manifests already
// moved to the target (an interrupted upgrade apply being resumed: etcd.yaml
// first, then the apiserver's and the others) gets no
// snapshot when none was taken before the apply: failed, with a detail
// saying the apply had already started. One taken before still counts.
func TestNoSnapshotOnceTheApplyBegan(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	// Cut right after kubeadm replaced etcd.yaml: the member already runs
	// etcd 3.7, the other three manifests are still at 1.36.
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		f.node.Write(paths.ManifestsDir+"/"+c+".yaml", testutil.StaticPodManifest(c, "v1.36.3"), 0o600)
	}
	f.etcd.SetImage("registry.k8s.io/etcd:3.7.0-0")
	if res := f.take(v1372); res.Outcome != Failed || !strings.Contains(res.Reason, "upgrade apply had already started") ||
		!strings.Contains(res.Reason, "etcd manifest already runs 3.7.0-0") {
		t.Fatalf("%s %q", res.Outcome, res.Reason)
	}
	f.oneLine(1, Failed, "reason=")
	if got := f.snapshots(); len(got) != 0 || len(f.run.cmds) != 0 {
		t.Fatalf("wrote %q or ran %v", got, f.run.paths())
	}
	f.log = &testutil.SyncBuffer{}
	f.before(v1372)

	f.node.Write(paths.APIServerManifest, testutil.APIServerManifest("v1.37.2"), 0o600)
	res := f.take(v1372)
	if res.Outcome != Failed || !strings.Contains(res.Reason, "upgrade apply had already started") ||
		!strings.Contains(res.Reason, "kube-apiserver manifest already runs v1.37.2") {
		t.Fatalf("%s %q", res.Outcome, res.Reason)
	}
	f.oneLine(1, Failed, "reason=")
	if got := f.snapshots(); len(got) != 0 || len(f.run.cmds) != 0 {
		t.Fatalf("wrote %q or ran %v", got, f.run.paths())
	}

	// The first, clean snapshot was taken before the apply: it is kept.
	f.node.Write(paths.APIServerManifest, testutil.APIServerManifest("v1.36.3"), 0o600)
	first := f.take(v1372)
	if first.Outcome != Taken {
		t.Fatalf("%s %s", first.Outcome, first.Reason)
	}
	f.etcd.SetImage("registry.k8s.io/etcd:3.7.0-0")
	f.node.Write(paths.APIServerManifest, testutil.APIServerManifest("v1.37.2"), 0o600)
	if again := f.take(v1372); again.Outcome != SkippedAlreadyTaken || again.Path != first.Path {
		t.Fatalf("%+v", again)
	}
}

// TestApplyStarted: kubeadm upgrade apply replaces etcd.yaml first (with
// stacked etcd) and waits for the new member before the apiserver,
// controller-manager and scheduler manifests; a cut in between leaves only
// etcd at the target's etcd, which upgrades.md names: etcd 3.6.8 under
// kubeadm 1.36, 3.7.0 under 1.37; 3.6.6 under 1.35.
func TestApplyStarted(t *testing.T) {
	m := func(kv ...string) map[string][]byte {
		out := map[string][]byte{}
		for i := 0; i < len(kv); i += 2 {
			if kv[i] == "etcd" {
				out["etcd"] = []byte(etcdtest.Manifest("cp1", kv[i+1], 2379, 2380))
				continue
			}
			out[kv[i]] = []byte(testutil.StaticPodManifest(kv[i], kv[i+1]))
		}
		return out
	}
	at136 := []string{"kube-apiserver", "v1.36.3", "kube-controller-manager", "v1.36.3", "kube-scheduler", "v1.36.3"}
	with := func(kv ...string) map[string][]byte { return m(append(append([]string{}, at136...), kv...)...) }
	for _, c := range []struct {
		name      string
		target    string
		manifests map[string][]byte
		want      string
	}{
		{"nothing moved", "v1.37.2", with("etcd", "registry.k8s.io/etcd:3.6.8-0"), ""},
		{"external etcd, nothing moved", "v1.37.2", with(), ""},
		{"apiserver moved", "v1.37.2", m("kube-apiserver", "v1.37.2", "kube-controller-manager", "v1.36.3"), "kube-apiserver manifest already runs v1.37.2"},
		{"controller-manager moved", "v1.37.2", m("kube-apiserver", "v1.36.3", "kube-controller-manager", "v1.37.0"), "kube-controller-manager manifest already runs v1.37.0"},
		{"scheduler a minor further", "v1.37.2", m("kube-scheduler", "v1.38.0"), "kube-scheduler manifest already runs v1.38.0"},
		{"no manifest", "v1.37.2", m(), ""},
		{"unparsable", "v1.37.2", map[string][]byte{"kube-apiserver": []byte("\x00not yaml"), "etcd": []byte("\x00")}, ""},

		// Cut after kubeadm replaced etcd.yaml, before the apiserver.
		{"only etcd moved to 3.7.0", "v1.37.2", with("etcd", "registry.k8s.io/etcd:3.7.0-0"), "etcd manifest already runs 3.7.0-0"},
		{"etcd moved, another registry", "v1.37.2", with("etcd", "mirror.example:5000/k8s/etcd:3.7.0-0"), "etcd manifest already runs 3.7.0-0"},
		{"etcd moved, pinned by digest", "v1.37.2", with("etcd", "registry.k8s.io/etcd:3.7.0-0@sha256:"+strings.Repeat("ab", 32)), "etcd manifest already runs 3.7.0-0"},
		{"etcd moved and the apiserver", "v1.37.2", m("etcd", "registry.k8s.io/etcd:3.7.0-0", "kube-apiserver", "v1.37.2"), "etcd manifest already runs 3.7.0-0"},
		{"1.35 to 1.36: etcd moved to 3.6.8", "v1.36.3", m("etcd", "registry.k8s.io/etcd:3.6.8-0", "kube-apiserver", "v1.35.4"), "etcd manifest already runs 3.6.8-0"},
		{"1.35 to 1.36: nothing moved", "v1.36.3", m("etcd", "registry.k8s.io/etcd:3.6.6-0", "kube-apiserver", "v1.35.4"), ""},
		// An etcd of the operator's own (etcd.local.imageTag, kept by kubeadm
		// across the upgrade) says nothing.
		{"an operator's etcd tag", "v1.37.2", with("etcd", "registry.k8s.io/etcd:3.7.1-0"), ""},
		// From 1.34 (out of the window) kubeadm 1.35.4 lists 3.6.6-0 for both
		// 1.34 and 1.35: etcd.yaml at 3.6.6-0 may predate the apply.
		{"1.34 to 1.35: etcd says nothing", "v1.35.4", m("etcd", "registry.k8s.io/etcd:3.6.6-0", "kube-apiserver", "v1.34.2"), ""},
		{"1.34 to 1.35: the apiserver still counts", "v1.35.4", m("etcd", "registry.k8s.io/etcd:3.6.6-0", "kube-apiserver", "v1.35.4"), "kube-apiserver manifest already runs v1.35.4"},
	} {
		got := ApplyStarted(version.MustParse(c.target), c.manifests)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s (%s): %q, want %q", c.name, c.target, got, c.want)
		}
	}
}

func write(t *testing.T, p string, b []byte, mode os.FileMode, uid int) {
	t.Helper()
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
}

// withTrailer appends the sha256 trailer etcdctl writes (body: a multiple
// of 512 bytes).
func withTrailer(body []byte) []byte {
	sum := sha256.Sum256(body)
	return append(body, sum[:]...)
}

// TestUnverifiableSnapshotIsSetAsideNotDeleted: the snapshot taken before
// the apply stops verifying (a damaged byte) and the apply has begun (a cut
// after kubeadm replaced etcd.yaml): no new one can be taken, so it is the
// only copy of the pre-upgrade state. It is renamed <name>.unverified, its
// reason written beside it as <name>.reason (0600), never through the
// links planted at those names; it never counts again and is not
// re-verified; at most one is kept; the next verified snapshot prunes it.
func TestUnverifiableSnapshotIsSetAsideNotDeleted(t *testing.T) {
	f, first := withSnapshot(t, 20)
	dir := f.node.Path(paths.EtcdBackupDir)
	name := filepath.Base(first.Path)
	damaged, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	damaged[8192] ^= 0xff
	write(t, filepath.Join(dir, name), damaged, 0o600, 0)

	// Links planted at both names the step writes: never followed.
	elsewhere := t.TempDir()
	for _, n := range []string{name + ".unverified", name + ".reason"} {
		target := filepath.Join(elsewhere, n)
		write(t, target, []byte("someone else's file"), 0o644, 0)
		if err := os.Symlink(target, filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}

	// The cut: the member is on etcd 3.7, the apply has begun.
	f.etcd.SetImage("registry.k8s.io/etcd:3.7.0-0")
	f.log = &testutil.SyncBuffer{}
	res := f.take(v1372)
	if res.Outcome != Failed || !strings.Contains(res.Reason, "upgrade apply had already started") {
		t.Fatalf("%s %q", res.Outcome, res.Reason)
	}
	f.oneLine(1, Failed, "reason=", "detail=", "set aside "+name+" as "+name+".unverified: sha256 trailer does not match")
	if got := f.snapshots(); !slices.Equal(got, []string{name + ".reason", name + ".unverified"}) {
		t.Fatalf("backup dir holds %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(dir, name+".unverified")); err != nil || !bytes.Equal(b, damaged) {
		t.Fatalf("the set-aside snapshot is not the file that was there: %v", err)
	}
	if uid, gid, mode := ownerAndMode(t, filepath.Join(dir, name+".unverified")); uid != 0 || gid != 0 || mode != 0o600 {
		t.Fatalf("set-aside snapshot %d:%d %o", uid, gid, mode)
	}
	reason := filepath.Join(dir, name+".reason")
	if uid, gid, mode := ownerAndMode(t, reason); uid != 0 || gid != 0 || mode != 0o600 {
		t.Fatalf("reason file %d:%d %o", uid, gid, mode)
	}
	if b, err := os.ReadFile(reason); err != nil || !strings.Contains(string(b), name+" did not pass its re-verification at 2026-11-30T10:00:00Z (target v1.37.2): sha256 trailer does not match the content") {
		t.Fatalf("reason file: %q %v", b, err)
	}
	for _, n := range []string{name + ".unverified", name + ".reason"} {
		if b, err := os.ReadFile(filepath.Join(elsewhere, n)); err != nil || string(b) != "someone else's file" {
			t.Fatalf("written through the link at %s: %q %v", n, b, err)
		}
	}

	// Another boot, the apply still begun: the set-aside file is neither
	// trusted nor verified again, and stays.
	ran := len(f.run.cmds)
	f.log = &testutil.SyncBuffer{}
	if again := f.take(v1372); again.Outcome != Failed || again.Detail != "" {
		t.Fatalf("%s %q %q", again.Outcome, again.Reason, again.Detail)
	}
	if len(f.run.cmds) != ran {
		t.Fatalf("ran %v on a set-aside snapshot", f.run.paths()[ran:])
	}
	if got := f.snapshots(); !slices.Equal(got, []string{name + ".reason", name + ".unverified"}) {
		t.Fatalf("backup dir holds %q", got)
	}

	// A second one set aside: only the newest is kept, with its reason.
	newer := strings.Replace(name, "20261130T100000Z", "20261130T110000Z", 1)
	write(t, filepath.Join(dir, newer), damaged, 0o600, 0)
	f.log = &testutil.SyncBuffer{}
	if r := f.take(v1372); r.Outcome != Failed || !strings.Contains(r.Detail, "removed the older set-aside "+name+".unverified (at most 1 kept)") {
		t.Fatalf("%s %q", r.Outcome, r.Detail)
	}
	if got := f.snapshots(); !slices.Equal(got, []string{newer + ".reason", newer + ".unverified"}) {
		t.Fatalf("backup dir holds %q", got)
	}

	// Before an apply again (the next upgrade): a verified snapshot is
	// taken and the set-aside one goes with the older snapshots.
	f.before(v1372)
	f.now = f.now.Add(2 * time.Hour)
	f.log = &testutil.SyncBuffer{}
	next := f.take(v1372)
	if next.Outcome != Taken || next.Pruned != 1 {
		t.Fatalf("%+v", next)
	}
	if got := f.snapshots(); !slices.Equal(got, []string{filepath.Base(next.Path)}) {
		t.Fatalf("backup dir holds %q", got)
	}
}
