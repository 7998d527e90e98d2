// Package testbin builds real Kubernetes (and etcd) binaries from the Go
// module proxy for tests, and caches them by version outside the repository:
// $PROVIDER_KUBERNETES_CACHE, default ~/.cache/provider-kubernetes. A cold
// kubeadm build takes a few minutes on two cores; a cached one costs nothing.
package testbin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// CacheDir is where built artifacts live.
func CacheDir() string {
	if d := os.Getenv("PROVIDER_KUBERNETES_CACHE"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "provider-kubernetes")
	}
	return filepath.Join(os.TempDir(), "provider-kubernetes-cache")
}

// Kubeadm returns the path of kubeadm at kver ("v1.37.2"), building it if needed.
func Kubeadm(t testing.TB, kver string) string {
	t.Helper()
	return KubernetesBinary(t, kver, "kubeadm")
}

// KubernetesBinary returns the path of k8s.io/kubernetes/cmd/<name> at
// kver ("v1.37.2"), building it if needed (a cold build is logged through
// t); skipped in -short mode.
func KubernetesBinary(t testing.TB, kver, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("builds real %s: not in -short mode", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	p, err := Kubernetes(ctx, kver, name, testLog{t})
	if err != nil {
		t.Fatalf("build %s %s: %v", name, kver, err)
	}
	return p
}

type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

// Kubernetes returns the path of a binary of k8s.io/kubernetes/cmd/<name> at
// kver, building it into the cache when missing. Concurrent callers (several
// test packages at once) serialise on a lock file.
func Kubernetes(ctx context.Context, kver, name string, log io.Writer) (string, error) {
	v, err := version.Parse(kver)
	if err != nil {
		return "", err
	}
	out := filepath.Join(CacheDir(), "bin", kver, name)
	return out, cached(out, fmt.Sprintf("%s %s from modules (cold: several minutes on 2 cores)", name, kver), log, func() error {
		wrap := filepath.Join(CacheDir(), "wrap", "kubernetes-"+kver)
		if err := writeWrapper(ctx, wrap, v); err != nil {
			return err
		}
		return goBuild(ctx, wrap, out, "k8s.io/kubernetes/cmd/"+name, ldflags(v), "", true, log)
	})
}

// KubernetesSet returns the paths of several binaries of
// k8s.io/kubernetes/cmd at kver, by name, building the missing ones into
// the cache in ONE go build: the packages they share are loaded and hashed
// once, and each binary's link runs beside the others' compiles instead of
// after them (two cores otherwise wait on a single-threaded link seven
// times a minor). The cache layout is Kubernetes's: a binary built either
// way is found by both.
func KubernetesSet(ctx context.Context, kver string, names []string, log io.Writer) (map[string]string, error) {
	v, err := version.Parse(kver)
	if err != nil {
		return nil, err
	}
	paths := map[string]string{}
	missing := func() []string {
		var m []string
		for _, n := range names {
			if !ok(paths[n]) {
				m = append(m, n)
			}
		}
		return m
	}
	for _, n := range names {
		if n == "" || strings.ContainsAny(n, "/\\.") {
			return nil, fmt.Errorf("not a Kubernetes command name (%d bytes)", len(n))
		}
		paths[n] = filepath.Join(CacheDir(), "bin", kver, n)
	}
	if len(missing()) == 0 {
		return paths, nil
	}
	unlock, err := Lock(filepath.Join(CacheDir(), "build.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	todo := missing()
	if len(todo) == 0 {
		return paths, nil
	}
	what := fmt.Sprintf("%s %s from modules in one go build (cold: 10-16 min on 2 cores)", strings.Join(todo, ", "), kver)
	fmt.Fprintf(log, "testbin: building %s into %s\n", what, filepath.Join(CacheDir(), "bin", kver))
	start := time.Now()
	wrap := filepath.Join(CacheDir(), "wrap", "kubernetes-"+kver)
	if err := writeWrapper(ctx, wrap, v); err != nil {
		return nil, err
	}
	var pkgs []string
	for _, n := range todo {
		pkgs = append(pkgs, "k8s.io/kubernetes/cmd/"+n)
	}
	if err := goBuildSet(ctx, wrap, filepath.Join(CacheDir(), "bin", kver), pkgs, ldflags(v), log); err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "testbin: built %s in %s\n", what, time.Since(start).Round(time.Second))
	return paths, nil
}

// cached builds out with build unless it is already there. Concurrent
// callers (several test packages at once) serialise on one lock file and
// check again once they hold it.
func cached(out, what string, log io.Writer, build func() error) error {
	if ok(out) {
		return nil
	}
	unlock, err := Lock(filepath.Join(CacheDir(), "build.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if ok(out) {
		return nil
	}
	fmt.Fprintf(log, "testbin: building %s into %s\n", what, out)
	start := time.Now()
	if err := build(); err != nil {
		return err
	}
	fmt.Fprintf(log, "testbin: built %s in %s\n", what, time.Since(start).Round(time.Second))
	return nil
}

// GoBinary returns the path of package pkg of module@ver built as name,
// building it into the cache when missing (etcd, etcdctl, etcdutl, coredns).
func GoBinary(ctx context.Context, module, ver, pkg, name, ldflags string, log io.Writer) (string, error) {
	return goBinary(ctx, module, ver, pkg, name, ldflags, "", log)
}

// KairosAgentVersion is the kairos-agent the end-to-end nodes boot with:
// the real Kairos client that sends agent.boot and runs the boot stage.
const KairosAgentVersion = "v2.31.4"

// KairosAgent returns the path of the real kairos-agent at
// KairosAgentVersion, built from its module (-tags nogit, static) into the
// cache when missing: about 3 minutes cold on 2 cores, 28 MB.
func KairosAgent(ctx context.Context, log io.Writer) (string, error) {
	const module = "github.com/kairos-io/kairos-agent/v2"
	return goBinary(ctx, module, KairosAgentVersion, module, "kairos-agent", "", "nogit", log)
}

func goBinary(ctx context.Context, module, ver, pkg, name, ldflags, tags string, log io.Writer) (string, error) {
	key := strings.ReplaceAll(module, "/", "_") + "@" + ver
	out := filepath.Join(CacheDir(), "bin", key, name)
	return out, cached(out, fmt.Sprintf("%s (%s@%s)", name, module, ver), log, func() error {
		wrap, err := requireWrapper(key, module, ver)
		if err != nil {
			return err
		}
		if ldflags == "" {
			ldflags = "-s -w"
		}
		return goBuild(ctx, wrap, out, pkg, ldflags, tags, true, log)
	})
}

// requireWrapper writes the wrapper module a build of module@ver runs in
// (the cache's wrap/<key>: a go.mod requiring exactly that version; the
// build's -mod=mod resolves the rest) and returns its directory.
func requireWrapper(key, module, ver string) (string, error) {
	wrap := filepath.Join(CacheDir(), "wrap", key)
	if err := os.MkdirAll(wrap, 0o755); err != nil {
		return "", err
	}
	gm := fmt.Sprintf("module example.com/wrap\n\ngo 1.26.0\n\nrequire %s %s\n", module, ver)
	return wrap, os.WriteFile(filepath.Join(wrap, "go.mod"), []byte(gm), 0o644)
}

// Etcd returns a cached etcd server binary at ver ("v3.6.8").
func Etcd(t testing.TB, ver string) string {
	return etcdBinary(t, "go.etcd.io/etcd/server/v3", ver, "etcd")
}

// Etcdctl returns a cached etcdctl at ver.
func Etcdctl(t testing.TB, ver string) string {
	return etcdBinary(t, "go.etcd.io/etcd/etcdctl/v3", ver, "etcdctl")
}

// Etcdutl returns a cached etcdutl at ver.
func Etcdutl(t testing.TB, ver string) string {
	return etcdBinary(t, "go.etcd.io/etcd/etcdutl/v3", ver, "etcdutl")
}

func etcdBinary(t testing.TB, module, ver, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds real " + name + ": not in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	p, err := GoBinary(ctx, module, ver, module, name, "", testLog{t})
	if err != nil {
		t.Fatalf("build %s %s: %v", name, ver, err)
	}
	return p
}

func ok(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// Lock takes an exclusive lock on the file p (created when missing) and
// returns its release: builds that share a cache directory take turns.
func Lock(p string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

func goBin() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); ok(p) {
		return p
	}
	return "go"
}

// ldflags stamps the version: unstamped, kubeadm reports v0.0.0-master and
// refuses to upgrade to a placeholder.
func ldflags(v version.Version) string {
	var b strings.Builder
	b.WriteString("-s -w")
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		fmt.Fprintf(&b, " -X %s.gitVersion=%s -X %s.gitMajor=%d -X %s.gitMinor=%d -X %s.gitTreeState=clean -X %s.buildDate=1970-01-01T00:00:00Z",
			pkg, v, pkg, v.Major, pkg, v.Minor, pkg, pkg)
	}
	return b.String()
}

// writeWrapper writes a module that requires k8s.io/kubernetes at v and
// replaces every staging module kubernetes requires at v0.0.0 with the
// matching v0.MINOR.PATCH release.
func writeWrapper(ctx context.Context, dir string, v version.Version) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	info, err := modDownload(ctx, dir, "k8s.io/kubernetes", v.String())
	if err != nil {
		return err
	}
	staging, err := stagingModules(info.GoMod)
	if err != nil {
		return err
	}
	var gm strings.Builder
	fmt.Fprintf(&gm, "module example.com/kwrap\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n", v)
	for _, m := range staging {
		fmt.Fprintf(&gm, "\t%s => %s v0.%d.%d\n", m, m, v.Minor, v.Patch)
	}
	gm.WriteString(")\n")
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gm.String()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tools.go"), []byte("//go:build tools\n\npackage tools\n\nimport _ \"k8s.io/kubernetes/cmd/kubeadm\"\n"), 0o644)
}

// modInfo is what `go mod download -json` says of one module.
type modInfo struct{ Dir, GoMod, Error string }

// modDownload downloads module@ver through the module proxy (from dir, a
// module directory) and returns where it landed in the module cache.
func modDownload(ctx context.Context, dir, module, ver string) (modInfo, error) {
	cmd := exec.CommandContext(ctx, goBin(), "mod", "download", "-json", module+"@"+ver)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		return modInfo{}, fmt.Errorf("go mod download %s@%s: %w", module, ver, exitDetail(err))
	}
	var info modInfo
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" || info.GoMod == "" {
		return modInfo{}, fmt.Errorf("go mod download %s@%s: no module directory or go.mod (%s)", module, ver, info.Error)
	}
	return info, nil
}

