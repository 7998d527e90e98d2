package etcdsnap

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
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
	good := f.take(version.MustParse("v1.36.3"))
	if good.Outcome != Taken {
		t.Fatalf("%s %s", good.Outcome, good.Reason)
	}
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
// moved to the target (an interrupted upgrade apply being resumed) gets no
// snapshot when none was taken before the apply: failed, with a detail
// saying the apply had already started. One taken before still counts.
func TestNoSnapshotOnceTheApplyBegan(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	f.node.Write(paths.APIServerManifest, testutil.APIServerManifest("v1.37.2"), 0o600)
	f.node.Write(paths.ManifestsDir+"/kube-controller-manager.yaml", testutil.StaticPodManifest("kube-controller-manager", "v1.36.3"), 0o600)
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
	f.node.Write(paths.APIServerManifest, testutil.APIServerManifest("v1.37.2"), 0o600)
	if again := f.take(v1372); again.Outcome != SkippedAlreadyTaken || again.Path != first.Path {
		t.Fatalf("%+v", again)
	}
}

func TestApplyStarted(t *testing.T) {
	m := func(kv ...string) map[string][]byte {
		out := map[string][]byte{}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = []byte(testutil.StaticPodManifest(kv[i], kv[i+1]))
		}
		return out
	}
	for _, c := range []struct {
		target    string
		manifests map[string][]byte
		want      string
	}{
		{"v1.37.2", m("kube-apiserver", "v1.36.3", "kube-controller-manager", "v1.36.3", "kube-scheduler", "v1.36.3"), ""},
		{"v1.37.2", m("kube-apiserver", "v1.37.2", "kube-controller-manager", "v1.36.3"), "kube-apiserver manifest already runs v1.37.2"},
		{"v1.37.2", m("kube-apiserver", "v1.36.3", "kube-controller-manager", "v1.37.0"), "kube-controller-manager manifest already runs v1.37.0"},
		{"v1.37.2", m("kube-scheduler", "v1.38.0"), "kube-scheduler manifest already runs v1.38.0"},
		{"v1.37.2", m(), ""},
		{"v1.37.2", map[string][]byte{"kube-apiserver": []byte("\x00not yaml")}, ""},
	} {
		got := ApplyStarted(version.MustParse(c.target), c.manifests)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s %v: %q, want %q", c.target, c.manifests, got, c.want)
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
