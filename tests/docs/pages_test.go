package docs_test

import (
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
)

// pageTests names, for every page of docs/, what runs its local commands:
// a test here, or elsewhere.
var pageTests = map[string]string{
	"upgrade.md":         "TestUpgradePage",
	"backups.md":         "TestBackupsPage",
	"troubleshooting.md": "TestTroubleshootingPage",
	"reference.md":       "TestReferencePage",
	"drain.md":           "TestDrainPage",
	"fleet-upgrade.md":   "TestFleetUpgradePage",
	// Its end-to-end command, booting the previous image, is run by the
	// Kairos VM test (tests/kairosvm TestKairosNode).
	"upgrade-failed.md": "TestUpgradeFailedPage",
	// Elsewhere: the real kairos-agent in a chroot runs its commands.
	"cloud-config.md": "tests/kairos TestRealKairosAgentChain",
	// The lead's, with the end-to-end restore and rejoin scenarios.
	"rollback-and-restore.md": "tests/e2e",
	"reset-and-rejoin.md":     "tests/e2e",
	// The Kairos VM test builds, pushes and installs the image with the
	// page's commands and config.
	"install.md": "tests/kairosvm TestKairosNode",
}

// Every page parses, and every page with a local command has a test that
// runs it; the end-to-end commands are listed for the end-to-end suite.
func TestEveryPageIsRun(t *testing.T) {
	pages, err := docs.Pages()
	if err != nil || len(pages) == 0 {
		t.Fatalf("pages %v: %v", pages, err)
	}
	for _, page := range pages {
		blocks, err := docs.Blocks(page)
		if err != nil {
			t.Errorf("docs/%s: %v", page, err)
			continue
		}
		local, e2e := 0, 0
		for _, b := range blocks {
			if len(b.Commands) == 0 {
				t.Errorf("docs/%s:%d: a ```sh block without a command (start each with sudo or $ )", page, b.Line)
			}
			if b.E2E {
				e2e += len(b.Commands)
				for _, c := range b.Commands {
					t.Logf("docs/%s: end-to-end: %s", page, c)
				}
			} else {
				local += len(b.Commands)
			}
		}
		if _, ok := pageTests[page]; !ok && local > 0 {
			t.Errorf("docs/%s shows %d commands and no test runs them: add one to tests/docs (and to pageTests)", page, local)
		}
	}
}

// Every relative link of a page points at a file of the checkout, and its
// #anchor at a heading there.
func TestLinks(t *testing.T) {
	pages, err := docs.Pages()
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range pages {
		checkLinks(t, "docs/"+page, read(t, page), docs.Dir())
	}
}

// anchors are the GitHub anchors of a markdown text's headings.
func anchors(text string) []string {
	var out []string
	in := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
		}
		if in || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}
