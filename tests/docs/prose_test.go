package docs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/joinconfig"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

// texts is every operator text: the README and each page of docs/, by
// name.
func texts(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{"README.md": string(b)}
	pages, err := docs.Pages()
	if err != nil || len(pages) == 0 {
		t.Fatalf("pages %v: %v", pages, err)
	}
	for _, p := range pages {
		out["docs/"+p] = read(t, p)
	}
	return out
}

// sentences splits a text joined onto one line at its sentence and clause
// ends.
func sentences(s string) []string {
	return regexp.MustCompile(`[.:;]\s+`).Split(oneLine(s), -1)
}

// hours is a whole number of hours as the pages write it: 24h, 168h.
func hours(d time.Duration) string { return fmt.Sprintf("%dh", d/time.Hour) }

// How long join material lasts has one home, how-it-works.md's "Joining
// more nodes" (the init token's: "Init and join"), stating the code's
// values; no other text, the README included, states a lifetime of its own
// (reset-and-rejoin.md said "valid for an hour" of a token that join-config
// creates for 24h).
func TestJoinMaterialLifetimeHasOneHome(t *testing.T) {
	const home = "docs/how-it-works.md"
	all := texts(t)
	page := all[home]
	join, init := section(t, page, "## Joining more nodes"), section(t, page, "## Init and join")
	for _, c := range []struct{ text, want string }{
		{join, "`--ttl " + hours(clusterconfig.DefaultTokenTTL) + "` by default, at most " + hours(clusterconfig.MaxTokenTTL)},
		{join, fmt.Sprintf("a control plane within %d hours", joinconfig.CertsLifetime/time.Hour)},
		{init, "The init token's TTL is " + hours(clusterconfig.DefaultTokenTTL) + " by default"},
		{init, "at most " + hours(clusterconfig.MaxTokenTTL)},
		{init, "kubeadm deletes the uploaded control-plane certificates after " + hours(joinconfig.CertsLifetime)},
	} {
		if !strings.Contains(oneLine(c.text), c.want) {
			t.Errorf("%s does not say %q", home, c.want)
		}
	}
	all[home] = strings.Replace(strings.Replace(page, join, "", 1), init, "", 1)
	secret := regexp.MustCompile(`(?i)\btoken\b|certificate key|join material|uploaded (control-plane )?certificates`)
	lifetime := regexp.MustCompile(`(?i)\b(hours?|days?|minutes?|\d+ ?[hm])\b|lifetime|expire|valid for`)
	for name, text := range all {
		for _, s := range sentences(text) {
			if secret.MatchString(s) && lifetime.MatchString(s) {
				t.Errorf("%s states how long join material lasts (%q): say it in %s's Joining more nodes and link there", name, s, home)
			}
		}
	}
}

// A failure reason (exit 1, phase Failed) is never shown as what a
// refusal (exit 3, phase Refused) records: ConfigInvalid was "refused
// (`ConfigInvalid`)" in the README, reference.md and what-it-refuses.md's
// list of what a pass refuses.
func TestFailureReasonsAreNotRefusals(t *testing.T) {
	reasons := values(consts(t, "internal/reconcile", func(n string) bool { return strings.HasPrefix(n, "Reason") }))
	for name, text := range texts(t) {
		one := oneLine(text)
		for _, r := range reasons {
			if m := regexp.MustCompile("(?i)refus\\w*,? \\(`" + regexp.QuoteMeta(r) + "`").FindString(one); m != "" {
				t.Errorf("%s: %q: %s is a failure (exit 1, phase Failed), not a refusal", name, m, r)
			}
		}
	}
	sec := oneLine(section(t, read(t, "what-it-refuses.md"), "## `reconcile`"))
	i := strings.Index(sec, "It then refuses, before any command runs (exit 3")
	if i < 0 {
		t.Fatal("what-it-refuses.md: no paragraph of what a pass refuses")
	}
	refusals := sec[i:]
	if j := strings.Index(refusals, "A record the pass acts on"); j >= 0 {
		refusals = refusals[:j]
	}
	for _, r := range reasons {
		if strings.Contains(refusals, "`"+r+"`") {
			t.Errorf("what-it-refuses.md lists %s among what a pass refuses: it is a failure", r)
		}
	}
}

// Every paragraph of prose closes the parentheses it opens, and opens the
// ones it closes (code spans and blocks aside): a fragment pasted into the
// wrong place, like the "`systemctl --failed`). ..." that ended the
// README's "Reset under Kairos", does not.
func TestParagraphsBalanceTheirParentheses(t *testing.T) {
	code := regexp.MustCompile("`[^`]*`")
	for name, text := range texts(t) {
		for _, p := range paragraphs(text) {
			depth := 0
			for _, r := range code.ReplaceAllString(oneLine(p.text), "C") {
				switch r {
				case '(':
					depth++
				case ')':
					depth--
				}
				if depth < 0 {
					break
				}
			}
			if depth != 0 {
				t.Errorf("%s:%d: a paragraph with unbalanced parentheses (a pasted fragment?): %.200s", name, p.line, oneLine(p.text))
			}
		}
	}
}

type paragraph struct {
	line int
	text string
}

// paragraphs are a markdown text's runs of prose lines: not in a fenced
// block, not a heading, a table row or an HTML comment.
func paragraphs(text string) []paragraph {
	var out []paragraph
	var cur []string
	start, fenced := 0, false
	flush := func() {
		if len(cur) > 0 {
			out = append(out, paragraph{start, strings.Join(cur, "\n")})
			cur = nil
		}
	}
	for i, l := range strings.Split(text, "\n") {
		s := strings.TrimSpace(l)
		if strings.HasPrefix(s, "```") {
			fenced = !fenced
			flush()
			continue
		}
		if fenced || s == "" || strings.HasPrefix(s, "#") || strings.HasPrefix(s, "|") || strings.HasPrefix(s, "<!--") {
			flush()
			continue
		}
		if len(cur) == 0 {
			start = i + 1
		}
		cur = append(cur, l)
	}
	flush()
	return out
}
