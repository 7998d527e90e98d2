package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// What an operator reads refers to nothing outside the repository: no
// "../" path that leaves the checkout or names nothing there, and no
// markdown file the checkout does not have (the README named a
// "user-facing contract" at ../shared/spec/upgrades.md, and pages said
// "see upgrades.md": a file no reader of this repository has). What an
// operator reads: the README, every page of docs/, every file of
// examples/.
func TestNoReferenceOutsideTheRepository(t *testing.T) {
	have := map[string]bool{}
	for _, f := range repoFiles(t, func(rel string) bool { return strings.HasSuffix(rel, ".md") }) {
		have[filepath.Base(f)] = true
	}
	if !have["README.md"] || !have["upgrade.md"] {
		t.Fatalf("the walk found %v: it is broken", have)
	}
	all := texts(t)
	examples := repoFiles(t, func(rel string) bool { return strings.HasPrefix(rel, "examples/") })
	if len(examples) < 3 {
		t.Fatalf("examples %v: the walk is broken", examples)
	}
	for _, f := range examples {
		b, err := os.ReadFile(filepath.Join(repo(), f))
		if err != nil {
			t.Fatal(err)
		}
		all[f] = string(b)
	}
	// A path up and out names a file (it has an extension): "../x.md", not
	// ".../v1" or a hostile hostname such as "../namespaces/...".
	up := regexp.MustCompile(`(?:^|[^.\w])((?:\.\./)+[A-Za-z0-9_./-]*\.[A-Za-z]{1,5})\b`)
	md := regexp.MustCompile(`[A-Za-z0-9_-]+\.md\b`)
	for name, text := range all {
		dir := filepath.Dir(filepath.Join(repo(), name))
		for _, m := range up.FindAllStringSubmatch(text, -1) {
			ref := m[1]
			path := filepath.Join(dir, ref)
			if !inside(path) {
				t.Errorf("%s refers to %s: outside the repository", name, ref)
			} else if _, err := os.Stat(path); err != nil {
				t.Errorf("%s refers to %s: not in the repository", name, ref)
			}
		}
		for _, f := range md.FindAllString(text, -1) {
			if !have[f] {
				t.Errorf("%s names %s: no such file in the repository (say what it says, in this project's words, or link a page that does)", name, f)
			}
		}
	}
}
