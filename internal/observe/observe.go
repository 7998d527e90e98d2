// Package observe is the only place that reads the host for decisions. It
// turns files under the root, the bundled binaries and the API into plain
// facts for the plan. Each fact is read on its own, so the plan preview can
// take some facts from flags and read only the rest, and a converged boot
// reads no more than it needs (no kubeadm exec, no API wait).
package observe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/bundle"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Observer reads facts from a host root.
type Observer struct {
	Root        paths.Root
	ClusterFile string // host path of the cluster file
	Runner      runner.Runner
	Clock       wait.Clock
	// APITimeout bounds one API request.
	APITimeout time.Duration
	// KubeadmVersionTimeout bounds the kubeadm version fallback.
	KubeadmVersionTimeout time.Duration
	Log                   *slog.Logger
}

// Config is the cluster file, parsed.
type Config struct {
	Cluster *clusterconfig.Cluster
	Kubeadm *clusterconfig.Kubeadm
	Pin     string
	Role    plan.Role
}

// Config reads the cluster file. An unreadable or invalid file is an error
// that the caller turns into an InvalidPin refusal.
func (o *Observer) Config() (Config, error) {
	p := o.ClusterFile
	if p == "" {
		p = paths.ClusterFile
	}
	// The plugin refused this boot's section: the boot stage wrote the
	// previous one. Acting on it would not be what the operator asked for.
	if msg, merr := fsutil.ReadFileTrusted(string(o.Root), paths.PluginError, 4<<10); merr == nil {
		return Config{}, fmt.Errorf("the cloud-config's cluster: section was refused at boot (%s); the cluster file holds the previous section, so nothing runs: fix the section under /oem, check it with kairos-agent notify agent.boot, and reboot",
			strings.TrimSpace(string(msg)))
	} else if !errors.Is(merr, os.ErrNotExist) {
		return Config{}, fmt.Errorf("read %s: %w", paths.PluginError, merr)
	}
	b, err := fsutil.ReadFileTrusted(string(o.Root), p, clusterconfig.MaxSize)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if _, yerr := os.Lstat(o.Root.Path(paths.ClusterYipFile)); yerr == nil {
				return Config{}, fmt.Errorf("cluster file %s does not exist although the plugin's %s does: Kairos's boot stage did not run it or failed (journalctl -b -u cos-setup-boot.service)", p, paths.ClusterYipFile)
			}
			return Config{}, fmt.Errorf("cluster file %s does not exist: Kairos's boot stage writes it from the cloud-config's cluster: section (none was found at the last boot)", p)
		}
		return Config{}, fmt.Errorf("read cluster file %s: %w", p, err)
	}
	c, err := clusterconfig.Parse(b)
	if err != nil {
		return Config{}, fmt.Errorf("cluster file %s: %w", p, err)
	}
	cfg, err := configOf(c)
	if err != nil {
		return Config{}, fmt.Errorf("cluster file %s: %w", p, err)
	}
	return cfg, nil
}

// Bundled returns the version of the bundled kubeadm: from the bundle
// manifest, or, only when the manifest is missing, from `kubeadm version -o
// short`. The source names which one answered.
func (o *Observer) Bundled(ctx context.Context) (v version.Version, source string, err error) {
	b, err := fsutil.ReadFileNoFollow(o.Root.Path(paths.BundleManifest), 1<<20)
	if err == nil {
		m, err := bundle.Parse(b)
		if err != nil {
			return version.Version{}, paths.BundleManifest, fmt.Errorf("%s: %w", paths.BundleManifest, err)
		}
		return m.KubeadmVersion(), paths.BundleManifest, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return version.Version{}, paths.BundleManifest, fmt.Errorf("read %s: %w", paths.BundleManifest, err)
	}
	timeout := o.KubeadmVersionTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	res, err := o.Runner.Run(ctx, runner.Cmd{Path: paths.Kubeadm, Args: []string{"version", "-o", "short"}, Timeout: timeout})
	if err != nil {
		return version.Version{}, paths.Kubeadm, fmt.Errorf("bundle manifest missing and kubeadm version failed: %w", err)
	}
	v, err = version.ParseReported(string(res.Stdout))
	if err != nil {
		return version.Version{}, paths.Kubeadm, fmt.Errorf("kubeadm version: %w", err)
	}
	return v, paths.Kubeadm, nil
}

// Membership reports whether this node is a cluster member and whether it
// runs a control plane.
func (o *Observer) Membership() (member, controlPlane bool, err error) {
	member, err = exists(o.Root.Path(paths.KubeletConf))
	if err != nil {
		return false, false, err
	}
	controlPlane, err = exists(o.Root.Path(paths.APIServerManifest))
	return member, controlPlane, err
}

