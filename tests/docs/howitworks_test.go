package docs_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
)

// how-it-works.md's bounds are the code's: the longest path of a pass with
// the default budgets, inside the pass bound.
func TestHowItWorksBounds(t *testing.T) {
	text := oneLine(section(t, read(t, "how-it-works.md"), "## Repair, gates and failures"))
	total := reconcile.DefaultBudgets().Total()
	// Whole minutes, rounded up: the page gives an upper bound.
	want := fmt.Sprintf("adds up to %d minutes with the defaults", (total+time.Minute-1)/time.Minute)
	if !strings.Contains(text, want) {
		t.Errorf("docs/how-it-works.md does not say %q (the default budgets add up to %s)", want, total)
	}
	if total > reconcile.PassBound {
		t.Errorf("the default budgets add up to %s, above the pass bound %s the page calls them inside", total, reconcile.PassBound)
	}
}
