package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pause")
	out, err := testutil.Command(t, 5*time.Minute, "go", "build", "-ldflags", "-X main.version=3.10.2", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return bin
}

func TestPauseAnswersVersion(t *testing.T) {
	out, err := testutil.Command(t, 30*time.Second, build(t), "-v").Output()
	if err != nil || strings.TrimSpace(string(out)) != "pause.go version 3.10.2" {
		t.Fatalf("%q %v", out, err)
	}
}

func TestPauseWaitsForTERM(t *testing.T) {
	cmd := testutil.Command(t, time.Minute, build(t))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("exited on its own: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after TERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("did not exit on SIGTERM")
	}
}
