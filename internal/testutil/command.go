package testutil

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Command is exec.Command bounded for a test: the process is killed after
// limit or when the test ends, whichever comes first, so a hung command
// fails its test instead of holding the whole binary until go test's -timeout.
func Command(t testing.TB, limit time.Duration, name string, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Tail is the last n lines of s (a log shown when a test fails).
func Tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
