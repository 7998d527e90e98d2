package reconcile

import (
	"encoding/json"
	"fmt"
	"time"
)

// Budgets bound every wait and every command of a pass. The defaults are
// documented in the README; providerConfig.budgets in the cluster section
// overrides them (durations such as "90s" or "10m").
type Budgets struct {
	// ClusterVersion: reading the cluster version when an upgrade may be due.
	ClusterVersion time.Duration `json:"clusterVersion"`
	// WaitForCluster: a worker waiting for its control planes to upgrade.
	WaitForCluster time.Duration `json:"waitForCluster"`
	// KubeadmUpgrade: one kubeadm upgrade apply or upgrade node.
	KubeadmUpgrade time.Duration `json:"kubeadmUpgrade"`
	// KubeletStart: kubeadm init phase kubelet-start during the repair.
	KubeletStart time.Duration `json:"kubeletStart"`
	// KubeletHealthy: the kubelet answering /healthz after the repair.
	KubeletHealthy time.Duration `json:"kubeletHealthy"`
	// LocalAPI: this control plane's apiserver answering /readyz after the repair.
	LocalAPI time.Duration `json:"localAPI"`
	// ControlPlaneHealth: a follower's gate before upgrade node (the cluster
	// endpoint's /readyz and every etcd member healthy).
	ControlPlaneHealth time.Duration `json:"controlPlaneHealth"`
	// EtcdSnapshot: the pre-upgrade snapshot step, all of it.
	EtcdSnapshot time.Duration `json:"etcdSnapshot"`
	// KubeletRestart: systemctl daemon-reload plus restart of the kubelet.
	KubeletRestart time.Duration `json:"kubeletRestart"`
	// Verify: the node and cluster reporting the target after an upgrade.
	Verify time.Duration `json:"verify"`
	// APIRequest: one API request.
	APIRequest time.Duration `json:"apiRequest"`
	// KubeadmBootstrap: one kubeadm init or kubeadm join.
	KubeadmBootstrap time.Duration `json:"kubeadmBootstrap"`
	// ControlPlaneReady: a joining control plane waiting for the
	// endpoint's /readyz before kubeadm join.
	ControlPlaneReady time.Duration `json:"controlPlaneReady"`
}

// DefaultBudgets are the defaults.
func DefaultBudgets() Budgets {
	return Budgets{
		ClusterVersion:     60 * time.Second,
		WaitForCluster:     10 * time.Minute,
		KubeadmUpgrade:     20 * time.Minute,
		KubeletStart:       2 * time.Minute,
		KubeletHealthy:     2 * time.Minute,
		LocalAPI:           5 * time.Minute,
		ControlPlaneHealth: 5 * time.Minute,
		EtcdSnapshot:       2 * time.Minute,
		KubeletRestart:     2 * time.Minute,
		Verify:             5 * time.Minute,
		APIRequest:         5 * time.Second,
		KubeadmBootstrap:   15 * time.Minute,
		ControlPlaneReady:  10 * time.Minute,
	}
}

// PassBound is the documented upper bound of one pass with default budgets:
// the sum of every budget a pass can spend, with margin. The reconcile unit's
// TimeoutStartSec uses it.
const PassBound = 50 * time.Minute

// Total is the most a pass can spend with these budgets: the longest of
// the control-plane upgrade path (two cluster-version reads around a repair,
// the repair with its waits, the snapshot, the follower gate, one kubeadm
// upgrade, a restart and a verification), the worker upgrade path (the same
// without the local API, snapshot and gate, with the wait for the control
// planes) and a bootstrap (a control-plane join waits for /readyz, then one
// kubeadm init or join).
func (b Budgets) Total() time.Duration {
	common := 2*b.ClusterVersion + b.KubeletStart + b.KubeletHealthy + b.KubeadmUpgrade + b.KubeletRestart + b.Verify
	cp := common + b.LocalAPI + b.EtcdSnapshot + b.ControlPlaneHealth
	worker := common + b.WaitForCluster
	bootstrap := b.ControlPlaneReady + b.KubeadmBootstrap
	return max(cp, worker, bootstrap)
}

// WithOverrides applies providerConfig's "budgets" map.
func (b Budgets) WithOverrides(providerConfig json.RawMessage) (Budgets, error) {
	if len(providerConfig) == 0 || string(providerConfig) == "null" {
		return b, nil
	}
	var pc struct {
		Budgets map[string]string `json:"budgets"`
	}
	if err := json.Unmarshal(providerConfig, &pc); err != nil {
		return b, fmt.Errorf("providerConfig.budgets: %w", err)
	}
	fields := map[string]*time.Duration{
		"clusterVersion":     &b.ClusterVersion,
		"waitForCluster":     &b.WaitForCluster,
		"kubeadmUpgrade":     &b.KubeadmUpgrade,
		"kubeletStart":       &b.KubeletStart,
		"kubeletHealthy":     &b.KubeletHealthy,
		"localAPI":           &b.LocalAPI,
		"controlPlaneHealth": &b.ControlPlaneHealth,
		"etcdSnapshot":       &b.EtcdSnapshot,
		"kubeletRestart":     &b.KubeletRestart,
		"verify":             &b.Verify,
		"apiRequest":         &b.APIRequest,
		"kubeadmBootstrap":   &b.KubeadmBootstrap,
		"controlPlaneReady":  &b.ControlPlaneReady,
	}
	for k, v := range pc.Budgets {
		f, ok := fields[k]
		if !ok {
			return b, fmt.Errorf("providerConfig.budgets.%s: unknown budget", k)
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return b, fmt.Errorf("providerConfig.budgets.%s: %q is not a positive duration", k, v)
		}
		*f = d
	}
	if b.Total() > PassBound {
		return b, fmt.Errorf("providerConfig.budgets add up to %s, above the pass bound of %s", b.Total(), PassBound)
	}
	return b, nil
}
