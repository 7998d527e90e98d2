package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
)

// docs/reference.md's Exit codes table is the one home of the exit codes;
// each command's help states its own. The two agree: the "other commands"
// cell of code 3 names exactly the commands (reconcile and plan have their
// own column) whose help lists ExitRefused, and the cell of code 2 names
// every command that exits 2 without --yes.
func TestReferenceExitCodesAgreeWithHelp(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(docs.Dir(), "reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "## "):
			in = l == "## Exit codes"
		case in && strings.HasPrefix(l, "| "):
			cells := strings.Split(strings.Trim(l, "|"), "|")
			if len(cells) == 3 {
				rows[strings.TrimSpace(cells[0])] = cells[2]
			}
		}
	}
	named := func(cell string) map[string]bool {
		out := map[string]bool{}
		for _, m := range regexp.MustCompile("`([a-z][a-z-]*)`").FindAllStringSubmatch(cell, -1) {
			if _, ok := helps[m[1]]; ok {
				out[m[1]] = true
			}
		}
		return out
	}
	if rows["2"] == "" || rows["3"] == "" {
		t.Fatalf("docs/reference.md's Exit codes has no row for 2 or 3: %q", rows)
	}
	refused, usage := named(rows["3"]), named(rows["2"])
	for name, h := range helps {
		if name == "reconcile" || name == "plan" {
			continue
		}
		has3 := false
		for _, e := range h.exits {
			has3 = has3 || e.code == reconcile.ExitRefused
		}
		if has3 != refused[name] {
			t.Errorf("%s: its help lists exit 3: %v; docs/reference.md's Exit codes names it under 3: %v", name, has3, refused[name])
		}
		if strings.Contains(h.usage, "--yes") && !usage[name] {
			t.Errorf("%s exits 2 %s: docs/reference.md's Exit codes does not name it under 2", name, h.usage)
		}
	}
}
