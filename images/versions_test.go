package images

import (
	"strings"
	"testing"
)

func TestCompiledManifest(t *testing.T) {
	m := Get()
	if m.Release == "" || len(m.Minors) != 3 {
		t.Fatalf("%+v", m)
	}
	if Window().String() != "1.35, 1.36, 1.37" {
		t.Fatalf("window %s", Window())
	}
	for _, e := range m.Minors {
		if !strings.HasSuffix(e.ImageTag, "-k8s"+e.Minor) {
			t.Errorf("minor %s: image tag %s does not name it", e.Minor, e.ImageTag)
		}
	}
}

func TestParseManifestRejects(t *testing.T) {
	base := "release: v0.4.0\nminors:\n"
	entry := func(minor, k string) string {
		return "  - {minor: \"" + minor + "\", kubernetes: " + k + ", etcd: 3.6.8-0, coredns: v1.14.2, pause: \"3.10.2\", imageTag: v0.4.0-k8s" + minor + "}\n"
	}
	for name, in := range map[string]string{
		"empty":            base,
		"patch of another": base + entry("1.36", "v1.37.2"),
		"gap":              base + entry("1.35", "v1.35.4") + entry("1.37", "v1.37.2"),
		"descending":       base + entry("1.36", "v1.36.3") + entry("1.35", "v1.35.4"),
		"pre-release":      base + entry("1.37", "v1.37.0-rc.1"),
		"unknown key":      base + entry("1.37", "v1.37.2") + "extra: 1\n",
		"missing etcd":     base + "  - {minor: \"1.37\", kubernetes: v1.37.2, coredns: v1, pause: \"3\", imageTag: x}\n",
	} {
		if _, _, err := ParseManifest([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
