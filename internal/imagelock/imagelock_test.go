package imagelock

import (
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	l := Lock{Images: []Image{
		{Ref: "registry.k8s.io/coredns/coredns:v1.14.6", File: FileName("registry.k8s.io/coredns/coredns:v1.14.6"), SHA256: strings.Repeat("a", 64), Size: 10},
		{Ref: "registry.k8s.io/etcd:3.7.0-0", File: "etcd_3.7.0-0.tar", SHA256: strings.Repeat("b", 64), Size: 11},
	}}
	if l.Images[0].File != "coredns_coredns_v1.14.6.tar" {
		t.Fatal(l.Images[0].File)
	}
	b, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
	if err != nil || len(got.Images) != 2 || got.Images[1] != l.Images[1] {
		t.Fatalf("%+v %v", got, err)
	}
}

func TestParseRejects(t *testing.T) {
	d := strings.Repeat("a", 64)
	img := func(ref, file, sha string) string {
		return "images:\n- ref: " + ref + "\n  file: " + file + "\n  sha256: " + sha + "\n  size: 5\n"
	}
	for name, in := range map[string]string{
		"empty":         "images: []\n",
		"no tag":        img("registry.k8s.io/pause", "p.tar", d),
		"digest ref":    img("registry.k8s.io/pause@sha256:"+d, "p.tar", d),
		"no registry":   img("pause:3.10.2", "p.tar", d),
		"path file":     img("registry.k8s.io/pause:3.10.2", "../p.tar", d),
		"subdir file":   img("registry.k8s.io/pause:3.10.2", "a/p.tar", d),
		"hidden file":   img("registry.k8s.io/pause:3.10.2", ".p.tar", d),
		"not tar":       img("registry.k8s.io/pause:3.10.2", "p.tgz", d),
		"bad digest":    img("registry.k8s.io/pause:3.10.2", "p.tar", "xyz"),
		"zero size":     "images:\n- {ref: registry.k8s.io/pause:3.10.2, file: p.tar, sha256: " + d + ", size: 0}\n",
		"duplicate":     img("registry.k8s.io/pause:3.10.2", "p.tar", d) + "- {ref: registry.k8s.io/pause:3.10.2, file: q.tar, sha256: " + d + ", size: 1}\n",
		"unknown field": "images:\n- {ref: registry.k8s.io/pause:3.10.2, file: p.tar, sha256: " + d + ", size: 1, x: 1}\n",
	} {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
