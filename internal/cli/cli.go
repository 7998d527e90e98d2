// Package cli is the thin command layer: flags, wiring, output and exit
// codes. It returns an exit code; only main exits.
package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/bootstrap"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/joinconfig"
	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/plugin"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/repair"
	"github.com/kairos-io/provider-kubernetes/internal/reset"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Version is stamped at build time.
var Version = "dev"

// Entry runs the process: argv is the whole command line, argv[0]
// included. Installed as agent-provider-kubernetes, or with a go-pluggable
// event name (agent.boot, cluster.reset) first, it is the Kairos plugin;
// otherwise the command line interface. It returns the exit code.
func Entry(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// client-go logs through klog what it also returns as an error; the
	// provider reports errors itself, once, escaped.
	klog.SetLogger(logr.Discard())
	return entry(ctx, argv, "/", stdin, stdout, stderr)
}

func entry(ctx context.Context, argv []string, root string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(argv) == 0 {
		overview(stderr)
		return reconcile.ExitUsage
	}
	if kube.IsPluginBound(argv[1:]) {
		// client-go runs a kubeconfig's credential plugin through this
		// binary, which bounds its time and output (internal/kube).
		return kube.RunPluginBound(ctx, argv[1:], stdin, stdout, stderr)
	}
	asPlugin := filepath.Base(argv[0]) == plugin.BinaryName
	if asPlugin || len(argv) > 1 && plugin.IsEvent(argv[1]) {
		if len(argv) < 2 {
			fmt.Fprintf(stderr, "%s: the event name is the first argument (go-pluggable), e.g. %s\n", plugin.BinaryName, plugin.EventBoot)
			return reconcile.ExitUsage
		}
		return servePlugin(ctx, paths.Root(root), argv[1], stdin, stdout, stderr)
	}
	return Main(ctx, argv[1:], stdin, stdout, stderr)
}

func servePlugin(ctx context.Context, r paths.Root, event string, stdin io.Reader, stdout, stderr io.Writer) int {
	o := plugin.Options{Root: r, Reset: func(ctx context.Context, logw io.Writer) (status.Document, error) {
		log, logFile, err := reconcileLogger(r, logw)
		if err != nil {
			return status.Document{Phase: status.PhaseResetFailed}, err
		}
		defer logFile.Close()
		res := reset.Run(ctx, reset.Options{Root: r, Runner: runner.Exec{Root: string(r)}, Log: log})
		return res.Status, res.Err
	}}
	if err := plugin.Serve(ctx, o, event, stdin, stdout); err != nil {
		fmt.Fprintf(stderr, "%s %s: %s\n", plugin.BinaryName, event, status.Printable(runner.Sanitize(err.Error(), 500)))
		return reconcile.ExitFailed
	}
	return reconcile.ExitOK
}

// Main runs the command line args and returns the exit code. With no
// command it prints the overview on stderr and exits 2; help, -h and
// --help print it on stdout. Only a command given - as its file reads
// stdin (nil reads as empty).
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		overview(stderr)
		return reconcile.ExitUsage
	}
	switch args[0] {
	case "help", "-h", "--help", "-help":
		return cmdHelp(ctx, args[1:], stdout, stderr)
	case "--version":
		return cmdVersion(ctx, args[1:], stdout, stderr)
	}
	if c, ok := lookup(args[0]); ok {
		return c.call(ctx, args[1:], stdin, stdout, stderr)
	}
	return usageError(stderr, "", "unknown command "+described(args[0]))
}

// flagSet is a command's flags: parse prints its help on stdout for -h
// and --help, and a usage error as one line and a hint on stderr.
type flagSet struct {
	*flag.FlagSet
	stdout, stderr io.Writer
	said           bytes.Buffer // what the flag package says about a bad flag
}

// newFlags is the FlagSet of the command name ("plan", "pin set"), whose
// help entry is that of its first word.
func newFlags(name string, stdout, stderr io.Writer) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), stdout: stdout, stderr: stderr}
	fs.SetOutput(&fs.said)
	fs.Usage = func() {}
	return fs
}

// usageError reports problem as this command's usage error (exit 2).
func (fs *flagSet) usageError(problem string) int {
	return usageError(fs.stderr, fs.Name(), problem)
}

