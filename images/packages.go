package images

// NodePackages are the Debian packages every node runs besides the tree:
// systemd as PID 1, runc, the CNI plugins (Debian puts them in
// /usr/lib/cni), and the tools kubeadm's preflight and kube-proxy look for.
// containerd is not among them: the tree carries its own (Containerd). One list: the Kairos base of `make image` (internal/kairosimage),
// the end-to-end nodes' Debian base (tests/e2e/harness) and the Earthfile's
// node-base (kept equal by a test) all install exactly these.
var NodePackages = []string{
	"systemd", "systemd-sysv", "dbus", "iproute2", "runc", "iptables",
	"conntrack", "ethtool", "socat", "ebtables", "kmod", "ca-certificates",
	"containernetworking-plugins",
}

// Containerd is the containerd release every node runs, built from its
// module into the tree (containerd, ctr, containerd-shim-runc-v2) with the
// tree's containerd.service. Not Debian bookworm's 1.6.20: its CRI has no
// pinned images, so nothing could keep the bundled images from the
// kubelet's image garbage collection; and SIG Node named Kubernetes 1.35
// the last release to support containerd 1.x (1.6 itself ended in August
// 2025).
const Containerd = "v2.3.4"
