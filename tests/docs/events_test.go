package docs_test

import (
	"go/ast"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// logCall is one log line the code writes: its event (the msg) and the
// keys it may carry.
type logCall struct {
	event string
	keys  map[string]bool
	at    string
}

// actionEvent stands for `string(a)`: the line of each step of a plan.
const actionEvent = "<action>"

// logCalls finds every slog call of the provider's own code (internal/,
// pkg/, cmd/provider-kubernetes; not the test helpers or the build tools):
// X.Log.Info/Warn/Error(msg, key, value, ...), log.Info(...), and
// X.Log.Log(ctx, level, msg, ...), with msg a string, a constant (this
// package's or another's) or a local variable set from constants, and the
// keys literal or from an attrs slice built in the same function.
func logCalls(t *testing.T) []logCall {
	t.Helper()
	var dirs []string
	for _, top := range []string{"internal", "pkg", "cmd/provider-kubernetes"} {
		err := filepath.WalkDir(filepath.Join(repo(), top), func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(repo(), p)
			if strings.HasPrefix(rel, "internal/testutil") || rel == "internal/testbin" || rel == "internal/imagetree" {
				return filepath.SkipDir
			}
			dirs = append(dirs, rel)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	constsOf := map[string]map[string]string{} // package name -> its string constants
	files := map[string][]*ast.File{}
	for _, d := range dirs {
		fs := pkgFiles(t, d)
		if len(fs) == 0 {
			continue
		}
		files[d] = fs
		name := fs[0].Name.Name
		if constsOf[name] == nil {
			constsOf[name] = map[string]string{}
		}
		for _, f := range fs {
			for _, decl := range f.Decls {
				g, ok := decl.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, s := range g.Specs {
					vs := s.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							if v, ok := str(vs.Values[i]); ok {
								constsOf[name][n.Name] = v
							}
						}
					}
				}
			}
		}
	}
	var out []logCall
	for d, fs := range files {
		pkg := fs[0].Name.Name
		resolve := func(e ast.Expr) (string, bool) {
			switch x := e.(type) {
			case *ast.BasicLit:
				return str(x)
			case *ast.Ident:
				v, ok := constsOf[pkg][x.Name]
				return v, ok
			case *ast.SelectorExpr:
				if p, ok := x.X.(*ast.Ident); ok {
					v, ok := constsOf[p.Name][x.Sel.Name]
					return v, ok
				}
			case *ast.CallExpr:
				if f, ok := x.Fun.(*ast.Ident); ok && f.Name == "string" && len(x.Args) == 1 {
					if a, ok := x.Args[0].(*ast.Ident); ok && a.Name == "a" {
						return actionEvent, true
					}
				}
			}
			return "", false
		}
		for _, f := range fs {
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				// attrs slices and local variables set from constants.
				attrs := map[string]map[string]bool{}
				locals := map[string][]string{}
				addKeys := func(v string, exprs []ast.Expr) {
					if attrs[v] == nil {
						attrs[v] = map[string]bool{}
					}
					for i := 0; i < len(exprs); i += 2 {
						if k, ok := str(exprs[i]); ok {
							attrs[v][k] = true
						}
					}
				}
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					switch x := n.(type) {
					case *ast.AssignStmt:
						for i, l := range x.Lhs {
							id, ok := l.(*ast.Ident)
							if !ok || i >= len(x.Rhs) {
								continue
							}
							if cl, ok := x.Rhs[i].(*ast.CompositeLit); ok {
								if at, ok := cl.Type.(*ast.ArrayType); ok {
									if el, ok := at.Elt.(*ast.Ident); ok && el.Name == "any" {
										addKeys(id.Name, cl.Elts)
									}
								}
							}
							if v, ok := resolve(x.Rhs[i]); ok {
								locals[id.Name] = append(locals[id.Name], v)
							}
						}
					case *ast.CallExpr:
						if f, ok := x.Fun.(*ast.Ident); ok && f.Name == "append" && len(x.Args) > 1 {
							if id, ok := x.Args[0].(*ast.Ident); ok {
								addKeys(id.Name, x.Args[1:])
							}
						}
					}
					return true
				})
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					c, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					sel, ok := c.Fun.(*ast.SelectorExpr)
					if !ok || !isLogger(sel.X) {
						return true
					}
					msgAt := 0
					switch sel.Sel.Name {
					case "Info", "Warn", "Error", "Debug":
					case "Log":
						msgAt = 2
					default:
						return true
					}
					if len(c.Args) <= msgAt {
						return true
					}
					at := d + ": " + fn.Name.Name
					events := []string{}
					if v, ok := resolve(c.Args[msgAt]); ok {
						events = append(events, v)
					} else if id, ok := c.Args[msgAt].(*ast.Ident); ok && len(locals[id.Name]) > 0 {
						events = locals[id.Name]
					} else {
						t.Errorf("%s: a log call whose event this test cannot name: teach logCalls", at)
						return true
					}
					keys := map[string]bool{}
					rest := c.Args[msgAt+1:]
					if c.Ellipsis.IsValid() && len(rest) > 0 {
						last := rest[len(rest)-1]
						rest = rest[:len(rest)-1]
						switch x := last.(type) {
						case *ast.Ident:
							for k := range attrs[x.Name] {
								keys[k] = true
							}
						case *ast.CallExpr:
							if id, ok := x.Args[0].(*ast.Ident); ok {
								for k := range attrs[id.Name] {
									keys[k] = true
								}
							}
						}
					}
					for i := 0; i < len(rest); i += 2 {
						if k, ok := str(rest[i]); ok {
							keys[k] = true
						}
					}
					for _, e := range events {
						out = append(out, logCall{event: e, keys: keys, at: at})
					}
					return true
				})
			}
		}
	}
	return out
}

