// Package version is the one small version type every other package uses:
// strict parsing of a pin, lenient parsing of what components report, compare,
// minor arithmetic and the supported window.
package version

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrInvalid is returned for anything that is not a version of the expected form.
var ErrInvalid = errors.New("invalid version")

// Version is a Kubernetes release version: MAJOR.MINOR.PATCH, no pre-release.
type Version struct {
	Major, Minor, Patch int
}

// Minor identifies a release line such as 1.37.
type Minor struct {
	Major, Minor int
}

// Parse accepts exactly "vMAJOR.MINOR.PATCH" with decimal numbers and no
// leading zeros, no pre-release and no build metadata. It is the grammar of
// a pin: "1.37", "v1.37", "latest", "v1.37.0-rc.1" and whitespace are refused.
func Parse(s string) (Version, error) {
	if !strings.HasPrefix(s, "v") {
		return Version{}, fmt.Errorf("%w %q: want vMAJOR.MINOR.PATCH", ErrInvalid, s)
	}
	parts := strings.Split(s[1:], ".")
	if len(parts) != 3 {
		return Version{}, fmt.Errorf("%w %q: want vMAJOR.MINOR.PATCH", ErrInvalid, s)
	}
	var n [3]int
	for i, p := range parts {
		v, err := number(p)
		if err != nil {
			return Version{}, fmt.Errorf("%w %q: want vMAJOR.MINOR.PATCH", ErrInvalid, s)
		}
		n[i] = v
	}
	return Version{Major: n[0], Minor: n[1], Patch: n[2]}, nil
}

// ParseReported parses what a component reports about itself: kubeadm
// "version -o short", an image tag, a Node's kubeletVersion, "kubelet
// --version" ("Kubernetes v1.36.3"). It accepts an optional leading word,
// an optional "v" and ignores build metadata after "+", but refuses a
// pre-release: the provider never treats a pre-release as a release.
func ParseReported(s string) (Version, error) {
	t := strings.TrimSpace(s)
	if i := strings.LastIndexByte(t, ' '); i >= 0 {
		t = t[i+1:]
	}
	if i := strings.IndexByte(t, '+'); i >= 0 {
		t = t[:i]
	}
	if !strings.HasPrefix(t, "v") {
		t = "v" + t
	}
	v, err := Parse(t)
	if err != nil {
		return Version{}, fmt.Errorf("%w: reported %q", ErrInvalid, s)
	}
	return v, nil
}

func number(p string) (int, error) {
	if p == "" || len(p) > 6 || (len(p) > 1 && p[0] == '0') {
		return 0, ErrInvalid
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return 0, ErrInvalid
		}
	}
	return strconv.Atoi(p)
}

// MustParse is for constants in tests and tables.
func MustParse(s string) Version {
	v, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return v
}

func (v Version) String() string { return fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch) }

// IsZero reports whether v is the zero value (no version known).
func (v Version) IsZero() bool { return v == Version{} }

// MinorOf returns v's release line.
func (v Version) MinorOf() Minor { return Minor{Major: v.Major, Minor: v.Minor} }

// Compare returns -1, 0 or +1.
func (v Version) Compare(o Version) int {
	for _, d := range [3]int{v.Major - o.Major, v.Minor - o.Minor, v.Patch - o.Patch} {
		if d < 0 {
			return -1
		}
		if d > 0 {
			return 1
		}
	}
	return 0
}

// Less reports v < o.
func (v Version) Less(o Version) bool { return v.Compare(o) < 0 }

func (m Minor) String() string { return fmt.Sprintf("%d.%d", m.Major, m.Minor) }

// ParseMinor parses "MAJOR.MINOR".
func ParseMinor(s string) (Minor, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 2 {
		return Minor{}, fmt.Errorf("%w minor %q: want MAJOR.MINOR", ErrInvalid, s)
	}
	ma, err1 := number(parts[0])
	mi, err2 := number(parts[1])
	if err1 != nil || err2 != nil {
		return Minor{}, fmt.Errorf("%w minor %q: want MAJOR.MINOR", ErrInvalid, s)
	}
	return Minor{Major: ma, Minor: mi}, nil
}

// Window is the ordered set of supported minors.
type Window []Minor

// Contains reports whether m is one of the window's minors.
func (w Window) Contains(m Minor) bool {
	for _, x := range w {
		if x == m {
			return true
		}
	}
	return false
}

func (w Window) String() string {
	s := make([]string, len(w))
	for i, m := range w {
		s[i] = m.String()
	}
	return strings.Join(s, ", ")
}
