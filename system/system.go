// Package system holds the systemd units provider-kubernetes ships in its OS
// images (units/, installed under /usr/lib/systemd/system with relative
// multi-user.target.wants links) and the manifest of everything it has ever
// shipped (shipped.yaml: exact host path → sha256 or link target, per
// release), which `provider-kubernetes migrate-units` uses to recognise the
// copies earlier releases left in /etc/systemd/system. Both are compiled in.
package system

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"
)

//go:embed units shipped.yaml history
var content embed.FS

// UnitDir is where the image's units live.
const UnitDir = "/usr/lib/systemd/system"

// WantsDir is the enablement directory the image's links go in.
const WantsDir = UnitDir + "/multi-user.target.wants"

// EtcUnitDir is where releases up to v0.3.0 put their copies.
const EtcUnitDir = "/etc/systemd/system"

// Unit names.
const (
	Kubelet       = "kubelet.service"
	Containerd    = "containerd.service"
	Reconcile     = "provider-kubernetes-reconcile.service"
	ImageImport   = "provider-kubernetes-image-import.service"
	UnitMigrate   = "provider-kubernetes-unit-migrate.service"
	Publish       = "provider-kubernetes-publish.service"
	KubeadmDropIn = "kubelet.service.d/10-kubeadm.conf"
)

// Wanted are the units the image enables through multi-user.target.wants.
var Wanted = []string{Containerd, Kubelet, ImageImport, Reconcile, UnitMigrate}

// File is one shipped file.
type File struct {
	Path string // absolute host path
	Mode fs.FileMode
	Data []byte
}

// Link is one shipped symlink.
type Link struct {
	Path   string // absolute host path of the link
	Target string // what it points at, as written
}

// Units returns the unit files and drop-ins the image installs, sorted by path.
func Units() []File {
	var out []File
	err := fs.WalkDir(content, "units", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := content.ReadFile(p)
		if err != nil {
			return err
		}
		out = append(out, File{Path: path.Join(UnitDir, strings.TrimPrefix(p, "units/")), Mode: 0o644, Data: b})
		return nil
	})
	if err != nil {
		panic(fmt.Sprintf("embedded units: %v", err)) // the embed is fixed at compile time
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// WantsLinks returns the relative enablement links the image installs.
func WantsLinks() []Link {
	out := make([]Link, 0, len(Wanted))
	for _, u := range Wanted {
		out = append(out, Link{Path: path.Join(WantsDir, u), Target: "../" + u})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Manifest is shipped.yaml.
type Manifest struct {
	Releases []Release `json:"releases"`
}

// Release is what one release shipped.
type Release struct {
	Release       string        `json:"release"`
	Reconstructed bool          `json:"reconstructed,omitempty"`
	Files         []ShippedFile `json:"files,omitempty"`
	Links         []ShippedLink `json:"links,omitempty"`
}

// ShippedFile is a file at an exact path with its digest.
type ShippedFile struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
}

// ShippedLink is a symlink at an exact path with its target.
type ShippedLink struct {
	Path   string `json:"path"`
	Target string `json:"target"`
}

// ErrInvalidManifest marks a manifest that cannot be trusted.
var ErrInvalidManifest = errors.New("invalid shipped-units manifest")

var hexDigest = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{64}$`) })

// ParseManifest parses and checks a manifest: clean absolute paths under
// /etc/systemd/system or /usr/lib/systemd/system, lowercase sha256 digests,
// non-empty link targets, no path that is a file in one entry and a link in
// another.
func ParseManifest(b []byte) (Manifest, error) {
	var m Manifest
	if err := yaml.UnmarshalStrict(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: %v", ErrInvalidManifest, err)
	}
	if len(m.Releases) == 0 {
		return Manifest{}, fmt.Errorf("%w: no releases", ErrInvalidManifest)
	}
	kind := map[string]string{}
	check := func(p, k string) error {
		if p != path.Clean(p) || !path.IsAbs(p) ||
			!(strings.HasPrefix(p, EtcUnitDir+"/") || strings.HasPrefix(p, UnitDir+"/")) {
			return fmt.Errorf("%w: path %q is not a clean path under %s or %s", ErrInvalidManifest, p, EtcUnitDir, UnitDir)
		}
		if prev, ok := kind[p]; ok && prev != k {
			return fmt.Errorf("%w: %s is a %s in one release and a %s in another", ErrInvalidManifest, p, prev, k)
		}
		kind[p] = k
		return nil
	}
	for _, r := range m.Releases {
		if r.Release == "" {
			return Manifest{}, fmt.Errorf("%w: a release without a name", ErrInvalidManifest)
		}
		for _, f := range r.Files {
			if err := check(f.Path, "file"); err != nil {
				return Manifest{}, err
			}
			if !hexDigest().MatchString(f.SHA256) {
				return Manifest{}, fmt.Errorf("%w: %s %s: sha256 %q", ErrInvalidManifest, r.Release, f.Path, f.SHA256)
			}
		}
		for _, l := range r.Links {
			if err := check(l.Path, "link"); err != nil {
				return Manifest{}, err
			}
			if l.Target == "" {
				return Manifest{}, fmt.Errorf("%w: %s %s: empty link target", ErrInvalidManifest, r.Release, l.Path)
			}
		}
	}
	return m, nil
}

// Shipped returns the compiled-in manifest.
func Shipped() Manifest {
	b, err := content.ReadFile("shipped.yaml")
	if err != nil {
		panic(fmt.Sprintf("embedded shipped.yaml: %v", err))
	}
	m, err := ParseManifest(b)
	if err != nil {
		panic(fmt.Sprintf("embedded shipped.yaml: %v", err))
	}
	return m
}

// History returns the bytes a (reconstructed) earlier release put at a host
// path, from history/<release>/: what tests recreate to play an older image.
func History(release, hostPath string) ([]byte, error) {
	return content.ReadFile(path.Join("history", release, strings.TrimPrefix(hostPath, "/")))
}

// Digest is the lowercase hex sha256 of b.
func Digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// EtcFiles returns, per path under /etc/systemd/system, every digest shipped there.
func (m Manifest) EtcFiles() map[string][]string {
	out := map[string][]string{}
	for _, r := range m.Releases {
		for _, f := range r.Files {
			if strings.HasPrefix(f.Path, EtcUnitDir+"/") {
				out[f.Path] = append(out[f.Path], f.SHA256)
			}
		}
	}
	return out
}

// EtcLinks returns, per path under /etc/systemd/system, every link target shipped there.
func (m Manifest) EtcLinks() map[string][]string {
	out := map[string][]string{}
	for _, r := range m.Releases {
		for _, l := range r.Links {
			if strings.HasPrefix(l.Path, EtcUnitDir+"/") {
				out[l.Path] = append(out[l.Path], l.Target)
			}
		}
	}
	return out
}

// ReleaseNamed returns the entry of one release.
func (m Manifest) ReleaseNamed(name string) (Release, bool) {
	for _, r := range m.Releases {
		if r.Release == name {
			return r, true
		}
	}
	return Release{}, false
}
