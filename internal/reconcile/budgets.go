package reconcile

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/certs"
	"github.com/kairos-io/provider-kubernetes/internal/imageimport"
	"github.com/kairos-io/provider-kubernetes/internal/metrics"
	"github.com/kairos-io/provider-kubernetes/internal/repair"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

// Budgets bound every wait and every command of a pass. The defaults are
// documented in docs/reference.md (providerConfig); the cluster section's
// providerConfig overrides them with budget.<name> keys (durations such as
// "90s" or "10m").
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
	// ControlPlaneTurn: a control plane waiting for its turn before its
	// kubeadm upgrade, while another control plane upgrades.
	ControlPlaneTurn time.Duration `json:"controlPlaneTurn"`
	// ControlPlaneHealth: the gate before a control plane's kubeadm upgrade,
	// once it holds its turn (the cluster endpoint's /readyz, every
	// control-plane Node Ready, every etcd member healthy).
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
	// CertificateRenewal: kubeadm certs renew all (the opt-in renewal,
	// certificates.renewBefore). The restart of the static pods after it
	// is bounded by LocalAPI.
	CertificateRenewal time.Duration `json:"certificateRenewal"`
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
		ControlPlaneTurn:   10 * time.Minute,
		ControlPlaneHealth: 5 * time.Minute,
		EtcdSnapshot:       2 * time.Minute,
		KubeletRestart:     2 * time.Minute,
		Verify:             5 * time.Minute,
		APIRequest:         5 * time.Second,
		KubeadmBootstrap:   15 * time.Minute,
		ControlPlaneReady:  10 * time.Minute,
		CertificateRenewal: 2 * time.Minute,
	}
}

// PassBound is the documented upper bound of one pass with default budgets:
// the sum of every budget a pass can spend, with margin. The reconcile unit's
// TimeoutStartSec uses it; it is also how long a control plane's published
// Upgrading counts for the others' turn (its pass cannot run longer).
const PassBound = 65 * time.Minute

// Total is the most a pass can spend with these budgets: the longest of
// the control-plane upgrade path (two cluster-version reads around a repair;
// the repair with its waits: the kubelet's grace, the local apiserver
// before kubelet-start and again after it; the snapshot, the wait for its
// turn and the health gate, one kubeadm upgrade, a restart and a
// verification), the worker upgrade path (the same without the local API,
// snapshot and gate, with the wait for the control planes), a bootstrap
// (a control-plane join waits for /readyz, then one kubeadm init or join)
// and a converged control plane's certificate renewal.
//
// The sum saturates at the largest time.Duration instead of wrapping, so
// budgets that add up past int64 read as too long rather than negative.
func (b Budgets) Total() time.Duration {
	common := sumDurations(b.ClusterVersion, b.ClusterVersion, repair.KubeletGrace, b.KubeletStart, b.KubeletHealthy, b.KubeadmUpgrade, b.KubeletRestart, b.Verify)
	cp := sumDurations(common, b.LocalAPI, b.LocalAPI, b.EtcdSnapshot, b.ControlPlaneTurn, b.ControlPlaneHealth)
	worker := sumDurations(common, b.WaitForCluster)
	bootstrap := sumDurations(b.ControlPlaneReady, b.KubeadmBootstrap)
	// A converged control plane's renewal: the certificates command, then
	// the restart of its static pods, bounded by budget.localAPI.
	renewal := sumDurations(b.ClusterVersion, b.CertificateRenewal, b.LocalAPI)
	return max(cp, worker, bootstrap, renewal)
}

// sumDurations adds durations, saturating at the largest time.Duration
// (and treating a negative one, which WithOverrides never yields, as the
// largest too, so it can only make the sum too long).
func sumDurations(ds ...time.Duration) time.Duration {
	const most = time.Duration(math.MaxInt64)
	var t time.Duration
	for _, d := range ds {
		if d < 0 || d > most-t {
			return most
		}
		t += d
	}
	return t
}

// BudgetKeyPrefix starts every budget key of providerConfig, which in
// Kairos's schema (kairos-sdk clusterplugin.Cluster) is a flat map of
// strings: "budget.waitForCluster: 15m".
const BudgetKeyPrefix = "budget."

// MaxEtcdSnapshot is the snapshot step's documented bound (upgrades.md: "It
// is bounded at two minutes"): providerConfig may lower it, not raise it.
const MaxEtcdSnapshot = 2 * time.Minute

// ErrProviderConfig marks a providerConfig the provider refuses: the one
// sentinel of pkg/clusterconfig, whose shape checks use it too.
var ErrProviderConfig = clusterconfig.ErrProviderConfig

