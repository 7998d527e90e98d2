package runner

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestExecStdinFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(p, []byte("verified bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Replacing the path after opening does not change what the command reads.
	if err := os.WriteFile(p+".new", []byte("swapped\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		t.Fatal(err)
	}
	res, err := Exec{}.Run(context.Background(), Cmd{Path: "/bin/cat", Stdin: f})
	if err != nil || string(res.Stdout) != "verified bytes\n" {
		t.Fatalf("%q %v", res.Stdout, err)
	}
}
