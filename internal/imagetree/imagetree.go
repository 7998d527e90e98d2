// Package imagetree assembles the filesystem tree of one per-minor OS image
// from images/versions.yaml, offline, from Go modules:
//
//	/system/providers/agent-provider-kubernetes      the provider (the Kairos plugin)
//	/usr/bin/provider-kubernetes                     -> ../../system/providers/agent-provider-kubernetes
//	/usr/bin/{kubeadm,kubelet,kubectl}               the minor's Kubernetes release
//	/usr/bin/{etcdctl,etcdutl}                       the etcd release that kubeadm deploys
//	/usr/bin/{containerd,ctr,containerd-shim-runc-v2} the node's containerd (images.Containerd)
//	/usr/lib/systemd/system/...                      the units, drop-in and relative .wants links
//	/system/provider-kubernetes/images/*.tar         control-plane images (OCI layout tarballs)
//	/system/provider-kubernetes/images/lock.yaml     their exact references, sizes, sha256 and manifest digests
//	/usr/share/provider-kubernetes/bundle.yaml       the bundle manifest reconcile reads
//
// The Earthfile lays this tree onto the Kairos base image (one image per
// minor); the end-to-end suite uses it as the lower directory of nspawn
// nodes. Binaries come from internal/testbin (built from the module proxy,
// cached by version); image tarballs are cached by the digest of their inputs.
package imagetree

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/bundle"
	"github.com/kairos-io/provider-kubernetes/internal/imagelock"
	"github.com/kairos-io/provider-kubernetes/internal/oci"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
	"github.com/kairos-io/provider-kubernetes/system"
)

// ModulePath is this project's module, located to build the provider and pause.
const ModulePath = "github.com/kairos-io/provider-kubernetes"

// Options tune a build.
type Options struct {
	// Log receives progress lines (nil: discarded).
	Log io.Writer
	// SourceDir is this module's root (default: found upwards from the working directory).
	SourceDir string
	// ProviderVersion is stamped into the provider binary (default "dev").
	ProviderVersion string
	// NoImages leaves out the control-plane images and their lock file
	// (binaries, units and bundle manifest only): a quick tree for work
	// that boots no control plane.
	NoImages bool
	// Replace removes an existing outDir first (default: refuse).
	Replace bool
	// HostRoot is where iptables for the kube-proxy image is taken from (default "/").
	HostRoot string
	// CacheDir holds built binaries and image tarballs (default testbin.CacheDir()).
	CacheDir string
}

// Result describes a built tree.
type Result struct {
	Dir    string
	Entry  images.MinorEntry
	Bundle bundle.Manifest
	Lock   imagelock.Lock // empty with NoImages
	Took   time.Duration
}

// Image names, in the order kubeadm lists them.
const (
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
	Proxy             = "kube-proxy"
	CoreDNS           = "coredns"
	Pause             = "pause"
	Etcd              = "etcd"
)

// Refs returns the exact registry.k8s.io references kubeadm of this entry
// expects, by image name, from versions.yaml.
func Refs(e images.MinorEntry) map[string]string {
	return map[string]string{
		APIServer:         "registry.k8s.io/kube-apiserver:" + e.Kubernetes,
		ControllerManager: "registry.k8s.io/kube-controller-manager:" + e.Kubernetes,
		Scheduler:         "registry.k8s.io/kube-scheduler:" + e.Kubernetes,
		Proxy:             "registry.k8s.io/kube-proxy:" + e.Kubernetes,
		CoreDNS:           "registry.k8s.io/coredns/coredns:" + e.CoreDNS,
		Pause:             "registry.k8s.io/pause:" + e.Pause,
		Etcd:              "registry.k8s.io/etcd:" + e.Etcd,
	}
}

// EtcdRelease is the etcd release of an etcd image tag ("3.7.0-0" -> "v3.7.0").
func EtcdRelease(tag string) (string, error) {
	base, _, _ := strings.Cut(tag, "-")
	v, err := version.Parse("v" + base)
	if err != nil {
		return "", fmt.Errorf("etcd image tag %q: %w", tag, err)
	}
	return v.String(), nil
}

// Entry returns versions.yaml's entry for minor ("1.37").
func Entry(minor string) (images.MinorEntry, error) {
	m, err := version.ParseMinor(minor)
	if err != nil {
		return images.MinorEntry{}, err
	}
	e, ok := images.ForMinor(m)
	if !ok {
		return images.MinorEntry{}, fmt.Errorf("minor %s is not in images/versions.yaml (window %s)", m, images.Window())
	}
	return e, nil
}

