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

func TestE2EBlocksAndPage(t *testing.T) {
	page := "# p\n\n```sh\nsudo provider-kubernetes status\nsudo provider-kubernetes status -o json\n```\n\nIt prints:\n\n  ```text\n  Phase: x\n    indented\n  ```\n\n<!-- e2e -->\n\n```sh\n$ kubectl get nodes\nsudo reboot\n```\n\n```yaml\nsudo: no\n```\n\n```text\nnot an output: a yaml block came between\n```\n\n<!-- e2e -->\ntext between: the marker is not the line before the fence\n```sh\nsudo grep x \\\n  /var/log/a.log\nsudo provider-kubernetes status\n```\n"
	dir := t.TempDir()
	path := filepath.Join(dir, "p.md")
	if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	blocks, err := BlocksIn(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 3 || blocks[0].E2E || !blocks[1].E2E || blocks[2].E2E || blocks[1].Line != 17 {
		t.Fatalf("blocks %+v", blocks)
	}
	if blocks[0].Output != "Phase: x\n  indented\n" || blocks[1].Output != "" || blocks[2].Output != "" {
		t.Fatalf("outputs %q %q %q", blocks[0].Output, blocks[1].Output, blocks[2].Output)
	}
	p, err := OpenAt(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"kubectl get nodes", "reboot"}; !reflect.DeepEqual(p.E2E(), want) {
		t.Fatalf("e2e %q, want %q", p.E2E(), want)
	}
	// Exactly the prefix wins over longer commands that start with it; a
	// command shown twice counts once.
	if c, err := p.Command("provider-kubernetes status"); err != nil || c != "provider-kubernetes status" || p.Output(c) != blocks[0].Output {
		t.Fatalf("%q %v", c, err)
	}
	if _, err := p.Command("provider-kubernetes"); err == nil {
		t.Fatal("an ambiguous prefix was accepted")
	}
	if _, err := p.Command("kubectl"); err == nil {
		t.Fatal("an end-to-end command was selected")
	}
	if want := []string{"provider-kubernetes status -o json", "grep x /var/log/a.log"}; !reflect.DeepEqual(p.Unrun(), want) {
		t.Fatalf("unrun %q, want %q", p.Unrun(), want)
	}
	if _, err := p.Command("grep x"); err != nil {
		t.Fatal(err)
	}
	if len(p.Unrun()) != 1 {
		t.Fatalf("unrun %q", p.Unrun())
	}
	// End-to-end commands are selected apart, and recorded apart.
	if _, err := p.E2ECommand("provider-kubernetes status"); err == nil {
		t.Fatal("a local command was selected as an end-to-end one")
	}
	if want := []string{"kubectl get nodes", "reboot"}; !reflect.DeepEqual(p.UnrunE2E(), want) {
		t.Fatalf("unrun e2e %q, want %q", p.UnrunE2E(), want)
	}
	if c, err := p.E2ECommand("reboot"); err != nil || c != "reboot" {
		t.Fatalf("%q %v", c, err)
	}
	if want := []string{"kubectl get nodes"}; !reflect.DeepEqual(p.UnrunE2E(), want) {
		t.Fatalf("unrun e2e %q, want %q", p.UnrunE2E(), want)
	}
}

func TestUnclosedBlock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.md")
	if err := os.WriteFile(path, []byte("```sh\nsudo a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := BlocksIn(path); err == nil {
		t.Fatal("an unclosed block was accepted")
	}
}

func TestTableRow(t *testing.T) {
	page := "| path | mode |\n|---|---|\n| `/a/b` | 0640 |\n| `/a/bc` | 0600 |\n|`x`|no space|\n| `dup` | 1 |\n| `dup` | 2 |\n"
	path := filepath.Join(t.TempDir(), "p.md")
	if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := TableRowIn(path, "/a/b"); err != nil || !reflect.DeepEqual(got, []string{"`/a/b`", "0640"}) {
		t.Fatalf("/a/b: %q %v", got, err)
	}
	for _, name := range []string{"/a", "dup", "missing"} {
		if got, err := TableRowIn(path, name); err == nil {
			t.Errorf("%s: %q, want an error", name, got)
		}
	}
}

func TestFileMode(t *testing.T) {
	// The real page: the reconcile log's row.
	if m, err := FileMode("/var/log/provider-kubernetes-reconcile.log"); err != nil || m != 0o640 {
		t.Fatalf("%o %v", m, err)
	}
	if _, err := FileMode("/no/such/file"); err == nil {
		t.Fatal("a path the table does not list has a mode")
	}
}
