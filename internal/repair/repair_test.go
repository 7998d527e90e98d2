package repair

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

var v137 = version.MustParse("v1.37.2")

func TestScanText(t *testing.T) {
	m137, m136 := v137.MinorOf(), version.Minor{Major: 1, Minor: 36}
	cases := []struct {
		text  string
		minor version.Minor
		want  []string
	}{
		{`KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.9"`, m137, []string{"--pod-infra-container-image"}},
		{`KUBELET_KUBEADM_ARGS="--pod-infra-container-image=x"`, m136, []string{"--pod-infra-container-image"}},
		{`KUBELET_EXTRA_ARGS=--containerd=/run/containerd/containerd.sock --node-ip=10.0.0.11`, m137, []string{"--containerd"}},
		{`KUBELET_EXTRA_ARGS=--containerd=/run/containerd/containerd.sock`, m136, nil},
		{`Environment="KUBELET_EXTRA_ARGS=--storage-driver-db=cadvisor --boot-id-file /proc/sys/kernel/random/boot_id"`, m137, []string{"--storage-driver-db", "--boot-id-file"}},
		{`KUBELET_EXTRA_ARGS=--container-runtime-endpoint=x --containerd-namespace=k8s.io`, m137, []string{"--containerd-namespace"}},
		{"# KUBELET_EXTRA_ARGS=--containerd=x\n", m137, nil},
		{`KUBELET_EXTRA_ARGS=--containerdx=1 --machine-id-file=/etc/machine-id`, m137, []string{"--machine-id-file"}},
	}
	for _, c := range cases {
		if got := ScanText([]byte(c.text), c.minor); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q at %s: %q, want %q", c.text, c.minor, got, c.want)
		}
	}
}

