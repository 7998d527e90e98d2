package observe

import (
	"testing"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// FuzzStaticPodManifest feeds arbitrary bytes as a static pod manifest
// (/etc/kubernetes/manifests/*.yaml): the image, its tag and the flags are
// read without a panic, and a version read from the tag is exact.
func FuzzStaticPodManifest(f *testing.F) {
	f.Add([]byte("spec:\n  containers:\n  - name: kube-apiserver\n    image: registry.k8s.io/kube-apiserver:v1.37.2\n    command: [kube-apiserver, --secure-port=6443]\n"))
	f.Add([]byte("spec:\n  containers:\n  - name: kube-apiserver\n    image: reg:5000/x@sha256:ab\n"))
	f.Add([]byte("spec: {containers: [{name: kube-apiserver, args: ['--=', '--a']}]}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ManifestFlags(b, "kube-apiserver")
		img, err := ManifestImage(b, "kube-apiserver")
		if err != nil {
			return
		}
		if v, err := version.ParseReported(ImageTag(img)); err == nil && v.IsZero() {
			t.Fatalf("tag of %q parsed to the zero version", img)
		}
	})
}
