package docs_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// reference.md's Commands table has a row for every command the binary's
// own `help` lists and none it does not; the JSON `plan -o json` prints has
// only the keys the section names, as has the one `version -o json`
// prints, and the section names every action
// pkg/plan can plan.
func TestReferenceCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the provider: not in -short mode")
	}
	bin := provider(t)
	out, err := exec.Command(bin, "help").CombinedOutput()
	if err != nil {
		t.Fatalf("provider-kubernetes help: %v\n%s", err, out)
	}
	var cmds []string
	for _, m := range regexp.MustCompile(`(?m)^\s+provider-kubernetes ([a-z][a-z-]*)`).FindAllStringSubmatch(string(out), -1) {
		cmds = append(cmds, m[1])
	}
	cmds = uniqStrings(cmds)
	if len(cmds) < 10 {
		t.Fatalf("help lists %v: the scan is broken\n%s", cmds, out)
	}
	sec := section(t, read(t, "reference.md"), "## Commands")
	rows := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z][a-z-]*)").FindAllStringSubmatch(sec, -1) {
		rows[m[1]] = true
	}
	for _, c := range cmds {
		if !rows[c] {
			t.Errorf("provider-kubernetes help lists %s: no row in docs/reference.md's Commands", c)
		}
	}
	for r := range rows {
		if !contains(cmds, r) {
			t.Errorf("docs/reference.md's Commands has a row for %s: provider-kubernetes help does not list it", r)
		}
	}

	text := oneLine(sec)
	jsonKeysNamed(t, text, "", 0, bin, "plan", "-o", "json", "--pin", "v1.37.2", "--bundled", "v1.37.2", "--node-version", "v1.36.3",
		"--cluster-version", "v1.36.3", "--role", "init", "--member=true")
	// So does `version -o json`, and `validate -o json` of a valid file and
	// of an invalid one.
	jsonKeysNamed(t, text, "", 0, bin, "version", "-o", "json")
	jsonKeysNamed(t, text, testutil.CloudConfig("init", "v1.37.2")+"  providerConfig:\n    budget.verify: 6m\n", 0, bin, "validate", "-o", "json", "-")
	jsonKeysNamed(t, text, "cluster: {}\n", 1, bin, "validate", "-o", "json", "-")

	i := strings.Index(text, "Actions: ")
	if i < 0 {
		t.Fatal("docs/reference.md's Commands lists no actions")
	}
	listed := regexp.MustCompile("`([a-z-]+)`").FindAllStringSubmatch(text[i:i+strings.Index(text[i:], ".")], -1)
	var got []string
	for _, m := range listed {
		got = append(got, m[1])
	}
	want := values(consts(t, "pkg/plan", func(n string) bool { return strings.HasPrefix(n, "Action") }))
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("docs/reference.md lists the actions %v; pkg/plan has %v", got, want)
	}
}

// jsonKeysNamed runs the command with stdin, wants it to exit with code
// and every key of the JSON object it prints named (in quotes) in text.
func jsonKeysNamed(t *testing.T, text, stdin string, code int, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.Output()
	var doc map[string]json.RawMessage
	if jerr := json.Unmarshal(out, &doc); jerr != nil || len(doc) == 0 || cmd.ProcessState.ExitCode() != code {
		t.Fatalf("%s: %v %v, want exit %d\n%s", strings.Join(args, " "), err, jerr, code, out)
	}
	for k, v := range doc {
		if !strings.Contains(text, `"`+k+`"`) {
			t.Errorf("%s prints %q: not in docs/reference.md's Commands", strings.Join(args, " "), k)
		}
		// And the keys of an object it holds (plan's facts).
		var inner map[string]json.RawMessage
		if json.Unmarshal(v, &inner) != nil {
			continue
		}
		for ik := range inner {
			if !strings.Contains(text, `"`+ik+`"`) {
				t.Errorf("%s prints %s.%s: not in docs/reference.md's Commands", strings.Join(args, " "), k, ik)
			}
		}
	}
}

