package bootstrap

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

type stepEnv struct {
	t     *testing.T
	node  *testutil.Node
	rec   *runner.Recorder
	clock *testutil.Clock
	log   *testutil.SyncBuffer
	step  *Step
	// seen is what the recorded kubeadm found at its --config path when it ran.
	seen struct {
		config  string
		mode    os.FileMode
		dirMode os.FileMode
	}
}

func newStepEnv(t *testing.T, role, host, extraKeys, docs string) *stepEnv {
	e := &stepEnv{t: t, node: testutil.NewNode(t, "n1"), clock: testutil.NewClock(), log: &testutil.SyncBuffer{}}
	e.node.Write(paths.ClusterFile, "cluster_token: "+clusterToken+"\ncontrol_plane_host: \""+host+"\"\nrole: "+role+"\n"+extraKeys+
		"config: |\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n"+docs, 0o600)
	e.node.Bundle("v1.37.2")
	e.rec = &runner.Recorder{Reply: func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		for i, a := range c.Args {
			if a == "--config" {
				f := c.Args[i+1]
				b, err := os.ReadFile(f)
				if err != nil {
					t.Errorf("kubeadm ran without its config: %v", err)
				}
				st, _ := os.Lstat(f)
				dst, _ := os.Lstat(filepath.Dir(f))
				e.seen.config, e.seen.mode, e.seen.dirMode = string(b), st.Mode(), dst.Mode()
			}
		}
		return runner.Result{}, nil
	}}
	e.step = &Step{Root: e.node.R(), Runner: e.rec, Clock: e.clock, Log: slog.New(slog.NewTextHandler(e.log, nil))}
	return e
}

func (e *stepEnv) obs() reconcile.Observation {
	e.t.Helper()
	cfg, err := (&observe.Observer{Root: e.node.R()}).Config()
	if err != nil {
		e.t.Fatal(err)
	}
	return reconcile.Observation{Config: cfg}
}

// noSecrets asserts neither the cluster token nor anything derived from it
// (nor any bootstrap token or certificate key) is in s.
func noSecrets(t *testing.T, what, s string) {
	t.Helper()
	for _, secret := range []string{clusterToken, DeriveToken(clusterToken), DeriveCertificateKey(clusterToken),
		strings.Split(DeriveToken(clusterToken), ".")[1], "0123456789abcdef", strings.Repeat("cd", 32)} {
		if strings.Contains(s, secret) {
			t.Fatalf("%s carries a secret:\n%s", what, s)
		}
	}
}

func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestInitRunsKubeadmWithItsConfigOnTmpfs(t *testing.T) {
	e := newStepEnv(t, "init", closedPort(t), "", "")
	if err := e.step.Bootstrap(context.Background(), plan.ActionInit, e.obs()); err != nil {
		t.Fatal(err)
	}
	file := e.node.Path(InitConfigPath)
	want := "/usr/bin/kubeadm init --config " + file + " --upload-certs --skip-token-print --skip-certificate-key-print"
	if got := e.rec.Lines(); len(got) != 1 || got[0] != want {
		t.Fatalf("ran %q, want %q", got, want)
	}
	if e.seen.mode.Perm() != 0o600 || e.seen.dirMode.Perm() != 0o700 {
		t.Fatalf("config %v in dir %v", e.seen.mode, e.seen.dirMode)
	}
	if !strings.Contains(e.seen.config, "token: "+DeriveToken(clusterToken)) || !strings.Contains(e.seen.config, "certificateKey: "+DeriveCertificateKey(clusterToken)) {
		t.Fatalf("config lacks the material:\n%s", redactForTest([]byte(e.seen.config)))
	}
	if e.node.Exists(InitConfigPath) {
		t.Fatal("the config was left behind")
	}
	noSecrets(t, "command lines", strings.Join(e.rec.Lines(), "\n"))
	noSecrets(t, "log", e.log.String())
	if !strings.Contains(e.log.String(), "token=derived-from-cluster-token") || !strings.Contains(e.log.String(), "answers_tls=false") {
		t.Fatalf("log:\n%s", e.log.String())
	}
	if e.rec.Cmds()[0].Timeout != reconcile.DefaultBudgets().KubeadmBootstrap {
		t.Fatalf("timeout %s", e.rec.Cmds()[0].Timeout)
	}
}

