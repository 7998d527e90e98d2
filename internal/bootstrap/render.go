// Package bootstrap is the init and join step of the reconcile pass: it
// renders the kubeadm configuration from the cluster section (pure), then
// runs kubeadm init or kubeadm join with it from a 0600 file on tmpfs. The
// bootstrap token and the certificate key live only in that file: never on
// a command line, in a log line or in the status.
package bootstrap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

// Sentinel errors for the decisions the renderer makes.
var (
	// ErrNoCAPin: a join without a CA pin is refused, never attempted unpinned.
	ErrNoCAPin = errors.New("no CA pin: joinConfiguration.discovery.bootstrapToken.caCertHashes is empty and cluster.ca_certs is not set; the provider never joins without pinning the cluster CA (run provider-kubernetes join-config on a control plane to get them)")
	// ErrRoleConflict: the documents ask for something the role does not do.
	ErrRoleConflict = errors.New("configuration conflicts with the role")
)

// Source says where a secret came from, for the log (never the value).
type Source string

// Sources.
const (
	SourceDerived  Source = "derived-from-cluster-token"
	SourceExplicit Source = "explicit"
)

// Rendered is a kubeadm configuration ready to be written, and what the
// step needs to know about it. Config holds secrets: never log it.
type Rendered struct {
	Config       []byte
	Endpoint     string   // host:port of the control plane
	CAHashes     []string // join: the CA pins discovery uses
	ControlPlane bool     // join: a control-plane join
	TokenSource  Source
	KeySource    Source // init, control-plane join
}

// RenderInit renders the documents for kubeadm init: the operator's
// InitConfiguration with a bootstrap token (derived from cluster_token
// unless given) and a certificate key (likewise), their
// ClusterConfiguration with controlPlaneEndpoint defaulted from
// control_plane_host, their KubeletConfiguration with the provider's
// defaults (clusterconfig.WithKubeletDefaults) and their
// KubeProxyConfiguration. apiVersion and kind are added when absent.
func RenderInit(c *clusterconfig.Cluster) (Rendered, error) {
	k, err := c.Validate()
	if err != nil {
		return Rendered{}, err
	}
	if c.Role != clusterconfig.RoleInit {
		return Rendered{}, fmt.Errorf("%w: kubeadm init needs role init, this node is %s", ErrRoleConflict, c.Role)
	}
	r := Rendered{TokenSource: SourceExplicit, KeySource: SourceExplicit}

	initDoc := typed(k.InitConfiguration, "initConfiguration")
	if _, ok := initDoc["bootstrapTokens"]; !ok {
		initDoc["bootstrapTokens"] = []any{map[string]any{
			"token":       DeriveToken(c.ClusterToken),
			"ttl":         clusterconfig.DefaultTokenTTL.String(),
			"description": "provider-kubernetes: derived from cluster_token",
		}}
		r.TokenSource = SourceDerived
	}
	if _, ok := initDoc["certificateKey"]; !ok {
		initDoc["certificateKey"] = DeriveCertificateKey(c.ClusterToken)
		r.KeySource = SourceDerived
	}

	clusterDoc := typed(k.ClusterConfiguration, "clusterConfiguration")
	ep, err := endpoint(c, k)
	if err != nil {
		return Rendered{}, err
	}
	if _, ok := clusterDoc["controlPlaneEndpoint"]; !ok {
		clusterDoc["controlPlaneEndpoint"] = ep
	}
	r.Endpoint = ep

	// The KubeletConfiguration init uploads (kubelet-config) is every
	// joining node's: the provider's defaults go in here once.
	docs := []map[string]any{initDoc, clusterDoc, typed(clusterconfig.WithKubeletDefaults(k.KubeletConfiguration), "kubeletConfiguration")}
	if k.KubeProxyConfiguration != nil {
		docs = append(docs, typed(k.KubeProxyConfiguration, "kubeProxyConfiguration"))
	}
	r.Config, err = marshalDocs(docs)
	return r, err
}

