package cli

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// command is one entry of the dispatch table Main looks commands up in.
type command struct {
	name string
	run  func(ctx context.Context, args []string, stdout, stderr io.Writer) int
	// runIn, when set, runs instead of run: a command that reads stdin.
	runIn func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int
	// words are what its first argument may be, for completion.
	words []string
}

func (c command) call(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if c.runIn != nil {
		return c.runIn(ctx, args, stdin, stdout, stderr)
	}
	return c.run(ctx, args, stdout, stderr)
}

// commands is the dispatch table, in the order the overview lists them.
// Every entry has a help entry in helps (a test checks it).
var commands = []command{
	{name: "reconcile", run: cmdReconcile},
	{name: "plan", run: cmdPlan},
	{name: "preflight", run: cmdPreflight},
	{name: "status", run: cmdStatus},
	{name: "publish", run: cmdPublish},
	{name: "drain", run: cmdDrain},
	{name: "join-config", run: cmdJoinConfig},
	{name: "reset", run: cmdReset},
	{name: "etcd-snapshot", run: cmdEtcdSnapshot},
	{name: "pin", words: []string{"show", "set"}, run: func(_ context.Context, args []string, stdout, stderr io.Writer) int {
		return cmdPin(args, stdout, stderr)
	}},
	{name: "validate", runIn: func(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
		return cmdValidate(args, stdin, stdout, stderr)
	}},
	{name: "restore-etcd", run: cmdRestoreEtcd},
	{name: "collect-manifests", run: func(_ context.Context, args []string, stdout, stderr io.Writer) int {
		return cmdCollectManifests(args, stdout, stderr)
	}},
	{name: "prune-kubeadm-backups", run: cmdPruneKubeadmBackups},
	{name: "migrate-units", run: cmdMigrateUnits},
	{name: "import-images", run: cmdImportImages},
	{name: "version", run: cmdVersion},
}

// completion reads the table it completes, so it joins it at init (a
// table entry naming it would be an initialization cycle).
func init() {
	commands = append(commands, command{name: "completion", run: cmdCompletion, words: shells})
}

func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// exitCode is one line of a command's "Exit codes:".
type exitCode struct {
	code int
	when string
}

// commandHelp is what `provider-kubernetes <cmd> --help` prints around the
// flags, which come from the command's own FlagSet.
type commandHelp struct {
	synopsis []string   // each after "provider-kubernetes "
	summary  string     // what it does, one or two sentences
	example  string     // one command line, after "provider-kubernetes "
	exits    []exitCode // every code but ExitUsage, which every command has
	usage    string     // what else exits ExitUsage, if anything
}