func exists(p string) (bool, error) {
	_, err := os.Lstat(p)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return false, err
}

// ControlPlaneVersion is this control plane's version: the lowest image tag
// among its kube-apiserver, kube-controller-manager and kube-scheduler static
// pods (the apiserver's is required). kubeadm rewrites them one after the
// other, so after an interrupted upgrade the lowest is the truth.
func (o *Observer) ControlPlaneVersion() (version.Version, error) {
	v, err := ManifestImageVersion(o.Root.Path(paths.APIServerManifest), "kube-apiserver")
	if err != nil {
		return version.Version{}, err
	}
	for _, c := range []string{"kube-controller-manager", "kube-scheduler"} {
		cv, err := ManifestImageVersion(o.Root.Path(paths.ManifestsDir+"/"+c+".yaml"), c)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return version.Version{}, err
		}
		if cv.Less(v) {
			v = cv
		}
	}
	return v, nil
}

// ManifestImageVersion reads the version tag of a static pod manifest's container image.
func ManifestImageVersion(file, container string) (version.Version, error) {
	b, err := fsutil.ReadFileNoFollow(file, 1<<20)
	if err != nil {
		return version.Version{}, err
	}
	img, err := ManifestImage(b, container)
	if err != nil {
		return version.Version{}, fmt.Errorf("%s: %w", file, err)
	}
	return version.ParseReported(ImageTag(img))
}

