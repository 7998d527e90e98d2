package testutil

import (
	"regexp"
	"strings"
	"sync"
)

var examplePlaceholders = sync.OnceValue(func() [2]*regexp.Regexp {
	return [2]*regexp.Regexp{regexp.MustCompile(`(cluster_token: )<[^>\n]*>`), regexp.MustCompile(`sha256:<[^>\n]*>`)}
})

// FillExample replaces an example cloud-config's placeholders
// (examples/cloud-config) as the operator does: the cluster token with
// token, the CA pin with a well-formed one.
func FillExample(b []byte, token string) []byte {
	re := examplePlaceholders()
	b = re[0].ReplaceAll(b, []byte("${1}"+token))
	return re[1].ReplaceAll(b, []byte("sha256:"+strings.Repeat("ab", 32)))
}