type logger struct{ w io.Writer }

func (l logger) Printf(format string, a ...any) {
	if l.w != nil {
		fmt.Fprintf(l.w, "imagetree: "+format+"\n", a...)
	}
}

// Build assembles the tree of minor ("1.37") into outDir. The tree is built
// next to outDir and renamed into place when complete, so outDir is either
// absent or whole.
func Build(ctx context.Context, minor, outDir string, o Options) (Result, error) {
	start := time.Now()
	entry, err := Entry(minor)
	if err != nil {
		return Result{}, err
	}
	if o.CacheDir == "" {
		o.CacheDir = testbin.CacheDir()
	}
	if o.HostRoot == "" {
		o.HostRoot = "/"
	}
	if o.ProviderVersion == "" {
		o.ProviderVersion = "dev"
	}
	if o.SourceDir == "" {
		if o.SourceDir, err = FindSourceDir(); err != nil {
			return Result{}, err
		}
	}
	log := logger{o.Log}
	outDir, err = filepath.Abs(outDir)
	if err != nil {
		return Result{}, err
	}
	if _, err := os.Lstat(outDir); err == nil {
		if !o.Replace {
			return Result{}, fmt.Errorf("%s exists (Replace to rebuild it)", outDir)
		}
		if err := os.RemoveAll(outDir); err != nil {
			return Result{}, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(outDir), 0o755); err != nil {
		return Result{}, err
	}
	work, err := os.MkdirTemp(filepath.Dir(outDir), "."+filepath.Base(outDir)+".part-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(work)
	tree := filepath.Join(work, "tree")
	scratch := filepath.Join(work, "scratch")
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return Result{}, err
	}

	log.Printf("minor %s: kubernetes %s, etcd %s, coredns %s, pause %s (versions.yaml, release %s)",
		entry.Minor, entry.Kubernetes, entry.Etcd, entry.CoreDNS, entry.Pause, images.Get().Release)
	etcdRel, err := EtcdRelease(entry.Etcd)
	if err != nil {
		return Result{}, err
	}
	bins, err := buildAll(ctx, entry, o.NoImages, o.logWriter())
	if err != nil {
		return Result{}, err
	}
	if bins["provider"], err = goBuildLocal(ctx, o.SourceDir, "./cmd/provider-kubernetes",
		"-s -w -X "+ModulePath+"/internal/cli.Version="+o.ProviderVersion, filepath.Join(scratch, "provider-kubernetes")); err != nil {
		return Result{}, err
	}
	// kubeadm itself must expect exactly the images versions.yaml names.
	if err := checkKubeadmImages(ctx, bins["kubeadm"], entry); err != nil {
		return Result{}, err
	}

	// The tree.
	copies := map[string]string{
		paths.ProviderPlugin: bins["provider"],
		paths.Kubeadm:        bins["kubeadm"],
		paths.Kubelet:        bins["kubelet"],
		paths.Kubectl:        bins["kubectl"],
		paths.Etcdctl:        bins["etcdctl"],
		paths.Etcdutl:        bins["etcdutl"],
		paths.Containerd:     bins["containerd"],
		paths.Ctr:            bins["ctr"],
		paths.ContainerdShim: bins["containerd-shim-runc-v2"],
	}
	for dst, src := range copies {
		if _, err := copyFile(src, hostPath(tree, dst), 0o755); err != nil {
			return Result{}, err
		}
	}
	if err := symlink(hostPath(tree, paths.ProviderBin), "../../system/providers/agent-provider-kubernetes"); err != nil {
		return Result{}, err
	}
	for _, u := range system.Units() {
		if err := writeFile(hostPath(tree, u.Path), u.Data, u.Mode); err != nil {
			return Result{}, err
		}
	}
	for _, l := range system.WantsLinks() {
		if err := symlink(hostPath(tree, l.Path), l.Target); err != nil {
			return Result{}, err
		}
	}

	b := bundle.Manifest{
		Kubernetes: entry.Kubernetes, Kubeadm: entry.Kubernetes, Kubelet: entry.Kubernetes, Kubectl: entry.Kubernetes,
		Etcd: entry.Etcd, Etcdctl: strings.TrimPrefix(etcdRel, "v"), Etcdutl: strings.TrimPrefix(etcdRel, "v"),
		ImageTag: entry.ImageTag,
	}
	var lock imagelock.Lock
	if !o.NoImages {
		imgs, err := o.controlPlaneImages(ctx, entry, bins, scratch)
		if err != nil {
			return Result{}, err
		}
		dir := hostPath(tree, paths.ImagesDir)
		for _, im := range imgs {
			cached, err := o.cachedImage(im, log)
			if err != nil {
				return Result{}, fmt.Errorf("image %s: %w", im.Ref, err)
			}
			file := imagelock.FileName(im.Ref)
			sum, err := copyFile(cached, filepath.Join(dir, file), 0o644)
			if err != nil {
				return Result{}, err
			}
			st, err := os.Stat(filepath.Join(dir, file))
			if err != nil {
				return Result{}, err
			}
			manifest, err := manifestDigest(filepath.Join(dir, file), im.Ref)
			if err != nil {
				return Result{}, err
			}
			lock.Images = append(lock.Images, imagelock.Image{Ref: im.Ref, File: file, SHA256: sum, Size: st.Size(), Manifest: manifest})
			b.Images = append(b.Images, im.Ref)
		}
		data, err := lock.Marshal()
		if err != nil {
			return Result{}, err
		}
		if _, err := imagelock.Parse(data); err != nil {
			return Result{}, err
		}
		if err := writeFile(hostPath(tree, paths.ImageLock), data, 0o644); err != nil {
			return Result{}, err
		}
	}
	data, err := b.Marshal()
	if err != nil {
		return Result{}, err
	}
	if _, err := bundle.Parse(data); err != nil {
		return Result{}, err
	}
	if err := writeFile(hostPath(tree, paths.BundleManifest), data, 0o644); err != nil {
		return Result{}, err
	}
	if err := normaliseDirs(tree); err != nil {
		return Result{}, err
	}
	// The binaries in the tree must say what the manifest says.
	if err := CheckVersions(ctx, tree, b); err != nil {
		return Result{}, err
	}
	if err := os.Rename(tree, outDir); err != nil {
		return Result{}, err
	}
	res := Result{Dir: outDir, Entry: entry, Bundle: b, Lock: lock, Took: time.Since(start)}
	log.Printf("tree for %s in %s (%d images) in %s", entry.Minor, outDir, len(lock.Images), res.Took.Round(time.Second))
	return res, nil
}

func (o Options) logWriter() io.Writer {
	if o.Log == nil {
		return io.Discard
	}
	return o.Log
}

// hostPath places an absolute host path inside the tree.
func hostPath(tree, p string) string { return paths.Root(tree).Path(p) }

// controlPlaneImages describes the seven images kubeadm init/upgrade needs.
func (o Options) controlPlaneImages(ctx context.Context, e images.MinorEntry, bins map[string]string, scratch string) ([]oci.Image, error) {
	refs := Refs(e)
	bin := map[string]string{}
	for _, n := range []string{APIServer, ControllerManager, Scheduler, Proxy, Etcd, CoreDNS} {
		bin[n] = bins[n]
	}
	var err error
	if bin[Pause], err = goBuildLocal(ctx, o.SourceDir, "./images/pause", "-s -w -X main.version="+e.Pause, filepath.Join(scratch, "pause")); err != nil {
		return nil, err
	}
	// The static-pod manifests call plain "kube-apiserver", "etcd": PATH must be in the image.
	path := []string{"PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin"}
	tmp := oci.Entry{Path: "/tmp", Type: tar.TypeDir, Mode: 0o777}
	var out []oci.Image
	for _, n := range []string{APIServer, ControllerManager, Scheduler} {
		out = append(out, oci.Image{Ref: refs[n], Config: oci.Config{Env: path, Entrypoint: []string{"/usr/local/bin/" + n}},
			Entries: []oci.Entry{{Path: "/usr/local/bin/" + n, Source: bin[n], Mode: 0o755}, tmp}})
	}
	ipt, err := iptablesEntries(o.HostRoot)
	if err != nil {
		return nil, err
	}
	proxy := append([]oci.Entry{{Path: "/usr/local/bin/" + Proxy, Source: bin[Proxy], Mode: 0o755}, tmp,
		{Path: "/run", Type: tar.TypeDir, Mode: 0o755}}, ipt...)
	out = append(out, oci.Image{Ref: refs[Proxy], Config: oci.Config{Env: path, Entrypoint: []string{"/usr/local/bin/" + Proxy}}, Entries: proxy})
	out = append(out, oci.Image{Ref: refs[CoreDNS],
		Config:  oci.Config{Entrypoint: []string{"/coredns"}, ExposedPorts: map[string]struct{}{"53/tcp": {}, "53/udp": {}}},
		Entries: []oci.Entry{{Path: "/coredns", Source: bin[CoreDNS], Mode: 0o755}, tmp, {Path: "/etc", Type: tar.TypeDir}}})
	// runAsUser 65535 like upstream's; kubeadm's upgrade health check runs it with ["-v"].
	out = append(out, oci.Image{Ref: refs[Pause], Config: oci.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"},
		Entries: []oci.Entry{{Path: "/pause", Source: bin[Pause], Mode: 0o755}}})
	out = append(out, oci.Image{Ref: refs[Etcd], Config: oci.Config{Env: path, Entrypoint: []string{"/usr/local/bin/etcd"}},
		Entries: []oci.Entry{{Path: "/usr/local/bin/etcd", Source: bin[Etcd], Mode: 0o755}, tmp,
			{Path: "/var/lib/etcd", Type: tar.TypeDir, Mode: 0o700}}})
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out, nil
}

// manifestDigest is the digest of the manifest a tarball's index names for
// ref: what containerd lists ref at once the tarball is imported, recorded in
// the lock file so that import-images can see it present without reading the
// tarball.
func manifestDigest(tarball, ref string) (string, error) {
	f, err := os.Open(tarball)
	if err != nil {
		return "", err
	}
	defer f.Close()
	r, err := oci.ReadRef(f)
	if err != nil {
		return "", fmt.Errorf("%s: %w", tarball, err)
	}
	if r.Name != ref {
		return "", fmt.Errorf("%s names %q, want %s", tarball, r.Name, ref)
	}
	return r.ManifestDigest, nil
}

// imageFormat changes when the way images are written changes, invalidating the cache.
const imageFormat = "provider-kubernetes-oci-v1"

// cachedImage returns a cached tarball of img, writing it when missing. The
// key is the digest of everything that goes into it (including each source
// file's content).
func (o Options) cachedImage(img oci.Image, log logger) (string, error) {
	h := sha256.New()
	cfg, _ := json.Marshal(img.Config)
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", imageFormat, runtime.GOARCH, img.Ref, cfg)
	entries := append([]oci.Entry(nil), img.Entries...)
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	for _, e := range entries {
		fmt.Fprintf(h, "%s %c %o %s ", e.Path, e.Type, e.Mode, e.Linkname)
		switch {
		case e.Source != "":
			f, err := os.Open(e.Source)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
		default:
			h.Write(e.Data)
		}
		h.Write([]byte{'\n'})
	}
	key := hex.EncodeToString(h.Sum(nil))
	dir := filepath.Join(o.CacheDir, "images")
	p := filepath.Join(dir, strings.TrimSuffix(imagelock.FileName(img.Ref), ".tar")+"-"+key[:16]+".tar")
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		return p, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	t := time.Now()
	if _, err := oci.WriteFile(p, img); err != nil {
		return "", err
	}
	log.Printf("wrote image %s in %s", img.Ref, time.Since(t).Round(time.Millisecond))
	return p, nil
}

// FindSourceDir finds this module's root upwards from the working directory.
func FindSourceDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			sc := bufio.NewScanner(f)
			sc.Scan()
			f.Close()
			if strings.TrimSpace(strings.TrimPrefix(sc.Text(), "module")) == ModulePath {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s above the working directory: set Options.SourceDir", ModulePath)
		}
		dir = parent
	}
}

