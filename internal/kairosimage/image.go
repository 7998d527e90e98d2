package kairosimage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/imagetree"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/system"
)

// Result is a built image.
type Result struct {
	Minor  string
	Tag    string // versions.yaml's imageTag ("v0.4.0-k8s1.37")
	Digest string // the image manifest's digest
	Layout string // the OCI image layout holding it (absolute)
	Base   Base
	// Release is the /etc/kairos-release kairos-init wrote for the image.
	Release map[string]string
	Took    time.Duration
}

// BuildOptions tune Build.
type BuildOptions struct {
	Options
	ProviderVersion string // stamped into the provider (default "dev")
}

// Build builds the image of minor ("1.37") and writes it, tagged with the
// minor's imageTag, into a new OCI image layout at out (refused when out
// exists). Layers, bottom up: the Kairos base, the tree, the node files,
// /etc/kairos-release.
func Build(ctx context.Context, minor, out string, o BuildOptions) (Result, error) {
	start := time.Now()
	o.Options = o.Options.withDefaults()
	entry, err := imagetree.Entry(minor)
	if err != nil {
		return Result{}, err
	}
	if out, err = filepath.Abs(out); err != nil {
		return Result{}, err
	}
	if _, err := os.Lstat(out); err == nil {
		return Result{}, fmt.Errorf("%s exists: give a new directory for the image layout", out)
	}
	base, err := EnsureBase(ctx, o.Options)
	if err != nil {
		return Result{}, err
	}
	work := filepath.Join(o.CacheDir, "minor-"+minor)
	if err := os.RemoveAll(work); err != nil {
		return Result{}, err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return Result{}, err
	}
	tree := filepath.Join(work, "tree")
	fmt.Fprintf(o.Log, "kairosimage: %s: the tree (internal/imagetree, as `make tree`)\n", minor)
	if _, err := imagetree.Build(ctx, minor, tree, imagetree.Options{Log: o.Log, ProviderVersion: o.ProviderVersion, Replace: true}); err != nil {
		return Result{}, err
	}
	nodeDir := filepath.Join(work, "node")
	if err := WriteNodeFiles(nodeDir, entry.Pause); err != nil {
		return Result{}, err
	}
	fmt.Fprintf(o.Log, "kairosimage: %s: /etc/kairos-release (kairos-init's kairosRelease step over base and tree)\n", minor)
	release, relDir, err := writeRelease(ctx, o.Options, work, base, tree, entry.Kubernetes)
	if err != nil {
		return Result{}, err
	}
	var layers []v1.Layer
	layers = append(layers, nil)
	if layers[0], err = tarball.LayerFromFile(base.Layer); err != nil {
		return Result{}, err
	}
	for _, l := range []struct{ name, dir string }{{"tree", tree}, {"node", nodeDir}, {"release", relDir}} {
		p := filepath.Join(work, l.name+".tar.gz")
		if _, err := WriteLayer(l.dir, p, nil); err != nil {
			return Result{}, err
		}
		layer, err := tarball.LayerFromFile(p)
		if err != nil {
			return Result{}, err
		}
		layers = append(layers, layer)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return Result{}, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Result{}, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: LayerTime}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.version":         entry.ImageTag,
		"io.kairos.provider-kubernetes.kubernetes": entry.Kubernetes,
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return Result{}, err
	}
	fmt.Fprintf(o.Log, "kairosimage: %s: writing the image layout %s\n", minor, out)
	lp, err := layout.Write(out, empty.Index)
	if err != nil {
		return Result{}, err
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": entry.ImageTag})); err != nil {
		return Result{}, err
	}
	d, err := img.Digest()
	if err != nil {
		return Result{}, err
	}
	return Result{Minor: minor, Tag: entry.ImageTag, Digest: d.String(), Layout: out, Base: base, Release: release, Took: time.Since(start)}, nil
}

// WriteNodeFiles writes system.NodeFiles for the pause tag into a new
// directory dir, root-owned, as the node layer (and the Earthfile's copy,
// through `mktree -node-files`).
func WriteNodeFiles(dir, pauseTag string) error {
	files, err := system.NodeFiles("registry.k8s.io/pause:" + pauseTag)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(strings.TrimPrefix(f.Path, "/")))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.Data, f.Mode); err != nil {
			return err
		}
		if err := os.Chmod(p, f.Mode); err != nil {
			return err
		}
	}
	return nil
}

// ReleaseStepArgs are kairos-init's arguments that run its kairosRelease
// step alone (every other step of the init stage skipped), writing
// /etc/kairos-release for release. The Earthfile runs the same (a test
// keeps them equal).
func ReleaseStepArgs(release string) []string {
	return []string{"-l", "info", "-s", "init", "-m", "generic", "-t", "false", "--version", release,
		"--skip-step", "kernel,initramfsConfigs,initrd,services,workarounds,cleanup"}
}

// writeRelease runs kairos-init's kairosRelease step alone in an overlay of
// the tree over the base (so the provider the tree installs answers
// init.provider.info), keeps the /etc/kairos-release it wrote, and checks
// it names the bundled Kubernetes version.
func writeRelease(ctx context.Context, o Options, work string, base Base, tree, kubernetes string) (map[string]string, string, error) {
	kinit, err := testbin.KairosInit(ctx, o.Log)
	if err != nil {
		return nil, "", err
	}
	scratch := filepath.Join(work, "release-overlay")
	if err := os.MkdirAll(filepath.Join(scratch, "upper"), 0o755); err != nil {
		return nil, "", err
	}
	if err := copyExecutable(kinit, filepath.Join(scratch, "upper", "kairos-init")); err != nil {
		return nil, "", err
	}
	err = Chroot(ctx, o.Log, 10*time.Minute, scratch, []string{tree, base.Rootfs},
		append([]string{"/kairos-init"}, ReleaseStepArgs(releaseVersion())...)...)
	if err != nil {
		return nil, "", err
	}
	// Written by kairos-init as root inside the chroot: read beneath the
	// upper directory, never through a link it could have left there.
	b, err := fsutil.ReadFileBeneath(filepath.Join(scratch, "upper"), "/etc/kairos-release", 64<<10)
	if err != nil {
		return nil, "", fmt.Errorf("kairos-init wrote no /etc/kairos-release: %w", err)
	}
	rel := ParseRelease(string(b))
	if rel["KAIROS_SOFTWARE_VERSION_PREFIX"] != "k8s" || rel["KAIROS_SOFTWARE_VERSION"] != kubernetes {
		return nil, "", fmt.Errorf("/etc/kairos-release does not carry the bundled Kubernetes (want prefix k8s and version %s): the provider did not answer init.provider.info", kubernetes)
	}
	dir := filepath.Join(work, "release")
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "kairos-release"), b, 0o644); err != nil {
		return nil, "", err
	}
	return rel, dir, os.RemoveAll(scratch)
}

// ParseRelease reads KEY="value" lines (/etc/kairos-release,
// os-release): comments and lines without "=" are skipped, the quotes
// around a value dropped.
func ParseRelease(s string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		out[k] = strings.Trim(v, `"'`)
	}
	return out
}

// ImageFileName is the file mkimage writes beside the layout's index: what
// it holds, for the tests and for an operator pushing it (`crane push`).
const ImageFileName = "image.json"

// ImageFile is ImageFileName's content.
type ImageFile struct {
	Minor  string `json:"minor"`
	Tag    string `json:"tag"`
	Digest string `json:"digest"`
	Layout string `json:"layout"`
}
