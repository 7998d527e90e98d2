package cli

import (
	"context"
	"encoding/json"
	"flag"
	"regexp"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
)

// Every command of the dispatch table has its help: `help CMD`, `CMD
// --help` and `CMD -h` print the same text on stdout and exit 0, that
// command's only: its synopsis, what it does, the flags its FlagSet
// defines (every flag its synopsis names among them, and none it does not
// name), an example whose flags parse, and its exit codes, 2 included. A
// command added to the table without a help entry, or whose flags do not
// go through parse, fails here.
func TestEveryCommandHasItsHelp(t *testing.T) {
	flagLine := regexp.MustCompile(`(?m)^  -([a-z][a-z-]*)`)
	synFlag := regexp.MustCompile(`(?:^|[\s\[|])--?([a-z][a-z-]*)`)
	exitLine := regexp.MustCompile(`(?m)^  ([0-9])  \S`)
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			h, ok := helps[c.name]
			if !ok || len(h.synopsis) == 0 || h.summary == "" || h.example == "" || len(h.exits) == 0 {
				t.Fatalf("no complete help entry: %+v", h)
			}
			code, out, errOut := run("help", c.name)
			if code != reconcile.ExitOK || errOut != "" {
				t.Fatalf("help %s: exit %d, stderr %q", c.name, code, errOut)
			}
			for _, flag := range []string{"--help", "-h"} {
				code, o, e := run(c.name, flag)
				if code != reconcile.ExitOK || e != "" || o != out {
					t.Errorf("%s %s: exit %d, stderr %q, stdout differs from help %s: %q", c.name, flag, code, e, c.name, o)
				}
			}
			if !strings.HasPrefix(out, "Usage:\n  provider-kubernetes "+c.name+" ") {
				t.Errorf("does not start with its synopsis:\n%s", out)
			}
			for _, other := range commands {
				if other.name != c.name && strings.Contains(out, "provider-kubernetes "+other.name+" ") {
					t.Errorf("prints %s's synopsis too:\n%s", other.name, out)
				}
			}
			_, rest, ok := strings.Cut(out, "\nFlags:\n")
			nflags := 0
			flagsOf(context.Background(), c).VisitAll(func(*flag.Flag) { nflags++ })
			if ok != (nflags > 0) {
				t.Fatalf("a Flags section: %v, for %d flags:\n%s", ok, nflags, out)
			}
			flagsSec, _, _ := strings.Cut(rest, "\n\n")
			defined := map[string]bool{}
			for _, m := range flagLine.FindAllStringSubmatch(flagsSec, -1) {
				defined[m[1]] = true
			}
			named := map[string]bool{}
			for _, s := range h.synopsis {
				for _, m := range synFlag.FindAllStringSubmatch(s, -1) {
					named[m[1]] = true
				}
			}
			for f := range named {
				if !defined[f] {
					t.Errorf("the synopsis names --%s: the command's flags do not define it\n%s", f, out)
				}
			}
			for f := range defined {
				if !named[f] {
					t.Errorf("the command defines -%s: its synopsis does not name it", f)
				}
			}
			if !strings.Contains(out, "\nExample:\n  provider-kubernetes "+h.example+"\n") {
				t.Errorf("no example:\n%s", out)
			}
			_, exits, ok := strings.Cut(out, "\nExit codes:\n")
			codes := ""
			for _, m := range exitLine.FindAllStringSubmatch(exits, -1) {
				codes += m[1]
			}
			if !ok || !strings.Contains(codes, "0") || !strings.Contains(codes, "2") {
				t.Errorf("exit codes %q:\n%s", codes, out)
			}

			// The example's flags parse: with one more argument the command
			// stops at the "unexpected arguments" usage error, having done
			// nothing.
			args, _, _ := strings.Cut(h.example, " >")
			argv := strings.Fields(args)
			if defined["root"] {
				argv = append(argv, "--root", t.TempDir())
			}
			argv = append(argv, "unexpected-by-design")
			code, o, e := run(argv...)
			if code != reconcile.ExitUsage || o != "" || !strings.Contains(e, "unexpected arguments: [unexpected-by-design]") {
				t.Errorf("the example %q does not parse: exit %d %q %q", h.example, code, o, e)
			}
		})
	}
	if len(helps) != len(commands) {
		t.Errorf("%d help entries for %d commands: one names no command", len(helps), len(commands))
	}
}

// The flags and their defaults are the FlagSet's own, as documented in
// docs/reference.md (publish retries within 5m, drain's budget is 10m,
// plan prints text).
func TestHelpShowsTheFlagDefaults(t *testing.T) {
	for _, c := range []struct{ cmd, want string }{
		{"publish", "  -budget value\n    \thow long to keep trying while the API is not reachable (Go duration) (default 5m0s)\n"},
		{"drain", "(default 10m0s)"},
		{"plan", "  -o string\n    \toutput: text, json or yaml (default \"text\")\n"},
		{"prune-kubeadm-backups", "(default 1)"},
		{"version", "  -o string\n    \toutput: text, json or yaml (default \"text\")\n"},
	} {
		_, out, _ := run("help", c.cmd)
		if !strings.Contains(out, c.want) {
			t.Errorf("help %s lacks %q:\n%s", c.cmd, c.want, out)
		}
	}
}

