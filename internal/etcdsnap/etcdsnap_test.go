package etcdsnap

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/cryptgate"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

var v1372 = version.MustParse("v1.37.2")

// recRunner records what reaches the runner and delegates to the real one.
// before and after see every command (after only a successful one);
// rewrite may change what a successful command printed.
type recRunner struct {
	mu      sync.Mutex
	inner   runner.Runner
	cmds    []runner.Cmd
	before  func(c runner.Cmd)
	after   func(c runner.Cmd)
	rewrite func(c runner.Cmd, res runner.Result) runner.Result
}

func (r *recRunner) Run(ctx context.Context, c runner.Cmd) (runner.Result, error) {
	r.mu.Lock()
	r.cmds = append(r.cmds, c)
	r.mu.Unlock()
	if r.before != nil {
		r.before(c)
	}
	res, err := r.inner.Run(ctx, c)
	if r.after != nil && err == nil {
		r.after(c)
	}
	if r.rewrite != nil && err == nil {
		res = r.rewrite(c, res)
	}
	return res, err
}

// paths returns the binaries that ran, in order.
func (r *recRunner) paths() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.cmds {
		out = append(out, c.Path)
	}
	return out
}

// afterSave runs fn on the file etcdctl just saved (the .part).
func afterSave(t *testing.T, fn func(fh *os.File)) func(c runner.Cmd) {
	return func(c runner.Cmd) {
		if c.Path != paths.Etcdctl {
			return
		}
		fh, err := os.OpenFile(c.Args[len(c.Args)-1], os.O_RDWR, 0)
		if err != nil {
			t.Error(err)
			return
		}
		defer fh.Close()
		fn(fh)
	}
}

type fixture struct {
	t    *testing.T
	node *testutil.Node
	etcd *etcdtest.Etcd
	fs   cryptgate.FS
	run  *recRunner
	log  *testutil.SyncBuffer
	now  time.Time
}

// newFixture: a control plane with stacked etcd (embedded, TLS), the real
// etcdctl bundled and an encrypted persistent partition.
func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, node: testutil.NewNode(t, "cp1"), log: &testutil.SyncBuffer{}, now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
	etcdtest.BundleEtcdTools(t, f.node)
	f.fs = etcdtest.EncryptedPersistent(t, f.node)
	f.etcd = etcdtest.Start(t, f.node, etcdtest.Config{})
	f.run = &recRunner{inner: runner.Exec{Root: f.node.Root}}
	return f
}

func (f *fixture) opts() Options {
	return Options{Root: f.node.R(), Runner: f.run, Log: slog.New(slog.NewTextHandler(f.log, nil)), FS: f.fs,
		Now: func() time.Time { return f.now }, Total: 60 * time.Second, Request: 5 * time.Second}
}

// before puts etcd.yaml where kubeadm left it on a control plane before its
// upgrade apply to target: at the etcd image the minor before deploys
// (otherwise the step reads the apply as begun and takes nothing).
func (f *fixture) before(target version.Version) {
	f.t.Helper()
	e, ok := images.ForMinor(version.Minor{Major: target.Major, Minor: target.Minor - 1})
	if !ok {
		f.t.Fatalf("no etcd known for the minor before %s", target)
	}
	f.etcd.SetImage("registry.k8s.io/etcd:" + e.Etcd)
}

func (f *fixture) take(target version.Version) Result {
	f.t.Helper()
	return Take(context.Background(), f.opts(), target)
}

// lines returns the log lines with msg=etcd-snapshot.
func eventLines(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "msg="+Event+" ") {
			out = append(out, l)
		}
	}
	return out
}

// oneLine asserts the log has exactly n attempt lines, the last with outcome.
func (f *fixture) oneLine(n int, outcome Outcome, subs ...string) string {
	f.t.Helper()
	ls := eventLines(f.log.String())
	if len(ls) != n {
		f.t.Fatalf("%d etcd-snapshot lines, want %d:\n%s", len(ls), n, f.log.String())
	}
	l := ls[n-1]
	if !strings.Contains(l, "etcd-snapshot outcome="+string(outcome)+" ") {
		f.t.Fatalf("line %q lacks outcome=%s", l, outcome)
	}
	for _, s := range subs {
		if !strings.Contains(l, s) {
			f.t.Fatalf("line %q lacks %q", l, s)
		}
	}
	f.noSecrets()
	f.t.Logf("%s", l)
	return l
}

