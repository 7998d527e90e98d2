package cli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
)

// complete runs real bash with `completion bash` sourced and asks its
// completion function, as bash would on a TAB, for each command line (the
// last word the one being completed): one line of candidates per line.
// It also returns what `complete -p provider-kubernetes` says.
func complete(t *testing.T, lines [][]string) (string, []string) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	code, script, errOut := run("completion", "bash")
	if code != reconcile.ExitOK {
		t.Fatalf("completion bash: exit %d %s", code, errOut)
	}
	p := filepath.Join(t.TempDir(), "completion.bash")
	var b strings.Builder
	b.WriteString(script + "\ncomplete -p provider-kubernetes\n")
	for _, l := range lines {
		words := append([]string{"provider-kubernetes"}, l...)
		for i, w := range words {
			words[i] = "'" + w + "'"
		}
		fmt.Fprintf(&b, "COMP_WORDS=(%s); COMP_CWORD=%d; COMPREPLY=(); _provider_kubernetes; echo \"${COMPREPLY[*]}\"\n",
			strings.Join(words, " "), len(words)-1)
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bash, "--norc", "--noprofile", p).CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(got) != len(lines)+1 {
		t.Fatalf("bash printed %d lines for %d questions:\n%s", len(got), len(lines)+1, out)
	}
	return got[0], got[1:]
}

func TestBashCompletesCommandsFlagsAndValues(t *testing.T) {
	cases := []struct {
		line []string
		want string
	}{
		{[]string{"pl"}, "plan"},
		{[]string{"re"}, "reconcile reset restore-etcd"},
		{[]string{"plan", "--pi"}, "--pin"},
		{[]string{"plan", "-o", "y"}, "yaml"},
		{[]string{"status", "--root", "/x", "-o", ""}, "text json yaml"},
		{[]string{"status", "--clu"}, "--cluster"},
		{[]string{"pin", "s"}, "show set"},
		{[]string{"pin", "set", "--d"}, "--dry-run"},
		{[]string{"help", "val"}, "validate"},
		{[]string{"completion", "f"}, "fish"},
		{[]string{"plan", "--root", ""}, ""}, // a path: bash's file names
		{[]string{"validate", "fi"}, ""},     // FILE: bash's file names
	}
	var lines [][]string
	for _, c := range cases {
		lines = append(lines, c.line)
	}
	reg, got := complete(t, lines)
	if reg != "complete -o default -F _provider_kubernetes provider-kubernetes" {
		t.Errorf("complete -p: %q", reg)
	}
	for i, c := range cases {
		if got[i] != c.want {
			t.Errorf("%v<TAB>: %q, want %q", c.line, got[i], c.want)
		}
	}
}

// The script cannot drift from the commands: every command of the
// dispatch table completes from its first letters, and every flag its
// FlagSet parses completes from its name.
func TestBashCompletesEveryCommandAndFlag(t *testing.T) {
	var lines [][]string
	var want []string
	for _, c := range commands {
		lines, want = append(lines, []string{c.name}), append(want, c.name)
		flagsOf(context.Background(), c).VisitAll(func(f *flag.Flag) {
			d := compFlag{name: f.Name}.dashed()
			lines, want = append(lines, []string{c.name, d}), append(want, d)
		})
	}
	if len(lines) < 50 {
		t.Fatalf("only %d questions: the table scan is broken", len(lines))
	}
	_, got := complete(t, lines)
	for i, l := range lines {
		if !strings.Contains(" "+got[i]+" ", " "+want[i]+" ") {
			t.Errorf("%v<TAB>: %q lacks %s", l, got[i], want[i])
		}
	}
}

func TestCompletionScripts(t *testing.T) {
	for _, sh := range shells {
		code, out, errOut := run("completion", sh)
		if code != reconcile.ExitOK || errOut != "" {
			t.Fatalf("completion %s: exit %d %s", sh, code, errOut)
		}
		for _, c := range commands {
			if !strings.Contains(out, c.name) {
				t.Errorf("completion %s lacks %s", sh, c.name)
			}
		}
	}
	_, fish, _ := run("completion", "fish")
	for _, want := range []string{
		"complete -c provider-kubernetes -n __fish_use_subcommand -a plan -d 'What the next boot would do, changing nothing'\n",
		"complete -c provider-kubernetes -n '__fish_seen_subcommand_from plan' -s o -x -a 'text json yaml' -d 'output: text, json or yaml'\n",
		"complete -c provider-kubernetes -n '__fish_seen_subcommand_from plan' -l member -d 'whether this node is already a cluster member'\n",
		"complete -c provider-kubernetes -n '__fish_seen_subcommand_from plan' -l root -r -F -d 'host root every path is read under'\n",
		"complete -c provider-kubernetes -n '__fish_seen_subcommand_from pin' -a 'show set'\n",
	} {
		if !strings.Contains(fish, want) {
			t.Errorf("completion fish lacks %q", want)
		}
	}
	for _, args := range [][]string{{"completion"}, {"completion", "tcsh"}, {"completion", "bash", "zsh"}} {
		if code, out, errOut := run(args...); code != reconcile.ExitUsage || out != "" || !strings.Contains(errOut, "run 'provider-kubernetes completion --help'") {
			t.Errorf("%v: exit %d %q %q", args, code, out, errOut)
		}
	}
}
