package bundle

import (
	"reflect"
	"testing"
)

// FuzzParse feeds arbitrary bytes as /usr/share/provider-kubernetes/bundle.yaml:
// Parse never panics, an accepted manifest has an exact kubeadm version and
// survives its own Marshal unchanged.
func FuzzParse(f *testing.F) {
	f.Add([]byte("kubernetes: v1.37.2\nkubeadm: v1.37.2\nkubelet: v1.37.2\netcd: 3.7.0-0\netcdctl: 3.7.0\n"))
	f.Add([]byte("kubeadm: v1.37\n"))
	f.Add([]byte("kubeadm: [v1.37.2]\n"))
	f.Add([]byte("\x00\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			return
		}
		if m.KubeadmVersion().IsZero() {
			t.Fatalf("accepted %q without a kubeadm version", b)
		}
		out, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil || !reflect.DeepEqual(back, m) {
			t.Fatalf("round trip of %q: %+v %v, want %+v", b, back, err, m)
		}
	})
}
