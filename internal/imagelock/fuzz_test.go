package imagelock

import (
	"reflect"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes as the image lock file: Parse never
// panics, and an accepted lock names only plain .tar files (no path
// component to escape the images directory), only sha256 manifest digests,
// and survives its own Marshal.
func FuzzParse(f *testing.F) {
	f.Add([]byte("images:\n- ref: registry.k8s.io/pause:3.10.2\n  file: pause.tar\n  sha256: " + strings.Repeat("a", 64) + "\n  size: 1\n"))
	f.Add([]byte("images:\n- ref: registry.k8s.io/pause:3.10.2\n  file: ../x.tar\n"))
	f.Add([]byte("images: []\n"))
	f.Add([]byte("images:\n- ref: registry.k8s.io/pause:3.10.2\n  file: pause.tar\n  sha256: " + strings.Repeat("a", 64) + "\n  size: 1\n  manifest: sha256:" + strings.Repeat("b", 64) + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := Parse(b)
		if err != nil {
			return
		}
		for _, im := range l.Images {
			if strings.ContainsAny(im.File, "/\x00") || strings.Contains(im.File, "..") || im.Size <= 0 ||
				im.Manifest != "" && (len(im.Manifest) != 71 || !strings.HasPrefix(im.Manifest, "sha256:")) {
				t.Fatalf("accepted %+v", im)
			}
		}
		out, err := l.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil || !reflect.DeepEqual(back, l) {
			t.Fatalf("round trip: %+v %v", back, err)
		}
	})
}
