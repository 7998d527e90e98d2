package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// repoFiles returns the checkout's files (not .git, build or bin) whose
// name keep accepts, relative to the checkout.
func repoFiles(t *testing.T, keep func(rel string) bool) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(repo(), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repo(), p)
		if d.IsDir() && (d.Name() == ".git" || rel == "build" || rel == "bin" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && keep(rel) {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// concat is the text of files (relative to the checkout).
func concat(t *testing.T, files []string) string {
	t.Helper()
	var b strings.Builder
	for _, f := range files {
		c, err := os.ReadFile(filepath.Join(repo(), f))
		if err != nil {
			t.Fatal(err)
		}
		b.Write(c)
		b.WriteByte('\n')
	}
	return b.String()
}

// docs/development.md is a developer's page: its commands are not run
// from its text (they are `make test` itself, benchmarks and the
// end-to-end suite), so what it names is checked instead: every make
// target is a rule of the Makefile, every test and benchmark a function of
// a test file, every repository path exists, every environment variable is
// one the code, the scripts or the Makefile read; and its layout lists
// every Go package of the checkout and nothing that is not there.
func TestDevelopmentPage(t *testing.T) {
	page := read(t, "development.md")
	// No ```sh block: a command shown as one would be an operator's, run
	// from the page's text (TestEveryPageIsRun).
	if strings.Contains(page, "```sh") {
		t.Error("docs/development.md has a ```sh block: its commands are a developer's and no test runs them from the page; use a plain fence")
	}

	makefile, err := os.ReadFile(filepath.Join(repo(), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(string(makefile), -1) {
		targets[m[1]] = true
	}
	makes := regexp.MustCompile(`\bmake ([a-z][a-z0-9-]*)`).FindAllStringSubmatch(page, -1)
	if len(makes) < 5 {
		t.Fatalf("found %d make commands in docs/development.md: the scan is broken", len(makes))
	}
	for _, m := range makes {
		if !targets[m[1]] {
			t.Errorf("docs/development.md names `make %s`: no such Makefile target", m[1])
		}
	}

	testFiles := repoFiles(t, func(rel string) bool { return strings.HasSuffix(rel, "_test.go") })
	tests := concat(t, testFiles)
	for _, name := range uniqStrings(regexp.MustCompile(`\b(?:Test|Benchmark)[A-Z][A-Za-z0-9]*\b`).FindAllString(page, -1)) {
		if !regexp.MustCompile(`(?m)^func (\([^)]*\) )?` + name + `\(`).MatchString(tests) {
			t.Errorf("docs/development.md names %s: no such test or benchmark", name)
		}
	}

	// A repository path, not a node's (/system/oem) nor part of a longer one.
	repoPath := regexp.MustCompile(`(?:^|[^/\w.-])(?:\./)?((?:cmd|internal|pkg|tests|images|system|examples|earthly|\.ci)/[A-Za-z0-9_./-]*[A-Za-z0-9_])`)
	var named []string
	for _, m := range repoPath.FindAllStringSubmatch(page, -1) {
		named = append(named, m[1])
	}
	if len(named) < 20 {
		t.Fatalf("found %d repository paths in docs/development.md: the scan is broken", len(named))
	}
	for _, p := range uniqStrings(named) {
		if _, err := os.Stat(filepath.Join(repo(), p)); err != nil {
			t.Errorf("docs/development.md names %s: not in the repository", p)
		}
	}

	code := concat(t, repoFiles(t, func(rel string) bool {
		return (strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, ".sh") || rel == "Makefile" || strings.HasPrefix(rel, ".ci/")) && !strings.HasPrefix(rel, "docs/")
	}))
	for _, v := range uniqStrings(regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b`).FindAllString(page, -1)) {
		if !strings.Contains(code, v) {
			t.Errorf("docs/development.md names %s: nothing in the code, the scripts or the Makefile reads it", v)
		}
	}

	// The layout: the first column of the block under "## Layout".
	layout := section(t, page, "## Layout")
	listed := map[string]bool{}
	in := false
	for _, l := range strings.Split(layout, "\n") {
		if strings.HasPrefix(l, "```") {
			in = !in
			continue
		}
		if !in || strings.TrimSpace(l) == "" {
			continue
		}
		first := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), 2)[0]
		for _, e := range strings.Split(first, ",") {
			e = strings.TrimSuffix(strings.TrimSpace(e), "/")
			listed[e] = true
			if _, err := os.Stat(filepath.Join(repo(), e)); err != nil {
				t.Errorf("docs/development.md's layout lists %s: not in the repository", e)
			}
		}
	}
	pkgs := map[string]bool{}
	for _, f := range repoFiles(t, func(rel string) bool { return strings.HasSuffix(rel, ".go") }) {
		pkgs[filepath.Dir(f)] = true
	}
	if len(pkgs) < 30 {
		t.Fatalf("found %d Go packages: the walk is broken", len(pkgs))
	}
	for p := range pkgs {
		if !listed[p] {
			t.Errorf("the Go package %s is not in docs/development.md's layout", p)
		}
	}
}

// uniqStrings is in, sorted, each string once.
func uniqStrings(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}