// parse parses args: ok when the command goes on, else the exit code
// (0 after printing the help, 2 after a usage error).
func parse(fs *flagSet, args []string) (int, bool) {
	if code, ok := parseFlags(fs, args); !ok {
		return code, false
	}
	if fs.NArg() > 0 {
		return fs.usageError(fmt.Sprintf("unexpected arguments: %v", fs.Args())), false
	}
	// Every command with --root re-bases host paths under it: never relative.
	if f := fs.Lookup("root"); f != nil && !filepath.IsAbs(f.Value.String()) {
		return fs.usageError(fmt.Sprintf("--root must be an absolute path, got %q", f.Value.String())), false
	}
	if problem := checkOutput(fs); problem != "" {
		return fs.usageError(problem), false
	}
	return 0, true
}

// parseArg is parse for a command that takes one argument, before or
// after its flags ("-", stdin, is an argument): the argument, "" when
// there is none, and ok when the command goes on.
func parseArg(fs *flagSet, args []string) (string, int, bool) {
	arg := ""
	if len(args) > 0 && (args[0] == "-" || !strings.HasPrefix(args[0], "-")) {
		arg, args = args[0], args[1:]
	} else {
		if code, ok := parseFlags(fs, args); !ok {
			return "", code, false
		}
		if args = fs.Args(); len(args) > 0 {
			arg, args = args[0], args[1:]
		}
	}
	code, ok := parse(fs, args)
	return arg, code, ok
}

// parseFlags is parse without its checks of the arguments left and --root.
func parseFlags(fs *flagSet, args []string) (int, bool) {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		if c, ok := fs.stdout.(*flagCollector); ok {
			c.set = fs.FlagSet
			return reconcile.ExitOK, false
		}
		name, _, _ := strings.Cut(fs.Name(), " ")
		printHelp(fs.stdout, name, fs.FlagSet)
		return reconcile.ExitOK, false
	}
	return fs.usageError(strings.TrimSpace(fs.said.String())), false
}

