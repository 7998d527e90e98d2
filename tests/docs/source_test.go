package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
)

// repo is the checkout's root.
func repo() string { return filepath.Dir(docs.Dir()) }

// pkgFiles parses the non-test Go files of a package directory (relative
// to the repository).
func pkgFiles(t *testing.T, dir string) []*ast.File {
	t.Helper()
	fset := token.NewFileSet()
	ents, err := os.ReadDir(filepath.Join(repo(), dir))
	if err != nil {
		t.Fatal(err)
	}
	var out []*ast.File
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(repo(), dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

// consts returns the package's string constants whose name keep accepts,
// name to value.
func consts(t *testing.T, dir string, keep func(name string) bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range pkgFiles(t, dir) {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i >= len(vs.Values) || !keep(n.Name) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						out[n.Name] = v
					}
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no constants found", dir)
	}
	return out
}

// sentinels returns the messages of the package's `Err... = errors.New("...")`.
func sentinels(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range pkgFiles(t, dir) {
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Err") || i >= len(vs.Values) {
					continue
				}
				if c, ok := vs.Values[i].(*ast.CallExpr); ok && len(c.Args) == 1 {
					if lit, ok := c.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						out[name.Name], _ = strconv.Unquote(lit.Value)
					}
				}
			}
			return true
		})
	}
	return out
}

func values(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// Every refusal code, failure reason, reset reason and restore refusal the
// code has is a section or a row of docs/troubleshooting.md, and every
// snapshot outcome a row of docs/backups.md: a new one fails here until
// it is documented.
func TestEveryCodeIsDocumented(t *testing.T) {
	trouble, backups := read(t, "troubleshooting.md"), read(t, "backups.md")
	isCode := func(string) bool { return true }
	var codes []string
	for _, f := range pkgFiles(t, "pkg/plan") {
		ast.Inspect(f, func(n ast.Node) bool {
			if vs, ok := n.(*ast.ValueSpec); ok {
				if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "Code" {
					for _, v := range vs.Values {
						s, _ := strconv.Unquote(v.(*ast.BasicLit).Value)
						codes = append(codes, s)
					}
				}
			}
			return true
		})
	}
	if len(codes) < 12 {
		t.Fatalf("pkg/plan: %d refusal codes found", len(codes))
	}
	for _, c := range codes {
		if !strings.Contains(trouble, "\n### `"+c+"`\n") {
			t.Errorf("refusal %s has no section in docs/troubleshooting.md", c)
		}
	}
	for _, r := range values(consts(t, "pkg/plan", func(n string) bool { return strings.HasPrefix(n, "Reason") })) {
		if !strings.Contains(trouble, "`"+r+"`") {
			t.Errorf("refusal reason %s is not in docs/troubleshooting.md", r)
		}
	}
	for _, r := range values(consts(t, "internal/reconcile", func(n string) bool { return strings.HasPrefix(n, "Reason") })) {
		if !strings.Contains(trouble, "\n### `"+r+"`\n") {
			t.Errorf("failure reason %s has no section in docs/troubleshooting.md", r)
		}
	}
	for _, r := range values(consts(t, "internal/reset", func(n string) bool { return strings.HasPrefix(n, "Reason") })) {
		if !strings.Contains(trouble, "| `"+r+"` |") {
			t.Errorf("reset reason %s has no row in docs/troubleshooting.md", r)
		}
	}
	for _, m := range values(sentinels(t, "internal/restore")) {
		if !strings.Contains(trouble, "| `"+m+"` |") {
			t.Errorf("restore refusal %q has no row in docs/troubleshooting.md", m)
		}
	}
	outcomes := consts(t, "internal/etcdsnap", isCode)
	for _, name := range []string{"Taken", "SkippedAlreadyTaken", "SkippedEncryptionUnconfirmed", "SkippedExternalEtcd", "SkippedEtcdctlMissing", "SkippedInsufficientSpace", "Failed"} {
		if _, ok := outcomes[name]; !ok {
			t.Fatalf("internal/etcdsnap has no outcome %s", name)
		}
	}
	for name, o := range outcomes {
		if (strings.HasPrefix(name, "Skipped") || name == "Taken" || name == "Failed") && !strings.Contains(backups, "| `"+o+"` |") {
			t.Errorf("snapshot outcome %s has no row in docs/backups.md", o)
		}
	}
}
