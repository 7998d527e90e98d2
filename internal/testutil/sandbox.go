package testutil

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// Node is a sandbox host root laid out like a Kairos node.
type Node struct {
	t    testing.TB
	Root string
	Name string
}

// NewNode makes an empty node root with a boot id and a hostname.
func NewNode(t testing.TB, name string) *Node {
	n := &Node{t: t, Root: t.TempDir(), Name: name}
	n.Write(paths.BootID, "3f7e0c4e-0000-4000-8000-00000000b007\n", 0o444)
	n.Write(paths.Hostname, name+"\n", 0o444)
	return n
}

// R is the root as a paths.Root.
func (n *Node) R() paths.Root { return paths.Root(n.Root) }

// Path re-bases a host path.
func (n *Node) Path(p string) string { return n.R().Path(p) }

// Write writes a file under the root.
func (n *Node) Write(p, content string, mode os.FileMode) {
	n.t.Helper()
	full := n.Path(p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), mode); err != nil {
		n.t.Fatal(err)
	}
}

// Read reads a file under the root.
func (n *Node) Read(p string) string {
	n.t.Helper()
	b, err := os.ReadFile(n.Path(p))
	if err != nil {
		n.t.Fatal(err)
	}
	return string(b)
}

// Exists reports whether a host path exists under the root.
func (n *Node) Exists(p string) bool {
	_, err := os.Lstat(n.Path(p))
	return err == nil
}

// Token is the cluster token the sandbox's cluster file carries; tests
// assert it never reaches a log, a status or a command line.
const Token = "k8s-token-0123456789abcdefXYZ"

// ClusterFile writes the cluster file with role and pin; extra is appended
// to the kubeadm config string (indented by the caller's two spaces).
func (n *Node) ClusterFile(role, pin, extraConfig string) {
	n.Write(paths.ClusterFile, ClusterSection(role, pin, extraConfig), 0o600)
}

// ClusterSection is the cluster section of the sandbox: what the boot
// stage writes to the cluster file from the cloud-config's cluster: key.
func ClusterSection(role, pin, extraConfig string) string {
	return fmt.Sprintf(`cluster_token: %s
control_plane_host: 10.0.0.11
role: %s
config: |
  clusterConfiguration:
    kubernetesVersion: %s
    controlPlaneEndpoint: 10.0.0.11:6443
%s`, Token, role, pin, extraConfig)
}

// CloudConfig is a node's cloud-config, as under /oem, whose cluster:
// section is ClusterSection's.
func CloudConfig(role, pin string) string {
	lines := strings.Split(strings.TrimSuffix(ClusterSection(role, pin, ""), "\n"), "\n")
	return "#cloud-config\ncluster:\n  " + strings.Join(lines, "\n  ") + "\n"
}

// Bundle writes the image's bundle manifest.
func (n *Node) Bundle(kubeadm string) {
	n.Write(paths.BundleManifest, fmt.Sprintf("kubernetes: %s\nkubeadm: %s\nkubelet: %s\netcd: 3.7.0-0\netcdctl: 3.7.0\n", kubeadm, kubeadm, kubeadm), 0o644)
}

// ControlPlaneComponents are the static pods kubeadm upgrades, in its order.
var ControlPlaneComponents = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// ControlPlane writes the static pod manifests of a control plane at v.
func (n *Node) ControlPlane(v string) {
	for _, c := range ControlPlaneComponents {
		n.Write(paths.ManifestsDir+"/"+c+".yaml", StaticPodManifest(c, v), 0o600)
	}
	n.Write(paths.EtcdManifest, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\nspec:\n  containers:\n  - name: etcd\n    image: registry.k8s.io/etcd:3.6.8-0\n    command:\n    - etcd\n    - --advertise-client-urls=https://10.0.0.11:2379\n", 0o600)
}

// StaticPodManifest is a static pod manifest of component at v.
func StaticPodManifest(component, v string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: kube-system
spec:
  containers:
  - name: %s
    image: registry.k8s.io/%s:%s
    command:
    - %s
    - --secure-port=6443
`, component, component, component, v, component)
}

// APIServerManifest is a kube-apiserver static pod manifest at v.
func APIServerManifest(v string) string { return StaticPodManifest("kube-apiserver", v) }

// KubeletClientCert is the dated client certificate (and key) the
// kubelet's rotation link points at in a sandbox member.
const KubeletClientCert = "/var/lib/kubelet/pki/kubelet-client-2026-11-29-12-00-00.pem"

// Member writes kubelet.conf pointing at api, with a node client
// certificate naming this node, as kubeadm and the kubelet leave it: the
// kubeconfig names kubelet-client-current.pem, the kubelet's rotation
// link (absolute target) to the dated certificate in the same directory.
func (n *Node) Member(api *API) {
	cert, key := ClientCert(n.t, "system:node:"+n.Name)
	n.Write(KubeletClientCert, string(cert)+string(key), 0o600)
	link := n.Path("/var/lib/kubelet/pki/kubelet-client-current.pem")
	_ = os.Remove(link)
	if err := os.Symlink(KubeletClientCert, link); err != nil {
		n.t.Fatal(err)
	}
	n.Write(paths.KubeletConf, Kubeconfig(api, "/var/lib/kubelet/pki/kubelet-client-current.pem"), 0o600)
}

// Admin writes admin.conf (a control plane's) pointing at api.
func (n *Node) Admin(api *API) {
	cert, key := ClientCert(n.t, "kubernetes-admin")
	n.Write("/etc/kubernetes/pki/admin-test.pem", string(cert)+string(key), 0o600)
	n.Write(paths.AdminConf, Kubeconfig(api, "/etc/kubernetes/pki/admin-test.pem"), 0o600)
	n.Write("/etc/kubernetes/pki/ca.crt", string(api.CAPEM()), 0o644)
}

// Kubeconfig is a kubeconfig for api with a client certificate file.
func Kubeconfig(api *API, certFile string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: %s
    server: %s
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
preferences: {}
users:
- name: default-auth
  user:
    client-certificate: %s
    client-key: %s
`, base64.StdEncoding.EncodeToString(api.CAPEM()), api.URL(), certFile, certFile)
}
