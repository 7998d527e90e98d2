// Package harness runs real nodes for the end-to-end suite: each node is a
// systemd-nspawn container with systemd as PID 1 whose root is an overlay of
//
//	lower: [OS tree of one Kubernetes minor (the A/B image), harness config layer, Kairos layer, Debian base rootfs]
//	upper: the node's persistent state
//
// on a private network (a bridge in its own network namespace, one network
// namespace per node, 10.0.0.0/24 that exists only inside them), each in its
// own cgroup subtree in every hierarchy (this host is cgroup v1 hybrid).
//
// The Kairos layer is a Kairos node's own boot chain: the real kairos-agent
// (built from its module), kairos-init's notify stage in /system/oem and
// cos-setup-boot.service as Kairos ships it. nspawn has no initramfs, so one
// harness unit runs the real `kairos-agent run-stage initramfs` as early as
// the container's systemd can (before sysinit.target); everything else is
// Kairos's. The operator's cloud-config is /oem/90_custom.yaml
// (WriteCloudConfig, EditCloudConfig).
//
// An image upgrade is what Kairos does: edit the pin in the node's
// persistent cloud-config, swap the lower tree and reboot (SwapTree). A hard
// crash is Kill.
//
// Host state is always restored by Cleanup (t.Cleanup): containers stopped,
// network namespaces deleted, cgroup subtrees removed, the host sysctls
// kubelet needs (kernel.panic=10, kernel.panic_on_oops=1,
// vm.overcommit_memory=1) put back to what they were. The overlay is mounted
// only inside a private mount namespace that dies with the container, so no
// mount can leak onto the host. What a killed test binary leaves behind
// (network namespaces, cgroups, sysctls) is swept by the next New from the
// records under /run/provider-kubernetes-e2e.
//
// The techniques and every pitfall behind them are in ../shared/spec/NOTES.md
// ("Real nodes on this machine") and ../shared/recipes/.
package harness