// cmdVersion prints this binary's version, release and supported window.
func cmdVersion(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("version", stdout, stderr)
	out := outputFlag(fs)
	if code, ok := parse(fs, args); !ok {
		return code
	}
	rel := images.Get().Release
	w := images.Window()
	minors := make([]string, len(w))
	for i, m := range w {
		minors[i] = m.String()
	}
	doc := struct {
		Version string   `json:"version"`
		Release string   `json:"release"`
		Window  []string `json:"window"`
	}{Version, rel, minors}
	err := emit(stdout, *out, doc, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "provider-kubernetes %s (release %s, Kubernetes %s)\n", Version, rel, images.Window())
		return err
	})
	if err != nil {
		fmt.Fprintf(stderr, "version: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	return reconcile.ExitOK
}

func cmdReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("reconcile", stdout, stderr)
	root := fs.String("root", "/", "host root every path is read and written under")
	clusterFile := fs.String("cluster-file", paths.ClusterFile, "cluster file (host path under --root)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	r := paths.Root(*root)
	log, logFile, err := reconcileLogger(r, stderr)
	if err != nil {
		fmt.Fprintln(stderr, status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	defer logFile.Close()
	ctx, cancel := context.WithTimeout(ctx, reconcile.PassBound)
	defer cancel()
	run := runner.Exec{Root: *root}
	boot := &bootstrap.Step{Root: r, Runner: run, Log: log}
	res := reconcile.Run(ctx, reconcile.Options{
		Root: r, ClusterFile: *clusterFile, Runner: run, Log: log,
		Steps: reconcile.Steps{RepairKubelet: repairStep(r, run, log), Bootstrap: boot.Bootstrap, EtcdSnapshot: snapshotStep(r, run, log),
			Images:      imagesStep(r, run, paths.ContainerdSocket, log),
			ReleasePins: releasePinsStep(run, paths.ContainerdSocket, log)},
	})
	if res.Err != nil {
		fmt.Fprintf(stderr, "reconcile: %s\n", status.Printable(res.Err.Error()))
	}
	return res.ExitCode
}

// repairStep wires the kubelet repair into the pass with the pass's budgets.
func repairStep(root paths.Root, run runner.Runner, log *slog.Logger) func(context.Context, reconcile.Observation) ([]string, error) {
	return func(ctx context.Context, obs reconcile.Observation) ([]string, error) {
		b := obs.Budgets
		rp := &repair.Repairer{Root: root, Runner: run, Log: log,
			Budgets: repair.Budgets{KubeletStart: b.KubeletStart, KubeletHealthy: b.KubeletHealthy, LocalAPI: b.LocalAPI, Attempt: b.APIRequest}}
		pin, _ := version.Parse(obs.Facts.Pin)
		name := ""
		if obs.Client != nil {
			name = obs.Client.NodeName
		}
		return rp.Repair(ctx, repair.Input{Target: pin, ControlPlane: obs.ControlPlane, Role: obs.Facts.Role, NodeName: name, Kubeadm: obs.Config.Kubeadm})
	}
}

// reconcileLogger is the logger every command that acts on the node uses:
// one logfmt line per event to the reconcile log and to the writer also (the journal,
// or a plugin's log field). The caller closes the returned file.
func reconcileLogger(r paths.Root, also io.Writer) (*slog.Logger, io.Closer, error) {
	f, err := OpenLog(r)
	if err != nil {
		return nil, nil, fmt.Errorf("open reconcile log: %w", err)
	}
	var w io.Writer = f
	if also != nil {
		w = io.MultiWriter(f, also)
	}
	return slog.New(slog.NewTextHandler(fieldsOnly{w}, nil)), f, nil
}

// fieldsOnly keeps a value from forging a field: slog's text handler
// quotes a value holding a space, '=' or '"', but the text inside the
// quotes (an etcd error saying "etcd-snapshot outcome=taken") would still
// match a grep for "etcd-snapshot outcome=". Every '=' inside a quoted
// value is written \x3d (strconv.Unquote reads it back as '='), so an
// unescaped '=' in a line is always a field's own. The handler writes each
// line in one Write.
type fieldsOnly struct{ w io.Writer }

func (q fieldsOnly) Write(p []byte) (int, error) {
	var out []byte // allocated only when a quoted value holds an '='
	quoted, escaped := false, false
	for i, c := range p {
		switch {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case quoted && c == '=':
			if out == nil {
				out = append(make([]byte, 0, len(p)+16), p[:i]...)
			}
			out = append(out, `\x3d`...)
			continue
		}
		if out != nil {
			out = append(out, c)
		}
	}
	if out == nil {
		out = p
	}
	if _, err := q.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// OpenLog opens the reconcile log for appending, 0640: never through a
// symlink, never a FIFO or device, never a file with a second hard link or
// another owner; a looser mode found there is set back to 0640, so nobody
// else can forge its lines.
func OpenLog(r paths.Root) (*os.File, error) {
	p := r.Path(paths.ReconcileLog)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, err
	}
	return fsutil.OpenAppend(p, 0o640)
}

// versionFlag is a version or "unknown", remembered only when set.
type versionFlag struct {
	v   version.Version
	set bool
}

func (f *versionFlag) String() string { return "" }
func (f *versionFlag) Set(s string) error {
	f.set = true
	if s == "unknown" {
		f.v = version.Version{}
		return nil
	}
	v, err := version.Parse(s)
	if err != nil {
		return err
	}
	f.v = v
	return nil
}

func (f *versionFlag) ptr() *version.Version {
	if !f.set {
		return nil
	}
	return &f.v
}

func cmdPlan(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("plan", stdout, stderr)
	root := fs.String("root", "/", "host root every path is read under")
	clusterFile := fs.String("cluster-file", paths.ClusterFile, "cluster file (host path under --root)")
	out := outputFlag(fs)
	var bundled, nodeV, clusterV, verified versionFlag
	fs.Var(&bundled, "bundled", "bundled kubeadm version, or unknown")
	fs.Var(&verified, "verified", "the version this node was last verified at (the provider's record), or unknown")
	fs.Var(&nodeV, "node-version", "this node's version, or unknown")
	fs.Var(&clusterV, "cluster-version", "the cluster's version, or unknown")
	pin := fs.String("pin", "", "the pin (clusterConfiguration.kubernetesVersion), as written")
	role := fs.String("role", "", "init, controlplane or worker")
	member := fs.Bool("member", false, "whether this node is already a cluster member")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	ov := reconcile.Overrides{Bundled: bundled.ptr(), Node: nodeV.ptr(), Cluster: clusterV.ptr(), Verified: verified.ptr()}
	if set["pin"] {
		ov.Pin = pin
	}
	if set["role"] {
		r, err := plan.ParseRole(*role)
		if err != nil {
			return fs.usageError(fmt.Sprintf("--role: %s", status.Printable(err.Error())))
		}
		ov.Role = &r
	}
	if set["member"] {
		ov.Member = member
	}
	b := reconcile.DefaultBudgets()
	o := &observe.Observer{Root: paths.Root(*root), ClusterFile: *clusterFile, Runner: runner.Exec{Root: *root},
		APITimeout: b.APIRequest}
	obs := reconcile.Gather(ctx, o, ov, wait.Budget{Total: 10 * 1e9, Interval: 2 * 1e9, PerAttempt: b.APIRequest})
	if _, err := reconcile.ConfigBudgets(obs, b); err != nil {
		// What a pass would do with this cluster file: fail before deciding.
		fmt.Fprintf(stderr, "plan: %s: %s\n", reconcile.ReasonConfigFailed, status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	pl := plan.Decide(images.Window(), obs.Facts)
	err := emit(stdout, *out, newPlanReport(obs, pl), func(w io.Writer) error {
		printPlan(w, obs, pl)
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "plan: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	if pl.Refused() {
		return reconcile.ExitRefused
	}
	return reconcile.ExitOK
}

// planReport is what plan -o json|yaml prints: the plan, the facts it
// was decided on as the text's Facts line shows them, and the text's
// Observed lines (bounded as there). docs/reference.md names every field.
type planReport struct {
	plan.Plan
	Facts plan.Shown `json:"facts"`
	Notes []string   `json:"notes"`
}

func newPlanReport(obs reconcile.Observation, pl plan.Plan) planReport {
	r := planReport{Plan: pl, Facts: obs.Facts.Shown(), Notes: []string{}}
	for _, n := range obs.Notes {
		r.Notes = append(r.Notes, runner.Sanitize(n, 300))
	}
	return r
}

// printPlan renders the plan for a person. Every value is printed through
// status.Printable: a pin or a message holding newlines and escape codes
// must not print a fake verdict over the real one.
func printPlan(w io.Writer, obs reconcile.Observation, pl plan.Plan) {
	f := obs.Facts
	p := status.Printable
	vs := func(v version.Version) string {
		if v.IsZero() {
			return "unknown"
		}
		return v.String()
	}
	pin := plan.ShownPin(f.Pin)
	if pin == "" {
		pin = "(not set)"
	}
	fmt.Fprintf(w, "Facts:    member=%v role=%s pin=%s bundled=%s node=%s cluster=%s verified=%s\n", f.Member, p(orDash(f.Role.Shown())), p(pin), vs(f.Bundled), vs(f.Node), vs(f.Cluster), vs(f.Verified))
	switch pl.Verdict {
	case plan.VerdictRefuse:
		fmt.Fprintf(w, "Verdict:  REFUSE %s (%s)\n", p(string(pl.Refusal)), p(pl.Reason))
	case plan.VerdictNone:
		fmt.Fprintf(w, "Verdict:  nothing to do\n")
	default:
		steps := make([]string, len(pl.Actions))
		for i, a := range pl.Actions {
			steps[i] = fmt.Sprintf("%d. %s", i+1, a)
		}
		fmt.Fprintf(w, "Verdict:  act\nActions:  %s\n", strings.Join(steps, "  "))
		if pl.Redecide {
			fmt.Fprintf(w, "          then observe again and decide again\n")
		}
	}
	fmt.Fprintf(w, "Message:  %s\n", p(pl.Message))
	for _, x := range pl.Warnings {
		fmt.Fprintf(w, "Warning:  %s\n", p(x))
	}
	for _, n := range obs.Notes {
		fmt.Fprintf(w, "Observed: %s\n", p(runner.Sanitize(n, 300)))
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("status", stdout, stderr)
	root := fs.String("root", "/", "host root")
	out := outputFlag(fs)
	cluster := fs.Bool("cluster", false, "every node of the cluster and the rollout's next step, from the API")
	kubeconfig := fs.String("kubeconfig", "", "with --cluster: a kubeconfig with read access (host path under --root; default: the KUBECONFIG list, else admin.conf, else kubelet.conf)")
	kubeContext := fs.String("context", "", "with --cluster: the kubeconfig context to use (default: its current context)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *cluster {
		return clusterStatus(ctx, paths.Root(*root), kubeSource(*kubeconfig, os.Getenv("KUBECONFIG"), *kubeContext), *out, stdout, stderr)
	}
	doc, src, err := status.ReadCurrent(paths.Root(*root))
	if err != nil {
		fmt.Fprintf(stderr, "status: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	if *out == "text" && src == paths.StatusMirror {
		fmt.Fprintf(stdout, "(from the persistent mirror %s: no pass has run on this boot yet)\n", src)
	}
	if err := emit(stdout, *out, doc, func(w io.Writer) error { return status.Print(w, doc, "text") }); err != nil {
		fmt.Fprintf(stderr, "status: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	return reconcile.ExitOK
}

func cmdJoinConfig(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("join-config", stdout, stderr)
	root := fs.String("root", "/", "host root")
	role := fs.String("role", "", "the next node's role: worker or controlplane")
	ttl := fs.Duration("ttl", clusterconfig.DefaultTokenTTL, "the bootstrap token's lifetime (at most "+clusterconfig.MaxTokenTTL.String()+")")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *role != clusterconfig.RoleWorker && *role != clusterconfig.RoleControlPlane {
		return fs.usageError(fmt.Sprintf("--role must be worker or controlplane, got %q", *role))
	}
	if *ttl <= 0 || *ttl > clusterconfig.MaxTokenTTL {
		return fs.usageError(fmt.Sprintf("--ttl must be more than 0 and at most %s, got %s", clusterconfig.MaxTokenTTL, *ttl))
	}
	m, err := joinconfig.Mint(ctx, joinconfig.Options{Root: paths.Root(*root), Runner: runner.Exec{Root: *root}, Role: *role, TTL: *ttl})
	if err != nil {
		fmt.Fprintf(stderr, "join-config: %s\n", status.Printable(runner.Sanitize(err.Error(), 1000)))
		return reconcile.ExitFailed
	}
	if _, err := stdout.Write(m.Section); err != nil {
		fmt.Fprintf(stderr, "join-config: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	fmt.Fprintf(stderr, "minted join material for a %s: bootstrap token id %s, expires %s\n", m.Role, m.TokenID, m.Expires.Format(time.RFC3339))
	return reconcile.ExitOK
}

func cmdReset(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("reset", stdout, stderr)
	root := fs.String("root", "/", "host root")
	yes := fs.Bool("yes", false, "confirm: this removes the node's Kubernetes state")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if !*yes {
		return fs.usageError(fmt.Sprintf("reset removes this node's Kubernetes state (kubeadm reset -f; %s emptied): run it with --yes", strings.Join(reset.Emptied, ", ")))
	}
	return runReset(ctx, paths.Root(*root), stdout, stderr)
}

// runReset is the reset shared by the command and the cluster.reset event.
func runReset(ctx context.Context, r paths.Root, stdout, stderr io.Writer) int {
	log, logFile, err := reconcileLogger(r, stderr)
	if err != nil {
		fmt.Fprintln(stderr, status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	defer logFile.Close()
	res := reset.Run(ctx, reset.Options{Root: r, Runner: runner.Exec{Root: string(r)}, Log: log})
	if res.ExitCode == reconcile.ExitRefused {
		// Nothing changed and no status was written: the refusal, not a
		// document that would describe the node (Member: false) wrongly.
		fmt.Fprintf(stderr, "reset: refused (%s), nothing changed: %s\n", res.Status.Reason, status.Printable(res.Status.Message))
		return res.ExitCode
	}
	_ = status.Print(stdout, res.Status, "text")
	return res.ExitCode
}
