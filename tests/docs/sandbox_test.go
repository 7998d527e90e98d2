// Package docs_test runs the commands of the operator documentation in
// docs/ from the pages' own text (internal/testutil/docs): one test per
// page, each in a sandbox node where the real provider binary ran first.
// How a page's command runs is internal/testutil/docs's convention: as
// written, `sh -c` as root, chrooted into the sandbox node's root, in a
// private mount, network and UTS namespace (nothing on the host changes,
// and 127.0.0.1 is the sandbox's own).
package docs_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
)

const (
	// childEnv names the test the re-executed binary runs inside the
	// private namespaces; providerEnv is the provider it built.
	childEnv    = "PROVIDER_KUBERNETES_DOCS_CHILD"
	providerEnv = "PROVIDER_KUBERNETES_DOCS_PROVIDER"
)

var (
	buildOnce sync.Once
	built     string
	buildErr  error
	buildDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// provider builds this checkout's provider once per test binary, as the
// image carries it.
func provider(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "docs-provider-")
		if buildErr != nil {
			return
		}
		built = filepath.Join(buildDir, "provider-kubernetes")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		buildErr = testbin.BuildProvider(ctx, built)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// inSandbox runs body in a copy of this test binary inside a private mount,
// network and UTS namespace: every mount, address and hostname of the
// sandbox dies with it.
func inSandbox(t *testing.T, body func(t *testing.T, s *sandbox)) {
	if os.Getenv(childEnv) == t.Name() {
		body(t, newSandbox(t))
		return
	}
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("builds the provider and runs it in a chroot: not in -short mode")
	}
	prov := provider(t)
	cmd := testutil.Command(t, 15*time.Minute, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1", "-test.timeout=14m")
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name(), providerEnv+"="+prov)
	// Go makes / private (recursively) in the child's new mount namespace.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("the sandboxed test: %v\n%s", err, out)
	}
	t.Logf("sandboxed:\n%s", out)
}

// sandbox is the child's side: the private namespaces, set up.
type sandbox struct {
	t        *testing.T
	provider string
}