func TestScanFiles(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	n.Write(KubeadmFlagsEnv, `KUBELET_KUBEADM_ARGS="--containerd=/run/containerd/containerd.sock"`+"\n", 0o644)
	n.Write("/etc/default/kubelet", "KUBELET_EXTRA_ARGS=--containerd-namespace=k8s.io\n", 0o644)
	n.Write("/etc/systemd/system/kubelet.service.d/20-extra.conf", "[Service]\nEnvironment=\"KUBELET_EXTRA_ARGS=--storage-driver-user=root\"\n", 0o644)
	n.Write("/etc/systemd/system/kubelet.service.d/README", "--containerd\n", 0o644)
	// A planted symlink is not followed.
	secret := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(secret, []byte("--boot-id-file=x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(n.Path("/etc/sysconfig"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, n.Path("/etc/sysconfig/kubelet")); err != nil {
		t.Fatal(err)
	}
	got := Scan(n.R(), v137.MinorOf())
	want := []Finding{
		{File: "/etc/default/kubelet", Flag: "--containerd-namespace", Minor: v137.MinorOf()},
		{File: "/etc/systemd/system/kubelet.service.d/20-extra.conf", Flag: "--storage-driver-user", Minor: v137.MinorOf()},
		{File: KubeadmFlagsEnv, Flag: "--containerd", Minor: v137.MinorOf(), FixedByRepair: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%+v\nwant %+v", got, want)
	}
}

func TestCgroupV1(t *testing.T) {
	v2 := "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
	hybrid := "25 23 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n26 25 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
	if v1, err := CgroupV1([]byte(v2)); err != nil || v1 {
		t.Fatalf("v2: %v %v", v1, err)
	}
	if v1, err := CgroupV1([]byte(hybrid)); err != nil || !v1 {
		t.Fatalf("hybrid: %v %v", v1, err)
	}
	if _, err := CgroupV1([]byte("22 1 0:5 / / rw - ext4 /dev/vda rw\n")); err == nil {
		t.Fatal("no cgroup mount accepted")
	}
}

func config(t *testing.T, role, extra string) *clusterconfig.Kubeadm {
	t.Helper()
	c := &clusterconfig.Cluster{Role: role, Config: `clusterConfiguration:
  kubernetesVersion: v1.36.3
  controlPlaneEndpoint: 10.0.0.11:6443
initConfiguration:
  bootstrapTokens:
  - token: abcdef.0123456789abcdef
  certificateKey: 0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9
  localAPIEndpoint:
    advertiseAddress: 10.0.0.11
    bindPort: 6443
  nodeRegistration:
    name: cp1
    criSocket: unix:///run/containerd/containerd.sock
    imagePullPolicy: Never
    kubeletExtraArgs:
    - name: node-ip
      value: 10.0.0.11
joinConfiguration:
  discovery:
    bootstrapToken:
      apiServerEndpoint: 10.0.0.11:6443
      token: abcdef.0123456789abcdef
      caCertHashes: [sha256:00]
  nodeRegistration:
    name: w1
    criSocket: unix:///run/containerd/containerd.sock
kubeletConfiguration:
  cgroupDriver: cgroupfs
  failCgroupV1: false
` + extra}
	k, err := c.Kubeadm()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKubeletStartConfigCarriesNoSecret(t *testing.T) {
	for _, role := range []plan.Role{plan.RoleInit, plan.RoleWorker} {
		pki := ""
		if role == plan.RoleWorker {
			pki = EmptyPKIDir
		}
		b, err := KubeletStartConfig(Input{Target: v137, ControlPlane: role == plan.RoleInit, Role: role, Kubeadm: config(t, string(role), "")}, pki)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		// A worker's kubelet-start gets the empty certificates directory,
		// and its kubelet keeps the cluster CA's real place.
		if role == plan.RoleWorker && (!strings.Contains(s, "certificatesDir: "+EmptyPKIDir) || !strings.Contains(s, "clientCAFile: /etc/kubernetes/pki/ca.crt")) {
			t.Fatalf("worker config:\n%s", s)
		}
		if role == plan.RoleInit && (strings.Contains(s, "certificatesDir") || strings.Contains(s, "clientCAFile")) {
			t.Fatalf("control plane config:\n%s", s)
		}
		for _, banned := range []string{"0123456789abcdef", "certificateKey", "bootstrapTokens", "discovery", "0a1b2c3d"} {
			if strings.Contains(s, banned) {
				t.Fatalf("%s config carries %q:\n%s", role, banned, s)
			}
		}
		for _, want := range []string{"kind: InitConfiguration", "kind: ClusterConfiguration", "kubernetesVersion: v1.37.2", "kind: KubeletConfiguration", "failCgroupV1: false"} {
			if !strings.Contains(s, want) {
				t.Fatalf("%s config lacks %q:\n%s", role, want, s)
			}
		}
		if role == plan.RoleWorker && (!strings.Contains(s, "name: w1") || strings.Contains(s, "localAPIEndpoint")) {
			t.Fatalf("worker registration:\n%s", s)
		}
		if role == plan.RoleInit && (!strings.Contains(s, "name: cp1") || !strings.Contains(s, "advertiseAddress: 10.0.0.11")) {
			t.Fatalf("control plane registration:\n%s", s)
		}
	}
}

// The config handed to kubelet-start is accepted by the real kubeadm 1.37.2
// (dry run into KUBEADM_INIT_DRYRUN_DIR), and the flags file it writes
// carries no flag removed in 1.37. The worker's certificates directory is
// a worker's: the cluster CA's certificate that kubeadm join wrote, without
// its key (made here by the real kubeadm, its key then removed), which
// kubeadm init takes for an external CA and refuses kubelet-start on.
func TestRealKubeadmKubeletStartDryRun(t *testing.T) {
	kubeadm := testbin.Kubeadm(t, "v1.37.2")
	workerPKI := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, kubeadm, "init", "phase", "certs", "ca", "--cert-dir", workerPKI).CombinedOutput(); err != nil {
		t.Fatalf("kubeadm init phase certs ca: %v\n%s", err, out)
	}
	if err := os.Remove(filepath.Join(workerPKI, "ca.key")); err != nil {
		t.Fatal(err)
	}
	kubeletStart := func(t *testing.T, b []byte) (string, []byte, error) {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "kubelet-start.yaml")
		if err := os.WriteFile(cfg, b, 0o600); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "dryrun")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, kubeadm, "init", "phase", "kubelet-start", "--config", cfg, "--dry-run")
		cmd.Env = append(append([]string{}, runner.BaseEnv...), "KUBEADM_INIT_DRYRUN_DIR="+out)
		res, err := cmd.CombinedOutput()
		return out, res, err
	}
	// Handed the worker's own certificates directory, kubeadm refuses: the
	// reason the repair hands a worker an empty one.
	in := Input{Target: v137, Role: plan.RoleWorker, Kubeadm: config(t, "worker", "")}
	in.Kubeadm.ClusterConfiguration["certificatesDir"] = workerPKI
	b, err := KubeletStartConfig(in, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, res, err := kubeletStart(t, b); err == nil || !strings.Contains(string(res), "external CA") {
		t.Fatalf("kubelet-start with a worker's certificates directory: %v\n%s", err, res)
	}
	for _, role := range []plan.Role{plan.RoleInit, plan.RoleWorker} {
		t.Run(string(role), func(t *testing.T) {
			// The operator's node registration still carries a flag 1.37 removed.
			k := config(t, string(role), "")
			pki := ""
			if role == plan.RoleWorker {
				k.ClusterConfiguration["certificatesDir"] = workerPKI
				pki = t.TempDir()
			}
			b, err := KubeletStartConfig(Input{Target: v137, ControlPlane: role == plan.RoleInit, Role: role, Kubeadm: k}, pki)
			if err != nil {
				t.Fatal(err)
			}
			out, res, err := kubeletStart(t, b)
			if err != nil {
				t.Fatalf("kubeadm refused the kubelet-start config: %v\n%s\n%s", err, res, b)
			}
			flags, err := os.ReadFile(filepath.Join(out, "kubeadm-flags.env"))
			if err != nil {
				t.Fatalf("no kubeadm-flags.env written: %v\n%s", err, res)
			}
			if bad := ScanText(flags, v137.MinorOf()); len(bad) != 0 {
				t.Fatalf("kubelet-start wrote removed flags %q:\n%s", bad, flags)
			}
			if !strings.Contains(string(flags), "KUBELET_KUBEADM_ARGS") {
				t.Fatalf("flags file:\n%s", flags)
			}
			kc, err := os.ReadFile(filepath.Join(out, "config.yaml"))
			if err != nil || !strings.Contains(string(kc), "failCgroupV1: false") || !strings.Contains(string(kc), "cgroupDriver: cgroupfs") ||
				!strings.Contains(string(kc), "shutdownGracePeriod: 30s") || !strings.Contains(string(kc), "shutdownGracePeriodCriticalPods: 10s") {
				t.Fatalf("kubelet config.yaml (%v):\n%s", err, kc)
			}
			// The kubelet trusts the cluster CA where it is, not the empty directory.
			if role == plan.RoleWorker && !strings.Contains(string(kc), "clientCAFile: "+filepath.Join(workerPKI, "ca.crt")) {
				t.Fatalf("worker kubelet config.yaml does not trust %s/ca.crt:\n%s", workerPKI, kc)
			}
		})
	}
}

