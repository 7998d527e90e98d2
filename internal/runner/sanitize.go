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
// password, cert, secret), or a run of 16 [a-z0-9] (a bootstrap token's
// secret half), of 32 hex digits or of 40 base64 characters. Text that is
// not ASCII is always scanned: (?i) folds some letters from outside ASCII
// (the Kelvin sign, the long s).
func mayHoldSecret(s string) bool {
	lower, hex, b64 := 0, 0, 0 // the current run of each class
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 {
			return true
		}
		isLower := 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
		isHex := '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
		isB64 := isLower || 'A' <= c && c <= 'Z' || c == '+' || c == '/'
		lower, hex, b64 = next(lower, isLower), next(hex, isHex), next(b64, isB64)
		if lower >= 16 || hex >= 32 || b64 >= 40 {
			return true
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

func next(run int, in bool) int {
	if in {
		return run + 1
	}
	return 0
}
