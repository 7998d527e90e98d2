package status

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Printable makes a value safe to print for a person on a terminal: every
// control character (C0 including newline, CR and ESC, DEL, C1), every
// Unicode format character (the bidirectional overrides that reorder what
// is shown, zero-width characters) and every byte that is not UTF-8 is
// written as a visible escape (\n, \r, \t, \xNN, \u{NNNN}), so a value read
// from a file cannot start a new line, move the cursor or repaint what was
// printed before it. Printable text is unchanged.
func Printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x100 && unsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u{%04x}`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}