// ManifestImage returns the image of the named container of a static pod manifest.
func ManifestImage(b []byte, container string) (string, error) {
	var pod struct {
		Spec struct {
			Containers []struct {
				Name  string `json:"name"`
				Image string `json:"image"`
			} `json:"containers"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &pod); err != nil {
		return "", fmt.Errorf("parse static pod manifest: %w", err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == container {
			return c.Image, nil
		}
	}
	return "", fmt.Errorf("no container %q", container)
}

// ImageTag returns the tag of an image reference (after the last ':' that
// follows the last '/'), without a digest.
func ImageTag(ref string) string {
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		ref = ref[:i]
	}
	slash := strings.LastIndexByte(ref, '/')
	colon := strings.LastIndexByte(ref, ':')
	if colon <= slash {
		return ""
	}
	return ref[colon+1:]
}

// WorkerVersion is this worker's version: the version the provider last
// converged it to (the persistent status mirror, else the verified-version
// record), else the Node's kubeletVersion. After an A/B swap the kubelet
// on disk is already the new one (and soon reports it on the Node), so the
// provider's records come first, and the kubelet binary is never asked: its
// version says which image booted, not what this node was upgraded to. No
// record and no API: unknown, and the plan refuses rather than guesses.
func (o *Observer) WorkerVersion(ctx context.Context, client *kube.Client) (version.Version, string, error) {
	if d, err := status.ReadTrusted(o.Root, paths.StatusMirror); err == nil && d.Member && d.NodeVersion != "" {
		if v, err := version.Parse(d.NodeVersion); err == nil {
			since := d.Time
			if d.Carried != nil && d.Carried.Since != "" {
				since = d.Carried.Since
			}
			return v, paths.StatusMirror + " (last known, since " + since + ")", nil
		}
	}
	if v, err := o.VerifiedVersion(); err == nil && !v.IsZero() {
		return v, paths.VerifiedRecord, nil
	}
	var errs []error
	if client != nil {
		name, err := o.NodeName(client.NodeName)
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, o.apiTimeout())
			var ni kube.NodeInfo
			ni, err = client.Node(actx, name)
			cancel()
			if err == nil {
				return ni.KubeletVersion, "Node " + name, nil
			}
		}
		errs = append(errs, err)
	} else {
		errs = append(errs, errors.New("no API client"))
	}
	return version.Version{}, "", fmt.Errorf("worker version: no provider record (%s, %s) and %w", paths.StatusMirror, paths.VerifiedRecord, errors.Join(errs...))
}

// BundleImages are the image references the image's bundle manifest lists.
func (o *Observer) BundleImages() ([]string, error) {
	b, err := fsutil.ReadFileNoFollow(o.Root.Path(paths.BundleManifest), 1<<20)
	if err != nil {
		return nil, err
	}
	m, err := bundle.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", paths.BundleManifest, err)
	}
	return m.Images, nil
}

// VerifiedVersion is the last version this node was verified at, from the
// provider's persistent record (paths.VerifiedRecord); zero, with no
// error, when there is no record (a node bootstrapped by an older release).
func (o *Observer) VerifiedVersion() (version.Version, error) {
	b, err := fsutil.ReadFileTrusted(string(o.Root), paths.VerifiedRecord, 4<<10)
	if errors.Is(err, os.ErrNotExist) {
		return version.Version{}, nil
	}
	if err != nil {
		return version.Version{}, fmt.Errorf("read %s: %w", paths.VerifiedRecord, err)
	}
	v, err := version.Parse(strings.TrimSpace(string(b)))
	if err != nil {
		return version.Version{}, fmt.Errorf("%s: %w", paths.VerifiedRecord, err)
	}
	return v, nil
}

// NodeName is this node's Node name: the one its kubelet client
// certificate names (certName), else the hostname lower-cased, as the
// kubelet registers it. A name that is not an RFC 1123 subdomain is
// refused, described and never quoted: it is about to become part of a
// URL path (a hostname like ../namespaces/kube-system/configmaps/x would
// name another object) and of log lines.
func (o *Observer) NodeName(certName string) (string, error) {
	if certName != "" {
		if len(validation.IsDNS1123Subdomain(certName)) == 0 {
			return certName, nil
		}
		return "", fmt.Errorf("the node client certificate names a node of %d bytes that is not an RFC 1123 name (not shown)", len(certName))
	}
	h := strings.ToLower(o.Hostname())
	if h == "" {
		return "", errors.New("the node's name is unknown (no node client certificate, no hostname)")
	}
	if len(validation.IsDNS1123Subdomain(h)) != 0 {
		return "", fmt.Errorf("the hostname (%d bytes) is not an RFC 1123 name (not shown): no Node can have it as its name", len(h))
	}
	return h, nil
}

// Hostname is the node's hostname from /proc under the root.
func (o *Observer) Hostname() string {
	b, err := fsutil.ReadFileNoFollow(o.Root.Path(paths.Hostname), 64<<10)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// BootID is this boot's id, or "".
func (o *Observer) BootID() string {
	b, err := fsutil.ReadFileNoFollow(o.Root.Path(paths.BootID), 64<<10)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Client returns an API client from kubelet.conf, else admin.conf.
func (o *Observer) Client() (*kube.Client, error) {
	return kube.Load(o.Root, o.apiTimeout(), paths.KubeletConf, paths.AdminConf)
}

func (o *Observer) apiTimeout() time.Duration {
	if o.APITimeout > 0 {
		return o.APITimeout
	}
	return 5 * time.Second
}

// ClusterVersion reads the cluster version within budget; the zero version
// and the last error when it cannot be read in time.
func (o *Observer) ClusterVersion(ctx context.Context, client *kube.Client, b wait.Budget) (version.Version, error) {
	if client == nil {
		return version.Version{}, errors.New("no API client")
	}
	var v version.Version
	err := wait.Poll(ctx, o.Clock, b, "read the cluster version", func(ctx context.Context) (bool, error) {
		got, err := client.ClusterVersion(ctx)
		if err != nil {
			return false, err
		}
		v = got
		return true, nil
	})
	return v, err
}

// ClusterVersionOnce is one attempt at the cluster version, bounded by the
// API timeout: no retry, no wait between attempts.
func (o *Observer) ClusterVersionOnce(ctx context.Context, client *kube.Client) (version.Version, error) {
	if client == nil {
		return version.Version{}, errors.New("no API client")
	}
	ctx, cancel := context.WithTimeout(ctx, o.apiTimeout())
	defer cancel()
	return client.ClusterVersion(ctx)
}

// ReadManifest reads a static pod manifest, refusing symlinks.
func ReadManifest(path string) ([]byte, error) { return fsutil.ReadFileNoFollow(path, 1<<20) }

// ManifestFlags returns the --key=value flags of the named container's
// command and args in a static pod manifest.
func ManifestFlags(b []byte, container string) (map[string]string, error) {
	var pod struct {
		Spec struct {
			Containers []struct {
				Name    string   `json:"name"`
				Command []string `json:"command"`
				Args    []string `json:"args"`
			} `json:"containers"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &pod); err != nil {
		return nil, fmt.Errorf("parse static pod manifest: %w", err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name != container {
			continue
		}
		flags := map[string]string{}
		for _, a := range append(append([]string{}, c.Command...), c.Args...) {
			if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok && strings.HasPrefix(a, "--") {
				flags[k] = v
			}
		}
		return flags, nil
	}
	return nil, fmt.Errorf("no container %q", container)
}

// ManifestFlag returns the value of --flag in the named container's command
// of a static pod manifest, or "".
func ManifestFlag(b []byte, container, flag string) string {
	flags, err := ManifestFlags(b, container)
	if err != nil {
		return ""
	}
	return flags[flag]
}
