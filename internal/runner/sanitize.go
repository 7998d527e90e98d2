package runner

import (
	"regexp"
	"strings"
	"sync"
)

// secretPatterns are compiled on first use: not by every process at start.
var secretPatterns = sync.OnceValue(func() []*regexp.Regexp {
	return []*regexp.Regexp{
		// PEM blocks and anything after a BEGIN line.
		regexp.MustCompile(`-----BEGIN [A-Z ]+-----.*`),
		// Bootstrap tokens: [a-z0-9]{6}.[a-z0-9]{16}.
		regexp.MustCompile(`\b[a-z0-9]{6}\.[a-z0-9]{16}\b`),
		// Values of secret-bearing flags or keys.
		regexp.MustCompile(`(?i)(--?(token|certificate-key|key|password|cert|cacert|discovery-token-ca-cert-hash)[= ])\S+`),
		regexp.MustCompile(`(?i)((token|certificateKey|certificate-key|password|secret)"?\s*[:=]\s*"?)[^\s",]+`),
		// Long hex strings (certificate keys, hashes).
		regexp.MustCompile(`\b[0-9a-fA-F]{32,}\b`),
		// Base64 runs long enough to be key material.
		regexp.MustCompile(`[A-Za-z0-9+/]{40,}={0,2}`),
	}
})

// Sanitize makes s safe for a log line: one line, no token, key or
// certificate material, at most max bytes.
func Sanitize(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	for _, re := range patternsFor(s) {
		s = re.ReplaceAllStringFunc(s, func(m string) string {
			sub := re.FindStringSubmatch(m)
			if len(sub) > 1 && sub[1] != "" && strings.HasPrefix(m, sub[1]) {
				return sub[1] + "[redacted]"
			}
			return "[redacted]"
		})
	}
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}

// patternsFor is the secret patterns to run over s: none when no pattern
// can match it (most log lines), so a pass that logs only plain notes
// never compiles them.
func patternsFor(s string) []*regexp.Regexp {
	if !mayHoldSecret(s) {
		return nil
	}
	return secretPatterns()
}

// mayHoldSecret is a necessary condition for any secret pattern to match
// s: each needs "-----BEGIN ", one of its keywords (any case: token, key,
// password, cert, secret) or a run of at least 16 characters of
// [A-Za-z0-9+/] (a bootstrap token's secret half, 32 hex digits, 40 of
// base64). Text that is not ASCII is always scanned: (?i) folds some
// letters from outside ASCII (the Kelvin sign, the long s).
func mayHoldSecret(s string) bool {
	run := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 0x80:
			return true
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '+', c == '/':
			if run++; run >= 16 {
				return true
			}
		default:
			run = 0
		}
	}
	l := strings.ToLower(s)
	for _, k := range []string{"-----begin ", "token", "key", "password", "cert", "secret"} {
		if strings.Contains(l, k) {
			return true
		}
	}
	return false
}
