package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// shells are what `completion` writes a script for.
var shells = []string{"bash", "zsh", "fish"}

// compCommand is one command as completion offers it: the dispatch
// table's name, its help's summary, the flags its FlagSet parses and the
// words its first argument may be.
type compCommand struct {
	name, summary string
	flags         []compFlag
	words         []string
}

// compFlag is a flag: its name, usage, whether it takes a value, and the
// values it takes when they are a fixed set (-o's formats).
type compFlag struct {
	name, usage string
	value       bool
	values      []string
}

// dashed is the flag as completion offers it: -o, --root.
func (f compFlag) dashed() string {
	if len(f.name) == 1 {
		return "-" + f.name
	}
	return "--" + f.name
}

// completionModel is every command (and help) with its flags, read from
// the dispatch table and each command's own FlagSet (flagsOf), so a
// script cannot offer a flag the command does not parse.
func completionModel(ctx context.Context) []compCommand {
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	out := []compCommand{{name: "help", summary: "Every command's synopsis, or one command's help.", words: names}}
	for _, c := range commands {
		cc := compCommand{name: c.name, summary: firstSentence(helps[c.name].summary), words: c.words}
		flagsOf(ctx, c).VisitAll(func(f *flag.Flag) {
			cf := compFlag{name: f.Name, usage: firstSentence(f.Usage), value: true}
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				cf.value = false
			}
			if f.Name == "o" {
				cf.values = formats
			}
			cc.flags = append(cc.flags, cf)
		})
		out = append(out, cc)
	}
	return out
}

// firstSentence is s up to its first ". " or "; ", for a one-line
// description.
func firstSentence(s string) string {
	for _, sep := range []string{". ", "; "} {
		if i := strings.Index(s, sep); i > 0 {
			s = s[:i]
		}
	}
	return strings.TrimSuffix(s, ".")
}

// cmdCompletion is `provider-kubernetes completion bash|zsh|fish`.
func cmdCompletion(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("completion", stdout, stderr)
	shell, code, ok := parseArg(fs, args)
	if !ok {
		return code
	}
	model := completionModel(ctx)
	var script string
	switch shell {
	case "bash":
		script = bashScript(model)
	case "zsh":
		script = zshScript(model)
	case "fish":
		script = fishScript(model)
	case "":
		return fs.usageError("completion: the shell is missing: completion " + strings.Join(shells, "|"))
	default:
		return fs.usageError("completion: the shell must be " + strings.Join(shells, ", ") + ", got " + plan.Described(shell))
	}
	if _, err := io.WriteString(stdout, script); err != nil {
		return reconcile.ExitFailed
	}
	return reconcile.ExitOK
}

// bashScript completes the command (its first word), the words of its
// first argument, its flags after a '-', and -o's values; anything else
// (a flag's path, validate's FILE) falls back to bash's file names.
func bashScript(model []compCommand) string {
	var b strings.Builder
	var names []string
	for _, c := range model {
		names = append(names, c.name)
	}
	b.WriteString(`# bash completion for provider-kubernetes, written by 'provider-kubernetes completion bash'.
_provider_kubernetes() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    COMPREPLY=()
    if [[ ${COMP_CWORD} -eq 1 ]]; then
        COMPREPLY=($(compgen -W "` + strings.Join(names, " ") + `" -- "${cur}"))
        return
    fi
    case "${COMP_WORDS[1]}" in
`)
	for _, c := range model {
		fmt.Fprintf(&b, "    %s)\n", c.name)
		var valued, fixed []string
		for _, f := range c.flags {
			if f.values != nil {
				fixed = append(fixed, fmt.Sprintf("        %s|-%s) COMPREPLY=($(compgen -W %q -- \"${cur}\")); return ;;\n",
					"-"+f.name, "-"+f.name, strings.Join(f.values, " ")))
			} else if f.value {
				valued = append(valued, "-"+f.name, "--"+f.name)
			}
		}
		if len(fixed)+len(valued) > 0 {
			b.WriteString("        case \"${prev}\" in\n")
			for _, l := range fixed {
				b.WriteString("    " + l)
			}
			if len(valued) > 0 {
				fmt.Fprintf(&b, "            %s) return ;;\n", strings.Join(valued, "|"))
			}
			b.WriteString("        esac\n")
		}
		var flags []string
		for _, f := range c.flags {
			flags = append(flags, f.dashed())
		}
		if len(flags) > 0 {
			fmt.Fprintf(&b, "        if [[ ${cur} == -* ]]; then COMPREPLY=($(compgen -W %q -- \"${cur}\")); return; fi\n", strings.Join(flags, " "))
		}
		if len(c.words) > 0 {
			fmt.Fprintf(&b, "        if [[ ${COMP_CWORD} -eq 2 ]]; then COMPREPLY=($(compgen -W %q -- \"${cur}\")); fi\n", strings.Join(c.words, " "))
		}
		b.WriteString("        ;;\n")
	}
	b.WriteString(`    esac
}
complete -o default -F _provider_kubernetes provider-kubernetes
`)
	return b.String()
}

// zshScript is the bash script through zsh's bashcompinit, which runs a
// bash completion function as it is: one logic, the one tested in bash.
func zshScript(model []compCommand) string {
	return `# zsh completion for provider-kubernetes, written by 'provider-kubernetes completion zsh':
# the bash completion, run by zsh's bashcompinit (compinit loaded first when it is not).
(( $+functions[compdef] )) || { autoload -U +X compinit && compinit }
autoload -U +X bashcompinit && bashcompinit
` + bashScript(model)
}

// fishScript completes the command, its first argument's words, its
// flags (with their usage; -o with its values) after the command.
func fishScript(model []compCommand) string {
	q := func(s string) string {
		return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
	}
	var b strings.Builder
	b.WriteString("# fish completion for provider-kubernetes, written by 'provider-kubernetes completion fish'.\n")
	b.WriteString("complete -c provider-kubernetes -f\n")
	for _, c := range model {
		fmt.Fprintf(&b, "complete -c provider-kubernetes -n __fish_use_subcommand -a %s -d %s\n", c.name, q(c.summary))
	}
	for _, c := range model {
		cond := q("__fish_seen_subcommand_from " + c.name)
		if len(c.words) > 0 {
			fmt.Fprintf(&b, "complete -c provider-kubernetes -n %s -a %s\n", cond, q(strings.Join(c.words, " ")))
		}
		if c.name == "validate" {
			fmt.Fprintf(&b, "complete -c provider-kubernetes -n %s -F\n", cond)
		}
		flags := append([]compFlag(nil), c.flags...)
		sort.SliceStable(flags, func(i, j int) bool { return flags[i].name < flags[j].name })
		for _, f := range flags {
			opt := "-l " + f.name
			if len(f.name) == 1 {
				opt = "-s " + f.name
			}
			switch {
			case f.values != nil:
				opt += " -x -a " + q(strings.Join(f.values, " "))
			case f.value:
				opt += " -r -F"
			}
			fmt.Fprintf(&b, "complete -c provider-kubernetes -n %s %s -d %s\n", cond, opt, q(f.usage))
		}
	}
	return b.String()
}
