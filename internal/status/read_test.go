package status

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// What `status` prints must be what a pass wrote: a status file over 1 MiB
// is refused, naming the path, without being parsed (what-it-refuses.md);
// one of exactly 1 MiB is read.
func TestReadRefusesAStatusOverOneMiB(t *testing.T) {
	root := t.TempDir()
	full := filepath.Join(root, paths.StatusFile)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(n int) {
		t.Helper()
		doc := []byte("phase: Converged\nnodeVersion: v1.37.2\n#")
		b := append(doc, bytes.Repeat([]byte("x"), n-len(doc)-1)...)
		if err := os.WriteFile(full, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	write(1 << 20)
	d, err := Read(paths.Root(root), paths.StatusFile)
	if err != nil || d.Phase != "Converged" || d.NodeVersion != "v1.37.2" {
		t.Fatalf("a status of exactly 1 MiB: %+v, %v", d, err)
	}

	write(1<<20 + 1)
	d, err = Read(paths.Root(root), paths.StatusFile)
	if !errors.Is(err, fsutil.ErrTooLarge) || !strings.Contains(err.Error(), full) {
		t.Fatalf("a status of 1 MiB + 1 byte: %+v, %v; want it refused as too large, naming the path", d, err)
	}
}
