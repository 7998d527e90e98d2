package testutil

import (
	"os"
	"strings"
	"testing"
)

// InCI is the one place that decides whether the tests run in CI: CI set
// to anything but empty, "0" or "false" (CI systems set CI=true; .ci/run
// is run with it). Under CI a test that needs root, the VM, systemd,
// containerd or nspawn fails instead of skipping: CI installs all of it,
// so a skip there would hide a broken setup.
func InCI() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv("CI"))) {
	case "", "0", "false", "no":
		return false
	}
	return true
}

// SkipUnlessCI skips t with why, except under CI, where it fails: what a
// test needs is missing from a machine that must have it.
func SkipUnlessCI(t testing.TB, why string) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s: CI must run this test (CI=%q)", why, os.Getenv("CI"))
	}
	t.Skip(why)
}
