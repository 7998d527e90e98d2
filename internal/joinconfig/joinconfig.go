// Package joinconfig mints join material on a control plane and renders it
// as a ready-to-paste cloud-config cluster section for the next node: a
// fresh bootstrap token created through the API (client-go, admin.conf),
// the CA pin from the cluster CA, and for a control plane a fresh
// certificate key with the control-plane certificates uploaded under it by
// kubeadm, the key handed over in a 0600 config file, never on argv.
package joinconfig

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/bootstrap"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

// UploadCertsConfigPath is where the certificate key is handed to kubeadm
// (tmpfs, 0600, removed after the command).
const UploadCertsConfigPath = paths.TmpDir + "/upload-certs.yaml"

// CertsLifetime is how long kubeadm keeps the uploaded control-plane
// certificates (kubeadm's DefaultCertTokenDuration): a control plane must
// join within it.
const CertsLifetime = 2 * time.Hour

// ErrNotControlPlane: join material is minted only where admin.conf and the CA are.
var ErrNotControlPlane = errors.New("join-config runs on a control plane: it needs /etc/kubernetes/admin.conf and /etc/kubernetes/pki/ca.crt")

// Options configure one minting.
type Options struct {
	Root   paths.Root
	Runner runner.Runner
	Role   string        // worker or controlplane
	TTL    time.Duration // the bootstrap token's lifetime
	Now    func() time.Time
	// APITimeout bounds one API request; KubeadmTimeout the upload-certs run.
	APITimeout     time.Duration
	KubeadmTimeout time.Duration
}

// Material is the minted join material. Section is a secret.
type Material struct {
	Section []byte // the cloud-config to paste into the next node
	TokenID string // the bootstrap token's public id
	Expires time.Time
	Role    string
}

// Mint creates the join material.
func Mint(ctx context.Context, o Options) (_ Material, err error) {
	if o.Role != clusterconfig.RoleWorker && o.Role != clusterconfig.RoleControlPlane {
		return Material{}, fmt.Errorf("--role must be worker or controlplane, got %q", o.Role)
	}
	if o.TTL <= 0 || o.TTL > clusterconfig.MaxTokenTTL {
		return Material{}, fmt.Errorf("--ttl %s is not bounded: want more than 0 and at most %s", o.TTL, clusterconfig.MaxTokenTTL)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.APITimeout <= 0 {
		o.APITimeout = 10 * time.Second
	}
	if o.KubeadmTimeout <= 0 {
		o.KubeadmTimeout = 2 * time.Minute
	}

	// The pass's rules: its lock (no join-config while a pass, a reset or
	// a restore works on the node) and its directories (the lock refuses a
	// /run/provider-kubernetes another user owns, who could swap the
	// upload-certs config under kubeadm). Taken before anything is minted.
	unlock, err := reconcile.Lock(o.Root)
	if err != nil {
		return Material{}, fmt.Errorf("take the reconcile lock (nothing minted): %w", err)
	}
	defer unlock()

	local, err := localCluster(o.Root)
	if err != nil {
		return Material{}, err
	}
	client, err := kube.Load(o.Root, o.APITimeout, paths.AdminConf)
	if err != nil {
		return Material{}, fmt.Errorf("%w: %v", ErrNotControlPlane, err)
	}
	cc, raw, err := clusterConfiguration(ctx, client)
	if err != nil {
		return Material{}, err
	}
	caFile := paths.CACert
	caPEM, err := fsutil.ReadFileNoFollow(o.Root.Path(caFile), 1<<20)
	if err != nil {
		return Material{}, fmt.Errorf("%w: %v", ErrNotControlPlane, err)
	}
	pins, err := clusterconfig.CertHashes(string(caPEM))
	if err != nil {
		return Material{}, fmt.Errorf("%s: %w", caFile, err)
	}
	endpoint, err := apiEndpoint(cc.ControlPlaneEndpoint, client.Server)
	if err != nil {
		return Material{}, err
	}

	token, err := randomToken()
	if err != nil {
		return Material{}, err
	}
	expires := o.Now().Add(o.TTL).UTC().Truncate(time.Second)
	if err := createToken(ctx, client, token, expires, o.Role); err != nil {
		return Material{}, err
	}
	m := Material{TokenID: token[:6], Expires: expires, Role: o.Role}
	// From here a failure leaves a live token nobody was given: delete it.
	minted := false
	defer func() {
		if !minted {
			err = errors.Join(err, deleteToken(ctx, client, m.TokenID, o.APITimeout))
		}
	}()

	join := map[string]any{
		"discovery": map[string]any{"bootstrapToken": map[string]any{
			"token": token, "apiServerEndpoint": endpoint, "caCertHashes": pins,
		}},
	}
	if o.Role == clusterconfig.RoleControlPlane {
		key, err := randomKey()
		if err != nil {
			return Material{}, err
		}
		if err := uploadCerts(ctx, o, raw, key); err != nil {
			return Material{}, err
		}
		join["controlPlane"] = map[string]any{"certificateKey": key}
	}
	if m.Section, err = render(local, endpoint, cc.KubernetesVersion, join, m, o.Now()); err != nil {
		return Material{}, err
	}
	minted = true
	return m, nil
}

// deleteToken removes a bootstrap token minted by a join-config that then
// failed, bounded, even when ctx was cancelled (an interrupted command).
func deleteToken(ctx context.Context, c *kube.Client, id string, timeout time.Duration) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	err := c.Delete(dctx, "kube-system", "secrets", "bootstrap-token-"+id)
	if err != nil && !kube.IsNotFound(err) {
		return fmt.Errorf("delete the unused bootstrap token %s (delete it with kubeadm token delete %s): %w", id, id, err)
	}
	return nil
}