// isLogger reports whether e is a logger: X.Log, X.Y.Log, log or Log.
func isLogger(e ast.Expr) bool {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name == "log" || x.Name == "Log"
	case *ast.SelectorExpr:
		return x.Sel.Name == "Log"
	}
	return false
}

func str(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// The reference lists every event the code logs, each with every key its
// lines may carry, and every step of a plan; a new event or key in the code
// fails here until the reference has it.
func TestReferenceNamesEveryLogEvent(t *testing.T) {
	page := section(t, read(t, "reference.md"), "## Log events")
	rows := map[string]string{} // event -> its table row
	for _, l := range strings.Split(page, "\n") {
		if !strings.HasPrefix(l, "| `") {
			continue
		}
		first := strings.Split(l, " | ")[0]
		for _, f := range strings.Split(first, "`") {
			if f != "" && f != "| " && f != ", " {
				rows[f] = l
			}
		}
	}
	calls := logCalls(t)
	if len(calls) < 50 {
		t.Fatalf("found %d log calls: the scan is broken", len(calls))
	}
	actions := consts(t, "pkg/plan", func(n string) bool { return strings.HasPrefix(n, "Action") })
	seen := map[string]bool{}
	for _, c := range calls {
		events := []string{c.event}
		if c.event == actionEvent {
			events = nil
			for _, a := range values(actions) {
				if a != "etcd-snapshot" && a != "renew-certificates" { // the step logs its own line
					events = append(events, a)
				}
			}
		}
		for _, e := range events {
			seen[e] = true
			row, ok := rows[e]
			if !ok {
				t.Errorf("%s logs %q: not in docs/reference.md's events", c.at, e)
				continue
			}
			var missing []string
			for k := range c.keys {
				if !strings.Contains(row, "`"+k+"`") {
					missing = append(missing, k)
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("%s logs %q with %v: not in its row of docs/reference.md", c.at, e, missing)
			}
		}
	}
	t.Logf("%d log calls, %d events", len(calls), len(seen))
}

// section is the part of a page from the heading to the next heading of
// the same level.
func section(t *testing.T, page, heading string) string {
	t.Helper()
	i := strings.Index(page, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("no %q section", heading)
	}
	rest := page[i+len(heading)+2:]
	level := heading[:strings.Index(heading, " ")+1]
	if j := strings.Index(rest, "\n"+level); j >= 0 {
		rest = rest[:j]
	}
	return rest
}