// The completion row's bash line, run as written by real bash with the
// built binary on PATH, registers a completion that completes a command
// and a flag; its fish and zsh lines name scripts the binary prints.
func TestReferenceCompletion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the provider: not in -short mode")
	}
	bin := provider(t)
	row := ""
	for _, l := range strings.Split(section(t, read(t, "reference.md"), "## Commands"), "\n") {
		if strings.HasPrefix(l, "| `completion ") {
			row = strings.ReplaceAll(l, `\|`, "|")
		}
	}
	var lines []string
	for _, m := range regexp.MustCompile("`([^`]*provider-kubernetes completion [^`]*)`").FindAllStringSubmatch(row, -1) {
		lines = append(lines, m[1])
	}
	if len(lines) != 3 || lines[0] != "source <(provider-kubernetes completion bash)" {
		t.Fatalf("the completion row shows %q", lines)
	}
	script := lines[0] + `
complete -p provider-kubernetes
COMP_WORDS=(provider-kubernetes val); COMP_CWORD=1; _provider_kubernetes; echo "${COMPREPLY[*]}"
COMP_WORDS=(provider-kubernetes drain --for); COMP_CWORD=2; _provider_kubernetes; echo "${COMPREPLY[*]}"
`
	cmd := exec.Command("bash", "--norc", "--noprofile", "-c", script)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if want := "complete -o default -F _provider_kubernetes provider-kubernetes\nvalidate\n--force\n"; err != nil || string(out) != want {
		t.Fatalf("bash: %v\n%s\nwant\n%s", err, out, want)
	}
	for _, l := range lines[1:] {
		shell := strings.Fields(strings.TrimPrefix(l, "source <("))[2]
		shell = strings.TrimSuffix(shell, ")")
		if out, err := exec.Command(bin, "completion", shell).Output(); err != nil || !strings.Contains(string(out), "provider-kubernetes") {
			t.Errorf("%s: completion %s: %v", l, shell, err)
		}
	}
}

// what-it-refuses.md's plan section says which version flags are usage
// errors (exit 2) and that --pin is refused as a pass refuses it
// (InvalidPin, exit 3): the binary does what it says for "1.37.2".
func TestWhatItRefusesPlanVersionFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the provider: not in -short mode")
	}
	bin := provider(t)
	sec := oneLine(section(t, read(t, "what-it-refuses.md"), "## `plan`"))
	i, j := strings.Index(sec, "`worker`, and a "), strings.Index(sec, " that is not an exact")
	pin := strings.Index(sec, "`--pin` is taken as written")
	if i < 0 || j < i || pin < 0 || !strings.Contains(sec[pin:], "`InvalidPin`, exit 3") {
		t.Fatalf("what-it-refuses.md's plan section no longer says which version flags are usage errors and what --pin does:\n%s", sec)
	}
	facts := []string{"--pin", "v1.37.2", "--bundled", "v1.37.2", "--node-version", "v1.36.3", "--cluster-version", "v1.36.3",
		"--verified", "v1.36.3", "--role", "controlplane", "--member"}
	with := func(flag string) []string {
		args := append([]string{"plan"}, facts...)
		for k := range args {
			if args[k] == flag {
				args[k+1] = "1.37.2"
			}
		}
		return args
	}
	flags := regexp.MustCompile("`(--[a-z-]+)`").FindAllStringSubmatch(sec[i:j], -1)
	if len(flags) != 4 {
		t.Fatalf("the usage-error sentence names %v", flags)
	}
	for _, f := range flags {
		if code, out := exitCode(t, bin, with(f[1])); code != 2 {
			t.Errorf("plan %s 1.37.2: exit %d, what-it-refuses.md says a usage error (2)\n%s", f[1], code, out)
		}
	}
	if code, out := exitCode(t, bin, with("--pin")); code != 3 || !strings.Contains(out, "REFUSE InvalidPin") {
		t.Errorf("plan --pin 1.37.2: exit %d, what-it-refuses.md says InvalidPin, exit 3\n%s", code, out)
	}
}

// exitCode runs bin with args: its exit code and its output.
func exitCode(t *testing.T, bin string, args []string) (int, string) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	if ee != nil {
		return ee.ExitCode(), string(out)
	}
	return 0, string(out)
}