type clusterConfig struct {
	KubernetesVersion    string `json:"kubernetesVersion"`
	ControlPlaneEndpoint string `json:"controlPlaneEndpoint"`
}

// clusterConfiguration reads the cluster's own ClusterConfiguration from
// kube-system/kubeadm-config: the truth the next node joins.
func clusterConfiguration(ctx context.Context, c *kube.Client) (clusterConfig, string, error) {
	data, err := c.ConfigMapData(ctx, "kube-system", "kubeadm-config")
	if err != nil {
		return clusterConfig{}, "", fmt.Errorf("get kube-system/kubeadm-config: %w", err)
	}
	raw := data["ClusterConfiguration"]
	var cc clusterConfig
	if err := yaml.Unmarshal([]byte(raw), &cc); err != nil || cc.KubernetesVersion == "" {
		return clusterConfig{}, "", fmt.Errorf("kube-system/kubeadm-config has no readable ClusterConfiguration (%v)", err)
	}
	return cc, raw, nil
}

// apiEndpoint is the controlPlaneEndpoint, else the host:port of the
// server admin.conf talks to.
func apiEndpoint(controlPlaneEndpoint, server string) (string, error) {
	if controlPlaneEndpoint != "" {
		return clusterconfig.Endpoint(controlPlaneEndpoint)
	}
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("no controlPlaneEndpoint in kubeadm-config and admin.conf names no server")
	}
	return clusterconfig.Endpoint(u.Host)
}

// localCluster reads this node's cluster section: the next node shares its
// cluster_token.
func localCluster(root paths.Root) (*clusterconfig.Cluster, error) {
	b, err := fsutil.ReadFileTrusted(string(root), paths.ClusterFile, clusterconfig.MaxSize)
	if err != nil {
		return nil, fmt.Errorf("read the cluster file %s: %w", paths.ClusterFile, err)
	}
	return clusterconfig.Parse(b)
}

const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// randomToken is a fresh bootstrap token, uniformly over [a-z0-9].
func randomToken() (string, error) {
	out := make([]byte, 0, 22)
	buf := make([]byte, 64)
	for len(out) < 22 {
		if _, err := rand.Read(buf); err != nil {
			return "", fmt.Errorf("random token: %w", err)
		}
		for _, b := range buf {
			if b < 252 && len(out) < 22 {
				out = append(out, alphabet[b%36])
			}
		}
	}
	return string(out[:6]) + "." + string(out[6:]), nil
}

