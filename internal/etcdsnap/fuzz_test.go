package etcdsnap

import (
	"path"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// FuzzEtcdFiles feeds arbitrary bytes as /etc/kubernetes/manifests/etcd.yaml,
// as what etcdutl snapshot status printed, and as the control-plane
// manifests ApplyStarted reads: no panic; an accepted manifest names an
// https URL and clean absolute paths (the healthcheck client's key is read
// from beside the CA, never elsewhere); an accepted status fits its file.
func FuzzEtcdFiles(f *testing.F) {
	f.Add([]byte("spec:\n  containers:\n  - name: etcd\n    command: [etcd, --listen-client-urls=https://127.0.0.1:2379, --trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt]\n"),
		[]byte(`{"hash":1,"revision":2,"totalKey":3,"totalSize":4096,"version":"3.6.0"}`), int64(8224))
	f.Add([]byte("spec: {containers: [{name: etcd, command: [--trusted-ca-file=../x]}]}"), []byte(`{}`), int64(0))
	f.Fuzz(func(t *testing.T, manifest, status []byte, size int64) {
		if ep, err := ParseManifest(manifest); err == nil {
			if !strings.HasPrefix(ep.URL, "https://") {
				t.Fatalf("accepted URL %q", ep.URL)
			}
			for _, p := range []string{ep.CA, ep.Cert, ep.Key, ep.DataDir} {
				if !path.IsAbs(p) || path.Clean(p) != p {
					t.Fatalf("accepted path %q", p)
				}
			}
			if path.Dir(ep.Key) != path.Dir(ep.CA) || path.Dir(ep.Cert) != path.Dir(ep.CA) {
				t.Fatalf("client certificate away from the CA: %+v", ep)
			}
		}
		if st, err := parseStatus(status, size); err == nil && (st.Revision < 0 || st.Keys < 0) {
			t.Fatalf("accepted %+v", st)
		}
		_ = ApplyStarted(version.MustParse("v1.37.2"), map[string][]byte{"kube-apiserver": manifest, "kube-scheduler": status})
	})
}