// kubelet is a loopback kubelet healthz endpoint whose health a test steers.
type kubelet struct {
	srv     *httptest.Server
	healthy atomic.Bool
	flap    atomic.Bool
	n       atomic.Int64
}

func newKubelet(t *testing.T) *kubelet {
	k := &kubelet{}
	k.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := k.n.Add(1)
		if k.healthy.Load() && (!k.flap.Load() || n%2 == 0) {
			_, _ = w.Write([]byte("ok"))
			return
		}
		http.Error(w, "[-]syncloop failed: reason withheld", http.StatusInternalServerError)
	}))
	t.Cleanup(k.srv.Close)
	return k
}

type rig struct {
	node  *testutil.Node
	rec   *runner.Recorder
	clock *testutil.Clock
	kl    *kubelet
	log   strings.Builder
	r     *Repairer
	seen  string // the config kubeadm was handed
	// emptyPKI: EmptyPKIDir was an empty 0700 directory while kubeadm ran.
	emptyPKI bool
	mode     os.FileMode
}

func newRig(t *testing.T, healthyAfterStart bool) *rig {
	g := &rig{node: testutil.NewNode(t, "w1"), clock: testutil.NewClock(), kl: newKubelet(t)}
	g.rec = &runner.Recorder{Reply: func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if strings.HasPrefix(c.String(), "/usr/bin/kubeadm init phase kubelet-start") {
			// The file kubeadm is handed, at the path it is handed (the
			// host path re-based on the sandbox root).
			cfg := c.Args[len(c.Args)-1]
			st, err := os.Stat(cfg)
			if err == nil {
				g.mode = st.Mode().Perm()
				b, _ := os.ReadFile(cfg)
				g.seen = string(b)
			}
			if ents, err := os.ReadDir(g.node.Path(EmptyPKIDir)); err == nil && len(ents) == 0 {
				if st, err := os.Lstat(g.node.Path(EmptyPKIDir)); err == nil && st.IsDir() && st.Mode().Perm() == 0o700 {
					g.emptyPKI = true
				}
			}
		}
		if c.String() == "/usr/bin/systemctl restart kubelet" && healthyAfterStart {
			g.kl.healthy.Store(true)
		}
		return runner.Result{}, nil
	}}
	g.r = &Repairer{Root: g.node.R(), Runner: g.rec, Clock: g.clock, Log: slog.New(slog.NewTextHandler(&g.log, nil)),
		Budgets:           Budgets{KubeletStart: time.Minute, KubeletHealthy: 2 * time.Minute, LocalAPI: 5 * time.Minute, Attempt: time.Second},
		KubeletHealthzURL: g.kl.srv.URL + "/healthz"}
	return g
}

