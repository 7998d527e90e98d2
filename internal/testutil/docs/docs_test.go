package docs

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestCommands(t *testing.T) {
	page := "```sh\n# a comment\n$ plan --pin v1\nsudo grep 'x' \\\n  /var/log/a.log\noutput line\n```\n\nsudo not-in-a-block\n```yaml\nsudo: no\n```\n```sh\nsudo a\n```\n"
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.md"), []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := CommandsIn(filepath.Join(dir, "p.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"plan --pin v1", "grep 'x' /var/log/a.log", "a"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
