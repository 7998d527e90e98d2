package runner

import (
	"strings"
	"testing"
)

// FuzzPrefilter: a line the prefilter lets through unscanned matches no
// secret pattern, so Sanitize is the same with and without it.
func FuzzPrefilter(f *testing.F) {
	for _, s := range []string{
		"bundled version from /usr/share/provider-kubernetes/bundle.yaml",
		"/usr/local/provider-kubernetes/status.yaml", strings.Repeat("a/", 30), strings.Repeat("A", 39), strings.Repeat("ABCDEF0123", 4),
		"abcdef.0123456789abcdef", "--token=x", "TOKEN: y", "certificateKey=z", "-----BEGIN CERTIFICATE-----",
		strings.Repeat("a", 15) + " " + strings.Repeat("b", 15), strings.Repeat("0123456789abcdef", 2),
		"to\u212aen=x", "\u017fecret: y", "pass word", "ke y", "Cert", "kEy",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		s = strings.Join(strings.Fields(s), " ")
		if mayHoldSecret(s) {
			return
		}
		for _, re := range secretPatterns() {
			if re.MatchString(s) {
				t.Fatalf("%q matches %s but was not scanned", s, re)
			}
		}
	})
}

// TestPrefilterLetsSecretsThrough: every redaction pattern's own example is scanned.
func TestPrefilterLetsSecretsThrough(t *testing.T) {
	for _, s := range []string{"abcdef.0123456789abcdef", "--cert x", "password=p", "-----BEGIN X-----",
		strings.Repeat("f", 32), strings.Repeat("Q", 40), "to\u212aen: x"} {
		if !mayHoldSecret(s) || Sanitize(s, 400) == s {
			t.Errorf("%q: not redacted (prefilter %v): %q", s, mayHoldSecret(s), Sanitize(s, 400))
		}
	}
	for _, s := range []string{"plan verdict=none actions= member=true", "bundled version from /usr/share/provider-kubernetes/bundle.yaml",
		"node version from /usr/local/provider-kubernetes/status.yaml"} {
		if mayHoldSecret(s) {
			t.Errorf("%q: scanned", s)
		}
	}
}
