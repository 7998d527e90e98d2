// Package kube reads what the provider needs from the API through client-go:
// the cluster version from kube-system/kubeadm-config and a Node's kubelet
// version. Kubeconfigs are read under the root, with their file paths
// re-based there too.
package kube

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Client is a clientset plus where it came from.
type Client struct {
	Clientset  kubernetes.Interface
	Kubeconfig string // host path
	NodeName   string // from the kubeconfig's client certificate, if it is a node's
	Server     string // the API server URL the kubeconfig points at
	rest       *rest.Config
}

// ErrNoKubeconfig is returned when neither kubelet.conf nor admin.conf exists.
var ErrNoKubeconfig = errors.New("no kubeconfig: neither kubelet.conf nor admin.conf is readable")

// Load builds a client from the first readable kubeconfig (host paths under
// root). The per-request timeout bounds every call made through it.
func Load(root paths.Root, timeout time.Duration, kubeconfigs ...string) (*Client, error) {
	var errs []error
	for _, kc := range kubeconfigs {
		c, err := load(root, kc, timeout)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("%w: %v", ErrNoKubeconfig, errors.Join(errs...))
}

func load(root paths.Root, kc string, timeout time.Duration) (*Client, error) {
	b, err := fsutil.ReadFileNoFollow(root.Path(kc), 1<<20)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", kc, err)
	}
	cfg, err := clientcmd.Load(b)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", kc, err)
	}
	if err := inline(root, cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", kc, err)
	}
	rc, err := clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("client config %s: %w", kc, err)
	}
	rc.Timeout = timeout
	rc.UserAgent = "provider-kubernetes"
	// Every call is already paced by a bounded poll (at most one per 2 s);
	// no client-side rate limiter on top.
	rc.QPS = -1
	// JSON both ways: every apiserver speaks it, and so does the test API.
	rc.ContentType, rc.AcceptContentTypes = "application/json", "application/json"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("clientset %s: %w", kc, err)
	}
	return &Client{Clientset: cs, Kubeconfig: kc, NodeName: nodeName(rc), Server: rc.Host, rest: rc}, nil
}

// At is a client for the apiserver at addr ("host:port") with the same
// credentials and trust: each apiserver of an HA control plane answers for
// itself, where the kubeconfig's server may be any of them (the endpoint).
func (c *Client) At(addr string) (*Client, error) {
	if c.rest == nil {
		return nil, errors.New("client has no rest config")
	}
	rc := rest.CopyConfig(c.rest)
	rc.Host = "https://" + addr
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("clientset for %s: %w", addr, err)
	}
	return &Client{Clientset: cs, Kubeconfig: c.Kubeconfig, NodeName: c.NodeName, Server: rc.Host, rest: rc}, nil
}

// APIServers lists the address of every apiserver in the endpoints of the
// default/kubernetes Service ("ip:port", sorted): each apiserver keeps its
// own address there while it runs (a lease). A node's own credentials may
// read this object (get endpoints); they may not list Nodes or other
// nodes' pods.
func (c *Client) APIServers(ctx context.Context) ([]string, error) {
	ep, err := c.Clientset.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get default/kubernetes endpoints via %s: %w", c.Kubeconfig, err)
	}
	var out []string
	for _, s := range ep.Subsets {
		port := 0
		for _, p := range s.Ports {
			if p.Name == "https" || port == 0 {
				port = int(p.Port)
			}
		}
		for _, a := range s.Addresses {
			out = append(out, net.JoinHostPort(a.IP, strconv.Itoa(port)))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("default/kubernetes endpoints list no apiserver")
	}
	sort.Strings(out)
	return out, nil
}