func stagingModules(gomod string) ([]string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mods []string
	seen := map[string]bool{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 2 && fields[0] == "require" && fields[1] == "(":
			in = true
		case in && len(fields) == 1 && fields[0] == ")":
			in = false
		case in && len(fields) >= 2 && strings.HasPrefix(fields[0], "k8s.io/") && fields[1] == "v0.0.0" && !seen[fields[0]]:
			seen[fields[0]] = true
			mods = append(mods, fields[0])
		}
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("%s: no staging modules found", gomod)
	}
	return mods, sc.Err()
}

// goBuild builds pkg of the module in dir at out (through out.part).
// modMod lets go resolve and update the module's requirements (the
// wrapper modules of the version builds); a checkout's own module is built
// as it is.
func goBuild(ctx context.Context, dir, out, pkg, ldflags, tags string, modMod bool, log io.Writer) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".part"
	args := []string{"build", "-trimpath", "-ldflags", ldflags}
	env := append(os.Environ(), "CGO_ENABLED=0")
	if modMod {
		args = append(args, "-mod=mod")
		env = append(env, "GOFLAGS=-mod=mod")
	}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.CommandContext(ctx, goBin(), append(args, "-o", tmp, pkg)...)
	cmd.Dir = dir
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = log, io.MultiWriter(&stderr, log)
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("go build %s: %w: %s", pkg, err, lastLines(stderr.String(), 5))
	}
	return os.Rename(tmp, out)
}

