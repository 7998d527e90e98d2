package imageimport

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/imagelock"
	"github.com/kairos-io/provider-kubernetes/internal/oci"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

type bundle struct {
	t    testing.TB
	root string
	lock imagelock.Lock
	mani map[string]string
	// noPin runs import-images with Options.NoPin (images.pin: "false").
	noPin bool
}

func newBundle(t testing.TB) *bundle {
	b := &bundle{t: t, root: t.TempDir(), mani: map[string]string{}}
	if err := os.MkdirAll(b.dir(), 0o755); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bundle) dir() string { return paths.Root(b.root).Path(paths.ImagesDir) }

// add builds a small image named ref into file and records it in the lock.
func (b *bundle) add(ref, file, content string) string {
	b.t.Helper()
	return b.addEntry(ref, file, oci.Entry{Path: "bin/x", Data: []byte(content), Mode: 0o755})
}

// addEntry builds an image of one file named ref into file and records it in the lock.
func (b *bundle) addEntry(ref, file string, e oci.Entry) string {
	b.t.Helper()
	p := filepath.Join(b.dir(), file)
	w, err := oci.WriteFile(p, oci.Image{Ref: ref, Config: oci.Config{Entrypoint: []string{"/bin/x"}},
		Entries: []oci.Entry{e}})
	if err != nil {
		b.t.Fatal(err)
	}
	b.lock.Images = append(b.lock.Images, imagelock.Image{Ref: ref, File: file, SHA256: w.SHA256, Size: w.Size, Manifest: w.ManifestDigest})
	b.mani[ref] = w.ManifestDigest
	return p
}

func (b *bundle) writeLock() {
	b.t.Helper()
	data, err := b.lock.Marshal()
	if err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.dir(), "lock.yaml"), data, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bundle) run(address string, r runner.Runner, clk *testutil.Clock) (Result, string) {
	var log bytes.Buffer
	o := Options{Root: paths.Root(b.root), Runner: r, Ctr: testutil.Ctr(b.t), Address: address,
		Log: slog.New(slog.NewTextHandler(&log, nil)), NoPin: b.noPin}
	if clk != nil {
		o.Clock = clk
	}
	res := Run(context.Background(), o)
	return res, log.String()
}

// runWant runs import-images on b with every command recorded, and fails
// the test unless its summary line has want.
func (b *bundle) runWant(address, want string) (Result, *runner.Recorder) {
	b.t.Helper()
	rec := &runner.Recorder{Reply: runner.Exec{}.Run}
	res, log := b.run(address, rec, nil)
	if !strings.Contains(log, want) {
		b.t.Fatalf("want %q in the summary:\n%s\n%v", want, log, rec.Lines())
	}
	return res, rec
}

// ctrOut runs the node's ctr in the k8s.io namespace of the containerd at
// address and returns its stdout (containerd 2's ctr warns on stderr on
// cgroup v1 hosts).
func ctrOut(t testing.TB, address string, args ...string) string {
	t.Helper()
	out, err := testutil.Command(t, time.Minute, testutil.Ctr(t), append([]string{"--address", address, "-n", Namespace}, args...)...).Output()
	if err != nil {
		t.Fatalf("ctr %v: %v: %s", args, err, out)
	}
	return string(out)
}

// ctrImport imports the tarball at p with ctr, behind import-images' back.
func ctrImport(t testing.TB, address, p string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := testutil.Command(t, time.Minute, testutil.Ctr(t), "--address", address, "-n", Namespace, "images", "import", "-")
	cmd.Stdin = f
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// listed is REF -> DIGEST of `ctr images ls`, read independently of the
// code under test.
func listed(t testing.TB, address string) map[string]string {
	t.Helper()
	out, err := testutil.Command(t, time.Minute, testutil.Ctr(t), "--address", address, "-n", "k8s.io", "images", "ls").Output()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for i, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); i > 0 && len(f) >= 3 {
			m[f[0]] = f[2]
		}
	}
	return m
}