var helps = map[string]commandHelp{
	"reconcile": {
		synopsis: []string{"reconcile [--root DIR] [--cluster-file FILE]"},
		summary:  "One reconcile pass: observe, decide, act, report. Run on every boot by provider-kubernetes-reconcile.service.",
		example:  "reconcile",
		exits: []exitCode{{reconcile.ExitOK, "converged, or nothing to do"}, {reconcile.ExitFailed, "a step failed, or another pass holds the lock"},
			{reconcile.ExitRefused, "refused: nothing changed"}},
	},
	"plan": {
		synopsis: []string{"plan [--root DIR] [--cluster-file FILE] [-o text|json|yaml] [--pin V] [--bundled V|unknown]\n" +
			"     [--node-version V|unknown] [--cluster-version V|unknown] [--role init|controlplane|worker] [--member=true|false]\n" +
			"     [--verified V|unknown]"},
		summary: "What the next boot would do, changing nothing. Facts given as flags replace what would be read from the node; with every fact given it reads nothing and works on any machine.",
		example: "plan --pin v1.37.2 --bundled v1.37.2 --node-version v1.36.3 --cluster-version v1.36.3 --role controlplane --member=true",
		exits: []exitCode{{reconcile.ExitOK, "the plan acts, or has nothing to do"}, {reconcile.ExitFailed, "the plan could not be printed"},
			{reconcile.ExitRefused, "the plan refuses"}},
	},
	"preflight": {
		synopsis: []string{"preflight [--host-root DIR] [--image-root DIR] [-o text|json|yaml]"},
		summary:  "From the image a node is about to be upgraded to, before the swap: what the node's next boot would decide and whether the cluster can take it now. Writes nothing.",
		example:  "preflight --host-root /host -o json",
		exits: []exitCode{{reconcile.ExitOK, "the upgrade may swap the image"}, {reconcile.ExitFailed, "the output could not be printed"},
			{reconcile.ExitRefused, "refused: the code on its one structured line"}},
	},
	"status": {
		synopsis: []string{"status [--root DIR] [-o text|json|yaml]",
			"status --cluster [--kubeconfig FILE] [--context NAME] [-o text|json|yaml] [--root DIR]"},
		summary: "The last pass's status document; with --cluster, every node of the cluster from the API and the rollout's next step.",
		example: "status --cluster",
		exits: []exitCode{{reconcile.ExitOK, "printed; with --cluster: every node converged at one version"},
			{reconcile.ExitFailed, "no status document to read; with --cluster: not converged, or the API did not answer"}},
	},
	"publish": {
		synopsis: []string{"publish [--root DIR] [--budget D]"},
		summary:  "Put the last pass on this node's Node (annotations, the KubernetesUpgrade condition, Events), retrying while the API comes up. Run by provider-kubernetes-publish.service after every pass.",
		example:  "publish --budget 2m",
		exits:    []exitCode{{reconcile.ExitOK, "published, or nothing to publish"}, {reconcile.ExitFailed, "the budget ran out"}},
	},
	"drain": {
		synopsis: []string{"drain [--node NAME] [--budget D] [--force] [--exclude-pod NS/NAME]... [--kubeconfig FILE] [--context NAME] [--root DIR]"},
		summary:  "Before a reboot: cordon the node and evict its pods through the Eviction API, PodDisruptionBudgets honoured; a failed drain makes the node schedulable again.",
		example:  "drain --budget 15m",
		exits: []exitCode{{reconcile.ExitOK, "drained"}, {reconcile.ExitFailed, "failed: the node made schedulable again"},
			{reconcile.ExitRefused, "refused: pods no controller manages, without --force (nothing changed)"}},
	},
	"join-config": {
		synopsis: []string{"join-config --role worker|controlplane [--ttl D] [--root DIR]"},
		summary:  "On a control plane: mint join material and print a ready-to-paste cloud-config cluster: section for the next node. The output is a secret.",
		example:  "join-config --role worker > worker-cluster.yaml",
		exits:    []exitCode{{reconcile.ExitOK, "printed"}, {reconcile.ExitFailed, "failed"}},
	},
	"reset": {
		synopsis: []string{"reset --yes [--root DIR]"},
		summary:  "Take this node out of Kubernetes: kubeadm reset -f, then empty its Kubernetes directories (never through a symlink). The provider's etcd snapshots are kept.",
		example:  "reset --yes",
		exits: []exitCode{{reconcile.ExitOK, "reset"}, {reconcile.ExitFailed, "failed"},
			{reconcile.ExitRefused, "refused: a pass holds the node's lock, the lock file is not one to trust, or a directory it empties (or a parent) is a symlink (nothing changed)"}},
		usage: "without --yes (nothing changed)",
	},
	"etcd-snapshot": {
		synopsis: []string{"etcd-snapshot --target vX.Y.Z [--root DIR]"},
		summary:  "The pre-upgrade etcd snapshot step alone, with the reconcile pass's rules and its one \"etcd-snapshot outcome=...\" line.",
		example:  "etcd-snapshot --target v1.37.2",
		exits:    []exitCode{{reconcile.ExitOK, "taken, or skipped"}, {reconcile.ExitFailed, "failed"}},
	},
	"pin": {
		synopsis: []string{"pin show [--root DIR]", "pin set vX.Y.Z [--dry-run] [--root DIR]"},
		summary:  "This node's pin (clusterConfiguration.kubernetesVersion in its /oem cloud-config): show prints it and its file; set changes it there atomically, every other byte kept. The next boot decides what it does.",
		example:  "pin set v1.37.2 --dry-run",
		exits: []exitCode{{reconcile.ExitOK, "shown, set, or already set"}, {reconcile.ExitFailed, "failed"},
			{reconcile.ExitRefused, "refused: it cannot be done safely (nothing changed)"}},
	},
	"restore-etcd": {
		synopsis: []string{"restore-etcd --snapshot FILE --manifests DIR --initial-cluster NAME=URL,... [--cluster-token T] --yes [--root DIR]"},
		summary:  "Restore this node's stacked etcd member from a snapshot, the old member directory moved aside; prints the command for the next member. Without --yes it shows what it would do.",
		example:  "restore-etcd --snapshot /run/etcd-backup/etcd-pre-upgrade.db --manifests /etc/kubernetes/tmp/restore-v1.36.3 --initial-cluster cp1=https://10.0.0.11:2380 --yes",
		exits:    []exitCode{{reconcile.ExitOK, "restored"}, {reconcile.ExitFailed, "failed"}, {reconcile.ExitRefused, "refused: nothing changed"}},
		usage:    "without --yes (what it would do shown, nothing changed)",
	},
	"collect-manifests": {
		synopsis: []string{"collect-manifests --to DIR [--root DIR]"},
		summary:  "For a rollback: copy into DIR (new or empty, made 0700) the static pod manifests this control plane ran at the booted image's version, restore-etcd's --manifests.",
		example:  "collect-manifests --to /etc/kubernetes/tmp/restore-v1.36.3",
		exits: []exitCode{{reconcile.ExitOK, "copied"}, {reconcile.ExitFailed, "failed"},
			{reconcile.ExitRefused, "refused: a manifest is missing, or DIR is not new or empty (nothing copied)"}},
	},
	"validate": {
		synopsis: []string{"validate [-o text|json|yaml] FILE"},
		summary: "Check a Kairos cloud-config file offline with the checks agent.boot and the reconcile pass apply to its cluster: section (its header, keys, role, pin, " +
			"providerConfig budgets, token strength, CA pin), and list every problem, one per line, never a value. FILE - reads stdin. Writes nothing.",
		example: "validate /oem/90_custom.yaml",
		exits:   []exitCode{{reconcile.ExitOK, "valid"}, {reconcile.ExitFailed, "invalid (every problem listed), or FILE could not be read"}},
		usage:   "no FILE",
	},
	"prune-kubeadm-backups": {
		synopsis: []string{"prune-kubeadm-backups [--keep N] [--root DIR]"},
		summary:  "Remove all but the newest N of kubeadm's plaintext etcd copies in /etc/kubernetes/tmp, only when this node is verified at the cluster's version.",
		example:  "prune-kubeadm-backups --keep 1",
		exits: []exitCode{{reconcile.ExitOK, "pruned, or nothing to prune"}, {reconcile.ExitFailed, "failed"},
			{reconcile.ExitRefused, "refused: not verified, or a pass holds the lock (nothing removed)"}},
	},
	"migrate-units": {
		synopsis: []string{"migrate-units [--root DIR]"},
		summary:  "Remove the unit copies earlier releases left in /etc/systemd/system when byte-identical to what was shipped, then reload systemd. Run by provider-kubernetes-unit-migrate.service.",
		example:  "migrate-units",
		exits:    []exitCode{{reconcile.ExitOK, "done"}, {reconcile.ExitFailed, "an edited copy was kept (named in the journal), or a step failed"}},
	},
	"import-images": {
		synopsis: []string{"import-images [--root DIR] [--address SOCKET]"},
		summary:  "Import exactly the image's bundled control-plane images into containerd's k8s.io namespace, refusing any tarball that fails a check. Run by provider-kubernetes-image-import.service.",
		example:  "import-images",
		exits:    []exitCode{{reconcile.ExitOK, "imported"}, {reconcile.ExitFailed, "a tarball was refused, or an import failed"}},
	},
	"completion": {
		synopsis: []string{"completion bash|zsh|fish"},
		summary: "Print a completion script for the shell: the commands, their flags and -o's formats, from the binary's own tables. " +
			"Load it with: source <(provider-kubernetes completion bash) (zsh: the same with zsh; fish: provider-kubernetes completion fish | source).",
		example: "completion bash",
		exits:   []exitCode{{reconcile.ExitOK, "printed"}},
		usage:   "no shell, or another shell",
	},
	"version": {
		synopsis: []string{"version [-o text|json|yaml]"},
		summary:  "This binary's version, its release and the Kubernetes minors it supports.",
		example:  "version -o json",
		exits:    []exitCode{{reconcile.ExitOK, "printed"}},
	},
}

