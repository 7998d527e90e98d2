// Package clusterconfig parses the Kairos cluster section the provider acts
// on: the file the plugin writes to /run/provider-kubernetes/cluster.yaml
// (the keys of the cloud-config's "cluster:" section), whose "config" is a
// YAML string holding the kubeadm configuration documents by key.
package clusterconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"sigs.k8s.io/yaml"
)

// ErrInvalid marks a cluster section the provider cannot act on.
var ErrInvalid = errors.New("invalid cluster config")

// MaxSize bounds the cluster file and the config string.
const MaxSize = 1 << 20

// Cluster is the cluster section. ClusterToken is a secret: never log a Cluster.
type Cluster struct {
	ClusterToken     string            `json:"cluster_token,omitempty"`
	ControlPlaneHost string            `json:"control_plane_host,omitempty"`
	Role             string            `json:"role,omitempty"`
	Config           string            `json:"config,omitempty"`
	ProviderConfig   json.RawMessage   `json:"providerConfig,omitempty"`
	Env              map[string]string `json:"env,omitempty"`
	CACerts          []string          `json:"ca_certs,omitempty"`
}

// Kubeadm is the parsed "config" string. Each document is kept as the
// operator wrote it, so what reaches kubeadm is exactly their configuration.
type Kubeadm struct {
	ClusterConfiguration   map[string]any `json:"clusterConfiguration,omitempty"`
	InitConfiguration      map[string]any `json:"initConfiguration,omitempty"`
	JoinConfiguration      map[string]any `json:"joinConfiguration,omitempty"`
	UpgradeConfiguration   map[string]any `json:"upgradeConfiguration,omitempty"`
	KubeletConfiguration   map[string]any `json:"kubeletConfiguration,omitempty"`
	KubeProxyConfiguration map[string]any `json:"kubeProxyConfiguration,omitempty"`
}

// Parse parses a cluster file. The error names the offending key and never
// quotes a value (the token lives in this file).
func Parse(b []byte) (*Cluster, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%w: file is %d bytes, limit %d", ErrInvalid, len(b), MaxSize)
	}
	var raw map[string]json.RawMessage
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("%w: not YAML: %s", ErrInvalid, firstLine(err))
	}
	if raw == nil {
		return nil, fmt.Errorf("%w: empty", ErrInvalid)
	}
	for _, k := range []string{"cluster_token", "control_plane_host", "role", "config"} {
		if v, ok := raw[k]; ok && !isString(v) {
			if k == "config" {
				return nil, fmt.Errorf("%w: config must be a YAML string holding the kubeadm documents by key (write config: | and indent them), got %s", ErrInvalid, jsonKind(v))
			}
			return nil, fmt.Errorf("%w: %s must be a string, got %s", ErrInvalid, k, jsonKind(v))
		}
	}
	var c Cluster
	js, _ := json.Marshal(raw)
	if err := json.Unmarshal(js, &c); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("%w: %s has the wrong type (want %s)", ErrInvalid, te.Field, te.Type)
		}
		return nil, fmt.Errorf("%w: %s", ErrInvalid, firstLine(err))
	}
	return &c, nil
}

// Kubeadm parses the config string.
func (c *Cluster) Kubeadm() (*Kubeadm, error) {
	if len(c.Config) > MaxSize {
		return nil, fmt.Errorf("%w: config is %d bytes, limit %d", ErrInvalid, len(c.Config), MaxSize)
	}
	var k Kubeadm
	if err := yaml.UnmarshalStrict([]byte(c.Config), &k); err != nil {
		return nil, fmt.Errorf("%w: config: %s", ErrInvalid, firstLine(err))
	}
	return &k, nil
}

// Pin returns clusterConfiguration.kubernetesVersion as written. A value that
// is not a string (kubernetesVersion: 1.37 is a YAML number) is an error.
func (k *Kubeadm) Pin() (string, error) {
	v, ok := k.ClusterConfiguration["kubernetesVersion"]
	if !ok || v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%w: clusterConfiguration.kubernetesVersion must be a string such as \"v1.37.2\", got %T", ErrInvalid, v)
	}
	return s, nil
}

func isString(m json.RawMessage) bool {
	m = bytes.TrimSpace(m)
	return len(m) > 0 && (m[0] == '"' || bytes.Equal(m, []byte("null")))
}

// jsonKind names the JSON type of a value, never the value itself.
func jsonKind(m json.RawMessage) string {
	m = bytes.TrimSpace(m)
	if len(m) == 0 {
		return "nothing"
	}
	switch m[0] {
	case '{':
		return "a map"
	case '[':
		return "a list"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

// quoted matches what YAML and JSON errors quote of the input: a value
// there may be the token, so it is never repeated.
var quoted = regexp.MustCompile("`[^`]*`")

func firstLine(err error) string {
	s := err.Error()
	if i := bytes.IndexByte([]byte(s), '\n'); i >= 0 {
		s = s[:i]
	}
	s = quoted.ReplaceAllString(s, "<value>")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