func TestImportIntoRealContainerd(t *testing.T) {
	address := testutil.Containerd(t)
	b := newBundle(t)
	b.add("registry.k8s.io/pause:3.10.2", "pause_3.10.2.tar", "pause")
	b.add("registry.k8s.io/etcd:3.7.0-0", "etcd_3.7.0-0.tar", "etcd")
	// Tampered after the lock was written: same size, one byte changed.
	tampered := b.add("registry.k8s.io/kube-apiserver:v1.37.2", "kube-apiserver_v1.37.2.tar", "apiserver")
	data, _ := os.ReadFile(tampered)
	i := bytes.Index(data, []byte("apiserver"))
	data[i] = 'A'
	if err := os.WriteFile(tampered, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// A symlink to a good tarball.
	real := b.add("registry.k8s.io/kube-scheduler:v1.37.2", "real-scheduler.tar", "scheduler")
	b.lock.Images[len(b.lock.Images)-1].File = "kube-scheduler_v1.37.2.tar"
	if err := os.Symlink(real, filepath.Join(b.dir(), "kube-scheduler_v1.37.2.tar")); err != nil {
		t.Fatal(err)
	}
	// Group-writable.
	gw := b.add("registry.k8s.io/kube-proxy:v1.37.2", "kube-proxy_v1.37.2.tar", "proxy")
	if err := os.Chmod(gw, 0o664); err != nil {
		t.Fatal(err)
	}
	// Not owned by root.
	nr := b.add("registry.k8s.io/kube-controller-manager:v1.37.2", "kube-controller-manager_v1.37.2.tar", "cm")
	if err := os.Chown(nr, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	// The lock's digest is right, but the tarball names another image.
	b.add("registry.k8s.io/coredns/coredns:v9.9.9", "coredns_coredns_v1.14.6.tar", "coredns")
	b.lock.Images[len(b.lock.Images)-1].Ref = "registry.k8s.io/coredns/coredns:v1.14.6"
	// The lock's sha256 is right, but it names another manifest than the tarball's index.
	b.add("registry.k8s.io/kube-proxy:v1.36.3", "kube-proxy_v1.36.3.tar", "proxy 1.36")
	b.lock.Images[len(b.lock.Images)-1].Manifest = "sha256:" + strings.Repeat("e", 64)
	b.writeLock()

	res, log := b.run(address, runner.Exec{}, nil)
	if res.ExitCode != 1 || res.Outcome() != "refused" || res.Err != nil || len(res.Failed) != 0 {
		t.Fatalf("%+v\n%s", res, log)
	}
	sort.Strings(res.Imported)
	if strings.Join(res.Imported, ",") != "registry.k8s.io/etcd:3.7.0-0,registry.k8s.io/pause:3.10.2" {
		t.Fatalf("imported %v", res.Imported)
	}
	reasons := map[string]error{
		"registry.k8s.io/kube-apiserver:v1.37.2":          ErrDigest,
		"registry.k8s.io/kube-scheduler:v1.37.2":          ErrSymlink,
		"registry.k8s.io/kube-proxy:v1.37.2":              ErrWritable,
		"registry.k8s.io/kube-controller-manager:v1.37.2": ErrOwner,
		"registry.k8s.io/coredns/coredns:v1.14.6":         ErrRef,
		"registry.k8s.io/kube-proxy:v1.36.3":              ErrManifest,
	}
	if len(res.Refused) != len(reasons) {
		t.Fatalf("refused %+v", res.Refused)
	}
	for _, r := range res.Refused {
		if want := reasons[r.Ref]; want == nil || !strings.Contains(r.Reason, want.Error()) {
			t.Errorf("%s refused for %q, want %v", r.Ref, r.Reason, want)
		}
	}
	// containerd has exactly the verified images, under their references and manifests.
	got := listed(t, address)
	if len(got) != 2 || got["registry.k8s.io/pause:3.10.2"] != b.mani["registry.k8s.io/pause:3.10.2"] ||
		got["registry.k8s.io/etcd:3.7.0-0"] != b.mani["registry.k8s.io/etcd:3.7.0-0"] {
		t.Fatalf("containerd lists %v", got)
	}
	// One summary line plus one line per refused image.
	lines := strings.Split(strings.TrimSpace(log), "\n")
	if len(lines) != 1+len(reasons) || strings.Count(log, "msg=image-refused") != len(reasons) ||
		!strings.Contains(lines[len(lines)-1], "msg=import-images") || !strings.Contains(lines[len(lines)-1], "imported=2 present=0 refused=6 failed=0") {
		t.Fatalf("log:\n%s", log)
	}
	// The symlink's target and the other files are untouched.
	if _, err := os.Stat(real); err != nil {
		t.Fatal(err)
	}

	// Fixed bundle: what is missing imports (pause, the same image, is there already).
	c := newBundle(t)
	c.add("registry.k8s.io/pause:3.10.2", "pause_3.10.2.tar", "pause")
	c.add("registry.k8s.io/kube-apiserver:v1.37.2", "kube-apiserver_v1.37.2.tar", "apiserver")
	c.writeLock()
	res, log = c.run(address, runner.Exec{}, nil)
	if res.ExitCode != 0 || strings.Join(res.Imported, ",") != "registry.k8s.io/kube-apiserver:v1.37.2" ||
		strings.Join(res.Present, ",") != "registry.k8s.io/pause:3.10.2" || !strings.Contains(log, "outcome=ok imported=1 present=1 refused=0 failed=0") {
		t.Fatalf("%+v\n%s", res, log)
	}
	if got := listed(t, address); got["registry.k8s.io/kube-apiserver:v1.37.2"] != c.mani["registry.k8s.io/kube-apiserver:v1.37.2"] {
		t.Fatalf("containerd lists %v", got)
	}
	// A lock file of an earlier release names no manifest digest: nothing
	// ties containerd's images to it, so everything is verified and
	// imported again, harmlessly.
	for i := range c.lock.Images {
		c.lock.Images[i].Manifest = ""
	}
	c.writeLock()
	res, log = c.run(address, runner.Exec{}, nil)
	if res.ExitCode != 0 || len(res.Imported) != 2 || len(res.Present) != 0 || !strings.Contains(log, "outcome=ok imported=2 present=0") {
		t.Fatalf("%+v\n%s", res, log)
	}
}

func TestContainerdNotAnswering(t *testing.T) {
	b := newBundle(t)
	b.add("registry.k8s.io/pause:3.10.2", "pause_3.10.2.tar", "pause")
	b.writeLock()
	rec := &runner.Recorder{Reply: func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		return runner.Result{ExitCode: 1}, &runner.ExitError{Cmd: c.Short(), Code: 1, Tail: "connection refused"}
	}}
	clk := testutil.NewClock()
	res, log := b.run("/nonexistent.sock", rec, clk)
	if res.ExitCode != 1 || res.Err == nil || !strings.Contains(res.Err.Error(), "connection refused") || len(res.Imported) != 0 {
		t.Fatalf("%+v\n%s", res, log)
	}
	for _, l := range rec.Lines() {
		if strings.Contains(l, "import") {
			t.Fatalf("imported without containerd: %s", l)
		}
	}
	if !strings.Contains(rec.Lines()[0], "--address /nonexistent.sock --namespace k8s.io version") {
		t.Fatal(rec.Lines())
	}
	if strings.Count(log, "\n") != 1 || !strings.Contains(log, "outcome=failed") {
		t.Fatal(log)
	}
}

func TestUntrustedLockOrDirectory(t *testing.T) {
	for name, spoil := range map[string]func(b *bundle){
		"lock group-writable": func(b *bundle) { os.Chmod(filepath.Join(b.dir(), "lock.yaml"), 0o664) },
		"lock not root's":     func(b *bundle) { os.Chown(filepath.Join(b.dir(), "lock.yaml"), 65534, 65534) },
		"dir other-writable":  func(b *bundle) { os.Chmod(b.dir(), 0o757) },
		"lock symlink": func(b *bundle) {
			p := filepath.Join(b.dir(), "lock.yaml")
			os.Rename(p, p+".real")
			os.Symlink(p+".real", p)
		},
		"dir symlink": func(b *bundle) {
			os.Rename(b.dir(), b.dir()+".real")
			os.Symlink(b.dir()+".real", b.dir())
		},
		"lock invalid": func(b *bundle) { os.WriteFile(filepath.Join(b.dir(), "lock.yaml"), []byte("images: []\n"), 0o644) },
	} {
		t.Run(name, func(t *testing.T) {
			if strings.Contains(name, "root") {
				testutil.RequireRoot(t)
			}
			b := newBundle(t)
			b.add("registry.k8s.io/pause:3.10.2", "pause_3.10.2.tar", "pause")
			b.writeLock()
			spoil(b)
			rec := &runner.Recorder{}
			res, _ := b.run("/x.sock", rec, testutil.NewClock())
			if res.ExitCode != 1 || res.Err == nil || len(rec.Lines()) != 0 {
				t.Fatalf("%+v %v", res, rec.Lines())
			}
		})
	}
}

// What the pass runs before each kubeadm action: an image the kubelet's
// image GC removed after the boot's import is imported again from the
// bundle; one whose tarball is gone too is named, with nothing else.
func TestBeforeKubeadmALostImageIsImportedAgainOrNamed(t *testing.T) {
	address := testutil.Containerd(t)
	// An image that bundles nothing has nothing to check.
	empty := newBundle(t)
	if ok, err := Bundles(paths.Root(empty.root)); ok || err != nil {
		t.Fatalf("no lock file: bundles %v, %v", ok, err)
	}
	if ok, err := Bundles(paths.Root(t.TempDir())); ok || err != nil {
		t.Fatalf("no images directory: bundles %v, %v", ok, err)
	}
	b := newBundle(t)
	pause := b.add("registry.k8s.io/pause:3.10.2", "pause_3.10.2.tar", "pause")
	b.add("registry.k8s.io/etcd:3.7.0-0", "etcd_3.7.0-0.tar", "etcd")
	b.writeLock()
	if ok, err := Bundles(paths.Root(b.root)); !ok || err != nil {
		t.Fatalf("a lock file: bundles %v, %v", ok, err)
	}
	// A lock file that is a symlink is not followed, and not taken for none.
	sym := newBundle(t)
	if err := os.Symlink(filepath.Join(b.dir(), "lock.yaml"), filepath.Join(sym.dir(), "lock.yaml")); err != nil {
		t.Fatal(err)
	}
	if ok, err := Bundles(paths.Root(sym.root)); err == nil {
		t.Fatalf("a symlinked lock file: bundles %v, no error", ok)
	}
	if res, log := b.run(address, runner.Exec{}, nil); res.NotInContainerd() != nil {
		t.Fatalf("the boot's import: %v\n%s", res.NotInContainerd(), log)
	}
	rm := func(ref string) {
		t.Helper()
		if out, err := testutil.Command(t, time.Minute, testutil.Ctr(t), "--address", address, "-n", Namespace, "images", "rm", "--sync", ref).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	// Removed from containerd (as the kubelet's image GC removes an image
	// no container uses): imported again.
	rm("registry.k8s.io/pause:3.10.2")
	res, log := b.run(address, runner.Exec{}, nil)
	if err := res.NotInContainerd(); err != nil || strings.Join(res.Imported, ",") != "registry.k8s.io/pause:3.10.2" {
		t.Fatalf("%v %+v\n%s", err, res, log)
	}
	if got := listed(t, address)["registry.k8s.io/pause:3.10.2"]; got != b.mani["registry.k8s.io/pause:3.10.2"] {
		t.Fatalf("containerd lists pause at %q", got)
	}
	// Removed, and its tarball gone from the image: named.
	rm("registry.k8s.io/pause:3.10.2")
	if err := os.Remove(pause); err != nil {
		t.Fatal(err)
	}
	res, log = b.run(address, runner.Exec{}, nil)
	err := res.NotInContainerd()
	if err == nil || !strings.Contains(err.Error(), "bundled images not in containerd: registry.k8s.io/pause:3.10.2 (") || strings.Contains(err.Error(), "etcd") {
		t.Fatalf("%v\n%s", err, log)
	}
	// containerd not answering: the run could not start, and says so.
	down := &runner.Recorder{Reply: func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		return runner.Result{ExitCode: 1}, &runner.ExitError{Cmd: c.Short(), Code: 1, Tail: "connection refused"}
	}}
	res, _ = b.run(address, down, testutil.NewClock())
	if err := res.NotInContainerd(); err == nil || !strings.HasPrefix(err.Error(), "the bundled images: ") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("containerd down: %v", err)
	}
}
