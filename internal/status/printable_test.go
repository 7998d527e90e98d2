package status

import "testing"

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"v1.37.2":                           "v1.37.2",
		"converged at v1.37.2 (ünïcode ok)": "converged at v1.37.2 (ünïcode ok)",
		"a\nb\rc\td":                        `a\nb\rc\td`,
		"\x1b[2J\x1b[1;1Hfake":              `\x1b[2J\x1b[1;1Hfake`,
		"del\x7f c1\u0085 nul\x00":          `del\x7f c1\x85 nul\x00`,
		"bidi\u202eevil\u2066 zw\u200b":     `bidi\u{202e}evil\u{2066} zw\u{200b}`,
		"line\u2028sep":                     `line\u{2028}sep`,
		"bad\xffutf8\xc3":                   `bad\xffutf8\xc3`,
		"":                                  "",
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzPrintable(f *testing.F) {
	f.Add("v1.37.2\r\x1b[1A\x1b[2Kok\n")
	f.Fuzz(func(t *testing.T, s string) {
		for _, r := range Printable(s) {
			if unsafeRune(r) {
				t.Fatalf("Printable(%q) keeps %U", s, r)
			}
		}
	})
}
