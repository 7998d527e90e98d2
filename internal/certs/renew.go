package certs

import (
	"fmt"
	"path"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// RenewBeforeKey is the providerConfig key that turns on the renewal of
// kubeadm's leaf certificates on a converged control plane: a Go
// duration; absent, renewal is off.
const RenewBeforeKey = "certificates.renewBefore"

// MaxRenewBefore bounds RenewBeforeKey: kubeadm's leaf certificates last
// one year by default, so a longer renewBefore would renew on every boot.
const MaxRenewBefore = 365 * 24 * time.Hour

// RenewBefore is the renewal threshold providerConfig asks for, 0 when it
// asks for none. A value that is not a positive Go duration of at most
// MaxRenewBefore is an error naming the key, never quoting the value.
func RenewBefore(providerConfig map[string]string) (time.Duration, error) {
	v, ok := providerConfig[RenewBeforeKey]
	if !ok {
		return 0, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("providerConfig %s is not a positive Go duration such as 720h (30 days)", RenewBeforeKey)
	}
	if d > MaxRenewBefore {
		return 0, fmt.Errorf("providerConfig %s is above %s, the year a kubeadm leaf certificate lasts by default: it would renew on every boot", RenewBeforeKey, MaxRenewBefore)
	}
	return d, nil
}

// RenewConfigPath is where the configuration handed to kubeadm certs renew
// all lives while kubeadm reads it (tmpfs, 0600, removed afterwards).
const RenewConfigPath = paths.TmpDir + "/certs-renew.yaml"

// RenewArgs is the kubeadm command line of a renewal, given the path of
// its configuration. With --config kubeadm reads no kubeadm-config
// ConfigMap: the renewal needs no API (at boot a control plane's own
// apiserver is not up yet, and kubeadm would otherwise fall back to its
// defaults, one year, whatever certificateValidityPeriod the cluster set).
func RenewArgs(configPath string) []string {
	return []string{"certs", "renew", "all", "--config", configPath}
}

// RenewConfig renders that configuration: the operator's
// clusterConfiguration (its certificatesDir, certificateValidityPeriod and
// encryptionAlgorithm are what kubeadm's renewal reads) at the node's
// version, its certificatesDir (default /etc/kubernetes/pki) re-based on
// root; with a node name, an InitConfiguration naming it (kubeadm
// otherwise validates the host name as one). Nothing secret is in it.
func RenewConfig(k *clusterconfig.Kubeadm, node version.Version, root paths.Root, nodeName string) ([]byte, error) {
	cluster := map[string]any{}
	if k != nil {
		for key, v := range k.ClusterConfiguration {
			cluster[key] = v
		}
	}
	cluster["apiVersion"], cluster["kind"] = "kubeadm.k8s.io/v1beta4", "ClusterConfiguration"
	cluster["kubernetesVersion"] = node.String()
	dir := paths.PKIDir
	if d, ok := cluster["certificatesDir"].(string); ok && d != "" {
		if !path.IsAbs(d) {
			return nil, fmt.Errorf("clusterConfiguration.certificatesDir is not an absolute path")
		}
		dir = path.Clean(d)
	}
	cluster["certificatesDir"] = root.Path(dir)
	b, err := yaml.Marshal(cluster)
	if err != nil {
		return nil, fmt.Errorf("render the certificate renewal config: %w", err)
	}
	if nodeName == "" {
		return b, nil
	}
	ic, err := yaml.Marshal(map[string]any{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
		"nodeRegistration": map[string]any{"name": nodeName}})
	if err != nil {
		return nil, fmt.Errorf("render the certificate renewal config: %w", err)
	}
	return append(append(ic, "---\n"...), b...), nil
}

// Due is the leaf (never an authority: kubeadm certs renew does not renew
// them) of cs that expires first, and whether it expires within before
// of now (an expired one too). before 0 is renewal off: never due.
func Due(cs []Cert, before time.Duration, now time.Time) (Cert, bool) {
	c, ok := Soonest(cs, false)
	if !ok || before <= 0 {
		return c, false
	}
	return c, c.NotAfter.Sub(now) < before
}