func randomKey() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random certificate key: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// createToken creates the bootstrap token Secret the way kubeadm does.
func createToken(ctx context.Context, c *kube.Client, token string, expires time.Time, role string) error {
	id, secret := token[:6], token[7:]
	s := map[string]any{
		"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]string{"name": "bootstrap-token-" + id, "namespace": "kube-system"},
		"type":     "bootstrap.kubernetes.io/token",
		"stringData": map[string]string{
			"description":                    "provider-kubernetes join-config for a " + role,
			"token-id":                       id,
			"token-secret":                   secret,
			"expiration":                     expires.Format(time.RFC3339),
			"usage-bootstrap-authentication": "true",
			"usage-bootstrap-signing":        "true",
			"auth-extra-groups":              "system:bootstrappers:kubeadm:default-node-token",
		},
	}
	if err := c.Create(ctx, "kube-system", "secrets", s); err != nil {
		return fmt.Errorf("create bootstrap token %s: %w", id, err)
	}
	return nil
}

// uploadCerts has kubeadm upload the control-plane certificates encrypted
// with key. The key travels in the InitConfiguration of a 0600 file next to
// the cluster's own ClusterConfiguration; --skip-certificate-key-print keeps
// it out of kubeadm's output.
func uploadCerts(ctx context.Context, o Options, clusterConfigDoc, key string) error {
	initDoc, err := yaml.Marshal(map[string]any{
		"apiVersion":     "kubeadm.k8s.io/v1beta4",
		"kind":           "InitConfiguration",
		"certificateKey": key,
	})
	if err != nil {
		return err
	}
	cfg := string(initDoc) + "---\n" + strings.TrimSpace(clusterConfigDoc) + "\n"
	full := o.Root.Path(UploadCertsConfigPath)
	remove, err := fsutil.WriteScratchBeneath(o.Root.Path("/"), UploadCertsConfigPath, []byte(cfg))
	if err != nil {
		return err
	}
	defer remove()
	_, err = o.Runner.Run(ctx, runner.Cmd{Path: paths.Kubeadm, Timeout: o.KubeadmTimeout, Args: []string{
		"init", "phase", "upload-certs", "--upload-certs", "--config", full,
		"--kubeconfig", o.Root.Path(paths.AdminConf), "--skip-certificate-key-print"}})
	if err != nil {
		return fmt.Errorf("upload the control-plane certificates: %w", err)
	}
	return nil
}

// render writes the cloud-config for the next node, and checks it is what
// the plugin and the join step accept.
func render(local *clusterconfig.Cluster, endpoint, kubernetesVersion string, join map[string]any, m Material, now time.Time) ([]byte, error) {
	config, err := yaml.Marshal(map[string]any{
		"clusterConfiguration": map[string]any{"kubernetesVersion": kubernetesVersion},
		"joinConfiguration":    join,
	})
	if err != nil {
		return nil, err
	}
	section := map[string]any{
		"cluster_token":      local.ClusterToken,
		"control_plane_host": endpoint,
		"role":               m.Role,
		"config":             string(config),
	}
	body, err := yaml.Marshal(map[string]any{"cluster": section})
	if err != nil {
		return nil, err
	}
	// What the next node's plugin and join step will do with it.
	sb, _ := yaml.Marshal(section)
	c, err := clusterconfig.Parse(sb)
	if err != nil {
		return nil, fmt.Errorf("rendered section: %w", err)
	}
	if _, err := bootstrap.RenderJoin(c); err != nil {
		return nil, fmt.Errorf("rendered section: %w", err)
	}

	var buf bytes.Buffer
	buf.WriteString("#cloud-config\n")
	fmt.Fprintf(&buf, "# provider-kubernetes join-config: join material for a %s, minted %s.\n", m.Role, now.UTC().Format(time.RFC3339))
	fmt.Fprintf(&buf, "# The bootstrap token %s expires at %s.\n", m.TokenID, m.Expires.Format(time.RFC3339))
	if m.Role == clusterconfig.RoleControlPlane {
		// The node needs both the token and the certificates: the earlier
		// of the two ends is the deadline (a --ttl below CertsLifetime).
		before := now.Add(CertsLifetime).UTC()
		if m.Expires.Before(before) {
			before = m.Expires
		}
		fmt.Fprintf(&buf, "# The uploaded control-plane certificates are deleted by kubeadm after %s: join before %s.\n",
			CertsLifetime, before.Format(time.RFC3339))
	}
	buf.WriteString("# This is a secret (it admits a node to the cluster): paste it into the next node's cloud-config and discard it.\n")
	buf.Write(body)
	return buf.Bytes(), nil
}
