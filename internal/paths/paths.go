// Package paths names every host path the provider reads or writes. Each is
// an absolute default that Root re-bases, so tests run on t.TempDir() and the
// same code runs on a node with Root "/".
package paths

import "path/filepath"

// Host paths, as on a node.
const (
	RunDir      = "/run/provider-kubernetes"
	ClusterFile = RunDir + "/cluster.yaml"
	// PluginError holds the plugin's one-line error when it refused this
	// boot's cluster: section (the boot then runs the previous section).
	PluginError = RunDir + "/agent-boot-error"
	StatusFile  = RunDir + "/status.yaml"
	// PublishedMarker names the last pass whose events are on the Node.
	PublishedMarker = RunDir + "/published"
	LockFile        = RunDir + "/reconcile.lock"
	TmpDir          = RunDir + "/tmp" // tmpfs: generated kubeadm configs, 0700
	PersistDir      = "/usr/local/provider-kubernetes"
	StatusMirror    = PersistDir + "/status.yaml"
	// VerifiedRecord is the last version this node was verified at: written
	// only when a pass that verified (or bootstrapped) this node converges.
	VerifiedRecord = PersistDir + "/verified-version"
	ReconcileLog   = "/var/log/provider-kubernetes-reconcile.log"
	KubeadmLog     = "/var/log/provider-kubernetes-kubeadm.log" // kubeadm's own output, sanitized
	BundleManifest = "/usr/share/provider-kubernetes/bundle.yaml"

	Kubeadm   = "/usr/bin/kubeadm"
	Kubelet   = "/usr/bin/kubelet"
	Kubectl   = "/usr/bin/kubectl"
	Etcdctl   = "/usr/bin/etcdctl"
	Etcdutl   = "/usr/bin/etcdutl"
	Systemctl = "/usr/bin/systemctl"
	Ctr       = "/usr/bin/ctr"
	// The node's containerd (images.Containerd), from the tree.
	Containerd     = "/usr/bin/containerd"
	ContainerdShim = "/usr/bin/containerd-shim-runc-v2"

	// The OS image: the provider as a Kairos plugin and on PATH, the
	// bundled control-plane images and their lock file.
	ProviderPlugin   = "/system/providers/agent-provider-kubernetes"
	ProviderBin      = "/usr/bin/provider-kubernetes"
	ImagesDir        = "/system/provider-kubernetes/images"
	ImageLock        = ImagesDir + "/lock.yaml"
	ContainerdSocket = "/run/containerd/containerd.sock"

	KubernetesDir     = "/etc/kubernetes"
	KubeletConf       = KubernetesDir + "/kubelet.conf"
	AdminConf         = KubernetesDir + "/admin.conf"
	ManifestsDir      = KubernetesDir + "/manifests"
	APIServerManifest = ManifestsDir + "/kube-apiserver.yaml"
	EtcdManifest      = ManifestsDir + "/etcd.yaml"
	PKIDir            = KubernetesDir + "/pki"
	CACert            = PKIDir + "/ca.crt"
	KubeadmTmpDir     = KubernetesDir + "/tmp" // kubeadm's own backups: kubeadm-backup-*

	KubeletDir = "/var/lib/kubelet"
	EtcdDir    = "/var/lib/etcd"
	// EtcdBackupDir holds the provider's pre-upgrade snapshots: a reset keeps it.
	EtcdBackupDir = PersistDir + "/etcd-backup"

	// OEMDir holds an installed node's own cloud-config (the operator's
	// cluster: section, and with it the pin), read by Kairos at every boot.
	OEMDir = "/oem"

	// CloudConfigDir is where the plugin writes the yip config Kairos runs at boot.
	CloudConfigDir = "/usr/local/cloud-config"
	ClusterYipFile = CloudConfigDir + "/cluster.kairos.yaml"
	ReconcileUnit  = "provider-kubernetes-reconcile.service"

	BootID   = "/proc/sys/kernel/random/boot_id"
	Hostname = "/proc/sys/kernel/hostname"
)

// Root is the host root every path is re-based on ("/" on a node).
type Root string

// Path re-bases an absolute host path under the root.
func (r Root) Path(p string) string {
	if r == "" || r == "/" {
		return filepath.Clean(p)
	}
	return filepath.Join(string(r), p)
}
