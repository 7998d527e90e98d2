package harness

import (
	"fmt"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/kairos"
)

// Harness units in the config layer.
const FixupUnit = "e2e-node-fixup.service"

// BridgeIP is the bridge's address in the bridge's own network namespace:
// every node's default gateway and resolver, where nothing answers, so no
// packet of a node ever leaves the namespaces the harness made.
const BridgeIP = "10.0.0.1"

// ContainerdConfig is containerd 2's config (version 3) for a kubeadm node
// in nspawn: kubeadm's pause, no oom_score_adj writes (no CAP_SYS_RESOURCE
// in the container), cgroupfs (kubelet cgroupDriver: cgroupfs), Debian's CNI dir.
const ContainerdConfig = `version = 3

[plugins]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "registry.k8s.io/pause:3.10.2"
  [plugins."io.containerd.cri.v1.runtime"]
    restrict_oom_score_adj = true
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
`

// fixupUnit makes an nspawn container a usable kubelet host: nspawn mounts
// the cgroup hierarchies read-only (kubelet and runc write them; only a
// bind remount flips the mount's flag, a plain remount asks to change the
// cgroup superblock and gets EBUSY), there is no /dev/kmsg (kubelet's OOM
// watcher opens it), and / must be rshared for the mount propagation of pod
// volumes. /dev/kmsg is /dev/null, never the console: console-getty.service
// (Type=idle, so it starts when the boot's last job ends) vhangup()s the
// console, and a kubelet holding it open through /dev/kmsg died of that
// SIGHUP and came back 10 s later (RestartSec), on every boot whose last
// job ended after the kubelet started: seen as a converged reboot's Node
// Ready 11 s later with the provider's units than without (issue 16).
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
ExecStart=/bin/sh -c '[ -e /dev/kmsg ] || ln -s /dev/null /dev/kmsg'
ExecStart=/bin/mount --make-rshared /
`

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
		// A persistent journal, so a node's journal can be read after it died.
		{Path: "etc/systemd/journald.conf.d/e2e.conf", Mode: 0o644, Data: "[Journal]\nStorage=persistent\nSystemMaxUse=64M\n"},
		// A bounded poweroff: Stop's SIGTERM must finish well inside its budget.
		{Path: "etc/systemd/system.conf.d/e2e.conf", Mode: 0o644, Data: "[Manager]\nDefaultTimeoutStopSec=20s\n"},
		{Path: "etc/resolv.conf", Mode: 0o644, Data: "# e2e: the bridge in the harness's own network namespace (no DNS server there)\nnameserver " + BridgeIP + "\n"},
		{Path: "etc/hosts", Mode: 0o644, Data: hostsFile(nil)},
	}
	for _, u := range masked {
		e = append(e, layerEntry{Path: "etc/systemd/system/" + u, Link: true, Data: "/dev/null"})
	}
	return e
}

// kairosLayer is a Kairos node's own layer under the OS tree (the Earthfile
// lays the tree onto the Kairos base image): the real kairos-agent,
// kairos-init's notify stage in /system/oem, cos-setup-boot.service as
// Kairos ships it (enabled as `systemctl enable` does), and, because nspawn
// has no initramfs, a unit that runs the real initramfs stage as early as
// the container's systemd can (kairos.InitramfsUnit). The operator's
// cloud-config goes in /oem; the plugin's yip config in
// /usr/local/cloud-config.
func kairosLayer(agent string) []layerEntry {
	return []layerEntry{
		{Path: kairos.Agent[1:], Mode: 0o755, Src: agent},
		{Path: kairos.NotifyStageFile[1:], Mode: 0o644, Data: kairos.NotifyStage},
		{Path: kairos.CosSetupBootPath[1:], Mode: 0o644, Data: kairos.CosSetupBootUnit},
		{Path: "etc/systemd/system/multi-user.target.wants/" + kairos.CosSetupBoot, Link: true, Data: kairos.CosSetupBootPath},
		{Path: "usr/lib/systemd/system/" + kairos.InitramfsUnitName, Mode: 0o644, Data: kairos.InitramfsUnit},
		{Path: "etc/systemd/system/sysinit.target.wants/" + kairos.InitramfsUnitName, Link: true, Data: "/usr/lib/systemd/system/" + kairos.InitramfsUnitName},
		{Path: "oem", Dir: true, Mode: 0o755},
		{Path: paths.CloudConfigDir[1:], Dir: true, Mode: 0o755},
		{Path: "system/providers", Dir: true, Mode: 0o755},
	}
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