// A control plane already answering TLS at the endpoint is never clobbered.
func TestInitRefusesWhenAControlPlaneAnswers(t *testing.T) {
	api := testutil.NewAPI(t, "v1.37.2")
	e := newStepEnv(t, "init", api.Addr(), "", "")
	err := e.step.Bootstrap(context.Background(), plan.ActionInit, e.obs())
	if !errors.Is(err, ErrControlPlaneExists) || !strings.Contains(err.Error(), api.Addr()) {
		t.Fatalf("%v", err)
	}
	if len(e.rec.Lines()) != 0 || e.node.Exists(InitConfigPath) {
		t.Fatalf("ran %q", e.rec.Lines())
	}
}

// The config file is removed when kubeadm fails too, and the failure carries
// no secret even when kubeadm's own output does.
func TestInitFailureRemovesTheConfig(t *testing.T) {
	e := newStepEnv(t, "init", closedPort(t), "", "")
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		tail := "error: bootstrapTokens[0].token: Invalid value: \"" + DeriveToken(clusterToken) + "\""
		return runner.Result{ExitCode: 1}, &runner.ExitError{Cmd: c.Short(), Code: 1, Tail: runner.Sanitize(tail, 300)}
	}
	err := e.step.Bootstrap(context.Background(), plan.ActionInit, e.obs())
	if err == nil || e.node.Exists(InitConfigPath) {
		t.Fatalf("%v, left: %v", err, e.node.Exists(InitConfigPath))
	}
	noSecrets(t, "error", err.Error())
}

func TestWorkerJoinRunsKubeadmJoinWithoutWaiting(t *testing.T) {
	api := testutil.NewAPI(t, "v1.37.2")
	api.SetNotReady(true) // a worker does not wait: kubeadm's own discovery retries
	ca := testCA(t)
	e := newStepEnv(t, "worker", api.Addr(), "ca_certs:\n- |\n"+indent(ca.pem, "  "), "")
	if err := e.step.Bootstrap(context.Background(), plan.ActionJoin, e.obs()); err != nil {
		t.Fatal(err)
	}
	want := "/usr/bin/kubeadm join --config " + e.node.Path(JoinConfigPath)
	if got := e.rec.Lines(); len(got) != 1 || got[0] != want {
		t.Fatalf("ran %q", got)
	}
	if api.Requests() != 0 {
		t.Fatalf("a worker join made %d requests", api.Requests())
	}
	if !strings.Contains(e.seen.config, ca.hash) || strings.Contains(e.seen.config, "unsafeSkipCAVerification") || strings.Contains(e.seen.config, "controlPlane") {
		t.Fatalf("config:\n%s", redactForTest([]byte(e.seen.config)))
	}
	if e.node.Exists(JoinConfigPath) {
		t.Fatal("the config was left behind")
	}
	noSecrets(t, "log", e.log.String())
}

// A control plane join waits, bounded, for /readyz, trusting the CA the
// cluster publishes only because it matches the pin.
func TestControlPlaneJoinWaitsForReadyz(t *testing.T) {
	api := testutil.NewAPI(t, "v1.37.2")
	pin := pinOf(t, api.CAPEM())
	api.SetNotReady(true)
	var readyAt int
	api.OnRequest = func(n int) {
		if n == 6 {
			readyAt = n
			api.SetNotReady(false)
		}
	}
	e := newStepEnv(t, "controlplane", api.Addr(), "", "  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        caCertHashes: ["+pin+"]\n")
	start := e.clock.Now()
	if err := e.step.Bootstrap(context.Background(), plan.ActionJoin, e.obs()); err != nil {
		t.Fatal(err)
	}
	if readyAt == 0 || len(e.rec.Lines()) != 1 || !strings.HasPrefix(e.rec.Lines()[0], "/usr/bin/kubeadm join --config ") {
		t.Fatalf("ready at %d, ran %q", readyAt, e.rec.Lines())
	}
	if spent := e.clock.Now().Sub(start); spent <= 0 || spent > 20*time.Second {
		t.Fatalf("waited %s of virtual time", spent)
	}
	if !strings.Contains(e.seen.config, "certificateKey: "+DeriveCertificateKey(clusterToken)) {
		t.Fatal("control plane join without its certificate key")
	}
}

