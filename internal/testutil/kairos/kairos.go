// Package kairos reproduces, for tests, the parts of a Kairos node that sit
// around the provider: where the real kairos-agent lives, kairos-init's
// notify stage (the only thing that sends agent.boot), Kairos's
// cos-setup-boot.service exactly as it ships, and the operator's
// cloud-config in /oem. The kairos-agent itself is the real one, built from
// its module (testbin.KairosAgent). Nothing here is a stand-in for
// kairos-agent's behaviour; InitramfsUnit only runs the real initramfs stage
// where a container without an initramfs can.
package kairos

// Paths on a Kairos node.
const (
	// Agent is the real kairos-agent.
	Agent = "/usr/bin/kairos-agent"
	// NotifyStageFile is kairos-init's stage file in /system/oem.
	NotifyStageFile = "/system/oem/02_notify.yaml"
	// OEMCloudConfig is the operator's cloud-config (upgrades.md: "the
	// node's cloud-config, which on an installed node is under /oem").
	OEMCloudConfig = "/oem/90_custom.yaml"
	// CosSetupBoot is the unit that runs the boot stage.
	CosSetupBoot = "cos-setup-boot.service"
	// CosSetupBootPath is where the unit file lives.
	CosSetupBootPath = "/usr/lib/systemd/system/" + CosSetupBoot
)

// NotifyStage is kairos-init's /system/oem notify file: its initramfs stage
// runs `kairos-agent notify agent.boot`, except in recovery and live mode.
// kairos-agent never emits agent.boot on its own.
const NotifyStage = `name: "Notify Kairos Plugins of Elemental Events"
stages:
    initramfs:
    - if: '[ ! -f "/run/cos/recovery_mode" ] && [ ! -f "/run/cos/live_mode" ]'
      commands:
      - kairos-agent notify agent.boot
`

// CosSetupBootUnit is cos-setup-boot.service as Kairos ships it: ordered
// against nothing but getty. A unit that needs the boot stage's output must
// order itself After= it.
const CosSetupBootUnit = `[Unit]
Description=cOS system configuration
Before=getty.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/kairos-agent run-stage boot

[Install]
WantedBy=multi-user.target
`

// InitramfsUnitName is the unit of InitramfsUnit.
const InitramfsUnitName = "e2e-kairos-initramfs-stage.service"

// InitramfsUnit runs the real `kairos-agent run-stage initramfs` early in
// boot. On a Kairos node immucore runs that stage in the initramfs, before
// switch-root and before any unit of the real root; a systemd-nspawn
// container has no initramfs, so this unit runs it as early as the
// container's own systemd can: before sysinit.target, after the root and
// /oem are there (local-fs.target), before the boot stage and every unit
// of the provider.
const InitramfsUnit = `# Test harness only: nspawn has no initramfs. On a Kairos node immucore runs
# the initramfs stage before switch-root; here it runs as early as the
# container's systemd allows. The stage and the agent are Kairos's own.
[Unit]
Description=e2e: Kairos's initramfs stage (kairos-agent run-stage initramfs)
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target cos-setup-boot.service containerd.service kubelet.service provider-kubernetes-unit-migrate.service provider-kubernetes-image-import.service provider-kubernetes-reconcile.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/kairos-agent run-stage initramfs
`