// overview is what `provider-kubernetes help` prints: every command's
// synopsis and what it does, from the help entries.
func overview(w io.Writer) {
	var b strings.Builder
	b.WriteString("provider-kubernetes: installs and upgrades Kubernetes with kubeadm on Kairos nodes.\n\nCommands:\n")
	for _, c := range commands {
		h := helps[c.name]
		for _, s := range h.synopsis {
			b.WriteString("  provider-kubernetes " + strings.ReplaceAll(s, "\n", "\n  ") + "\n")
		}
		b.WriteString(wrap(h.summary, "      ", 78))
	}
	b.WriteString(`
As a Kairos plugin (installed as agent-provider-kubernetes, or given an
event name first) it answers the go-pluggable events agent.boot and
cluster.reset on stdin/stdout.

Exit codes: 0 converged or nothing to do, 1 failed, 2 usage, 3 refused.
For one command's flags, an example and its exit codes, run
'provider-kubernetes help COMMAND' or 'provider-kubernetes COMMAND --help'.
`)
	fmt.Fprint(w, b.String())
}

// wrap fills text into lines of at most width columns, each indented.
func wrap(text, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, word := range strings.Fields(text) {
		if line != indent && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if line != indent {
			line += " "
		}
		line += word
	}
	return b.String() + line + "\n"
}

