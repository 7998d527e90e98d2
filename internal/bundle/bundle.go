// Package bundle reads the bundle manifest an OS image carries at
// /usr/share/provider-kubernetes/bundle.yaml: the versions of the binaries
// and the control-plane images baked into that image.
package bundle

import (
	"errors"
	"fmt"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// ErrInvalid marks a manifest the provider cannot trust.
var ErrInvalid = errors.New("invalid bundle manifest")

// Manifest is bundle.yaml.
type Manifest struct {
	Kubernetes string   `json:"kubernetes"`
	Kubeadm    string   `json:"kubeadm"`
	Kubelet    string   `json:"kubelet"`
	Kubectl    string   `json:"kubectl,omitempty"`
	Etcd       string   `json:"etcd"`
	Etcdctl    string   `json:"etcdctl,omitempty"`
	Etcdutl    string   `json:"etcdutl,omitempty"`
	ImageTag   string   `json:"imageTag,omitempty"`
	Images     []string `json:"images,omitempty"`
}

// Parse parses and checks a manifest: kubeadm and kubelet must be exact,
// equal releases.
func Parse(b []byte) (Manifest, error) {
	var m Manifest
	if err := yaml.UnmarshalStrict(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := version.Parse(m.Kubeadm); err != nil {
		return Manifest{}, fmt.Errorf("%w: kubeadm: %v", ErrInvalid, err)
	}
	if m.Kubelet != "" && m.Kubelet != m.Kubeadm {
		return Manifest{}, fmt.Errorf("%w: kubelet %s differs from kubeadm %s", ErrInvalid, m.Kubelet, m.Kubeadm)
	}
	return m, nil
}

// KubeadmVersion is the bundled kubeadm's version.
func (m Manifest) KubeadmVersion() version.Version {
	v, _ := version.Parse(m.Kubeadm)
	return v
}

// Marshal renders the manifest.
func (m Manifest) Marshal() ([]byte, error) { return yaml.Marshal(m) }