func newSandbox(t *testing.T) *sandbox {
	// Only a fresh network namespace has nothing but a loopback that is
	// down: never bind the host's 127.0.0.1:2379.
	ifs, err := net.Interfaces()
	if err != nil || len(ifs) != 1 || ifs[0].Name != "lo" || ifs[0].Flags&net.FlagUp != 0 {
		t.Fatalf("not in a fresh network namespace (interfaces %v, %v)", ifs, err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		t.Fatalf("bring the sandbox's loopback up: %v", err)
	}
	return &sandbox{t: t, provider: os.Getenv(providerEnv)}
}

// node is a sandbox node: a testutil.Node root that commands run chrooted
// into, laid out like a Kairos node running the image.
type node struct {
	*testutil.Node
	t      *testing.T
	mounts []string
}

// node makes a sandbox node root named name (also the UTS hostname while
// its commands run).
func (s *sandbox) node(name string) *node {
	t := s.t
	t.Helper()
	n := &node{Node: testutil.NewNode(t, name), t: t}
	layer := t.TempDir()
	// Registered last, run first: the mounts go before the directories
	// under them are removed.
	t.Cleanup(func() {
		for i := len(n.mounts) - 1; i >= 0; i-- {
			_ = unix.Unmount(n.mounts[i], unix.MNT_DETACH)
		}
	})
	for _, d := range []string{"usr", "etc", "dev", "sys", "tmp", "run", "root", "var/log", "var/lib", "oem", "system/providers"} {
		if err := os.MkdirAll(n.Path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, n.Path(l)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(n.Path("tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	// The image's /usr: the host's programs (sh, grep, ...) with the
	// image's own binaries laid over them.
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(layer, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n.mount("overlay", "usr", "overlay", 0, "lowerdir=/usr,upperdir="+filepath.Join(layer, "upper")+",workdir="+filepath.Join(layer, "work"))
	n.mount("tmpfs", "usr/local", "tmpfs", 0, "mode=0755")
	n.mount("proc", "proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	n.mount("/sys", "sys", "", unix.MS_BIND, "")
	if err := unix.Mount("", n.Path("sys"), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount sys read-only: %v", err)
	}
	for name, dev := range map[string]int{"null": 3, "zero": 5, "random": 8, "urandom": 9} {
		if err := unix.Mknod(n.Path("dev/"+name), unix.S_IFCHR|0o666, int(unix.Mkdev(1, uint32(dev)))); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(n.Path("dev/"+name), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	// Names for ls and stat, the dynamic loader's cache and the host's
	// program alternatives (awk); nothing else of the host's /etc.
	for _, f := range []string{"passwd", "group", "nsswitch.conf", "ld.so.cache"} {
		if b, err := os.ReadFile("/etc/" + f); err == nil {
			n.Write("/etc/"+f, string(b), 0o644)
		}
	}
	if alts, err := os.ReadDir("/etc/alternatives"); err == nil {
		if err := os.MkdirAll(n.Path("/etc/alternatives"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, a := range alts {
			if target, err := os.Readlink("/etc/alternatives/" + a.Name()); err == nil {
				if err := os.Symlink(target, n.Path("/etc/alternatives/"+a.Name())); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// The provider where the image has it.
	n.install(os.Getenv(providerEnv), paths.ProviderPlugin)
	if err := os.Symlink("../../system/providers/agent-provider-kubernetes", n.Path(paths.ProviderBin)); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *node) mount(src, dst, fstype string, flags uintptr, data string) {
	n.t.Helper()
	p := n.Path(dst)
	if err := unix.Mount(src, p, fstype, flags, data); err != nil {
		n.t.Fatalf("mount %s on %s: %v", src, p, err)
	}
	n.mounts = append(n.mounts, p)
}

// install puts a binary at a host path of the node, as the image does:
// bound there read-only (a node's /usr is the image's, read-only too).
func (n *node) install(bin, p string) {
	n.t.Helper()
	if err := os.MkdirAll(filepath.Dir(n.Path(p)), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(n.Path(p), nil, 0o755); err != nil {
		n.t.Fatal(err)
	}
	n.mount(bin, p, "", unix.MS_BIND, "")
	if err := unix.Mount("", n.Path(p), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		n.t.Fatalf("remount %s read-only: %v", p, err)
	}
}

// exec runs argv chrooted into the node, as root, closed environment.
func (n *node) exec(argv ...string) (string, int) {
	n.t.Helper()
	return n.execIn(nil, argv...)
}

// execIn is exec with stdin.
func (n *node) execIn(stdin []byte, argv ...string) (string, int) {
	n.t.Helper()
	if err := unix.Sethostname([]byte(n.Name)); err != nil {
		n.t.Fatal(err)
	}
	cmd := testutil.Command(n.t, 3*time.Minute, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: n.Root}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C", "TERM=dumb"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	code := cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		n.t.Fatalf("%q: %v\n%s", argv, err, out.String())
	}
	return out.String(), code
}

// provider runs the provider itself (a step of the scenario, not a page's
// command).
func (n *node) provider(args ...string) (string, int) {
	n.t.Helper()
	return n.exec(append([]string{paths.ProviderBin}, args...)...)
}

// doc runs the page's command selected by prefix, as the page shows it.
func (n *node) doc(p *docs.Page, prefix string) (string, int) {
	n.t.Helper()
	line, err := p.Command(prefix)
	if err != nil {
		n.t.Fatal(err)
	}
	out, code := n.exec("/bin/sh", "-c", line)
	n.t.Logf("%s# %s\n%s(exit %d)", n.Name, line, out, code)
	return out, code
}

// docOK runs the page's command and wants exit 0 and every want in its
// output.
func (n *node) docOK(p *docs.Page, prefix string, want ...string) string {
	n.t.Helper()
	out, code := n.doc(p, prefix)
	if code != 0 {
		n.t.Fatalf("docs/%s: %q: exit %d\n%s", p.Name, prefix, code, out)
	}
	has(n.t, "docs/"+p.Name+": "+prefix, out, want...)
	return out
}

func has(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Fatalf("%s: no %q in:\n%s", what, w, out)
		}
	}
}

// open opens a page and fails the test at its end when the test left one of
// the page's local commands unrun.
func open(t *testing.T, page string) *docs.Page {
	t.Helper()
	p, err := docs.Open(page)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if u := p.Unrun(); len(u) > 0 && !t.Failed() {
			t.Errorf("docs/%s shows commands its test does not run (run them, or mark their block %s if they need a live cluster): %q", page, docs.E2EMarker, u)
		}
	})
	return p
}

// --- the node's state, as kubeadm and the image leave it ---

// clusterFile is the cluster file the boot stage writes; extra is more
// top-level keys (providerConfig, for one).
func (n *node) clusterFile(role, pin, extra string) {
	n.ClusterFile(role, pin, extra)
	// What the plugin wrote at agent.boot (its boot stage wrote the file above).
	n.Write(paths.ClusterYipFile, "#cloud-config\nname: provider-kubernetes\n", 0o600)
}

// image is the booted image's bundle manifest (its kubeadm's version).
func (n *node) image(kubeadm string) { n.Bundle(kubeadm) }

// controlPlane makes the node a control plane at v with api as its
// cluster: manifests, kubelet.conf and admin.conf, its Node and its
// verified-version record.
func (n *node) controlPlane(api *testutil.API, v string) {
	n.ControlPlane(v)
	n.Member(api)
	n.Admin(api)
	api.SetNode(n.Name, v, true)
	n.Write(paths.VerifiedRecord, v+"\n", 0o644)
}

// worker makes the node a worker at v: kubelet.conf, its Node, and the
// provider's records of its version.
func (n *node) worker(api *testutil.API, v string) {
	n.Member(api)
	api.SetNode(n.Name, v, true)
	n.Write(paths.VerifiedRecord, v+"\n", 0o644)
	n.Write(paths.StatusMirror, "phase: Converged\nmember: true\nrole: worker\nnodeVersion: "+v+"\ntime: \"2026-11-29T12:00:00Z\"\n", 0o644)
}

// kubelet answers the kubelet's /healthz on 127.0.0.1:10248 of the
// sandbox, as a running kubelet does: the pass's kubelet check then finds
// no repair to make.
func kubelet(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:10248")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// logLines checks a page's example log lines against what the provider
// printed: every example line, without its time= and from its first
// free-text or timing field (detail=, message=, error=, reason=,
// duration=) on, is in out.
func logLines(t *testing.T, out, example string) {
	t.Helper()
	if strings.TrimSpace(example) == "" {
		t.Fatal("the page shows no example output here")
	}
	for _, l := range strings.Split(strings.TrimSpace(example), "\n") {
		if _, rest, ok := strings.Cut(l, " level="); ok && strings.HasPrefix(l, "time=") {
			l = "level=" + rest
		}
		for _, f := range []string{" detail=", " message=", " error=", " reason=", " duration="} {
			l, _, _ = strings.Cut(l, f)
		}
		if !strings.Contains(out, l) {
			t.Fatalf("the page shows a line starting %q; the provider printed:\n%s", l, out)
		}
	}
}

// example is what the page shows its command selected by prefix printing.
func example(t *testing.T, p *docs.Page, prefix string) string {
	t.Helper()
	line, err := p.Command(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return p.Output(line)
}
