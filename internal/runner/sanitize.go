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
	for _, re := range secretPatterns() {
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