func goBin() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileOK(p) {
		return p
	}
	return "go"
}

func fileOK(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// goBuildLocal builds a package of this module (static, trimmed, without
// the VCS stamp whatever GOFLAGS says: the same source gives the same
// binary, so a commit that changes no code changes no image).
func goBuildLocal(ctx context.Context, srcDir, pkg, ldflags, out string) (string, error) {
	cmd := exec.CommandContext(ctx, goBin(), "build", "-trimpath", "-buildvcs=false", "-tags", testbin.ProviderTags, "-ldflags", ldflags, "-o", out, pkg)
	cmd.Dir = srcDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", pkg, err, runner.Sanitize(string(b), 600))
	}
	return out, nil
}

// checkKubeadmImages compares `kubeadm config images list` with versions.yaml.
func checkKubeadmImages(ctx context.Context, kubeadm string, e images.MinorEntry) error {
	res, err := runner.Exec{}.Run(ctx, runner.Cmd{Path: kubeadm, Args: []string{"config", "images", "list", "--kubernetes-version", e.Kubernetes}, Timeout: time.Minute})
	if err != nil {
		return fmt.Errorf("kubeadm config images list: %w", err)
	}
	got := strings.Fields(string(res.Stdout))
	var want []string
	for _, r := range Refs(e) {
		want = append(want, r)
	}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		return fmt.Errorf("images/versions.yaml disagrees with kubeadm %s: kubeadm expects %v, versions.yaml gives %v", e.Kubernetes, got, want)
	}
	return nil
}

