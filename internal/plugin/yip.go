package plugin

import (
	"bytes"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// The yip schema as kairos' yip reads it (github.com/mudler/yip/pkg/schema:
// File and Directory have no YAML tags, so their keys are the lowercased
// field names; permissions are a plain integer).
type yipConfig struct {
	Name   string                `json:"name"`
	Stages map[string][]yipStage `json:"stages"`
}

type yipStage struct {
	Name        string         `json:"name"`
	Directories []yipDirectory `json:"directories,omitempty"`
	Files       []yipFile      `json:"files,omitempty"`
	Commands    []string       `json:"commands,omitempty"`
}

type yipDirectory struct {
	Path        string `json:"path"`
	Permissions uint32 `json:"permissions"`
	Owner       int    `json:"owner"`
	Group       int    `json:"group"`
}

type yipFile struct {
	Path        string `json:"path"`
	Permissions uint32 `json:"permissions"`
	Owner       int    `json:"owner"`
	Group       int    `json:"group"`
	Content     string `json:"content"`
}

// StartReconcile is the boot stage's command: start the reconcile unit
// without waiting for the pass (it can take many minutes).
var StartReconcile = "systemctl start --no-block " + paths.ReconcileUnit

// Render is the yip config written to /usr/local/cloud-config/cluster.kairos.yaml:
// at boot, write the cluster section to the cluster file (root, 0600, on
// tmpfs), then start the reconcile unit. Stages run in order.
func Render(clusterSection []byte) ([]byte, error) {
	cfg := yipConfig{
		Name: "provider-kubernetes",
		Stages: map[string][]yipStage{"boot": {
			{
				Name:        "provider-kubernetes cluster file",
				Directories: []yipDirectory{{Path: paths.RunDir, Permissions: 0o755}},
				Files:       []yipFile{{Path: paths.ClusterFile, Permissions: 0o600, Content: string(clusterSection)}},
			},
			{
				Name:     "provider-kubernetes reconcile",
				Commands: []string{StartReconcile},
			},
		}},
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.WriteString("#cloud-config\n")
	buf.Write(b)
	return buf.Bytes(), nil
}
