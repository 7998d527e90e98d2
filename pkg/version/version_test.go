package version

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	good := map[string]Version{
		"v1.37.2":  {1, 37, 2},
		"v1.35.0":  {1, 35, 0},
		"v2.0.10":  {2, 0, 10},
		"v0.0.1":   {0, 0, 1},
		"v1.100.3": {1, 100, 3},
	}
	for s, want := range good {
		got, err := Parse(s)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, got, err, want)
		}
		if got.String() != s {
			t.Errorf("round trip %q -> %q", s, got.String())
		}
	}
	for _, s := range []string{"", " ", "1.37", "v1.37", "latest", "stable", "v1.37.0-rc.1", "v1.37.2+k3s1",
		" v1.37.2", "v1.37.2 ", "v1.37.2\n", "1.37.2", "V1.37.2", "v01.37.2", "v1.037.2", "v1.37.02",
		"v1..2", "v1.37.", "v-1.37.2", "v1.37.2.1", "v1.3a.2", "v9999999.1.1", "vv1.37.2", "v\u0661.37.2"} {
		if got, err := Parse(s); err == nil || !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %v, %v; want ErrInvalid", s, got, err)
		}
	}
}

func TestParseReported(t *testing.T) {
	good := map[string]Version{
		"v1.37.2":                  {1, 37, 2},
		"v1.37.2\n":                {1, 37, 2},
		"Kubernetes v1.36.3":       {1, 36, 3},
		"1.36.3":                   {1, 36, 3},
		"v1.36.3+k3s1":             {1, 36, 3},
		"registry.k8s.io/x:v1.2.3": {}, // not a tag parser: callers split the image
	}
	for s, want := range good {
		got, err := ParseReported(s)
		if want.IsZero() {
			if err == nil {
				t.Errorf("ParseReported(%q) = %v, want error", s, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("ParseReported(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "v1.37.0-rc.1", "v0.0.0-master+$Format:%H$", "Kubernetes", "v1.37"} {
		if got, err := ParseReported(s); err == nil {
			t.Errorf("ParseReported(%q) = %v, want error", s, got)
		}
	}
}

func TestCompare(t *testing.T) {
	order := []string{"v1.34.9", "v1.35.0", "v1.35.4", "v1.36.3", "v1.37.0", "v1.37.2", "v2.0.0"}
	for i := range order {
		for j := range order {
			a, b := MustParse(order[i]), MustParse(order[j])
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := a.Compare(b); got != want {
				t.Errorf("%s cmp %s = %d, want %d", a, b, got, want)
			}
			if a.Less(b) != (want < 0) {
				t.Errorf("%s < %s wrong", a, b)
			}
		}
	}
}

func TestWindow(t *testing.T) {
	w := Window{{1, 35}, {1, 36}, {1, 37}}
	if !w.Contains(Minor{1, 36}) || w.Contains(Minor{1, 34}) || w.Contains(Minor{1, 38}) || w.Contains(Minor{2, 36}) {
		t.Fatal("Contains")
	}
	if w.String() != "1.35, 1.36, 1.37" {
		t.Fatal(w.String())
	}
	if _, err := ParseMinor("1.37.0"); err == nil {
		t.Fatal("ParseMinor accepted a patch")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"v1.37.2", "1.37", "v1.37.0-rc.1", "", " v1.2.3", "v01.2.3", "Kubernetes v1.36.3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		// A valid pin is canonical: it prints back to exactly the input.
		if v.String() != s {
			t.Fatalf("Parse(%q) prints %q", s, v.String())
		}
		r, err := ParseReported(s)
		if err != nil || r != v {
			t.Fatalf("ParseReported disagrees on %q: %v %v", s, r, err)
		}
		if v.Compare(v) != 0 || v.Less(v) {
			t.Fatal("not reflexive")
		}
	})
}