// Versions runs each binary of a tree and returns what it reports about
// itself: kubeadm, kubelet, kubectl ("v1.37.2"), etcdctl, etcdutl ("3.7.0")
// and the provider's window ("1.35, 1.36, 1.37").
func Versions(ctx context.Context, tree string) (map[string]string, error) {
	r := runner.Exec{}
	run := func(bin string, args ...string) (string, error) {
		res, err := r.Run(ctx, runner.Cmd{Path: hostPath(tree, bin), Args: args, Timeout: 30 * time.Second})
		if err != nil {
			return "", err
		}
		return string(res.Stdout), nil
	}
	out := map[string]string{}
	var err error
	var s string
	if s, err = run(paths.Kubeadm, "version", "-o", "short"); err != nil {
		return nil, err
	}
	out["kubeadm"] = strings.TrimSpace(s)
	if s, err = run(paths.Kubelet, "--version"); err != nil {
		return nil, err
	}
	out["kubelet"] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "Kubernetes"))
	if s, err = run(paths.Kubectl, "version", "--client", "-o", "json"); err != nil {
		return nil, err
	}
	var kv struct {
		ClientVersion struct{ GitVersion string } `json:"clientVersion"`
	}
	if err := json.Unmarshal([]byte(s), &kv); err != nil {
		return nil, fmt.Errorf("kubectl version: %w", err)
	}
	out["kubectl"] = kv.ClientVersion.GitVersion
	for _, n := range []string{"etcdctl", "etcdutl"} {
		if s, err = run("/usr/bin/"+n, "version"); err != nil {
			return nil, err
		}
		first, _, _ := strings.Cut(s, "\n")
		out[n] = strings.TrimSpace(strings.TrimPrefix(first, n+" version:"))
	}
	// "containerd github.com/containerd/containerd/v2 v2.3.4 <revision>"
	if s, err = run(paths.Containerd, "--version"); err != nil {
		return nil, err
	}
	if f := strings.Fields(s); len(f) >= 3 {
		out["containerd"] = f[2]
	}
	if s, err = run(paths.ProviderBin, "version"); err != nil {
		return nil, err
	}
	_, w, ok := strings.Cut(strings.TrimSpace(s), ", Kubernetes ")
	if !ok {
		return nil, fmt.Errorf("provider version output %q", runner.Sanitize(s, 200))
	}
	out["window"] = strings.TrimSuffix(w, ")")
	return out, nil
}