// help, -h, --help, help --help and help help print the overview on stdout and exit 0; no command
// at all prints it on stderr and exits 2. It lists every command.
func TestOverview(t *testing.T) {
	_, want, _ := run("help")
	for _, c := range commands {
		if !strings.Contains(want, "\n  provider-kubernetes "+c.name+" ") {
			t.Errorf("the overview does not list %s", c.name)
		}
	}
	if !strings.Contains(want, "'provider-kubernetes help COMMAND'") {
		t.Errorf("the overview does not say where a command's help is:\n%s", want)
	}
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"help", "--help"}, {"help", "help"}} {
		code, out, errOut := run(args...)
		if code != reconcile.ExitOK || out != want || errOut != "" {
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q", args, code, len(out), errOut)
		}
	}
	// pin's subcommands, as the overview lists them, have pin's help.
	_, pinHelp, _ := run("pin", "--help")
	for _, sub := range []string{"show", "set"} {
		if code, out, errOut := run("help", "pin", sub); code != reconcile.ExitOK || out != pinHelp || errOut != "" {
			t.Errorf("help pin %s: exit %d, stdout %d bytes, stderr %q", sub, code, len(out), errOut)
		}
	}
	code, out, errOut := run()
	if code != reconcile.ExitUsage || out != "" || errOut != want {
		t.Errorf("no command: exit %d, stdout %q, stderr %d bytes", code, out, len(errOut))
	}
}

// A usage error is two lines on stderr, the problem and where the help
// is, and exit 2: never the overview, never on stdout, every byte of what
// was typed escaped.
func TestUsageErrorsAreOneLineAndAHint(t *testing.T) {
	root := t.TempDir()
	for _, c := range []struct {
		args    []string
		problem string
		hint    string
	}{
		{[]string{"plan", "--bogus"}, "flag provided but not defined: -bogus", "plan"},
		{[]string{"status", "--root"}, "flag needs an argument: -root", "status"},
		{[]string{"plan", "--bundled", "1.37"}, `invalid value "1.37" for flag -bundled: `, "plan"},
		{[]string{"reconcile", "--root", root, "extra"}, "unexpected arguments: [extra]", "reconcile"},
		{[]string{"drain", "--root", root, "a\x1b[2J\nb"}, `unexpected arguments: [a\x1b[2J\nb]`, "drain"},
		{[]string{"plan", "--\x1b[2J"}, `flag provided but not defined: -\x1b[2J`, "plan"},
		{[]string{"pin", "show", "--dry-run"}, "flag provided but not defined: -dry-run", "pin show"},
		{[]string{"pin", "set", "--bogus"}, "flag provided but not defined: -bogus", "pin set"},
		{[]string{"pin"}, "pin: show or set vX.Y.Z", "pin"},
		{[]string{"version", "x"}, "unexpected arguments: [x]", "version"},
		{[]string{"version", "-o", "yml"}, "-o must be text, json or yaml, got <a value of 3 characters, not shown>", "version"},
		{[]string{"plan", "-o", "xml"}, "-o must be text, json or yaml, got <a value of 3 characters, not shown>", "plan"},
		{[]string{"join-config", "--root", root, "--role", "master"}, `--role must be worker or controlplane, got "master"`, "join-config"},
		{[]string{"reset", "--root", root}, "reset removes this node's Kubernetes state", "reset"},
		{[]string{"collect-manifests", "--root", root}, "collect-manifests: --to DIR is required", "collect-manifests"},
		{[]string{"pin", "set", "--root", root}, "pin set: the version to pin is missing", "pin set"},
		{[]string{"etcd-snapshot", "--root", root, "--target", "1.37"}, "--target: ", "etcd-snapshot"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`, ""},
		{[]string{"\x1b[2Jplan"}, "unknown command (a word of 8 bytes, not shown)", ""},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`, ""},
		{[]string{"help", "plan", "extra"}, "unexpected arguments: [extra]", ""},
	} {
		code, out, errOut := run(c.args...)
		hint := "run 'provider-kubernetes help'\n"
		if c.hint != "" {
			hint = "run 'provider-kubernetes " + c.hint + " --help'\n"
		}
		lines := strings.SplitAfter(errOut, "\n")
		if code != reconcile.ExitUsage || out != "" || len(lines) != 3 || lines[2] != "" ||
			!strings.HasPrefix(lines[0], c.problem) || lines[1] != hint || strings.Contains(errOut, "\x1b") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and %q then %q", c.args, code, out, errOut, c.problem, hint)
		}
	}
}

// version refuses arguments (above) and prints, as text or JSON, the same
// three facts: the binary's version, its release and its window (the
// minors docs/reference.md's window names). The text form is what
// internal/imagetree parses.
func TestVersion(t *testing.T) {
	code, text, errOut := run("version")
	if code != reconcile.ExitOK || errOut != "" {
		t.Fatalf("exit %d %q", code, errOut)
	}
	code, js, errOut := run("version", "-o", "json")
	if code != reconcile.ExitOK || errOut != "" {
		t.Fatalf("exit %d %q", code, errOut)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(js), &v); err != nil || len(v) != 3 {
		t.Fatalf("%v: %s", err, js)
	}
	rel, _ := v["release"].(string)
	window, _ := v["window"].([]any)
	if v["version"] != Version || !strings.HasPrefix(rel, "v") || len(window) != 3 || window[0] != "1.35" || window[2] != "1.37" {
		t.Fatalf("version -o json: %s", js)
	}
	if want := "provider-kubernetes " + Version + " (release " + rel + ", Kubernetes 1.35, 1.36, 1.37)\n"; text != want {
		t.Fatalf("version: %q, want %q", text, want)
	}
	if code, o, _ := run("--version"); code != reconcile.ExitOK || o != text {
		t.Fatalf("--version: exit %d %q", code, o)
	}
}
