package kairos_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	sdk "github.com/kairos-io/kairos-sdk/clusterplugin"
	yaml3 "gopkg.in/yaml.v3"

	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

// examplesDir holds the cloud-configs an operator copies, one per role.
const examplesDir = "../../examples/cloud-config"

// fill replaces an example's placeholders as the operator does: the
// cluster token and the CA pin.
func fill(b []byte) []byte { return testutil.FillExample(b, chainToken) }

func examples(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, role := range []string{clusterconfig.RoleInit, clusterconfig.RoleControlPlane, clusterconfig.RoleWorker} {
		b, err := os.ReadFile(filepath.Join(examplesDir, role+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		out[role] = b
	}
	return out
}

// Each example is Kairos's schema (the SDK's own parser reads it), is
// refused as shipped (its placeholders are not secrets anyone should
// boot with) and, filled in, is accepted by every check the plugin makes.
// TestRealKairosAgentChain sends each through the real kairos-agent too.
func TestExampleCloudConfigs(t *testing.T) {
	for role, b := range examples(t) {
		t.Run(role, func(t *testing.T) {
			if !strings.HasPrefix(string(b), "#cloud-config\n") {
				t.Fatal("no #cloud-config header")
			}
			var cfg sdk.Config
			if err := yaml3.Unmarshal(b, &cfg); err != nil || cfg.Cluster == nil {
				t.Fatalf("kairos-sdk cannot read it: %v", err)
			}
			if string(cfg.Cluster.Role) != role || len(cfg.Cluster.ProviderOptions) == 0 {
				t.Fatalf("role %q providerConfig %v", cfg.Cluster.Role, cfg.Cluster.ProviderOptions)
			}
			c, _, err := clusterconfig.ParseCloudConfig(b)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Validate(); err == nil || !strings.Contains(err.Error(), "cluster_token is still a placeholder") {
				t.Fatalf("the example as shipped: %v, want the placeholder refused", err)
			}
			filled := fill(b)
			c, _, err = clusterconfig.ParseCloudConfig(filled)
			if err != nil {
				t.Fatal(err)
			}
			k, err := c.Validate()
			if err != nil {
				t.Fatalf("filled in: %v", err)
			}
			if pin, _ := k.Pin(); pin == "" {
				t.Fatal("no pin")
			}
			if _, err := reconcile.DefaultBudgets().WithOverrides(c.ProviderConfig); err != nil {
				t.Fatalf("providerConfig: %v", err)
			}
			for _, l := range strings.Split(string(filled), "\n") {
				if !strings.HasPrefix(strings.TrimSpace(l), "#") && strings.ContainsAny(l, "<>") {
					t.Fatalf("a placeholder left after filling: %q", l)
				}
			}
		})
	}
}