// goBuildSet builds the main packages pkgs (module mode, static, stamped
// with ldflags) in one go build into a fresh directory beside outDir, then
// moves each binary to outDir/<last element of its package path>: none is
// in place before all were built.
func goBuildSet(ctx context.Context, dir, outDir string, pkgs []string, ldflags string, log io.Writer) error {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(outDir, ".part-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	args := append([]string{"build", "-trimpath", "-ldflags", ldflags, "-mod=mod", "-o", tmp + "/"}, pkgs...)
	cmd := exec.CommandContext(ctx, goBin(), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = log, io.MultiWriter(&stderr, log)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", strings.Join(pkgs, " "), err, lastLines(stderr.String(), 5))
	}
	for _, p := range pkgs {
		name := p[strings.LastIndex(p, "/")+1:]
		if !ok(filepath.Join(tmp, name)) {
			return fmt.Errorf("go build %s wrote no %s", strings.Join(pkgs, " "), name)
		}
	}
	for _, p := range pkgs {
		name := p[strings.LastIndex(p, "/")+1:]
		if err := os.Rename(filepath.Join(tmp, name), filepath.Join(outDir, name)); err != nil {
			return err
		}
	}
	return nil
}

func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("%w: %s", err, lastLines(string(ee.Stderr), 5))
	}
	return err
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}