// repairLines are the commands of a repair: kubeadm is handed the config's
// path under the node's root (one root for every path, children included).
func (g *rig) repairLines() []string {
	return []string{"/usr/bin/kubeadm init phase kubelet-start --config " + g.node.Path(ConfigPath), "/usr/bin/systemctl daemon-reload", "/usr/bin/systemctl restart kubelet"}
}

func TestWorkerRepair(t *testing.T) {
	g := newRig(t, true)
	g.node.Write("/etc/default/kubelet", "KUBELET_EXTRA_ARGS=--containerd=/run/containerd/containerd.sock\n", 0o644)
	// What a repair cut short left there is not handed to kubeadm.
	g.node.Write(EmptyPKIDir+"/ca.crt", "left over", 0o600)
	warnings, err := g.r.Repair(context.Background(), Input{Target: v137, Role: plan.RoleWorker, Kubeadm: config(t, "worker", "")})
	if err != nil {
		t.Fatal(err)
	}
	// A worker's kubelet-start is handed an empty certificates directory
	// (kubeadm init refuses a CA certificate without its key), removed after.
	if !g.emptyPKI || !strings.Contains(g.seen, "certificatesDir: "+EmptyPKIDir) || g.node.Exists(EmptyPKIDir) {
		t.Fatalf("empty certificates directory: while kubeadm ran %v, left after %v; config:\n%s", g.emptyPKI, g.node.Exists(EmptyPKIDir), g.seen)
	}
	if !reflect.DeepEqual(g.rec.Lines(), g.repairLines()) {
		t.Fatalf("ran %q", g.rec.Lines())
	}
	if g.mode != 0o600 || !strings.Contains(g.seen, "kubernetesVersion: v1.37.2") {
		t.Fatalf("config mode %v:\n%s", g.mode, g.seen)
	}
	if g.node.Exists(ConfigPath) {
		t.Fatal("config left on tmpfs")
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "--containerd") || !strings.Contains(warnings[0], "/etc/default/kubelet") {
		t.Fatalf("warnings %q", warnings)
	}
	if !strings.Contains(g.log.String(), "msg=kubelet-flags-removed flag=--containerd file=/etc/default/kubelet removed_in=1.37 fixed_by_repair=false") {
		t.Fatalf("log:\n%s", g.log.String())
	}
}

func TestKubeletNeverHealthyNamesTheFlag(t *testing.T) {
	g := newRig(t, false)
	g.node.Write("/etc/default/kubelet", "KUBELET_EXTRA_ARGS=--containerd=/run/containerd/containerd.sock\n", 0o644)
	start := g.clock.Now()
	_, err := g.r.Repair(context.Background(), Input{Target: v137, Role: plan.RoleWorker, Kubeadm: config(t, "worker", "")})
	if err == nil || !strings.Contains(err.Error(), "syncloop failed") || !strings.Contains(err.Error(), "--containerd") {
		t.Fatalf("%v", err)
	}
	// The grace for a starting kubelet, then the 2m budget after kubelet-start.
	if spent := g.clock.Now().Sub(start); spent < KubeletGrace+2*time.Minute || spent > KubeletGrace+2*time.Minute+5*time.Second {
		t.Fatalf("spent %s of a %s grace and a 2m budget", spent, KubeletGrace)
	}
}

func TestKubeletFlappingBecomesHealthy(t *testing.T) {
	g := newRig(t, true)
	g.kl.flap.Store(true)
	if _, err := g.r.Repair(context.Background(), Input{Target: v137, Role: plan.RoleWorker, Kubeadm: config(t, "worker", "")}); err != nil {
		t.Fatal(err)
	}
}

