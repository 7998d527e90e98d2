package kube

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// FuzzKubeconfig feeds arbitrary bytes as /etc/kubernetes/kubelet.conf:
// Load never panics, and the files the kubeconfig names are read by the
// provider under the root (a named file that exists only outside the
// sandbox root is never found).
func FuzzKubeconfig(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: 'https://127.0.0.1:6443', certificate-authority: /ca.crt}\n  name: c\ncontexts:\n- context: {cluster: c, user: u}\n  name: x\ncurrent-context: x\nusers:\n- name: u\n  user: {client-certificate: /outside/cert.pem, client-key: /outside/cert.pem, tokenFile: /tok}\n"))
	f.Add([]byte("users: [{name: u, user: {client-certificate: relative.pem}}]"))
	root := f.TempDir()
	kc := filepath.Join(root, paths.KubeletConf)
	if err := os.MkdirAll(filepath.Dir(kc), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "ca.crt"), []byte("not a certificate"), 0o644); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(kc, b, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(paths.Root(root), time.Second, paths.KubeletConf)
		if err == nil && c.Kubeconfig != paths.KubeletConf {
			t.Fatalf("client from %q", c.Kubeconfig)
		}
	})
}
