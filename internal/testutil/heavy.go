package testutil

import (
	"path/filepath"

	"github.com/kairos-io/provider-kubernetes/internal/testbin"
)

// Heavy takes the machine-wide lock of the test packages that keep both
// cores busy for many minutes with timing budgets of their own (the
// end-to-end nspawn clusters, the Kairos VM under TCG): `go test ./...`
// runs packages side by side, and either one starved by the other fails
// on its budgets. Release it with the returned function.
func Heavy() (func(), error) {
	return testbin.Lock(filepath.Join(testbin.CacheDir(), "heavy.lock"))
}