// printHelp writes one command's help: synopsis, what it does, its flags
// as its FlagSet describes them (defaults included), an example and its
// exit codes.
func printHelp(w io.Writer, name string, fs *flag.FlagSet) {
	h := helps[name]
	var b strings.Builder
	b.WriteString("Usage:\n")
	for _, s := range h.synopsis {
		b.WriteString("  provider-kubernetes " + strings.ReplaceAll(s, "\n", "\n  ") + "\n")
	}
	b.WriteString("\n" + wrap(h.summary, "", 78))
	var flags bytes.Buffer
	out := fs.Output()
	fs.SetOutput(&flags)
	fs.PrintDefaults()
	fs.SetOutput(out)
	if flags.Len() > 0 {
		b.WriteString("\nFlags:\n" + flags.String())
	}
	b.WriteString("\nExample:\n  provider-kubernetes " + h.example + "\n\nExit codes:\n")
	usage := "usage: a bad flag or value, a missing value, an unexpected argument"
	if h.usage != "" {
		usage += "; " + h.usage
	}
	exits := append([]exitCode{{reconcile.ExitUsage, usage}}, h.exits...)
	sort.SliceStable(exits, func(i, j int) bool { return exits[i].code < exits[j].code })
	for _, e := range exits {
		fmt.Fprintf(&b, "  %d  %s\n", e.code, e.when)
	}
	fmt.Fprint(w, b.String())
}

// cmdHelp is `provider-kubernetes help [COMMAND]`: the overview, or that
// command's help (the command run with --help).
func cmdHelp(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0, args[0] == "-h", args[0] == "--help", args[0] == "-help", len(args) == 1 && args[0] == "help":
		overview(stdout)
		return reconcile.ExitOK
	case len(args) == 2 && args[0] == "pin" && (args[1] == "show" || args[1] == "set"):
		return cmdHelp(ctx, args[:1], stdout, stderr) // pin's own help covers both
	case len(args) == 1:
		if c, ok := lookup(args[0]); ok {
			return c.call(ctx, []string{"--help"}, nil, stdout, stderr)
		}
		return usageError(stderr, "help", "unknown command "+described(args[0]))
	}
	return usageError(stderr, "help", "unexpected arguments: "+status.Printable(fmt.Sprint(args[1:])))
}

// usageError reports a usage error on stderr as one line naming the
// problem and one pointing at the command's help, and returns ExitUsage.
// cmd is the command as typed ("plan", "pin set"); "" or "help" points at
// the overview.
func usageError(stderr io.Writer, cmd, problem string) int {
	fmt.Fprintln(stderr, status.Printable(problem))
	if cmd == "" || cmd == "help" {
		fmt.Fprintln(stderr, "run 'provider-kubernetes help'")
	} else {
		fmt.Fprintf(stderr, "run 'provider-kubernetes %s --help'\n", cmd)
	}
	return reconcile.ExitUsage
}

// described names a command-line word that is not a command: as typed
// when it could be one (letters, digits and dashes, short), else by length.
func described(s string) string {
	ok := len(s) > 0 && len(s) <= 40
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			ok = false
		}
	}
	if ok {
		return "\"" + s + "\""
	}
	return fmt.Sprintf("(a word of %d bytes, not shown)", len(s))
}
