package repair

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/health"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Events.
const (
	EventFlagsRemoved = "kubelet-flags-removed"
	EventCgroupV1     = "kubelet-cgroup-v1"
	EventKubeletStart = "kubelet-start"
	EventNotNeeded    = "kubelet-repair-not-needed"
	// EventLocalAPIUnreachable: a control plane's kubelet runs, its local
	// apiserver did not answer within budget.localAPI: the repair runs.
	EventLocalAPIUnreachable = "kubelet-repair-local-api-unreachable"
)

// Triggers: why kubelet-start ran (the kubelet-start line's trigger=).
const (
	TriggerKubeletDown         = "kubelet-down"
	TriggerLocalAPIUnreachable = "local-api-unreachable"
)

// ConfigPath is where the kubelet-start config lives while kubeadm reads it
// (tmpfs, 0600, removed afterwards).
const ConfigPath = paths.TmpDir + "/kubelet-start.yaml"

// EmptyPKIDir is the empty certificates directory a worker's kubelet-start
// is handed (tmpfs, 0700, removed afterwards).
const EmptyPKIDir = paths.TmpDir + "/kubelet-start-pki"

// CACert is the cluster CA kubeadm writes on a control plane.
const CACert = paths.KubernetesDir + "/pki/ca.crt"

// Budgets bound the repair.
type Budgets struct {
	KubeletStart   time.Duration // the kubeadm command
	KubeletHealthy time.Duration // kubelet /healthz after it
	LocalAPI       time.Duration // local apiserver /readyz after it (control plane)
	Attempt        time.Duration // one probe
}

// Input is what the repair needs to know about the node.
type Input struct {
	Target       version.Version
	ControlPlane bool
	Role         plan.Role
	NodeName     string
	Kubeadm      *clusterconfig.Kubeadm
}

// Repairer runs the repair.
type Repairer struct {
	Root    paths.Root
	Runner  runner.Runner
	Clock   wait.Clock
	Log     *slog.Logger
	Budgets Budgets
	Prober  health.Prober
	// KubeletHealthzURL and LocalAPIHost default to the node's loopback.
	KubeletHealthzURL string
	LocalAPIHost      string
	// LocalAPIServerName is the name the apiserver certificate is verified
	// for (default health.APIServerName).
	LocalAPIServerName string
}