func (f *fixture) noSecrets() {
	f.t.Helper()
	log := f.log.String()
	key, _ := os.ReadFile(f.node.Path(etcdtest.HCKey))
	if l := strings.Split(string(key), "\n"); len(l) > 2 && strings.Contains(log, l[1][:20]) || strings.Contains(log, "BEGIN") {
		f.t.Fatalf("key material in the log:\n%s", log)
	}
}

func (f *fixture) snapshots() []string {
	f.t.Helper()
	ents, err := os.ReadDir(f.node.Path(paths.EtcdBackupDir))
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func ownerAndMode(t testing.TB, p string) (uid, gid uint32, mode os.FileMode) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid, os.FileMode(st.Mode & 0o7777)
}

func TestTakenVerifiedSealedAndRestorable(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	f.etcd.PutKeys("/registry/secrets/default/s", 300, 200)
	t.Setenv("ETCDCTL_ENDPOINTS", "https://127.0.0.1:1") // inherited, it would point etcdctl nowhere
	t.Setenv("ETCDCTL_API", "2")
	// kubeadm leaves the dir 0755 (the status mirror's parent): the step tightens it.
	res := f.take(v1372)
	if res.Outcome != Taken {
		t.Fatalf("outcome %s: %s\n%s", res.Outcome, res.Reason, f.log.String())
	}
	cid := f.etcd.ClusterID()
	want := fmt.Sprintf("%s/etcd-%016x-v1.37-20261130T100000Z.db", paths.EtcdBackupDir, cid)
	if res.Path != want || res.ClusterID != cid {
		t.Fatalf("path %s cluster %x, want %s %x", res.Path, res.ClusterID, want, cid)
	}
	if res.Keys != 300 || res.Revision <= 0 || res.Hash == 0 || res.DBSize <= 0 {
		t.Fatalf("result %+v", res)
	}
	f.oneLine(1, Taken, "path="+want, "target=v1.37.2", "keys=300")
	if got := f.snapshots(); len(got) != 1 || got[0] != filepath.Base(want) {
		t.Fatalf("backup dir holds %q: want only the snapshot (no .part)", got)
	}
	if uid, gid, mode := ownerAndMode(t, f.node.Path(want)); uid != 0 || gid != 0 || mode != 0o600 {
		t.Fatalf("snapshot %d:%d %o, want 0:0 600", uid, gid, mode)
	}
	if uid, gid, mode := ownerAndMode(t, f.node.Path(paths.EtcdBackupDir)); uid != 0 || gid != 0 || mode != 0o700 {
		t.Fatalf("backup dir %d:%d %o, want 0:0 700", uid, gid, mode)
	}
	// Exactly the bundled etcdctl, then the bundled etcdutl, through the
	// runner, bounded, closed env.
	if got := f.run.paths(); !reflect.DeepEqual(got, []string{paths.Etcdctl, paths.Etcdutl}) {
		t.Fatalf("commands %v", got)
	}
	c := f.run.cmds[0]
	if c.Path != "/usr/bin/etcdctl" || len(c.Env) != 0 || c.Timeout <= 0 || c.Timeout > 60*time.Second {
		t.Fatalf("command %+v", c)
	}
	for _, a := range []string{"--endpoints=" + f.etcd.ClientURL, "--cert=" + f.node.Path(etcdtest.HCCert), "--key=" + f.node.Path(etcdtest.HCKey),
		"--cacert=" + f.node.Path(etcdtest.CACert), "snapshot", "save"} {
		if !strings.Contains(" "+strings.Join(c.Args, " ")+" ", " "+a+" ") {
			t.Fatalf("etcdctl args %q lack %q", c.Args, a)
		}
	}
	// The snapshot is written through the backup directory the provider
	// holds open and checked (this process's descriptor of it), never
	// through its name.
	last := c.Args[len(c.Args)-1]
	if !regexp.MustCompile(`^/proc/` + strconv.Itoa(os.Getpid()) + `/fd/[0-9]+/` + regexp.QuoteMeta(path.Base(want)) + `\.part$`).MatchString(last) {
		t.Fatalf("etcdctl writes %q, want %s.part through the held directory", last, path.Base(want))
	}
	// etcdutl reads the very file descriptor the provider opened and checked.
	u := f.run.cmds[1]
	if u.String() != "/usr/bin/etcdutl snapshot status /proc/self/fd/0 -w json" || len(u.Env) != 0 || u.Timeout <= 0 || u.Timeout > 60*time.Second {
		t.Fatalf("etcdutl command %+v", u)
	}
	if in, ok := u.Stdin.(*os.File); !ok || in.Name() != last {
		t.Fatalf("etcdutl stdin %#v, want the .part file etcdctl wrote, opened through the held directory", u.Stdin)
	}
	restoreAndRead(t, f.node.Path(want), "/registry/secrets/default/s", 300, 200)
}

