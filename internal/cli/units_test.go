package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/system"
)

// Every provider-kubernetes command line a shipped unit runs is one the
// CLI accepts: its flags parse (a unit with a bad flag fails on every
// boot). Checked without running anything: with one extra positional
// argument the parser gets through every flag, then stops with its
// "unexpected arguments" usage error.
func TestUnitCommandLinesParse(t *testing.T) {
	seen := 0
	for _, u := range system.Units() {
		for _, l := range strings.Split(string(u.Data), "\n") {
			rest, ok := strings.CutPrefix(l, "ExecStart=/usr/bin/provider-kubernetes ")
			if !ok {
				continue
			}
			seen++
			args := append(strings.Fields(rest), "--root", t.TempDir(), "unexpected-by-design")
			var out, errb bytes.Buffer
			code := Main(context.Background(), args, nil, &out, &errb)
			if code != 2 || !strings.Contains(errb.String(), "unexpected arguments: [unexpected-by-design]") {
				t.Errorf("%s: %q exits %d: %s", u.Path, rest, code, errb.String())
			}
		}
	}
	if seen < 4 {
		t.Fatalf("only %d provider-kubernetes command lines in the units", seen)
	}
}
