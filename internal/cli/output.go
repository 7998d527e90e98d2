package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// formats are what -o takes on every command that prints a report: one
// set, checked in one place (parse), so no command can accept a format
// another refuses.
var formats = []string{"text", "json", "yaml"}

// outputFlag defines the -o flag of a command that prints a report; parse
// refuses a value outside formats as a usage error.
func outputFlag(fs *flagSet) *string {
	return fs.String("o", "text", "output: "+formatList())
}

// checkOutput is parse's check of -o, for a command that has it: the
// problem, or "" when the value is one of formats.
func checkOutput(fs *flagSet) string {
	f := fs.Lookup("o")
	if f == nil {
		return ""
	}
	for _, s := range formats {
		if f.Value.String() == s {
			return ""
		}
	}
	return "-o must be " + formatList() + ", got " + plan.Described(f.Value.String())
}

// formatList is formats as a sentence says them: "text, json or yaml".
func formatList() string {
	return strings.Join(formats[:len(formats)-1], ", ") + " or " + formats[len(formats)-1]
}

// emit writes v in format: json (indented, as written: no HTML escaping)
// or yaml (its json field names), or calls text for a person.
func emit(w io.Writer, format string, v any, text func(io.Writer) error) error {
	switch format {
	case "json":
		e := json.NewEncoder(w)
		e.SetEscapeHTML(false)
		e.SetIndent("", "  ")
		return e.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case "text":
		return text(w)
	}
	return fmt.Errorf("unknown output format %s", plan.Described(format))
}

// flagCollector is the stdout a command is run with to learn its flags:
// its --help hands the collector its FlagSet instead of printing the help
// (parseFlags), so completion and the tests read the flags each command
// really parses, not a copy.
type flagCollector struct{ set *flag.FlagSet }

func (*flagCollector) Write(p []byte) (int, error) { return len(p), nil }

// flagsOf is the FlagSet command c parses (pin's: pin set's, a superset
// of pin show's).
func flagsOf(ctx context.Context, c command) *flag.FlagSet {
	col := &flagCollector{}
	c.call(ctx, []string{"--help"}, nil, col, io.Discard)
	if col.set == nil {
		return flag.NewFlagSet(c.name, flag.ContinueOnError)
	}
	return col.set
}
