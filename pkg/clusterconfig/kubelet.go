package clusterconfig

// Graceful node shutdown: the kubelet takes a systemd-logind delay
// inhibitor lock and, when the node is shut down or rebooted (a Kairos
// upgrade reboots every node), terminates its pods within these periods,
// running their preStop hooks and termination grace, instead of leaving
// them to be killed. Off in the kubelet's own defaults.
const (
	ShutdownGracePeriod             = "30s"
	ShutdownGracePeriodCriticalPods = "10s"
)

// shutdownKeys are the KubeletConfiguration fields of graceful node
// shutdown: an operator who set any of them has chosen.
var shutdownKeys = []string{"shutdownGracePeriod", "shutdownGracePeriodCriticalPods", "shutdownGracePeriodByPodPriority"}

// WithKubeletDefaults returns a copy of the operator's KubeletConfiguration
// (nil: none) with what the provider sets unless the operator did:
// graceful node shutdown, both periods, only when none of its fields is
// set (the critical pods' period must not exceed the whole, and by-priority
// periods exclude both). `shutdownGracePeriod: 0s` turns it off.
func WithKubeletDefaults(kc map[string]any) map[string]any {
	out := make(map[string]any, len(kc)+2)
	for k, v := range kc {
		out[k] = v
	}
	for _, k := range shutdownKeys {
		if _, ok := kc[k]; ok {
			return out
		}
	}
	out["shutdownGracePeriod"] = ShutdownGracePeriod
	out["shutdownGracePeriodCriticalPods"] = ShutdownGracePeriodCriticalPods
	return out
}