func TestControlPlaneJoinGivesUpAtItsBudget(t *testing.T) {
	api := testutil.NewAPI(t, "v1.37.2")
	api.SetNotReady(true)
	pin := pinOf(t, api.CAPEM())
	e := newStepEnv(t, "controlplane", api.Addr(), "providerConfig:\n  budget.controlPlaneReady: 30s\n",
		"  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        caCertHashes: ["+pin+"]\n")
	start := e.clock.Now()
	err := e.step.Bootstrap(context.Background(), plan.ActionJoin, e.obs())
	if !errors.Is(err, wait.ErrBudgetExhausted) || !strings.Contains(err.Error(), "/readyz answered 500") {
		t.Fatalf("%v", err)
	}
	if spent := e.clock.Now().Sub(start); spent < 30*time.Second || spent > 32*time.Second {
		t.Fatalf("spent %s, budget 30s", spent)
	}
	if len(e.rec.Lines()) != 0 {
		t.Fatalf("kubeadm ran: %q", e.rec.Lines())
	}
}

// A control plane whose CA matches no pin is never trusted nor joined:
// neither the CA it publishes in cluster-info, nor a server certificate
// that does not chain to the pinned ca_certs.
func TestControlPlaneJoinRefusesAnUnpinnedCA(t *testing.T) {
	api := testutil.NewAPI(t, "v1.37.2")
	other := testCA(t)
	for _, tc := range []struct{ name, keys, docs, want string }{
		{"cluster-info CA not pinned", "", "  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        caCertHashes: [" + other.hash + "]\n",
			"kube-public/cluster-info: no CA certificate matches caCertHashes: refusing to trust it"},
		{"server not signed by ca_certs", "ca_certs:\n- |\n" + indent(other.pem, "  "), "", "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newStepEnv(t, "controlplane", api.Addr(), tc.keys, tc.docs)
			e.step.Budgets = reconcile.DefaultBudgets()
			e.step.Budgets.ControlPlaneReady = 10 * time.Second
			err := e.step.Bootstrap(context.Background(), plan.ActionJoin, e.obs())
			if !errors.Is(err, wait.ErrBudgetExhausted) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v", err)
			}
			if len(e.rec.Lines()) != 0 {
				t.Fatalf("ran %q", e.rec.Lines())
			}
		})
	}
}

// The pass wires the step: a new init node converges, and neither the
// status nor the log carries a secret.
func TestReconcilePassInitialisesThroughTheStep(t *testing.T) {
	e := newStepEnv(t, "init", closedPort(t), "", "")
	res := reconcile.Run(context.Background(), reconcile.Options{Root: e.node.R(), Runner: e.rec, Clock: e.clock,
		Log: slog.New(slog.NewTextHandler(e.log, nil)), Steps: reconcile.Steps{Bootstrap: e.step.Bootstrap}})
	if res.ExitCode != reconcile.ExitOK || res.Status.Phase != status.PhaseConverged {
		t.Fatalf("%d %+v %v", res.ExitCode, res.Status, res.Err)
	}
	if !strings.Contains(e.log.String(), "msg=init outcome=ok") {
		t.Fatalf("log:\n%s", e.log.String())
	}
	st := e.node.Read(paths.StatusFile)
	noSecrets(t, "status", st)
	noSecrets(t, "log", e.log.String())
}

// The exact command line the step runs for init, with --dry-run appended,
// is run by the real kubeadm 1.37.2 with the file the step wrote: flags
// that mix with --config, a configuration it loads, defaults and uses all
// the way through a dry-run init.
func TestRealKubeadmDryRunsTheInitCommandLine(t *testing.T) {
	kubeadm := testbin.Kubeadm(t, "v1.37.2")
	e := newStepEnv(t, "init", closedPort(t), "",
		"  initConfiguration:\n    nodeRegistration:\n      ignorePreflightErrors: [all]\n  kubeletConfiguration:\n    failCgroupV1: false\n")
	dry := t.TempDir()
	ran := false
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, kubeadm, append(append([]string{}, c.Args...), "--dry-run")...)
		cmd.Env = append(append([]string{}, runner.BaseEnv...), "KUBEADM_INIT_DRYRUN_DIR="+dry)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Your Kubernetes control-plane has initialized successfully") {
			t.Fatalf("real kubeadm: %v\n%s", err, tail(string(out), 15))
		}
		noSecrets(t, "kubeadm output", string(out))
		ran = true
		return runner.Result{}, nil
	}
	if err := e.step.Bootstrap(context.Background(), plan.ActionInit, e.obs()); err != nil || !ran {
		t.Fatalf("%v ran=%v", err, ran)
	}
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
