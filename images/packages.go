package images

// NodePackages are the Debian packages every node runs besides the tree:
// systemd as PID 1, containerd and runc, the CNI plugins (Debian puts them
// in /usr/lib/cni), and the tools kubeadm's preflight and kube-proxy look
// for. One list: the Kairos base of `make image` (internal/kairosimage),
// the end-to-end nodes' Debian base (tests/e2e/harness) and the Earthfile's
// node-base (kept equal by a test) all install exactly these.
var NodePackages = []string{
	"systemd", "systemd-sysv", "dbus", "iproute2", "containerd", "runc", "iptables",
	"conntrack", "ethtool", "socat", "ebtables", "kmod", "ca-certificates",
	"containernetworking-plugins",
}
