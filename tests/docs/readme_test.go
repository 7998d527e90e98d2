package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
)

// readmeMaxLines is the front door's size (issue 25: "at most ~200
// lines"): what goes beyond it belongs to a page of docs/.
const readmeMaxLines = 200

func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The README is a front door: short, and its documentation table lists
// every page of docs/ (a page nobody can find from the README is a page
// nobody reads), each link leading to a file and heading that exist.
func TestReadmeIsAFrontDoor(t *testing.T) {
	text := readme(t)
	if n := strings.Count(text, "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail to a page of docs/ and link it", n, readmeMaxLines)
	}
	pages, err := docs.Pages()
	if err != nil || len(pages) == 0 {
		t.Fatalf("pages %v: %v", pages, err)
	}
	table := section(t, text, "## Documentation")
	for _, p := range pages {
		if !strings.Contains(table, "| [docs/"+p+"](docs/"+p+") |") {
			t.Errorf("README.md's Documentation table has no row for docs/%s", p)
		}
	}
	checkLinks(t, "README.md", text, repo())
}

// checkLinks fails on every relative link of text (a file in dir) whose
// file does not exist or whose #anchor is no heading there.
func checkLinks(t *testing.T, name, text, dir string) {
	t.Helper()
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, m := range link.FindAllStringSubmatch(text, -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		file, anchor, _ := strings.Cut(target, "#")
		content := text
		if file != "" {
			path := filepath.Join(dir, file)
			if !inside(path) {
				t.Errorf("%s links %s: outside the repository", name, target)
				continue
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Errorf("%s links %s: %v", name, target, err)
				continue
			}
			if st.IsDir() {
				if anchor != "" {
					t.Errorf("%s links %s: an anchor in a directory", name, target)
				}
				continue
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s links %s: %v", name, target, err)
				continue
			}
			content = string(b)
		}
		if anchor != "" && !contains(anchors(content), anchor) {
			t.Errorf("%s links %s: no such heading there", name, target)
		}
	}
}

// inside reports whether path is within the checkout.
func inside(path string) bool {
	rel, err := filepath.Rel(repo(), filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