// moduleRoot is this checkout's module root (the directory of go.mod).
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// ProviderTags are the build tags of every provider binary (`make build`,
// the image, the tests): grpcnotrace leaves out grpc's golang.org/x/net/trace
// and what it links (html/template...), about 4 MB the provider never uses.
const ProviderTags = "grpcnotrace"

// BuildProvider builds this checkout's provider-kubernetes at out as
// `make build` and the image make it: static (CGO_ENABLED=0), -trimpath,
// stripped, ProviderTags.
func BuildProvider(ctx context.Context, out string) error {
	if err := BuildStatic(ctx, "./cmd/provider-kubernetes", out); err != nil {
		return fmt.Errorf("build the provider: %w", err)
	}
	return nil
}

// BuildStatic builds pkg of this module ("./cmd/provider-kubernetes", a
// test's guest program) at out as the provider is built: static
// (CGO_ENABLED=0), stripped, ProviderTags.
func BuildStatic(ctx context.Context, pkg, out string) error {
	return goBuild(ctx, moduleRoot(), out, pkg, "-s -w", ProviderTags, false, io.Discard)
}

// Provider is BuildProvider into a new temporary directory of t, bounded
// at 10 minutes.
func Provider(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "provider-kubernetes")
	if err := BuildProvider(ctx, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// Named is a binary under a name (a build compared side by side).
type Named struct{ Name, Path string }

// Providers are the builds a benchmark compares: those its environment
// variable env names ("before=/abs/path,after=/abs/path"; reserved is the
// name the benchmark gives its own reference), else this checkout's
// (Provider) as "provider".
func Providers(t testing.TB, env, reserved string) []Named {
	t.Helper()
	s := os.Getenv(env)
	if s == "" {
		return []Named{{"provider", Provider(t)}}
	}
	var out []Named
	for _, kv := range strings.Split(s, ",") {
		name, p, ok := strings.Cut(kv, "=")
		if !ok || name == "" || name == reserved || !filepath.IsAbs(p) {
			t.Fatalf("%s: %q is not name=/absolute/path", env, kv)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err)
		}
		out = append(out, Named{name, p})
	}
	return out
}