// Repair runs kubeadm init phase kubelet-start when the kubelet cannot
// bring this node up (upgrades.md: "when an upgrade is due and the local
// API is unreachable"):
//
//   - a control plane whose local apiserver answers /readyz: nothing;
//   - otherwise the kubelet gets KubeletGrace to answer /healthz. A worker
//     whose kubelet answers: nothing (a worker has no local API; its kubelet
//     crash-looping on a removed flag is what the repair is for). A control
//     plane whose kubelet answers is most likely still starting its static
//     pods after the boot: the local apiserver gets budget.localAPI, and
//     only when it stays unreachable does the repair run;
//   - a kubelet that does not answer: the repair runs at once.
//
// The repair names the removed kubelet flags kubelet-start cannot fix, runs
// kubelet-start with a config built from the cluster file, restarts the
// kubelet and waits, bounded, for it and (control plane) the local
// apiserver. It returns warnings for the status document.
func (r *Repairer) Repair(ctx context.Context, in Input) ([]string, error) {
	if in.Kubeadm == nil {
		return nil, errors.New("no cluster config to build the kubelet-start configuration from")
	}
	if in.ControlPlane && r.localReadyzOnce(ctx, in) == nil {
		r.Log.Info(EventNotNeeded, "control_plane", true)
		return nil, nil
	}
	// Give a kubelet that is just starting (this unit starts with it) a short
	// grace: one that crash-loops on a removed flag never serves /healthz.
	b := wait.Budget{Total: KubeletGrace, Interval: 2 * time.Second, PerAttempt: r.attempt()}
	trigger := TriggerKubeletDown
	if wait.Poll(ctx, r.Clock, b, "kubelet", func(ctx context.Context) (bool, error) {
		return true, r.Prober.Kubelet(ctx, r.kubeletURL())
	}) == nil {
		if !in.ControlPlane {
			r.Log.Info(EventNotNeeded, "control_plane", false)
			return nil, nil
		}
		// The kubelet runs: the static control plane is most likely still
		// starting. Wait for it rather than restart the kubelet under it;
		// only an apiserver still unreachable at the end of the budget
		// makes the repair run.
		b.Total = r.Budgets.LocalAPI
		err := wait.Poll(ctx, r.Clock, b, "wait for the local apiserver", func(ctx context.Context) (bool, error) {
			return true, r.localReadyz(ctx, in)
		})
		if err == nil {
			r.Log.Info(EventNotNeeded, "control_plane", true)
			return nil, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		trigger = TriggerLocalAPIUnreachable
		r.Log.Warn(EventLocalAPIUnreachable, "kubelet", "running", "error", runner.Sanitize(err.Error(), 400))
	}
	warnings := r.scan(in)
	full := r.Root.Path(ConfigPath)
	if err := fsutil.MkdirAllMode(filepath.Dir(full), 0o700); err != nil {
		return warnings, fmt.Errorf("tmp dir: %w", err)
	}
	// A worker holds the cluster CA's certificate without its key, which
	// kubeadm init reads as an external CA whose apiserver certificates
	// must be on the node: kubelet-start refuses to run there. It is handed
	// an empty certificates directory instead (it writes no certificate).
	pki := ""
	if !in.ControlPlane {
		pki = EmptyPKIDir
		if err := r.emptyDir(pki); err != nil {
			return warnings, err
		}
		defer os.Remove(r.Root.Path(pki))
	}
	cfg, err := KubeletStartConfig(in, pki)
	if err != nil {
		return warnings, err
	}
	remove, err := fsutil.WriteScratchBeneath(r.Root.Path("/"), ConfigPath, cfg)
	if err != nil {
		return warnings, err
	}
	// budget.kubeletStart bounds kubelet-start and the restart after it
	// together, so the pass's longest path counts it once.
	sctx, cancel := context.WithTimeout(ctx, r.Budgets.KubeletStart)
	defer cancel()
	_, err = r.Runner.Run(sctx, runner.Cmd{Path: paths.Kubeadm, Args: []string{"init", "phase", "kubelet-start", "--config", full}, Timeout: r.Budgets.KubeletStart})
	remove()
	if err != nil {
		r.Log.Error(EventKubeletStart, "outcome", "failed", "trigger", trigger, "error", runner.Sanitize(err.Error(), 400))
		return warnings, fmt.Errorf("kubeadm init phase kubelet-start: %w", err)
	}
	// kubelet-start restarts the kubelet itself but exits 0 when systemctl
	// fails: restart it here so a failure is seen.
	for _, args := range [][]string{{"daemon-reload"}, {"restart", "kubelet"}} {
		if _, err := r.Runner.Run(sctx, runner.Cmd{Path: paths.Systemctl, Args: args, Timeout: r.Budgets.KubeletStart}); err != nil {
			return warnings, err
		}
	}
	cancel()
	r.Log.Info(EventKubeletStart, "outcome", "ok", "target", in.Target.String(), "trigger", trigger)

	b.Total = r.Budgets.KubeletHealthy
	if err := wait.Poll(ctx, r.Clock, b, "wait for the kubelet", func(ctx context.Context) (bool, error) {
		return true, r.Prober.Kubelet(ctx, r.kubeletURL())
	}); err != nil {
		return warnings, withFindings(err, warnings)
	}
	if in.ControlPlane {
		b.Total = r.Budgets.LocalAPI
		if err := wait.Poll(ctx, r.Clock, b, "wait for the local apiserver", func(ctx context.Context) (bool, error) {
			return true, r.localReadyz(ctx, in)
		}); err != nil {
			return warnings, err
		}
	}
	return warnings, nil
}

// emptyDir makes p (a host path) a new, empty 0700 directory: whatever
// was left there (a previous repair cut short) is removed first, a link
// itself and never what it points to.
func (r *Repairer) emptyDir(p string) error {
	full := r.Root.Path(p)
	if err := os.RemoveAll(full); err != nil {
		return fmt.Errorf("empty certificates directory for kubelet-start: %w", err)
	}
	if err := os.Mkdir(full, 0o700); err != nil {
		return fmt.Errorf("empty certificates directory for kubelet-start: %w", err)
	}
	return nil
}

func withFindings(err error, warnings []string) error {
	if len(warnings) == 0 {
		return err
	}
	return fmt.Errorf("%w; %s", err, strings.Join(warnings, "; "))
}

func (r *Repairer) attempt() time.Duration {
	if r.Budgets.Attempt > 0 {
		return r.Budgets.Attempt
	}
	return health.DefaultAttempt
}

func (r *Repairer) kubeletURL() string {
	if r.KubeletHealthzURL != "" {
		return r.KubeletHealthzURL
	}
	return health.KubeletHealthzURL
}

// KubeletGrace is how long a kubelet that does not answer yet is given
// before the repair concludes it is down.
const KubeletGrace = 30 * time.Second

func (r *Repairer) localReadyzOnce(ctx context.Context, in Input) error {
	ctx, cancel := context.WithTimeout(ctx, r.attempt())
	defer cancel()
	return r.localReadyz(ctx, in)
}

func (r *Repairer) localReadyz(ctx context.Context, in Input) error {
	ca, err := fsutil.ReadFileNoFollow(r.Root.Path(CACert), 1<<20)
	if err != nil {
		return fmt.Errorf("cluster CA: %w", err)
	}
	host := r.LocalAPIHost
	if host == "" {
		host = "127.0.0.1"
	}
	name := r.LocalAPIServerName
	if name == "" {
		name = health.APIServerName
	}
	return r.Prober.Readyz(ctx, fmt.Sprintf("%s:%d", host, r.bindPort(in)), name, ca)
}

// bindPort is the apiserver's --secure-port from its manifest, else the
// cluster config's localAPIEndpoint.bindPort, else 6443.
func (r *Repairer) bindPort(in Input) int {
	if b, err := observe.ReadManifest(r.Root.Path(paths.APIServerManifest)); err == nil {
		if p, err := strconv.Atoi(observe.ManifestFlag(b, "kube-apiserver", "secure-port")); err == nil && p > 0 {
			return p
		}
	}
	if ep, ok := localAPIEndpoint(in); ok {
		if p, ok := ep["bindPort"].(float64); ok && p > 0 {
			return int(p)
		}
	}
	return 6443
}

// scan logs and returns the removed flags kubelet-start will not fix, and
// a cgroup v1 host without failCgroupV1: false.
func (r *Repairer) scan(in Input) []string {
	var warnings []string
	for _, f := range Scan(r.Root, in.Target.MinorOf()) {
		r.Log.Warn(EventFlagsRemoved, "flag", f.Flag, "file", f.File, "removed_in", f.Minor.String(), "fixed_by_repair", f.FixedByRepair)
		if !f.FixedByRepair {
			warnings = append(warnings, fmt.Sprintf("kubelet flag %s (removed in %s) in %s: the kubelet %s will not start until it is removed", f.Flag, f.Minor, f.File, in.Target))
		}
	}
	if in.Target.MinorOf().Minor >= 35 {
		if mi, err := fsutil.ReadFileNoFollow(r.Root.Path("/proc/self/mountinfo"), 16<<20); err == nil {
			if v1, err := CgroupV1(mi); err == nil && v1 && !failCgroupV1False(in.Kubeadm) {
				r.Log.Warn(EventCgroupV1, "fail_cgroup_v1", "unset")
				warnings = append(warnings, fmt.Sprintf("this host runs cgroup v1 and kubeletConfiguration does not set failCgroupV1: false: the kubelet %s refuses to start", in.Target))
			}
		}
	}
	return warnings
}

func failCgroupV1False(k *clusterconfig.Kubeadm) bool {
	if k == nil || k.KubeletConfiguration == nil {
		return false
	}
	v, ok := k.KubeletConfiguration["failCgroupV1"].(bool)
	return ok && !v
}

func localAPIEndpoint(in Input) (map[string]any, bool) {
	k := in.Kubeadm
	if k == nil {
		return nil, false
	}
	if ep, ok := k.InitConfiguration["localAPIEndpoint"].(map[string]any); ok && in.Role == plan.RoleInit {
		return ep, true
	}
	if cp, ok := k.JoinConfiguration["controlPlane"].(map[string]any); ok {
		if ep, ok := cp["localAPIEndpoint"].(map[string]any); ok {
			return ep, true
		}
	}
	ep, ok := k.InitConfiguration["localAPIEndpoint"].(map[string]any)
	return ep, ok
}

// KubeletStartConfig renders the configuration handed to kubeadm init phase
// kubelet-start: an InitConfiguration carrying only this node's registration
// (and, on a control plane, its local API endpoint), the operator's
// ClusterConfiguration pinned to the target, and the operator's
// KubeletConfiguration with the provider's defaults, as init renders it. No bootstrap token, certificate key or discovery
// material is copied: kubelet-start needs no secret.
//
// A non-empty pkiDir (a worker's: see EmptyPKIDir) becomes the
// ClusterConfiguration's certificatesDir, and the kubelet's client CA file,
// which kubeadm would otherwise derive from it, is set to the cluster CA's
// real place unless the operator set it.
func KubeletStartConfig(in Input, pkiDir string) ([]byte, error) {
	k := in.Kubeadm
	reg := map[string]any{}
	src := k.JoinConfiguration
	if in.Role == plan.RoleInit || src == nil {
		src = k.InitConfiguration
	}
	if nr, ok := src["nodeRegistration"].(map[string]any); ok {
		for key, v := range nr {
			reg[key] = v
		}
	} else if nr, ok := k.InitConfiguration["nodeRegistration"].(map[string]any); ok {
		for key, v := range nr {
			reg[key] = v
		}
	}
	if _, ok := reg["name"]; !ok && in.NodeName != "" {
		reg["name"] = in.NodeName
	}
	initCfg := map[string]any{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration", "nodeRegistration": reg}
	if ep, ok := localAPIEndpoint(in); ok && in.ControlPlane {
		initCfg["localAPIEndpoint"] = ep
	}
	cluster := map[string]any{}
	for key, v := range k.ClusterConfiguration {
		cluster[key] = v
	}
	cluster["apiVersion"], cluster["kind"] = "kubeadm.k8s.io/v1beta4", "ClusterConfiguration"
	cluster["kubernetesVersion"] = in.Target.String()
	caDir := paths.PKIDir
	if d, ok := cluster["certificatesDir"].(string); ok && d != "" {
		caDir = d
	}
	if pkiDir != "" {
		cluster["certificatesDir"] = pkiDir
	}
	kc := clusterconfig.WithKubeletDefaults(k.KubeletConfiguration)
	kc["apiVersion"], kc["kind"] = "kubelet.config.k8s.io/v1beta1", "KubeletConfiguration"
	if pkiDir != "" {
		setClientCA(kc, path.Join(caDir, "ca.crt"))
	}
	docs := []map[string]any{initCfg, cluster, kc}
	var out []byte
	for i, d := range docs {
		b, err := yaml.Marshal(d)
		if err != nil {
			return nil, fmt.Errorf("render kubelet-start config: %w", err)
		}
		if i > 0 {
			out = append(out, []byte("---\n")...)
		}
		out = append(out, b...)
	}
	return out, nil
}

// setClientCA sets a KubeletConfiguration's authentication.x509.clientCAFile
// to file unless it is set, copying the maps it changes (they may be the
// operator's).
func setClientCA(kc map[string]any, file string) {
	auth := map[string]any{}
	if a, ok := kc["authentication"].(map[string]any); ok {
		for k, v := range a {
			auth[k] = v
		}
	}
	x509 := map[string]any{}
	if x, ok := auth["x509"].(map[string]any); ok {
		for k, v := range x {
			x509[k] = v
		}
	}
	if f, ok := x509["clientCAFile"].(string); ok && f != "" {
		return
	}
	x509["clientCAFile"] = file
	auth["x509"] = x509
	kc["authentication"] = auth
}
