package testutil

import (
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// InPrivateMountNamespace runs the calling test again, as root, in a
// process of its own in a new mount namespace whose mounts are private,
// and reports whether this is that process: the caller goes on with the
// test when it is, and returns when it is not (the re-run's result is
// this test's). Bind mounts a test makes there leave no trace on the host.
func InPrivateMountNamespace(t *testing.T) bool {
	t.Helper()
	const env = "PROVIDER_KUBERNETES_TEST_IN_MOUNTNS"
	if os.Getenv(env) == t.Name() {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			t.Fatalf("make the mounts private: %v", err)
		}
		return true
	}
	RequireRoot(t)
	cmd := Command(t, 5*time.Minute, os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1", "-test.short")
	cmd.Env = append(os.Environ(), env+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("the test in a private mount namespace: %v\n%s", err, out)
	}
	return false
}