// The control-plane side: the local apiserver's /readyz on a real HTTPS
// endpoint on loopback that turns healthy late, never, or flaps.
func TestControlPlaneRepairWaitsForTheLocalAPI(t *testing.T) {
	for _, tc := range []struct {
		name    string
		readyAt int64 // request number from which /readyz answers ok; 0 never
		flap    bool
		ok      bool
	}{
		{"late", 20, false, true},
		{"never", 0, false, false},
		{"flapping", 5, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int64
			api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				i := n.Add(1)
				if r.URL.Path == "/readyz" && tc.readyAt > 0 && i >= tc.readyAt && (!tc.flap || i%3 != 0) {
					_, _ = w.Write([]byte("ok"))
					return
				}
				http.Error(w, "[-]etcd failed: reason withheld", http.StatusServiceUnavailable)
			}))
			defer api.Close()
			g := newRig(t, true)
			host, port, _ := strings.Cut(strings.TrimPrefix(api.URL, "https://"), ":")
			g.r.LocalAPIHost = host
			g.r.LocalAPIServerName = "example.com" // httptest's certificate
			g.node.Write(CACert, string(pemOf(api)), 0o644)
			g.node.Write(paths.APIServerManifest, strings.Replace(testutil.APIServerManifest("v1.36.3"), "--secure-port=6443", "--secure-port="+port, 1), 0o600)
			start := g.clock.Now()
			_, err := g.r.Repair(context.Background(), Input{Target: v137, ControlPlane: true, Role: plan.RoleControlPlane, Kubeadm: config(t, "controlplane", "")})
			if tc.ok != (err == nil) {
				t.Fatalf("err %v", err)
			}
			if !reflect.DeepEqual(g.rec.Lines(), g.repairLines()) {
				t.Fatalf("ran %q", g.rec.Lines())
			}
			if !tc.ok {
				if !strings.Contains(err.Error(), "etcd failed") {
					t.Fatalf("last real error not named: %v", err)
				}
				if spent := g.clock.Now().Sub(start); spent < KubeletGrace+5*time.Minute || spent > KubeletGrace+5*time.Minute+5*time.Second {
					t.Fatalf("spent %s of a %s grace and a 5m budget", spent, KubeletGrace)
				}
			}
		})
	}
}

