// Package images holds the version manifest (versions.yaml): per supported
// minor, the Kubernetes patch release, the etcd, coredns and pause images that
// release's kubeadm deploys, and the OS image tag. It is compiled into the
// provider so the window the binary enforces and the images the build
// produces come from one file.
package images

import (
	_ "embed"
	"fmt"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

//go:embed versions.yaml
var manifestYAML []byte

// Manifest is versions.yaml.
type Manifest struct {
	Release string       `json:"release"`
	Minors  []MinorEntry `json:"minors"`
}

// MinorEntry describes one per-minor image.
type MinorEntry struct {
	Minor      string `json:"minor"`
	Kubernetes string `json:"kubernetes"`
	Etcd       string `json:"etcd"`
	CoreDNS    string `json:"coredns"`
	Pause      string `json:"pause"`
	ImageTag   string `json:"imageTag"`
}

var (
	manifest Manifest
	window   version.Window
)

func init() {
	m, w, err := ParseManifest(manifestYAML)
	if err != nil {
		panic(fmt.Sprintf("images/versions.yaml compiled into the binary is invalid: %v", err))
	}
	manifest, window = m, w
}

// ParseManifest parses and checks a version manifest: every minor parses,
// every Kubernetes release belongs to its minor, minors ascend without gaps.
func ParseManifest(b []byte) (Manifest, version.Window, error) {
	var m Manifest
	if err := yaml.UnmarshalStrict(b, &m); err != nil {
		return Manifest{}, nil, fmt.Errorf("parse version manifest: %w", err)
	}
	if len(m.Minors) == 0 {
		return Manifest{}, nil, fmt.Errorf("version manifest lists no minors")
	}
	var w version.Window
	for i, e := range m.Minors {
		mi, err := version.ParseMinor(e.Minor)
		if err != nil {
			return Manifest{}, nil, fmt.Errorf("minor %d: %w", i, err)
		}
		k, err := version.Parse(e.Kubernetes)
		if err != nil {
			return Manifest{}, nil, fmt.Errorf("minor %s: kubernetes: %w", e.Minor, err)
		}
		if k.MinorOf() != mi {
			return Manifest{}, nil, fmt.Errorf("minor %s: kubernetes %s is not of that minor", e.Minor, e.Kubernetes)
		}
		if e.Etcd == "" || e.CoreDNS == "" || e.Pause == "" || e.ImageTag == "" {
			return Manifest{}, nil, fmt.Errorf("minor %s: etcd, coredns, pause and imageTag are required", e.Minor)
		}
		if i > 0 {
			prev := w[i-1]
			if mi.Major != prev.Major || mi.Minor != prev.Minor+1 {
				return Manifest{}, nil, fmt.Errorf("minor %s does not follow %s", mi, prev)
			}
		}
		w = append(w, mi)
	}
	return m, w, nil
}

// Window returns the supported minors compiled into this binary.
func Window() version.Window { return append(version.Window(nil), window...) }

// Get returns the compiled-in manifest.
func Get() Manifest {
	c := manifest
	c.Minors = append([]MinorEntry(nil), manifest.Minors...)
	return c
}

// ForMinor returns the entry of minor m.
func ForMinor(m version.Minor) (MinorEntry, bool) {
	for _, e := range manifest.Minors {
		if e.Minor == m.String() {
			return e, true
		}
	}
	return MinorEntry{}, false
}