// ServerVersion is the version the apiserver this client talks to serves
// (/version, readable by any authenticated client).
func (c *Client) ServerVersion(ctx context.Context) (version.Version, error) {
	body, err := c.Clientset.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(ctx)
	if err != nil {
		return version.Version{}, fmt.Errorf("/version of %s: %w", c.Server, err)
	}
	var info struct {
		GitVersion string `json:"gitVersion"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return version.Version{}, fmt.Errorf("/version of %s: %w", c.Server, err)
	}
	v, err := version.ParseReported(info.GitVersion)
	if err != nil {
		return version.Version{}, fmt.Errorf("/version of %s: %w", c.Server, err)
	}
	return v, nil
}

// inline reads every file a kubeconfig names (CA, client certificate and
// key, token file) under the root through the provider's checked open, and
// puts the content into the config: client-go would otherwise open them
// itself, following any symlink and blocking on a planted FIFO. The one
// link followed is the kubelet's own rotation link
// (kubelet-client-current.pem -> kubelet-client-<time>.pem, in its
// root-owned pki directory): fsutil.ReadFileRotated.
func inline(root paths.Root, cfg *clientcmdapi.Config) error {
	read := func(p string) ([]byte, error) {
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("%q is not an absolute path", p)
		}
		b, err := fsutil.ReadFileRotated(string(root), p, 1<<20)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		return b, nil
	}
	var err error
	for _, c := range cfg.Clusters {
		if c.CertificateAuthority != "" {
			if c.CertificateAuthorityData, err = read(c.CertificateAuthority); err != nil {
				return err
			}
			c.CertificateAuthority = ""
		}
	}
	for _, a := range cfg.AuthInfos {
		if a.ClientCertificate != "" {
			if a.ClientCertificateData, err = read(a.ClientCertificate); err != nil {
				return err
			}
			a.ClientCertificate = ""
		}
		if a.ClientKey != "" {
			if a.ClientKeyData, err = read(a.ClientKey); err != nil {
				return err
			}
			a.ClientKey = ""
		}
		if a.TokenFile != "" {
			b, err := read(a.TokenFile)
			if err != nil {
				return err
			}
			a.Token, a.TokenFile = strings.TrimSpace(string(b)), ""
		}
	}
	return nil
}

// nodeName is the CN of a node client certificate ("system:node:NAME").
func nodeName(rc *rest.Config) string {
	data := rc.TLSClientConfig.CertData
	for len(data) > 0 {
		var blk *pem.Block
		blk, data = pem.Decode(data)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return ""
		}
		if n, ok := strings.CutPrefix(c.Subject.CommonName, "system:node:"); ok {
			return n
		}
		return ""
	}
	return ""
}

// ClusterVersion reads kube-system/kubeadm-config ClusterConfiguration.kubernetesVersion.
func (c *Client) ClusterVersion(ctx context.Context) (version.Version, error) {
	cm, err := c.Clientset.CoreV1().ConfigMaps("kube-system").Get(ctx, "kubeadm-config", metav1.GetOptions{})
	if err != nil {
		return version.Version{}, fmt.Errorf("get kube-system/kubeadm-config via %s: %w", c.Kubeconfig, err)
	}
	raw, ok := cm.Data["ClusterConfiguration"]
	if !ok {
		return version.Version{}, fmt.Errorf("kube-system/kubeadm-config has no ClusterConfiguration")
	}
	var cc struct {
		KubernetesVersion string `json:"kubernetesVersion"`
	}
	if err := yaml.Unmarshal([]byte(raw), &cc); err != nil {
		return version.Version{}, fmt.Errorf("parse kubeadm-config ClusterConfiguration: %w", err)
	}
	v, err := version.ParseReported(cc.KubernetesVersion)
	if err != nil {
		return version.Version{}, fmt.Errorf("kubeadm-config kubernetesVersion: %w", err)
	}
	return v, nil
}

// NodeInfo is what the provider reads of a Node.
type NodeInfo struct {
	KubeletVersion version.Version
	Ready          bool
	ReadyReason    string
	ReadyMessage   string
}

// NoCNI reports whether a NotReady node is waiting only for a network
// plugin: a known state on a cluster without a CNI yet, not a hang.
func (n NodeInfo) NoCNI() bool {
	m := strings.ToLower(n.ReadyMessage)
	return !n.Ready && (strings.Contains(m, "cni") || strings.Contains(m, "network plugin"))
}

// Readyz asks the apiserver this client talks to for /readyz.
func (c *Client) Readyz(ctx context.Context) error {
	body, err := c.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("/readyz via %s: %w (%s)", c.Kubeconfig, err, strings.TrimSpace(string(body)))
	}
	return nil
}

// PodInfo is what the provider reads of a static (mirror) pod.
type PodInfo struct {
	Image   string
	Running bool
	Ready   bool
}

// Pod reads the first container of a pod.
func (c *Client) Pod(ctx context.Context, namespace, name string) (PodInfo, error) {
	p, err := c.Clientset.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return PodInfo{}, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	if len(p.Spec.Containers) == 0 {
		return PodInfo{}, fmt.Errorf("pod %s/%s has no container", namespace, name)
	}
	pi := PodInfo{Image: p.Spec.Containers[0].Image}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == p.Spec.Containers[0].Name {
			pi.Running = cs.State.Running != nil
			pi.Ready = cs.Ready
		}
	}
	return pi, nil
}

// Annotate merges annotations into a Node's metadata (a JSON merge patch:
// other annotations stay). A node's own credentials may patch its own Node.
func (c *Client) Annotate(ctx context.Context, node string, annotations map[string]string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	if _, err := c.Clientset.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "provider-kubernetes"}); err != nil {
		return fmt.Errorf("annotate node %s: %w", node, err)
	}
	return nil
}

// NodeEvent records a core/v1 Event about a Node (in the default
// namespace, as the kubelet records its own), so `kubectl describe node`
// shows it. eventType is Normal or Warning.
func (c *Client) NodeEvent(ctx context.Context, node, eventType, reason, message string, now time.Time) error {
	uid := ""
	if n, err := c.Clientset.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
		uid = string(n.UID)
	}
	t := metav1.NewTime(now)
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: node + ".provider-kubernetes.", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(uid), APIVersion: "v1"},
		Reason:         reason, Message: message, Type: eventType,
		Source:         corev1.EventSource{Component: "provider-kubernetes", Host: node},
		FirstTimestamp: t, LastTimestamp: t, Count: 1,
		ReportingController: "provider-kubernetes", ReportingInstance: node,
	}
	if _, err := c.Clientset.CoreV1().Events("default").Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("record event %s on node %s: %w", reason, node, err)
	}
	return nil
}

// NodeRecord is what the cluster view reads of a Node.
type NodeRecord struct {
	Name           string
	ControlPlane   bool // labelled node-role.kubernetes.io/control-plane
	KubeletVersion string
	Ready          bool
	Annotations    map[string]string
}

// Nodes lists every Node, sorted by name (needs list on Nodes).
func (c *Client) Nodes(ctx context.Context) ([]NodeRecord, error) {
	l, err := c.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes via %s: %w", c.Kubeconfig, err)
	}
	out := make([]NodeRecord, 0, len(l.Items))
	for _, n := range l.Items {
		_, cp := n.Labels["node-role.kubernetes.io/control-plane"]
		r := NodeRecord{Name: n.Name, ControlPlane: cp, KubeletVersion: n.Status.NodeInfo.KubeletVersion, Annotations: n.Annotations}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				r.Ready = cond.Status == corev1.ConditionTrue
			}
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// NodeAddr is a Node's name and internal address.
type NodeAddr struct{ Name, IP string }

// ControlPlaneNodes lists the Nodes labelled node-role.kubernetes.io/control-plane
// (kubeadm labels every control plane), sorted by name. Needs list on
// Nodes: admin.conf has it, a node's own credentials do not.
func (c *Client) ControlPlaneNodes(ctx context.Context) ([]NodeAddr, error) {
	l, err := c.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "node-role.kubernetes.io/control-plane"})
	if err != nil {
		return nil, fmt.Errorf("list control-plane nodes via %s: %w", c.Kubeconfig, err)
	}
	var out []NodeAddr
	for _, n := range l.Items {
		na := NodeAddr{Name: n.Name}
		for _, a := range n.Status.Addresses {
			if a.Type == "InternalIP" {
				na.IP = a.Address
				break
			}
		}
		out = append(out, na)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Rollout is an add-on workload's image and rollout state.
type Rollout struct {
	Image     string
	Desired   int32 // pods the workload wants
	Updated   int32 // pods of its current template
	Available int32
	Total     int32 // pods of any template (old ones linger during a rollout)
	Current   bool  // the controller has observed the latest spec
}

// Done reports a rollout as kubectl rollout status does: the latest spec
// observed, every pod of the current template, no old one left, all available.
func (r Rollout) Done() bool {
	return r.Current && r.Updated == r.Desired && r.Total == r.Desired && r.Available == r.Desired
}

// DaemonSet reads a DaemonSet's first container image and rollout.
func (c *Client) DaemonSet(ctx context.Context, namespace, name string) (Rollout, error) {
	d, err := c.Clientset.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Rollout{}, fmt.Errorf("get daemonset %s/%s: %w", namespace, name, err)
	}
	if len(d.Spec.Template.Spec.Containers) == 0 {
		return Rollout{}, fmt.Errorf("daemonset %s/%s has no container", namespace, name)
	}
	s := d.Status
	return Rollout{Image: d.Spec.Template.Spec.Containers[0].Image, Desired: s.DesiredNumberScheduled, Updated: s.UpdatedNumberScheduled,
		Available: s.NumberAvailable, Total: s.CurrentNumberScheduled, Current: s.ObservedGeneration >= d.Generation}, nil
}

// Deployment reads a Deployment's first container image and rollout.
func (c *Client) Deployment(ctx context.Context, namespace, name string) (Rollout, error) {
	d, err := c.Clientset.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Rollout{}, fmt.Errorf("get deployment %s/%s: %w", namespace, name, err)
	}
	if len(d.Spec.Template.Spec.Containers) == 0 {
		return Rollout{}, fmt.Errorf("deployment %s/%s has no container", namespace, name)
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	return Rollout{Image: d.Spec.Template.Spec.Containers[0].Image, Desired: want, Updated: s.UpdatedReplicas,
		Available: s.AvailableReplicas, Total: s.Replicas, Current: s.ObservedGeneration >= d.Generation}, nil
}

// Node reads a Node's kubelet version and readiness.
func (c *Client) Node(ctx context.Context, name string) (NodeInfo, error) {
	if name == "" {
		return NodeInfo{}, errors.New("node name unknown")
	}
	n, err := c.Clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return NodeInfo{}, fmt.Errorf("get node %s: %w", name, err)
	}
	v, err := version.ParseReported(n.Status.NodeInfo.KubeletVersion)
	if err != nil {
		return NodeInfo{}, fmt.Errorf("node %s kubeletVersion: %w", name, err)
	}
	ni := NodeInfo{KubeletVersion: v}
	for _, cond := range n.Status.Conditions {
		if cond.Type == "Ready" {
			ni.Ready = cond.Status == "True"
			ni.ReadyReason = cond.Reason
			ni.ReadyMessage = cond.Message
		}
	}
	return ni, nil
}