// CheckVersions compares what the tree's binaries report with the manifest
// and the provider's compiled-in window with versions.yaml.
func CheckVersions(ctx context.Context, tree string, b bundle.Manifest) error {
	got, err := Versions(ctx, tree)
	if err != nil {
		return err
	}
	want := map[string]string{"kubeadm": b.Kubeadm, "kubelet": b.Kubelet, "kubectl": b.Kubectl,
		"etcdctl": b.Etcdctl, "etcdutl": b.Etcdutl, "window": images.Window().String(), "containerd": images.Containerd}
	var bad []string
	for k, w := range want {
		if got[k] != w {
			bad = append(bad, fmt.Sprintf("%s reports %q, want %q", k, got[k], w))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("tree %s: %s", tree, strings.Join(bad, "; "))
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) (string, error) {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(out, h), in); err != nil {
		out.Close()
		return "", err
	}
	if err := out.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), os.Chmod(dst, mode) // exact mode whatever the umask
}

func writeFile(dst string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(dst, data, mode); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

func symlink(at, target string) error {
	if err := os.MkdirAll(filepath.Dir(at), 0o755); err != nil {
		return err
	}
	return os.Symlink(target, at)
}

// normaliseDirs makes every directory of the tree 0755, whatever the umask.
func normaliseDirs(tree string) error {
	return filepath.WalkDir(tree, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		return os.Chmod(p, 0o755)
	})
}