// RenderJoin renders the JoinConfiguration for kubeadm join (kubeadm join
// reads no other document: the kubelet and kube-proxy configuration come
// from the cluster). Discovery is by bootstrap token against the control
// plane endpoint, pinned by caCertHashes (the operator's, plus the pins of
// cluster.ca_certs); unsafeSkipCAVerification is never set. The token is
// the join document's, else the init document's, else derived from
// cluster_token, so every node with the same cluster section agrees; a
// control plane's certificate key is resolved the same way.
func RenderJoin(c *clusterconfig.Cluster) (Rendered, error) {
	k, err := c.Validate()
	if err != nil {
		return Rendered{}, err
	}
	if c.Role == clusterconfig.RoleInit {
		return Rendered{}, fmt.Errorf("%w: role init initialises a cluster, it does not join one", ErrRoleConflict)
	}
	r := Rendered{ControlPlane: c.Role == clusterconfig.RoleControlPlane, TokenSource: SourceExplicit}

	joinDoc := typed(k.JoinConfiguration, "joinConfiguration")
	if v, ok := joinDoc["controlPlane"]; ok && v != nil && !r.ControlPlane {
		return Rendered{}, fmt.Errorf("%w: joinConfiguration.controlPlane is set but the role is worker", ErrRoleConflict)
	}
	discovery := submap(joinDoc, "discovery")
	bt := submap(discovery, "bootstrapToken")

	if _, ok := bt["token"]; !ok {
		if tok, ok := initToken(k); ok {
			bt["token"] = tok
		} else {
			bt["token"] = DeriveToken(c.ClusterToken)
			r.TokenSource = SourceDerived
		}
	}
	ep, err := endpoint(c, k)
	if err != nil {
		return Rendered{}, err
	}
	if v, ok := bt["apiServerEndpoint"].(string); ok {
		ep, _ = clusterconfig.Endpoint(v) // validated
	} else {
		bt["apiServerEndpoint"] = ep
	}
	r.Endpoint = ep

	var pins []string
	if list, ok := bt["caCertHashes"].([]any); ok {
		for _, h := range list {
			pins = append(pins, h.(string)) // validated: strings
		}
	}
	for _, p := range c.CACerts {
		hs, _ := clusterconfig.CertHashes(p) // validated
		pins = append(pins, hs...)
	}
	slices.Sort(pins)
	pins = slices.Compact(pins)
	if len(pins) == 0 {
		return Rendered{}, ErrNoCAPin
	}
	r.CAHashes = pins
	bt["caCertHashes"] = toAny(pins)
	delete(bt, "unsafeSkipCAVerification") // validated absent or false

	if r.ControlPlane {
		r.KeySource = SourceExplicit
		cp := submap(joinDoc, "controlPlane")
		if _, ok := cp["certificateKey"]; !ok {
			if key, ok := k.InitConfiguration["certificateKey"].(string); ok {
				cp["certificateKey"] = key
			} else {
				cp["certificateKey"] = DeriveCertificateKey(c.ClusterToken)
				r.KeySource = SourceDerived
			}
		}
	}
	r.Config, err = marshalDocs([]map[string]any{joinDoc})
	return r, err
}

// endpoint is the control plane endpoint: clusterConfiguration's
// controlPlaneEndpoint, else control_plane_host with the default port.
func endpoint(c *clusterconfig.Cluster, k *clusterconfig.Kubeadm) (string, error) {
	if v, ok := k.ClusterConfiguration["controlPlaneEndpoint"].(string); ok {
		return clusterconfig.Endpoint(v)
	}
	return clusterconfig.Endpoint(c.ControlPlaneHost)
}

// initToken is the first explicit bootstrap token of the init document.
func initToken(k *clusterconfig.Kubeadm) (string, bool) {
	list, _ := k.InitConfiguration["bootstrapTokens"].([]any)
	for _, item := range list {
		if m, ok := item.(map[string]any); ok {
			if s, ok := m["token"].(string); ok {
				return s, true
			}
		}
	}
	return "", false
}

// typed deep-copies the operator's document and adds apiVersion and kind
// when absent.
func typed(doc map[string]any, key string) map[string]any {
	out := deepCopy(doc)
	apiVersion, kind := clusterconfig.TypeMeta(key)
	if _, ok := out["apiVersion"]; !ok {
		out["apiVersion"] = apiVersion
	}
	if _, ok := out["kind"]; !ok {
		out["kind"] = kind
	}
	return out
}

func submap(m map[string]any, key string) map[string]any {
	if sub, ok := m[key].(map[string]any); ok {
		return sub
	}
	sub := map[string]any{}
	m[key] = sub
	return sub
}

func deepCopy(m map[string]any) map[string]any {
	out := map[string]any{}
	if m == nil {
		return out
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("bootstrap: a parsed YAML document does not marshal: %v", err))
	}
	if err := json.Unmarshal(b, &out); err != nil {
		panic(fmt.Sprintf("bootstrap: deep copy: %v", err))
	}
	return out
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func marshalDocs(docs []map[string]any) ([]byte, error) {
	var buf bytes.Buffer
	for i, d := range docs {
		b, err := yaml.Marshal(d)
		if err != nil {
			return nil, fmt.Errorf("render %v: %w", d["kind"], err)
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}
