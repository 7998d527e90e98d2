package harness

import (
	"fmt"
	"path"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// OEMClusterFile is where the harness keeps a node's cloud-config cluster
// section in its persistent state; the stand-in unit copies it to
// paths.ClusterFile on every boot.
const OEMClusterFile = "/oem/provider-kubernetes/cluster.yaml"

// Harness units in the config layer.
const (
	FixupUnit         = "e2e-node-fixup.service"
	ClusterConfigUnit = "e2e-cluster-config.service"
)

// BridgeIP is the bridge's address in the bridge's own network namespace:
// every node's default gateway and resolver, where nothing answers, so no
// packet of a node ever leaves the namespaces the harness made.
const BridgeIP = "10.0.0.1"

// ContainerdConfig is containerd 1.6's config (v2) for a kubeadm node in
// nspawn: kubeadm's pause, no oom_score_adj writes (no CAP_SYS_RESOURCE in
// the container), cgroupfs (kubelet cgroupDriver: cgroupfs), Debian's CNI dir.
const ContainerdConfig = `version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.10.2"
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
`

// fixupUnit makes an nspawn container a usable kubelet host: nspawn mounts
// the cgroup hierarchies read-only (kubelet and runc write them; only a
// bind remount flips the mount's flag, a plain remount asks to change the
// cgroup superblock and gets EBUSY), there is no /dev/kmsg (kubelet's OOM
// watcher opens it), and / must be rshared for the mount propagation of pod
// volumes.
const fixupUnit = `# Test harness only (tests/e2e/harness): what a real node's kernel gives
# kubelet and runc and an nspawn container does not.
[Unit]
Description=e2e: nspawn node fixups (cgroups rw, /dev/kmsg, rshared /)
DefaultDependencies=no
After=local-fs.target
Before=containerd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'set -e; for d in /sys/fs/cgroup /sys/fs/cgroup/*; do [ -L "$d" ] || mount -o remount,bind,rw "$d"; done'
ExecStart=/bin/sh -c '[ -e /dev/kmsg ] || ln -s /dev/console /dev/kmsg'
ExecStart=/bin/mount --make-rshared /
`

// clusterConfigUnit stands in for Kairos's boot stage.
var clusterConfigUnit = fmt.Sprintf(`# Test harness only (tests/e2e/harness): a stand-in for Kairos's boot stage.
# On a real node the provider's plugin answers agent.boot with a yip config
# (/usr/local/cloud-config/cluster.kairos.yaml) whose boot stage writes the
# cloud-config's cluster section to %[2]s (0600) before the
# reconcile unit runs. Here the harness keeps that section in the node's
# persistent state (%[1]s) and this unit copies it.
[Unit]
Description=e2e: stand-in for the Kairos boot stage (cluster section to %[2]s)
DefaultDependencies=no
After=local-fs.target
Before=provider-kubernetes-reconcile.service provider-kubernetes-image-import.service kubelet.service
ConditionPathExists=%[1]s

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/install -d -m 0755 %[3]s
ExecStart=/usr/bin/install -m 0600 -o root -g root %[1]s %[2]s
`, OEMClusterFile, paths.ClusterFile, paths.RunDir)

// masked are base units a test node must not run: Debian's etcd (it would
// hold :2379 if some package pulled it in) and the periodic jobs that would
// only add noise and load.
var masked = []string{
	"etcd.service", "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer",
	"e2scrub_all.timer", "e2scrub_reap.service", "fstrim.timer",
}

// configLayer is the harness's layer between the OS tree and the Debian
// rootfs. Changing any of it changes its cache key.
func configLayer() []layerEntry {
	e := []layerEntry{
		{Path: "etc/containerd/config.toml", Mode: 0o644, Data: ContainerdConfig},
		{Path: "etc/systemd/system/" + FixupUnit, Mode: 0o644, Data: fixupUnit},
		{Path: "etc/systemd/system/multi-user.target.wants/" + FixupUnit, Link: true, Data: "../" + FixupUnit},
		{Path: "etc/systemd/system/" + ClusterConfigUnit, Mode: 0o644, Data: clusterConfigUnit},
		{Path: "etc/systemd/system/multi-user.target.wants/" + ClusterConfigUnit, Link: true, Data: "../" + ClusterConfigUnit},
		// A persistent journal, so a node's journal can be read after it died.
		{Path: "etc/systemd/journald.conf.d/e2e.conf", Mode: 0o644, Data: "[Journal]\nStorage=persistent\nSystemMaxUse=64M\n"},
		// A bounded poweroff: Stop's SIGTERM must finish well inside its budget.
		{Path: "etc/systemd/system.conf.d/e2e.conf", Mode: 0o644, Data: "[Manager]\nDefaultTimeoutStopSec=20s\n"},
		{Path: "etc/resolv.conf", Mode: 0o644, Data: "# e2e: the bridge in the harness's own network namespace (no DNS server there)\nnameserver " + BridgeIP + "\n"},
		{Path: "etc/hosts", Mode: 0o644, Data: hostsFile(nil)},
		{Path: path.Dir(OEMClusterFile)[1:], Dir: true, Mode: 0o755},
	}
	for _, u := range masked {
		e = append(e, layerEntry{Path: "etc/systemd/system/" + u, Link: true, Data: "/dev/null"})
	}
	return e
}

// hostsFile is /etc/hosts naming every node.
func hostsFile(nodes []hostEntry) string {
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	for _, n := range nodes {
		fmt.Fprintf(&b, "%s\t%s\n", n.IP, n.Name)
	}
	return b.String()
}

type hostEntry struct{ IP, Name string }

// cniConflist is a node's CNI config: a bridge with host-local addresses from
// the node's own pod subnet; other nodes' pod subnets are routed through
// their node addresses (routes set in each node's network namespace).
func cniConflist(podSubnet string) string {
	return fmt.Sprintf(`{"cniVersion":"0.4.0","name":"podnet","plugins":[
 {"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,"hairpinMode":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"routes":[{"dst":"0.0.0.0/0"}]}},
 {"type":"portmap","capabilities":{"portMappings":true}}]}
`, podSubnet)
}