// TestRepairTrigger is the rule upgrades.md and the README state, at the
// runner: kubelet-start runs when the local API is unreachable (a control
// plane) or the kubelet does not come up (a worker, which has no local
// API). "Unreachable" is bounded, not one probe: a control plane whose
// kubelet answers is still starting its static pods after the boot and
// gets budget.localAPI (5m) first; a kubelet that does not answer within
// the 30 s grace makes the repair run at once.
func TestRepairTrigger(t *testing.T) {
	const (
		up      = "up"      // answers from the start
		late    = "late"    // answers from the 12th probe on
		started = "started" // answers once the repair restarted the kubelet
		down    = "down"    // never answers
		// grace is what reference.md promises a kubelet just starting.
		grace = 30 * time.Second
	)
	for _, c := range []struct {
		name         string
		controlPlane bool
		kubelet, api string
		repair       bool   // kubeadm init phase kubelet-start, daemon-reload, restart kubelet
		trigger      string // the kubelet-start line's trigger=
		err          string // the last real error, when it fails
		spent        time.Duration
	}{
		{name: "worker, kubelet up", kubelet: up},
		{name: "worker, kubelet starting", kubelet: late},
		{name: "worker, kubelet crash-looping", kubelet: started, repair: true, trigger: "kubelet-down", spent: grace},
		{name: "worker, kubelet never up", kubelet: down, repair: true, trigger: "kubelet-down", err: "syncloop failed", spent: grace + 2*time.Minute},

		{name: "control plane, local API up", controlPlane: true, kubelet: down, api: up},
		{name: "control plane, kubelet up, API starting", controlPlane: true, kubelet: up, api: late},
		{name: "control plane, kubelet crash-looping", controlPlane: true, kubelet: started, api: started, repair: true, trigger: "kubelet-down", spent: grace},
		{name: "control plane, kubelet up, API unreachable until the repair", controlPlane: true, kubelet: up, api: started, repair: true, trigger: "local-api-unreachable", spent: 5 * time.Minute},
		{name: "control plane, kubelet up, API never", controlPlane: true, kubelet: up, api: down, repair: true, trigger: "local-api-unreachable", err: "etcd failed", spent: 10 * time.Minute},
		{name: "control plane, kubelet crash-looping, API never", controlPlane: true, kubelet: started, api: down, repair: true, trigger: "kubelet-down", err: "etcd failed", spent: grace + 5*time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			var restarted atomic.Bool
			serves := func(mode string, n int64) bool {
				return mode == up || mode == late && n >= 12 || mode == started && restarted.Load()
			}
			var kn, an atomic.Int64
			kubelet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if serves(c.kubelet, kn.Add(1)) {
					_, _ = w.Write([]byte("ok"))
					return
				}
				http.Error(w, "[-]syncloop failed: reason withheld", http.StatusInternalServerError)
			}))
			defer kubelet.Close()
			api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/readyz" && serves(c.api, an.Add(1)) {
					_, _ = w.Write([]byte("ok"))
					return
				}
				http.Error(w, "[-]etcd failed: reason withheld", http.StatusServiceUnavailable)
			}))
			defer api.Close()

			g := newRig(t, false)
			g.rec.Reply = func(ctx context.Context, cmd runner.Cmd) (runner.Result, error) {
				if cmd.String() == "/usr/bin/systemctl restart kubelet" {
					restarted.Store(true)
				}
				return runner.Result{}, nil
			}
			g.r.KubeletHealthzURL = kubelet.URL + "/healthz"
			host, port, _ := strings.Cut(strings.TrimPrefix(api.URL, "https://"), ":")
			g.r.LocalAPIHost, g.r.LocalAPIServerName = host, "example.com" // httptest's certificate
			g.node.Write(CACert, string(pemOf(api)), 0o644)
			g.node.Write(paths.APIServerManifest, strings.Replace(testutil.APIServerManifest("v1.36.3"), "--secure-port=6443", "--secure-port="+port, 1), 0o600)
			in := Input{Target: v137, Role: plan.RoleWorker, Kubeadm: config(t, "worker", "")}
			if c.controlPlane {
				in = Input{Target: v137, ControlPlane: true, Role: plan.RoleControlPlane, Kubeadm: config(t, "controlplane", "")}
			}

			start := g.clock.Now()
			_, err := g.r.Repair(context.Background(), in)
			spent := g.clock.Now().Sub(start)

			want := []string{}
			if c.repair {
				want = g.repairLines()
			}
			if got := g.rec.Lines(); !reflect.DeepEqual(got, want) {
				t.Fatalf("ran %q, want %q\n%s", got, want, g.log.String())
			}
			if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Fatalf("error %v, want %q", err, c.err)
			}
			// Virtual time: the waits the rule promises, and no more
			// (a few 2 s intervals of slack).
			if spent < c.spent || spent > c.spent+30*time.Second {
				t.Fatalf("spent %s, want %s", spent, c.spent)
			}
			log := g.log.String()
			if c.repair != strings.Contains(log, "msg=kubelet-start ") {
				t.Fatalf("log:\n%s", log)
			}
			if c.repair && !strings.Contains(log, "trigger="+c.trigger) {
				t.Fatalf("no trigger=%s in:\n%s", c.trigger, log)
			}
			if !c.repair && !strings.Contains(log, "msg=kubelet-repair-not-needed") {
				t.Fatalf("log:\n%s", log)
			}
			if c.trigger == "local-api-unreachable" && !strings.Contains(log, "msg=kubelet-repair-local-api-unreachable kubelet=running") {
				t.Fatalf("log:\n%s", log)
			}
		})
	}
}

// budget.kubeletStart bounds kubelet-start and the daemon-reload and
// restart after it together (the pass's longest path counts it once): the
// three commands run under one deadline, budget.kubeletStart from the
// start of kubelet-start, not one each.
func TestKubeletStartBudgetShared(t *testing.T) {
	g := newRig(t, true)
	var deadlines []time.Time
	reply := g.rec.Reply
	g.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		d, ok := ctx.Deadline()
		if !ok {
			t.Errorf("%s ran without a deadline", c)
		}
		deadlines = append(deadlines, d)
		return reply(ctx, c)
	}
	start := time.Now()
	if _, err := g.r.Repair(context.Background(), Input{Target: v137, Role: plan.RoleWorker, Kubeadm: config(t, "worker", "")}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.rec.Lines(), g.repairLines()) {
		t.Fatalf("ran %q", g.rec.Lines())
	}
	for i, d := range deadlines {
		if !d.Equal(deadlines[0]) {
			t.Fatalf("%s has its own deadline (%s after the first's)", g.repairLines()[i], d.Sub(deadlines[0]))
		}
	}
	if b := g.r.Budgets.KubeletStart; deadlines[0].Sub(start) < b || deadlines[0].After(time.Now().Add(b)) {
		t.Fatalf("the deadline is not budget.kubeletStart (%s) from the start", b)
	}
}
