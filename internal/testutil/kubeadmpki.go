package testutil

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/runner"
)

// KubeadmInitPhases runs the real kubeadm's `init phase <phase> --config F`
// for each phase, as kubeadm init makes a control plane: F is an
// InitConfiguration for node n1 at 10.0.0.11 and a v1.37.2
// ClusterConfiguration with clusterKeys (YAML lines: certificatesDir, the
// validity periods, etcd's dataDir). kubeconfigDir, when not "", is given
// to the kubeconfig phases (kubeadm writes to /etc/kubernetes otherwise).
func KubeadmInitPhases(t testing.TB, kubeadm, clusterKeys, kubeconfigDir string, phases ...string) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "kubeadm.yaml")
	doc := `apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: 10.0.0.11
  bindPort: 6443
nodeRegistration:
  name: n1
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.37.2
controlPlaneEndpoint: 10.0.0.11:6443
` + clusterKeys
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ph := range phases {
		args := append(append([]string{"init", "phase"}, strings.Fields(ph)...), "--config", cfg)
		if kubeconfigDir != "" && strings.HasPrefix(ph, "kubeconfig") {
			args = append(args, "--kubeconfig-dir", kubeconfigDir)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, kubeadm, args...)
		cmd.Env = runner.BaseEnv
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("kubeadm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
