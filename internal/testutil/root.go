package testutil

import (
	"os"
	"testing"
)

// RequireRoot skips a test that writes root:root files unless it runs as
// root. Under CI (CI=true), which runs as root, it fails instead: a skip
// there would hide the test.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Getuid() == 0 {
		return
	}
	SkipUnlessCI(t, "writes root:root files: needs root (CI runs as root)")
}
