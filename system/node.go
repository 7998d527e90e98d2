package system

import (
	"fmt"
	"sort"
	"strings"
)

// CNIPluginDir is where the node's container runtime looks for CNI plugins:
// where every CNI installer (flannel, Calico, Cilium) puts its own, and on
// a Kairos node a persistent path, so an installer's plugin survives
// reboots and upgrades. Debian installs its plugins in DebianCNIDir; a
// tmpfiles rule links each into CNIPluginDir at every boot, never over a
// file already there (an installer's newer copy wins).
const (
	CNIPluginDir = "/opt/cni/bin"
	DebianCNIDir = "/usr/lib/cni"
)

// DebianCNIPlugins are the plugins Debian bookworm's
// containernetworking-plugins (1.1.1) installs in DebianCNIDir; the Kairos
// image build refuses a base whose DebianCNIDir holds another set, so no
// link can dangle.
var DebianCNIPlugins = []string{
	"bandwidth", "bridge", "dhcp", "firewall", "host-device", "host-local", "ipvlan",
	"loopback", "macvlan", "portmap", "ptp", "sbr", "static", "tuning", "vlan", "vrf",
}

// NodeFiles are the files a real node needs besides the tree and its
// packages, for the minor whose kubeadm deploys the pause image pauseRef
// ("registry.k8s.io/pause:3.10.2"): containerd's config (the bundled pause
// as its sandbox image, since the node cannot pull one; the systemd cgroup
// driver the kubelet uses; CNIPluginDir), the kernel modules and sysctls
// kubeadm's preflight checks and pod networking need, and the CNI links.
// The Kairos image (`make image`) and the Earthfile lay exactly these (the
// Earthfile takes them from `mktree -node-files`); the end-to-end nspawn
// nodes do not (their harness has its own containerd config: cgroupfs, no
// module loading in a container).
func NodeFiles(pauseRef string) ([]File, error) {
	if pauseRef == "" || strings.ContainsAny(pauseRef, "\"\\\n") {
		return nil, fmt.Errorf("node files: the pause image reference is empty or not a plain reference")
	}
	containerd := `version = 3

# provider-kubernetes: the node's containerd (system/node.go), containerd 2's
# config. The sandbox image is the pause image this image bundles and
# imports; the node never pulls it.
[plugins]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "` + pauseRef + `"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["` + CNIPluginDir + `"]
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      SystemdCgroup = true
`
	var tmp strings.Builder
	tmp.WriteString("# provider-kubernetes: Debian's CNI plugins where CNI installers and containerd look.\n")
	tmp.WriteString("d " + CNIPluginDir + " 0755 root root -\n")
	plugins := append([]string(nil), DebianCNIPlugins...)
	sort.Strings(plugins)
	for _, p := range plugins {
		fmt.Fprintf(&tmp, "L %s/%s - - - - %s/%s\n", CNIPluginDir, p, DebianCNIDir, p)
	}
	return []File{
		{Path: "/etc/containerd/config.toml", Mode: 0o644, Data: []byte(containerd)},
		{Path: "/etc/modules-load.d/provider-kubernetes.conf", Mode: 0o644,
			Data: []byte("# provider-kubernetes: overlayfs for containerd's snapshotter, bridge netfilter for pod traffic.\noverlay\nbr_netfilter\n")},
		// "-": a kernel without br_netfilter loaded must not fail the unit.
		{Path: "/etc/sysctl.d/90-provider-kubernetes.conf", Mode: 0o644,
			Data: []byte("# provider-kubernetes: what kubeadm's preflight and pod networking need.\nnet.ipv4.ip_forward = 1\n-net.bridge.bridge-nf-call-iptables = 1\n-net.bridge.bridge-nf-call-ip6tables = 1\n")},
		{Path: "/usr/lib/tmpfiles.d/provider-kubernetes-cni.conf", Mode: 0o644, Data: []byte(tmp.String())},
	}, nil
}