// restoreAndRead restores a snapshot the way upgrades.md tells an operator
// to, with the bundled etcdutl binary (which checks the sha256 trailer),
// into a fresh data dir, starts etcd on it and reads the keys back.
func restoreAndRead(t *testing.T, snap, prefix string, n, size int) {
	t.Helper()
	node := testutil.NewNode(t, "restored")
	etcdtest.NewPKI(t, node)
	peerPort := etcdtest.FreePort(t)
	peer := fmt.Sprintf("https://127.0.0.1:%d", peerPort)
	dataDir := filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, testbin.Etcdutl(t, etcdtest.EtcdctlVersion), "snapshot", "restore", snap,
		"--name", node.Name, "--data-dir", dataDir, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", node.Name+"="+peer, "--initial-cluster-token", "restored-from-provider-snapshot").CombinedOutput()
	if err != nil {
		t.Fatalf("etcdutl snapshot restore: %v\n%s", err, out)
	}
	e := etcdtest.Start(t, node, etcdtest.Config{DataDir: dataDir, PeerPort: peerPort})
	c := e.Client()
	defer c.Close()
	gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
	defer gcancel()
	resp, err := c.Get(gctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != n {
		t.Fatalf("restored %d keys under %s, want %d", len(resp.Kvs), prefix, n)
	}
	for i, kv := range resp.Kvs {
		if string(kv.Key) != fmt.Sprintf("%s%08d", prefix, i) || len(kv.Value) != size {
			t.Fatalf("restored key %d: %q (%d bytes)", i, kv.Key, len(kv.Value))
		}
	}
}

// withSnapshot is a fixture whose etcd holds keys keys, with its v1.37
// snapshot taken.
func withSnapshot(t *testing.T, keys int) (*fixture, Result) {
	t.Helper()
	testutil.RequireRoot(t)
	f := newFixture(t)
	f.etcd.PutKeys("/registry/a/", keys, 100)
	first := f.take(v1372)
	if first.Outcome != Taken {
		t.Fatalf("first: %s %s", first.Outcome, first.Reason)
	}
	return f, first
}

func TestOncePerClusterAndMinorAcrossReboot(t *testing.T) {
	f, first := withSnapshot(t, 50)
	var before unix.Stat_t
	if err := unix.Stat(f.node.Path(first.Path), &before); err != nil {
		t.Fatal(err)
	}

	// The upgrade half-ran, the node rebooted: etcd restarts on the same data,
	// the provider starts from scratch (fresh options, fresh log, later clock).
	f.etcd.PutKeys("/registry/b/", 50, 100) // partially upgraded data
	f.etcd.Restart()
	f.log = &testutil.SyncBuffer{}
	f.now = f.now.Add(7 * time.Minute)
	again := f.take(version.MustParse("v1.37.0")) // same minor, any patch
	if again.Outcome != SkippedAlreadyTaken || again.Path != first.Path {
		t.Fatalf("after reboot: %s %s path %s", again.Outcome, again.Reason, again.Path)
	}
	f.oneLine(1, SkippedAlreadyTaken, "path="+first.Path)
	var after unix.Stat_t
	if err := unix.Stat(f.node.Path(first.Path), &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino != before.Ino || after.Mtim != before.Mtim || after.Size != before.Size {
		t.Fatal("the first, clean snapshot was replaced")
	}
	// Only etcdutl ran again: the kept snapshot is verified, not retaken.
	if got := f.run.paths(); !reflect.DeepEqual(got, []string{paths.Etcdctl, paths.Etcdutl, paths.Etcdutl}) {
		t.Fatalf("commands %v", got)
	}

	// The next upgrade (next minor): a new snapshot, and only once it is
	// verified the older one goes.
	f.now = f.now.Add(30 * 24 * time.Hour)
	next := f.take(version.MustParse("v1.38.0"))
	if next.Outcome != Taken || next.Pruned != 1 || next.Path == first.Path {
		t.Fatalf("next minor: %+v", next)
	}
	if got := f.snapshots(); len(got) != 1 || got[0] != filepath.Base(next.Path) {
		t.Fatalf("after pruning: %q", got)
	}
	f.oneLine(2, Taken, "pruned=1")
}

func TestCorruptSnapshotNeverCountsAndKeepsTheOlder(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	f.etcd.PutKeys("/registry/a/", 20, 100)
	f.before(version.MustParse("v1.36.3"))
	old := f.take(version.MustParse("v1.36.3"))
	if old.Outcome != Taken {
		t.Fatalf("%s %s", old.Outcome, old.Reason)
	}
	f.before(v1372)
	// etcdctl "succeeds" but the bytes on disk are damaged afterwards.
	f.run.after = afterSave(t, func(fh *os.File) {
		if _, err := fh.WriteAt([]byte("corrupt!"), 8192); err != nil {
			t.Error(err)
		}
	})
	res := f.take(v1372)
	if res.Outcome != Failed || !strings.Contains(res.Reason, "sha256") {
		t.Fatalf("%s %q", res.Outcome, res.Reason)
	}

	f.oneLine(2, Failed, "reason=")
	if got := f.snapshots(); len(got) != 1 || got[0] != filepath.Base(old.Path) {
		t.Fatalf("backup dir %q: the older snapshot must stay and nothing partial remain", got)
	}
	// A failed attempt does not count: the next one takes it.
	f.run.after = nil
	if res := f.take(v1372); res.Outcome != Taken || res.Pruned != 1 {
		t.Fatalf("retry: %+v", res)
	}
}

// TestDamagedDatabaseRefusedByEtcdutl damages both bbolt meta pages and
// recomputes the sha256 trailer, so only the real etcdutl can tell.
func TestDamagedDatabaseRefusedByEtcdutl(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	f.etcd.PutKeys("/registry/a/", 20, 100)
	f.run.after = afterSave(t, func(fh *os.File) {
		fi, err := fh.Stat()
		if err != nil {
			t.Error(err)
			return
		}
		body := make([]byte, fi.Size()-sha256.Size)
		if _, err := fh.ReadAt(body, 0); err != nil {
			t.Error(err)
			return
		}
		// bbolt's two meta pages start at 0 and at the page size (4096 here);
		// their magic is at offset 16 within the page (after the page header).
		for _, off := range []int{16, 4096 + 16} {
			copy(body[off:], "notbolt!")
		}
		sum := sha256.Sum256(body)
		if _, err := fh.WriteAt(append(body, sum[:]...), 0); err != nil {
			t.Error(err)
		}
	})
	res := f.take(v1372)
	if res.Outcome != Failed || !strings.Contains(res.Reason, "etcdutl snapshot status") {
		t.Fatalf("%s %q", res.Outcome, res.Reason)
	}
	f.oneLine(1, Failed, "reason=")
	if got := f.snapshots(); len(got) != 0 {
		t.Fatalf("backup dir %q: nothing may remain of a snapshot etcdutl refused", got)
	}
	if got := f.run.paths(); !reflect.DeepEqual(got, []string{paths.Etcdctl, paths.Etcdutl}) {
		t.Fatalf("commands %v", got)
	}
}

// TestKeyCountFromEtcdutlIsCompared: etcdutl's key count must match what
// etcd holds at the snapshot's revision.
func TestKeyCountFromEtcdutlIsCompared(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	f.etcd.PutKeys("/registry/a/", 20, 100)
	f.run.rewrite = func(c runner.Cmd, res runner.Result) runner.Result {
		if c.Path == paths.Etcdutl {
			res.Stdout = regexp.MustCompile(`"totalKey":20,`).ReplaceAll(res.Stdout, []byte(`"totalKey":19,`))
		}
		return res
	}
	res := f.take(v1372)
	if res.Outcome != Failed || !strings.Contains(res.Reason, "holds 19 keys") || !strings.Contains(res.Reason, "etcd has 20") {
		t.Fatalf("%s %q", res.Outcome, res.Reason)
	}
	if got := f.snapshots(); len(got) != 0 {
		t.Fatalf("backup dir %q", got)
	}
}

func TestAnotherClusterGetsItsOwnSnapshot(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	first := f.take(v1372)
	if first.Outcome != Taken {
		t.Fatalf("%s %s", first.Outcome, first.Reason)
	}
	// The node was reset and a new cluster created: a new etcd cluster id.
	f.etcd.Stop()
	if err := os.RemoveAll(f.node.Path(etcdtest.DataDir)); err != nil {
		t.Fatal(err)
	}
	f.etcd = etcdtest.Start(t, f.node, etcdtest.Config{})
	f.now = f.now.Add(time.Hour)
	second := f.take(v1372)
	if second.Outcome != Taken || second.ClusterID == first.ClusterID || second.Pruned != 1 {
		t.Fatalf("new cluster: %+v (first %x)", second, first.ClusterID)
	}
}

func TestSkippedOutcomes(t *testing.T) {
	t.Run("external etcd", func(t *testing.T) {
		f := &fixture{t: t, node: testutil.NewNode(t, "cp1"), log: &testutil.SyncBuffer{}, run: &recRunner{inner: &runner.Recorder{}}}
		f.fs = etcdtest.EncryptedPersistent(t, f.node)
		res := f.take(v1372)
		if res.Outcome != SkippedExternalEtcd {
			t.Fatalf("%+v", res)
		}
		f.oneLine(1, SkippedExternalEtcd)
		if f.node.Exists(paths.EtcdBackupDir) || len(f.run.cmds) != 0 {
			t.Fatal("wrote or ran something")
		}
	})
	t.Run("etcdctl missing", func(t *testing.T) {
		node := testutil.NewNode(t, "cp1")
		f := &fixture{t: t, node: node, log: &testutil.SyncBuffer{}, run: &recRunner{inner: &runner.Recorder{}}}
		f.fs = etcdtest.EncryptedPersistent(t, node)
		f.etcd = etcdtest.Start(t, node, etcdtest.Config{})
		res := f.take(v1372)
		if res.Outcome != SkippedEtcdctlMissing {
			t.Fatalf("%+v", res)
		}
		f.oneLine(1, SkippedEtcdctlMissing, "detail=")
		if f.node.Exists(paths.EtcdBackupDir) || len(f.run.cmds) != 0 {
			t.Fatal("wrote or ran something")
		}
	})
	t.Run("etcdutl missing", func(t *testing.T) {
		node := testutil.NewNode(t, "cp1")
		f := &fixture{t: t, node: node, log: &testutil.SyncBuffer{}, run: &recRunner{inner: &runner.Recorder{}}}
		etcdtest.BundleEtcdTools(t, node)
		if err := os.Remove(node.Path(paths.Etcdutl)); err != nil {
			t.Fatal(err)
		}
		f.fs = etcdtest.EncryptedPersistent(t, node)
		f.etcd = etcdtest.Start(t, node, etcdtest.Config{})
		res := f.take(v1372)
		if res.Outcome != SkippedEtcdctlMissing || !strings.Contains(res.Reason, paths.Etcdutl) {
			t.Fatalf("%+v", res)
		}
		f.oneLine(1, SkippedEtcdctlMissing, "detail=")
		if f.node.Exists(paths.EtcdBackupDir) || len(f.run.cmds) != 0 {
			t.Fatal("wrote or ran something: a snapshot nobody can verify is not worth writing")
		}
	})
	t.Run("encryption unconfirmed: the default install", func(t *testing.T) {
		node := testutil.NewNode(t, "cp1")
		f := &fixture{t: t, node: node, log: &testutil.SyncBuffer{}, run: &recRunner{inner: runner.Exec{Root: node.Root}}}
		etcdtest.BundleEtcdTools(t, node)
		f.fs = etcdtest.PlainPersistent(t, node)
		f.etcd = etcdtest.Start(t, node, etcdtest.Config{})
		res := f.take(v1372)
		if res.Outcome != SkippedEncryptionUnconfirmed || res.Reason == "" {
			t.Fatalf("%+v", res)
		}
		f.oneLine(1, SkippedEncryptionUnconfirmed, "detail=")
		if f.node.Exists(paths.EtcdBackupDir) || len(f.run.cmds) != 0 {
			t.Fatal("wrote or ran something on unencrypted storage")
		}
	})
	t.Run("a symlink planted as the backup dir", func(t *testing.T) {
		f := newFixture(t)
		elsewhere := t.TempDir()
		if err := os.Symlink(elsewhere, f.node.Path(paths.EtcdBackupDir)); err != nil {
			t.Fatal(err)
		}
		res := f.take(v1372)
		if res.Outcome != SkippedEncryptionUnconfirmed || !strings.Contains(res.Reason, "symlink") {
			t.Fatalf("%+v", res)
		}
		if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 || len(f.run.cmds) != 0 {
			t.Fatal("wrote through the symlink")
		}
	})
}

// TestInsufficientSpace mounts a small tmpfs on the backup directory in a
// private mount namespace (the test re-runs itself in one).
func TestInsufficientSpace(t *testing.T) {
	if os.Getenv("ETCDSNAP_IN_MOUNTNS") == "" {
		if os.Getuid() != 0 {
			testutil.SkipUnlessCI(t, "needs root for a private mount namespace (CI runs as root)")
		}
		testbin.Etcdctl(t, etcdtest.EtcdctlVersion) // build both tools outside the child's budget
		testbin.Etcdutl(t, etcdtest.EtcdctlVersion)
		cmd := testutil.Command(t, 10*time.Minute, os.Args[0], "-test.run=^TestInsufficientSpace$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "ETCDSNAP_IN_MOUNTNS=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestInsufficientSpace") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	f := newFixture(t)
	dir := f.node.Path(paths.EtcdBackupDir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m,mode=0700"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	res := f.take(v1372)
	if res.Outcome != SkippedInsufficientSpace || !strings.Contains(res.Reason, "needed (2 x database") {
		t.Fatalf("%+v\n%s", res, f.log.String())
	}
	f.oneLine(1, SkippedInsufficientSpace, "detail=")
	if len(f.snapshots()) != 0 || len(f.run.cmds) != 0 {
		t.Fatal("wrote or ran something")
	}
}

func TestConcurrentAttemptsSerialise(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	started := make(chan struct{})
	release := make(chan struct{})
	f.run.before = func(runner.Cmd) {
		close(started)
		<-release
	}
	done := make(chan Result)
	go func() { done <- f.take(v1372) }()
	<-started
	// A second attempt (the etcd-snapshot command) while the first holds the directory.
	f.run.before = nil
	other := Take(context.Background(), f.opts(), v1372)
	close(release)
	first := <-done
	if first.Outcome != Taken || other.Outcome != Failed || !strings.Contains(other.Reason, "another etcd snapshot") {
		t.Fatalf("first %s %s, other %s %s", first.Outcome, first.Reason, other.Outcome, other.Reason)
	}
}
