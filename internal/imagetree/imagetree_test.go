package imagetree

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/bundle"
	"github.com/kairos-io/provider-kubernetes/internal/imageimport"
	"github.com/kairos-io/provider-kubernetes/internal/imagelock"
	"github.com/kairos-io/provider-kubernetes/internal/oci"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/system"
)

// The default test builds ONE minor's whole tree: 1.37, whose binaries the
// end-to-end suite needs anyway (so CI pays its cold build once) and whose
// kubeadm the reconcile tests already build. PROVIDER_KUBERNETES_TREE_MINOR
// picks another; `make trees` builds them all.
func treeMinor() string {
	if m := os.Getenv("PROVIDER_KUBERNETES_TREE_MINOR"); m != "" {
		return m
	}
	return "1.37"
}

type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

// diskManifest is images/versions.yaml as it is on disk now.
func diskManifest(t *testing.T) images.Manifest {
	t.Helper()
	src, err := FindSourceDir()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(src, "images", "versions.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m, w, err := images.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	if w.String() != images.Window().String() {
		t.Fatalf("images/versions.yaml says %s, the compiled-in window is %s", w, images.Window())
	}
	return m
}

// The provider binary the tree ships must enforce the window versions.yaml
// names: built from this source, asked with its own `version`.
func TestProviderWindowMatchesVersionsYAML(t *testing.T) {
	m := diskManifest(t)
	var minors []string
	for _, e := range m.Minors {
		minors = append(minors, e.Minor)
	}
	src, _ := FindSourceDir()
	t.Setenv("GOFLAGS", "-buildvcs=auto") // go's default (this machine sets false): a clone stamps its commit
	bin, err := goBuildLocal(context.Background(), src, "./cmd/provider-kubernetes", "-s -w", filepath.Join(t.TempDir(), "p"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := testutil.Command(t, 30*time.Second, bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "release " + m.Release + ", Kubernetes " + strings.Join(minors, ", ") + ")"; !strings.Contains(string(out), want) {
		t.Fatalf("provider says %q, versions.yaml %q", out, want)
	}
	// Built from the source alone: no VCS stamp (the commit, a dirty tree),
	// which would make every commit a new binary and a new image.
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range info.Settings {
		if strings.HasPrefix(s.Key, "vcs") {
			t.Errorf("the provider binary carries %s=%s: the image would change with every commit", s.Key, s.Value)
		}
	}
}

func TestEtcdRelease(t *testing.T) {
	for in, want := range map[string]string{"3.7.0-0": "v3.7.0", "3.6.8-0": "v3.6.8", "3.6.6": "v3.6.6"} {
		if got, err := EtcdRelease(in); err != nil || got != want {
			t.Errorf("%s: %s %v", in, got, err)
		}
	}
	if _, err := EtcdRelease("latest"); err == nil {
		t.Error("latest accepted")
	}
	if _, err := Entry("1.34"); err == nil {
		t.Error("a minor outside the window accepted")
	}
}

// versions.yaml must name exactly the images kubeadm itself expects.
func TestKubeadmImagesAgreeWithVersionsYAML(t *testing.T) {
	e, err := Entry("1.37")
	if err != nil {
		t.Fatal(err)
	}
	kubeadm := testbin.Kubeadm(t, e.Kubernetes)
	ctx := context.Background()
	if err := checkKubeadmImages(ctx, kubeadm, e); err != nil {
		t.Fatal(err)
	}
	bad := e
	bad.Etcd = "3.6.8-0"
	if err := checkKubeadmImages(ctx, kubeadm, bad); err == nil || !strings.Contains(err.Error(), "versions.yaml disagrees") {
		t.Fatalf("a wrong etcd tag passed: %v", err)
	}
}

func TestBuildTree(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a whole OS image tree (Kubernetes binaries and images from modules): not in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	minor := treeMinor()
	dir := filepath.Join(t.TempDir(), "tree-"+minor)
	start := time.Now()
	res, err := Build(ctx, minor, dir, Options{Log: testLog{t}, ProviderVersion: "v0.4.0-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tree %s built in %s", minor, time.Since(start).Round(time.Millisecond))
	e := res.Entry
	if e.Minor != minor {
		t.Fatalf("entry %+v", e)
	}
	for _, d := range diskManifest(t).Minors {
		if d.Minor == minor && d != e {
			t.Fatalf("versions.yaml on disk %+v, compiled in %+v", d, e)
		}
	}

	t.Run("layout and modes", func(t *testing.T) { checkLayout(t, dir) })
	t.Run("units", func(t *testing.T) { checkUnits(t, dir) })
	t.Run("lock file", func(t *testing.T) { checkLock(t, dir, e) })
	t.Run("bundle manifest", func(t *testing.T) { checkBundle(t, dir, e) })
	t.Run("image contents", func(t *testing.T) { checkImages(t, dir, e) })
	t.Run("systemd-analyze verify", func(t *testing.T) { checkVerify(t, dir) })
	t.Run("import-images into containerd", func(t *testing.T) { checkImport(t, dir, e) })

	// Refuses to overwrite; a warm rebuild is reproducible and cheap.
	if _, err := Build(ctx, minor, dir, Options{}); err == nil {
		t.Fatal("overwrote an existing tree without Replace")
	}
	start = time.Now()
	again, err := Build(ctx, minor, filepath.Join(t.TempDir(), "again"), Options{ProviderVersion: "v0.4.0-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("warm rebuild in %s", time.Since(start).Round(time.Millisecond))
	for i := range res.Lock.Images {
		if again.Lock.Images[i] != res.Lock.Images[i] {
			t.Errorf("not reproducible: %+v vs %+v", again.Lock.Images[i], res.Lock.Images[i])
		}
	}
}

func checkLayout(t *testing.T, dir string) {
	want := map[string]os.FileMode{
		paths.ProviderPlugin: 0o755, paths.Kubeadm: 0o755, paths.Kubelet: 0o755, paths.Kubectl: 0o755,
		paths.Etcdctl: 0o755, paths.Etcdutl: 0o755, paths.BundleManifest: 0o644, paths.ImageLock: 0o644,
		paths.Containerd: 0o755, paths.Ctr: 0o755, paths.ContainerdShim: 0o755,
	}
	for _, u := range system.Units() {
		want[u.Path] = 0o644
	}
	links := map[string]string{paths.ProviderBin: "../../system/providers/agent-provider-kubernetes"}
	for _, l := range system.WantsLinks() {
		links[l.Path] = l.Target
	}
	lock := readLock(t, dir)
	for _, im := range lock.Images {
		want[paths.ImagesDir+"/"+im.File] = 0o644
	}
	seen := map[string]bool{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		host := "/" + strings.TrimPrefix(strings.TrimPrefix(p, dir), "/")
		st := fi.Sys().(*syscall.Stat_t)
		if os.Getuid() == 0 && (st.Uid != 0 || st.Gid != 0) {
			t.Errorf("%s: owned by %d:%d", host, st.Uid, st.Gid)
		}
		switch {
		case fi.IsDir():
			if fi.Mode().Perm() != 0o755 {
				t.Errorf("%s: dir mode %o", host, fi.Mode().Perm())
			}
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			if links[host] != target {
				t.Errorf("%s: link to %q, want %q", host, target, links[host])
			}
			// Relative, and it resolves inside the tree.
			if resolved, err := filepath.EvalSymlinks(p); err != nil || !strings.HasPrefix(resolved, dir+"/") {
				t.Errorf("%s: resolves to %q (%v)", host, resolved, err)
			}
			seen[host] = true
		default:
			m, ok := want[host]
			if !ok {
				t.Errorf("unexpected file %s", host)
			} else if fi.Mode() != m {
				t.Errorf("%s: mode %v, want %v", host, fi.Mode(), m)
			}
			seen[host] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for p := range want {
		if !seen[p] {
			t.Errorf("missing %s", p)
		}
	}
	for p := range links {
		if !seen[p] {
			t.Errorf("missing link %s", p)
		}
	}
}

func checkUnits(t *testing.T, dir string) {
	for _, u := range system.Units() {
		b, err := os.ReadFile(hostPath(dir, u.Path))
		if err != nil || !bytes.Equal(b, u.Data) {
			t.Errorf("%s differs from system/units (%v)", u.Path, err)
		}
	}
}

func readLock(t *testing.T, dir string) imagelock.Lock {
	t.Helper()
	b, err := os.ReadFile(hostPath(dir, paths.ImageLock))
	if err != nil {
		t.Fatal(err)
	}
	l, err := imagelock.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func checkLock(t *testing.T, dir string, e images.MinorEntry) {
	lock := readLock(t, dir)
	var refs, want []string
	for _, r := range Refs(e) {
		want = append(want, r)
	}
	for _, im := range lock.Images {
		refs = append(refs, im.Ref)
		p := filepath.Join(hostPath(dir, paths.ImagesDir), im.File)
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		sum, n, err := oci.FileDigest(f)
		f.Close()
		if err != nil || sum != im.SHA256 || n != im.Size {
			t.Errorf("%s: sha256 %s size %d, lock file %s %d (%v)", im.File, sum, n, im.SHA256, im.Size, err)
		}
		// Inspect also checks that the manifest blob hashes to the digest the index names.
		info, err := oci.Inspect(p)
		if err != nil || info.Ref.Name != im.Ref {
			t.Errorf("%s names %q, lock file %s (%v)", im.File, info.Ref.Name, im.Ref, err)
		}
		if im.Manifest == "" || info.Ref.ManifestDigest != im.Manifest {
			t.Errorf("%s: manifest %s, lock file %q", im.File, info.Ref.ManifestDigest, im.Manifest)
		}
	}
	sort.Strings(refs)
	sort.Strings(want)
	if strings.Join(refs, " ") != strings.Join(want, " ") {
		t.Fatalf("lock file %v, want %v", refs, want)
	}
	// Exactly what the tree's kubeadm deploys.
	out, err := testutil.Command(t, time.Minute, hostPath(dir, paths.Kubeadm), "config", "images", "list", "--kubernetes-version", e.Kubernetes).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Fields(string(out))
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(refs, " ") {
		t.Fatalf("kubeadm lists %v, the lock file %v", got, refs)
	}
}

func checkBundle(t *testing.T, dir string, e images.MinorEntry) {
	b, err := os.ReadFile(hostPath(dir, paths.BundleManifest))
	if err != nil {
		t.Fatal(err)
	}
	m, err := bundle.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Versions(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("binaries report %v", got)
	etcdRel, _ := EtcdRelease(e.Etcd)
	for k, want := range map[string][2]string{
		"kubeadm": {m.Kubeadm, e.Kubernetes},
		"kubelet": {m.Kubelet, e.Kubernetes},
		"kubectl": {m.Kubectl, e.Kubernetes},
		"etcdctl": {m.Etcdctl, strings.TrimPrefix(etcdRel, "v")},
		"etcdutl": {m.Etcdutl, strings.TrimPrefix(etcdRel, "v")},
		"window":  {images.Window().String(), images.Window().String()},
	} {
		if got[k] != want[0] || want[0] != want[1] {
			t.Errorf("%s: binary says %q, bundle.yaml %q, versions.yaml %q", k, got[k], want[0], want[1])
		}
	}
	if m.Kubernetes != e.Kubernetes || m.Etcd != e.Etcd || m.ImageTag != e.ImageTag || len(m.Images) != 7 {
		t.Errorf("bundle %+v, versions.yaml %+v", m, e)
	}
	if m.KubeadmVersion().String() != e.Kubernetes {
		t.Errorf("reconcile would read kubeadm %s", m.KubeadmVersion())
	}
}

// Each image carries what kubeadm's manifests run, at the right version.
func checkImages(t *testing.T, dir string, e images.MinorEntry) {
	refs := Refs(e)
	lock := readLock(t, dir)
	file := map[string]string{}
	for _, im := range lock.Images {
		file[im.Ref] = filepath.Join(hostPath(dir, paths.ImagesDir), im.File)
	}
	etcdRel, _ := EtcdRelease(e.Etcd)
	for name, c := range map[string]struct {
		bin  string
		args []string
		want string
	}{
		APIServer:         {"/usr/local/bin/kube-apiserver", []string{"--version"}, "Kubernetes " + e.Kubernetes},
		ControllerManager: {"/usr/local/bin/kube-controller-manager", []string{"--version"}, "Kubernetes " + e.Kubernetes},
		Scheduler:         {"/usr/local/bin/kube-scheduler", []string{"--version"}, "Kubernetes " + e.Kubernetes},
		Proxy:             {"/usr/local/bin/kube-proxy", []string{"--version"}, "Kubernetes " + e.Kubernetes},
		Etcd:              {"/usr/local/bin/etcd", []string{"--version"}, "etcd Version: " + strings.TrimPrefix(etcdRel, "v")},
		CoreDNS:           {"/coredns", []string{"-version"}, "CoreDNS-" + strings.TrimPrefix(e.CoreDNS, "v")},
		Pause:             {"/pause", []string{"-v"}, "pause.go version " + e.Pause},
	} {
		p := file[refs[name]]
		info, err := oci.Inspect(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(info.Config.Entrypoint) != 1 || info.Config.Entrypoint[0] != c.bin {
			t.Errorf("%s: entrypoint %v", name, info.Config.Entrypoint)
		}
		if name != CoreDNS && name != Pause && (len(info.Config.Env) == 0 || !strings.HasPrefix(info.Config.Env[0], "PATH=/usr/local/bin:")) {
			t.Errorf("%s: no PATH in the image config (the static pods call plain %q): %v", name, name, info.Config.Env)
		}
		bin := filepath.Join(t.TempDir(), name)
		if err := oci.Extract(p, c.bin, bin); err != nil {
			t.Fatal(err)
		}
		out, err := testutil.Command(t, 30*time.Second, bin, c.args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s %v: %q (%v), want %q", c.bin, c.args, firstLine(out), err, c.want)
		}
	}
	// kube-proxy's iptables runs from its own image.
	if os.Getuid() != 0 {
		// Under CI (root) this fails instead: the chroot run must happen.
		testutil.SkipUnlessCI(t, "not root: the chroot run of the kube-proxy image's iptables")
	}
	root := t.TempDir()
	if err := unpack(t, file[refs[Proxy]], root); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		out, err := testutil.Command(t, 30*time.Second, "chroot", root, "/usr/sbin/"+n, "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "nf_tables") {
			t.Errorf("%s in the kube-proxy image: %q %v", n, out, err)
		}
	}
}

// The tree's lock file and tarballs are what import-images accepts, and
// containerd then holds exactly the references kubeadm expects.
func checkImport(t *testing.T, dir string, e images.MinorEntry) {
	address := testutil.Containerd(t)
	ctr := hostPath(dir, paths.Ctr) // the tree's own ctr
	var log bytes.Buffer
	res := imageimport.Run(context.Background(), imageimport.Options{Root: paths.Root(dir), Runner: runner.Exec{}, Ctr: ctr,
		Address: address, Log: slog.New(slog.NewTextHandler(&log, nil))})
	if res.ExitCode != 0 || len(res.Imported) != 7 {
		t.Fatalf("%+v\n%s", res, log.String())
	}
	t.Logf("%s", strings.TrimSpace(log.String()))
	out, err := testutil.Command(t, time.Minute, ctr, "--address", address, "-n", "k8s.io", "images", "ls", "-q").Output()
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	got = strings.Fields(string(out))
	for _, r := range Refs(e) {
		want = append(want, r)
	}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("containerd lists %v, want %v", got, want)
	}
	// A converged boot: every image present at the lock file's manifest
	// digest, nothing imported.
	log.Reset()
	rec := &runner.Recorder{Reply: runner.Exec{}.Run}
	res = imageimport.Run(context.Background(), imageimport.Options{Root: paths.Root(dir), Runner: rec, Ctr: ctr,
		Address: address, Log: slog.New(slog.NewTextHandler(&log, nil))})
	if res.ExitCode != 0 || len(res.Present) != 7 || len(res.Imported) != 0 ||
		!strings.Contains(log.String(), "outcome=ok imported=0 present=7 refused=0 failed=0") {
		t.Fatalf("%+v\n%s", res, log.String())
	}
	for _, l := range rec.Lines() {
		if strings.Contains(l, " images import ") {
			t.Fatalf("imported again: %v", rec.Lines())
		}
	}
	t.Logf("%s", strings.TrimSpace(log.String()))
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// unpack extracts an image's single layer with Debian's tar.
func unpack(t testing.TB, tarball, root string) error {
	info, err := oci.Inspect(tarball)
	if err != nil {
		return err
	}
	blobs := filepath.Join(filepath.Dir(root), "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return err
	}
	layer := "blobs/sha256/" + strings.TrimPrefix(info.Layers[0], "sha256:")
	if out, err := testutil.Command(t, 2*time.Minute, "tar", "-C", filepath.Dir(blobs), "-xf", tarball, layer).CombinedOutput(); err != nil {
		return fmt.Errorf("tar: %w: %s", err, out)
	}
	if out, err := testutil.Command(t, 2*time.Minute, "tar", "-C", root, "-xf", filepath.Join(filepath.Dir(blobs), layer)).CombinedOutput(); err != nil {
		return fmt.Errorf("tar: %w: %s", err, out)
	}
	return nil
}

func checkVerify(t *testing.T, dir string) {
	if _, err := os.Stat(SystemdAnalyze); err != nil {
		testutil.SkipUnlessCI(t, fmt.Sprintf("Debian's systemd-analyze is not installed: %v", err))
	}
	ctx := context.Background()
	if err := VerifyUnits(ctx, dir, ""); err != nil {
		t.Fatal(err)
	}
	// The check can fail: a broken unit, or a unit whose binary is not in the tree.
	for name, spoil := range map[string]func(copy string){
		"unknown key": func(c string) {
			p := hostPath(c, system.UnitDir+"/"+system.Reconcile)
			b, _ := os.ReadFile(p)
			os.Remove(p) // a hard link to the tree's file: replace, do not edit
			os.WriteFile(p, append(b, []byte("TimeoutStartSex=5\n")...), 0o644)
		},
		"missing binary": func(c string) { os.Remove(hostPath(c, paths.Kubelet)) },
		"dangling wants": func(c string) { os.Remove(hostPath(c, system.UnitDir+"/"+system.ImageImport)) },
	} {
		c := filepath.Join(t.TempDir(), "copy")
		if err := linkTree(dir, c); err != nil {
			t.Fatal(err)
		}
		spoil(c)
		if err := VerifyUnits(ctx, c, ""); err == nil {
			t.Errorf("%s: verify passed", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// The Earthfile takes every version from versions.yaml (through mktree), so
// published images cannot drift from the window compiled into the binary.
func TestEarthfileTakesVersionsFromManifest(t *testing.T) {
	src, err := FindSourceDir()
	if err != nil {
		t.Fatal(err)
	}
	var all string
	for _, f := range []string{"Earthfile", "earthly/Earthfile"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		all += string(b)
	}
	for _, e := range images.Get().Minors {
		for _, v := range []string{e.Kubernetes, e.Etcd, e.CoreDNS, e.ImageTag, "pause:" + e.Pause} {
			if strings.Contains(all, v) {
				t.Errorf("the Earthfile hard-codes %q: take it from images/versions.yaml (mktree -list)", v)
			}
		}
	}
	for _, want := range []string{"go run ./cmd/mktree -minor", "go run ./cmd/mktree -list", "SAVE IMAGE --push $REGISTRY:$TAG",
		"-node-files /out/node", "COPY (+tree/node"} {
		if !strings.Contains(all, want) {
			t.Errorf("the Earthfile lacks %q", want)
		}
	}
}

// The Earthfile's node base installs exactly images.NodePackages, the list
// the Kairos base of `make image` and the end-to-end nodes install.
func TestEarthfileInstallsNodePackages(t *testing.T) {
	src, err := FindSourceDir()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(src, "earthly", "Earthfile"))
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.ReplaceAll(string(b), "\\\n", " ")
	const cmd = "apt-get install -y --no-install-recommends"
	var got []string
	n := 0
	for _, line := range strings.Split(joined, "\n") {
		_, rest, ok := strings.Cut(line, cmd)
		if !ok {
			continue
		}
		n++
		rest, _, _ = strings.Cut(rest, "&&")
		got = append(got, strings.Fields(rest)...)
	}
	if n != 1 {
		t.Fatalf("earthly/Earthfile has %d %q commands, want 1", n, cmd)
	}
	want := append([]string(nil), images.NodePackages...)
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("earthly/Earthfile installs\n  %v\nimages.NodePackages is\n  %v", got, want)
	}
}