// fields maps each budget's key name to its field.
func (b *Budgets) fields() map[string]*time.Duration {
	return map[string]*time.Duration{
		"clusterVersion":     &b.ClusterVersion,
		"waitForCluster":     &b.WaitForCluster,
		"kubeadmUpgrade":     &b.KubeadmUpgrade,
		"kubeletStart":       &b.KubeletStart,
		"kubeletHealthy":     &b.KubeletHealthy,
		"localAPI":           &b.LocalAPI,
		"controlPlaneTurn":   &b.ControlPlaneTurn,
		"controlPlaneHealth": &b.ControlPlaneHealth,
		"etcdSnapshot":       &b.EtcdSnapshot,
		"kubeletRestart":     &b.KubeletRestart,
		"verify":             &b.Verify,
		"apiRequest":         &b.APIRequest,
		"kubeadmBootstrap":   &b.KubeadmBootstrap,
		"controlPlaneReady":  &b.ControlPlaneReady,
		"certificateRenewal": &b.CertificateRenewal,
	}
}

// BudgetKeys are the providerConfig keys of the budgets, sorted.
func BudgetKeys() []string {
	var b Budgets
	var keys []string
	for k := range b.fields() {
		keys = append(keys, BudgetKeyPrefix+k)
	}
	sort.Strings(keys)
	return keys
}

// WithOverrides applies providerConfig's budget keys ("budget.<name>": a
// positive Go duration). Every key of providerConfig must be one of them;
// errors name the key and the expected form, never the value (the plugin
// refuses a bad one at boot with this same check). The error is the first
// of OverrideProblems.
func (b Budgets) WithOverrides(providerConfig map[string]string) (Budgets, error) {
	nb, problems := b.withOverrides(providerConfig)
	if len(problems) > 0 {
		return b, problems[0]
	}
	return nb, nil
}

// OverrideProblems is every problem WithOverrides finds in providerConfig,
// in its order: each key's, then the bounds on the budgets it set.
func (b Budgets) OverrideProblems(providerConfig map[string]string) []error {
	_, problems := b.withOverrides(providerConfig)
	return problems
}

func (b Budgets) withOverrides(providerConfig map[string]string) (Budgets, []error) {
	var problems []error
	fields := b.fields()
	keys := make([]string, 0, len(providerConfig))
	for k := range providerConfig {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == metrics.Key {
			// Not a budget: the metrics textfile's directory (or off).
			if _, err := metrics.Dir(providerConfig); err != nil {
				problems = append(problems, fmt.Errorf("%w: %w", ErrProviderConfig, err))
			}
			continue
		}
		if k == imageimport.PinKey {
			// Not a budget: the bundled images' pins (or off).
			if _, err := imageimport.PinWanted(providerConfig); err != nil {
				problems = append(problems, fmt.Errorf("%w: %w", ErrProviderConfig, err))
			}
			continue
		}
		if k == certs.RenewBeforeKey {
			// Not a budget: the opt-in certificate renewal's threshold.
			if _, err := certs.RenewBefore(providerConfig); err != nil {
				problems = append(problems, fmt.Errorf("%w: %w", ErrProviderConfig, err))
			}
			continue
		}
		name, isBudget := strings.CutPrefix(k, BudgetKeyPrefix)
		f, ok := fields[name]
		if !isBudget || !ok {
			others := []string{metrics.Key, certs.RenewBeforeKey, imageimport.PinKey}
			problems = append(problems, fmt.Errorf("%w: providerConfig has an unknown key, %s: the keys are %s (a Go duration each, e.g. budget.verify: 6m), %s and %s",
				ErrProviderConfig, clusterconfig.ShownKey(k, append(BudgetKeys(), others...)), strings.Join(BudgetKeys(), ", "), strings.Join(others[:len(others)-1], ", "), others[len(others)-1]))
			continue
		}
		d, err := time.ParseDuration(strings.TrimSpace(providerConfig[k]))
		if err != nil || d <= 0 {
			problems = append(problems, fmt.Errorf("%w: providerConfig %s is not a positive Go duration such as 90s or 10m", ErrProviderConfig, k))
			continue
		}
		// Each budget alone must fit the pass bound: this also keeps
		// their sum far from int64's range.
		if d > PassBound {
			problems = append(problems, fmt.Errorf("%w: providerConfig %s is above the pass bound of %s: every budget and their sum must fit it", ErrProviderConfig, k, PassBound))
			continue
		}
		*f = d
	}
	if b.EtcdSnapshot > MaxEtcdSnapshot {
		problems = append(problems, fmt.Errorf("%w: providerConfig %s%s is above the snapshot step's bound of %s: it may be lowered, not raised",
			ErrProviderConfig, BudgetKeyPrefix, "etcdSnapshot", MaxEtcdSnapshot))
	}
	if b.Total() > PassBound {
		problems = append(problems, fmt.Errorf("%w: the budgets add up to %s, above the pass bound of %s", ErrProviderConfig, b.Total(), PassBound))
	}
	return b, problems
}
