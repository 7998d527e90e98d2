package status

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// FuzzRead feeds arbitrary bytes as the status document
// (/run/provider-kubernetes/status.yaml and its mirror): Read never panics,
// and what status -o text prints of an accepted document is one labelled
// line per value with no control or format character.
func FuzzRead(f *testing.F) {
	f.Add([]byte("phase: Converged\npin: v1.37.2\nwarnings: [a, b]\nmember: true\ntime: x\n"))
	f.Add([]byte("phase: \"Refused\\r\\e[1A\\e[2KConverged\\nReason: x\"\n"))
	f.Add([]byte("kubeadmEtcdBackups: {count: -1, bytes: -9223372036854775808}\n"))
	root := f.TempDir()
	file := filepath.Join(root, paths.StatusFile)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		d, err := Read(paths.Root(root), paths.StatusFile)
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := Print(&out, d, "text"); err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			if l == "" {
				continue
			}
			if k, _, ok := strings.Cut(l, ":"); !ok || strings.ContainsAny(k, "\t") || len(k) > 16 {
				t.Fatalf("an unlabelled line: %q", l)
			}
			for _, r := range l {
				if unsafeRune(r) {
					t.Fatalf("printed %U in %q", r, l)
				}
			}
		}
	})
}
