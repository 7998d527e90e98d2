// Package kube reads and writes the few API objects the provider needs: the
// cluster version from kube-system/kubeadm-config, Nodes, a few kube-system
// workloads, Events, bootstrap-token Secrets. Kubeconfigs are read under the
// root, with their file paths re-based there too.
//
// It is a lean client over net/http that does what client-go's REST
// client does for these calls (kubeconfig resolution and checks, TLS,
// credentials including exec plugins, the "timeout" parameter, retries
// after Retry-After, Status errors and NotFound), decoding only the fields
// the provider reads. client-go is not linked: its packages' init and size
// were most of what every provider process spent starting, on every boot,
// converged or not.
package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// userAgent is what every request says it comes from.
const userAgent = "provider-kubernetes"

// Client talks to one apiserver, and says where its kubeconfig came from.
type Client struct {
	Kubeconfig string // host path
	NodeName   string // from the kubeconfig's client certificate, if it is a node's
	Server     string // the API server URL the kubeconfig points at
	conn       *conn
	timeout    time.Duration // each call's bound
	hc         *http.Client
	exec       *execPlugin // the kubeconfig's credential plugin, if any
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
	cfg, err := parseKubeconfig(b)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", kc, err)
	}
	if err := inline(root, cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", kc, err)
	}
	cn, err := cfg.resolve()
	if err != nil {
		return nil, fmt.Errorf("client config %s: %w", kc, err)
	}
	c := forConn(cn, timeout)
	c.Kubeconfig, c.NodeName = kc, nodeName(cn.user.ClientCertificateData)
	return c, nil
}

// forConn is a client over its own transport (one connection per server).
func forConn(cn *conn, timeout time.Duration) *Client {
	c := &Client{Server: cn.host, conn: cn, timeout: timeout}
	if cn.user.Exec != nil {
		c.exec = &execPlugin{cfg: cn.user.Exec, cluster: cn.cluster, server: cn.host}
		if cn.tls != nil && len(cn.tls.Certificates) == 0 {
			cn.tls.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
				_, cert, err := c.exec.credentials(cri.Context())
				if err != nil || cert == nil {
					return &tls.Certificate{}, err
				}
				return cert, nil
			}
		}
	}
	c.hc = &http.Client{Transport: cn.transport(), Timeout: timeout}
	return c
}

// At is a client for the apiserver at addr ("host:port") with the same
// credentials and trust: each apiserver of an HA control plane answers for
// itself, where the kubeconfig's server may be any of them (the endpoint).
func (c *Client) At(addr string) (*Client, error) {
	if c.conn == nil {
		return nil, errors.New("client has no connection config")
	}
	cn := *c.conn
	cn.host = "https://" + addr
	base, err := serverURL(cn.host)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", addr, err)
	}
	cn.base = base
	if cn.tls != nil {
		cn.tls = cn.tls.Clone()
	} else if cn.tls, err = tlsConfig(cn.cluster, cn.user); err != nil {
		return nil, fmt.Errorf("client for %s: %w", addr, err)
	}
	out := forConn(&cn, c.timeout)
	if c.exec != nil {
		out.exec = c.exec // one plugin run per process
	}
	out.Kubeconfig, out.NodeName = c.Kubeconfig, c.NodeName
	return out, nil
}

func unmarshalCaseSensitive(b []byte, out any) error {
	return kjson.UnmarshalCaseSensitivePreserveInts(b, out)
}

// ConfigMapData reads a ConfigMap's data.
func (c *Client) ConfigMapData(ctx context.Context, namespace, name string) (map[string]string, error) {
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := c.get(ctx, "", namespace, "configmaps", name, &cm); err != nil {
		return nil, err
	}
	return cm.Data, nil
}

// Create creates obj (a JSON-marshalable object of the core API) in a
// namespaced resource.
func (c *Client) Create(ctx context.Context, namespace, resource string, obj any) error {
	body, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	b, err := c.do(ctx, request{verb: http.MethodPost, path: objectPath("", namespace, resource, ""), body: body,
		contentType: "application/json", resource: resource, timeout: c.timeout})
	if err != nil {
		return err
	}
	return statusInBody(b)
}

// Delete deletes a named object of a namespaced core resource.
func (c *Client) Delete(ctx context.Context, namespace, resource, name string) error {
	_, err := c.do(ctx, request{verb: http.MethodDelete, path: objectPath("", namespace, resource, name),
		body: []byte(`{"kind":"DeleteOptions","apiVersion":"v1"}` + "\n"), contentType: "application/json",
		resource: resource, name: name, timeout: c.timeout})
	return err
}

// statusInBody is the failure a successful answer may still carry: a
// Status that is not Success, where an object was expected.
func statusInBody(b []byte) error {
	var st apiStatus
	// A Status names its kind, literally or with \u escapes: a body with
	// neither is none (no second decode).
	if !bytes.Contains(b, []byte(`"Status"`)) && !bytes.Contains(b, []byte(`\u`)) ||
		unmarshalCaseSensitive(b, &st) != nil || st.Kind != "Status" || st.Status == "Success" {
		return nil
	}
	return &StatusError{Code: st.Code, Reason: st.Reason, Message: st.Message}
}

// APIServers lists the address of every apiserver in the endpoints of the
// default/kubernetes Service ("ip:port", sorted): each apiserver keeps its
// own address there while it runs (a lease). A node's own credentials may
// read this object (get endpoints); they may not list Nodes or other
// nodes' pods.
func (c *Client) APIServers(ctx context.Context) ([]string, error) {
	var ep struct {
		Subsets []struct {
			Addresses []struct {
				IP string `json:"ip"`
			} `json:"addresses"`
			Ports []struct {
				Name string `json:"name"`
				Port int32  `json:"port"`
			} `json:"ports"`
		} `json:"subsets"`
	}
	if err := c.get(ctx, "", "default", "endpoints", "kubernetes", &ep); err != nil {
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
	body, err := c.do(ctx, request{verb: http.MethodGet, path: "/version", timeout: c.timeout})
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
func inline(root paths.Root, cfg *kubeconfig) error {
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
	for i := range cfg.Clusters {
		c := &cfg.Clusters[i].Cluster
		if c.CertificateAuthority != "" {
			if c.CertificateAuthorityData, err = read(c.CertificateAuthority); err != nil {
				return err
			}
			c.CertificateAuthority = ""
		}
	}
	for i := range cfg.AuthInfos {
		a := &cfg.AuthInfos[i].AuthInfo
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
func nodeName(data []byte) string {
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
	data, err := c.ConfigMapData(ctx, "kube-system", "kubeadm-config")
	if err != nil {
		return version.Version{}, fmt.Errorf("get kube-system/kubeadm-config via %s: %w", c.Kubeconfig, err)
	}
	raw, ok := data["ClusterConfiguration"]
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
	UID            string
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
	body, err := c.do(ctx, request{verb: http.MethodGet, path: "/readyz", timeout: c.timeout, keepBody: true})
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
	// NodeUID is the uid of the Node the kubelet that created this mirror
	// pod had registered (its Node owner reference), "" when it has none.
	NodeUID string
}

// OfNode reports whether the pod mirrors what the kubelet of the Node
// with this uid runs. A mirror pod owned by an earlier Node of the same
// name (the node was reset and joined again) shows what ran before until
// the garbage collector or the new kubelet replaces it. Either uid
// unknown: it cannot tell, and counts the pod.
func (p PodInfo) OfNode(uid string) bool {
	return p.NodeUID == "" || uid == "" || p.NodeUID == uid
}

// container is the part of a pod template's container the provider reads.
type container struct {
	Name  string `json:"name"`
	Image string `json:"image"`
}

// Pod reads the first container of a pod.
func (c *Client) Pod(ctx context.Context, namespace, name string) (PodInfo, error) {
	var p struct {
		Metadata struct {
			OwnerReferences []struct {
				Kind string `json:"kind"`
				UID  string `json:"uid"`
			} `json:"ownerReferences"`
		} `json:"metadata"`
		Spec struct {
			Containers []container `json:"containers"`
		} `json:"spec"`
		Status struct {
			ContainerStatuses []struct {
				Name  string `json:"name"`
				Ready bool   `json:"ready"`
				State struct {
					Running *struct{} `json:"running"`
				} `json:"state"`
			} `json:"containerStatuses"`
		} `json:"status"`
	}
	if err := c.get(ctx, "", namespace, "pods", name, &p); err != nil {
		return PodInfo{}, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	if len(p.Spec.Containers) == 0 {
		return PodInfo{}, fmt.Errorf("pod %s/%s has no container", namespace, name)
	}
	pi := PodInfo{Image: p.Spec.Containers[0].Image}
	for _, o := range p.Metadata.OwnerReferences {
		if o.Kind == "Node" {
			pi.NodeUID = o.UID
		}
	}
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
	b, err := c.do(ctx, request{verb: http.MethodPatch, path: objectPath("", "", "nodes", node),
		query: map[string][]string{"fieldManager": {"provider-kubernetes"}}, body: patch,
		contentType: "application/merge-patch+json", resource: "nodes", name: node, timeout: c.timeout})
	if err == nil {
		err = statusInBody(b)
	}
	if err != nil {
		return fmt.Errorf("annotate node %s: %w", node, err)
	}
	return nil
}

// node is the part of a Node the provider reads.
type node struct {
	Metadata struct {
		Name        string            `json:"name"`
		UID         string            `json:"uid"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Status struct {
		NodeInfo struct {
			KubeletVersion string `json:"kubeletVersion"`
		} `json:"nodeInfo"`
		Conditions []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"conditions"`
		Addresses []struct {
			Type    string `json:"type"`
			Address string `json:"address"`
		} `json:"addresses"`
	} `json:"status"`
}

// ready is the Node's Ready condition.
func (n *node) ready() (ready bool, reason, message string) {
	for _, cond := range n.Status.Conditions {
		if cond.Type == "Ready" {
			ready, reason, message = cond.Status == "True", cond.Reason, cond.Message
		}
	}
	return ready, reason, message
}

// event is a core/v1 Event as the provider records it.
type event struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		GenerateName string `json:"generateName"`
		Namespace    string `json:"namespace"`
	} `json:"metadata"`
	InvolvedObject struct {
		Kind       string `json:"kind"`
		Name       string `json:"name"`
		UID        string `json:"uid,omitempty"`
		APIVersion string `json:"apiVersion"`
	} `json:"involvedObject"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Source  struct {
		Component string `json:"component"`
		Host      string `json:"host"`
	} `json:"source"`
	FirstTimestamp      string `json:"firstTimestamp"`
	LastTimestamp       string `json:"lastTimestamp"`
	Count               int32  `json:"count"`
	Type                string `json:"type"`
	ReportingController string `json:"reportingComponent"`
	ReportingInstance   string `json:"reportingInstance"`
}

// NodeEvent records a core/v1 Event about a Node (in the default
// namespace, as the kubelet records its own), so `kubectl describe node`
// shows it. eventType is Normal or Warning.
func (c *Client) NodeEvent(ctx context.Context, nodeName, eventType, reason, message string, now time.Time) error {
	var n node
	uid := ""
	if c.get(ctx, "", "", "nodes", nodeName, &n) == nil {
		uid = n.Metadata.UID
	}
	t := now.UTC().Format(time.RFC3339) // metav1.Time: seconds, UTC
	ev := event{APIVersion: "v1", Kind: "Event", Reason: reason, Message: message, Type: eventType,
		FirstTimestamp: t, LastTimestamp: t, Count: 1,
		ReportingController: "provider-kubernetes", ReportingInstance: nodeName}
	ev.Metadata.GenerateName, ev.Metadata.Namespace = nodeName+".provider-kubernetes.", "default"
	ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.InvolvedObject.UID, ev.InvolvedObject.APIVersion = "Node", nodeName, uid, "v1"
	ev.Source.Component, ev.Source.Host = "provider-kubernetes", nodeName
	if err := c.Create(ctx, "default", "events", ev); err != nil {
		return fmt.Errorf("record event %s on node %s: %w", reason, nodeName, err)
	}
	return nil
}

// NodeRecord is what the cluster view reads of a Node.
type NodeRecord struct {
	Name           string
	UID            string
	ControlPlane   bool // labelled node-role.kubernetes.io/control-plane
	KubeletVersion string
	Ready          bool
	Annotations    map[string]string
}

// listNodes lists the Nodes (those matching selector, when given).
func (c *Client) listNodes(ctx context.Context, selector string) ([]node, error) {
	// As the typed client lists: no server-side timeout parameter, and
	// the HTTP client's timeout alone bounds it.
	r := request{verb: http.MethodGet, path: objectPath("", "", "nodes", ""), resource: "nodes"}
	if selector != "" {
		r.query = map[string][]string{"labelSelector": {selector}}
	}
	b, err := c.do(ctx, r)
	if err == nil {
		err = statusInBody(b)
	}
	var l struct {
		Items []node `json:"items"`
	}
	if err == nil {
		err = decode(b, &l)
	}
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// Nodes lists every Node, sorted by name (needs list on Nodes).
func (c *Client) Nodes(ctx context.Context) ([]NodeRecord, error) {
	items, err := c.listNodes(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list nodes via %s: %w", c.Kubeconfig, err)
	}
	out := make([]NodeRecord, 0, len(items))
	for _, n := range items {
		_, cp := n.Metadata.Labels["node-role.kubernetes.io/control-plane"]
		r := NodeRecord{Name: n.Metadata.Name, UID: n.Metadata.UID, ControlPlane: cp, KubeletVersion: n.Status.NodeInfo.KubeletVersion, Annotations: n.Metadata.Annotations}
		r.Ready, _, _ = n.ready()
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
	items, err := c.listNodes(ctx, "node-role.kubernetes.io/control-plane")
	if err != nil {
		return nil, fmt.Errorf("list control-plane nodes via %s: %w", c.Kubeconfig, err)
	}
	var out []NodeAddr
	for _, n := range items {
		na := NodeAddr{Name: n.Metadata.Name}
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

// workload is the part of a DaemonSet or Deployment the provider reads.
type workload struct {
	Metadata struct {
		Generation int64 `json:"generation"`
	} `json:"metadata"`
	Spec struct {
		Replicas *int32 `json:"replicas"` // a Deployment's
		Template struct {
			Spec struct {
				Containers []container `json:"containers"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
	Status struct {
		ObservedGeneration int64 `json:"observedGeneration"`
		// a DaemonSet's
		DesiredNumberScheduled int32 `json:"desiredNumberScheduled"`
		UpdatedNumberScheduled int32 `json:"updatedNumberScheduled"`
		NumberAvailable        int32 `json:"numberAvailable"`
		CurrentNumberScheduled int32 `json:"currentNumberScheduled"`
		// a Deployment's
		UpdatedReplicas   int32 `json:"updatedReplicas"`
		AvailableReplicas int32 `json:"availableReplicas"`
		Replicas          int32 `json:"replicas"`
	} `json:"status"`
}

// DaemonSet reads a DaemonSet's first container image and rollout.
func (c *Client) DaemonSet(ctx context.Context, namespace, name string) (Rollout, error) {
	var d workload
	if err := c.get(ctx, "apps", namespace, "daemonsets", name, &d); err != nil {
		return Rollout{}, fmt.Errorf("get daemonset %s/%s: %w", namespace, name, err)
	}
	if len(d.Spec.Template.Spec.Containers) == 0 {
		return Rollout{}, fmt.Errorf("daemonset %s/%s has no container", namespace, name)
	}
	s := d.Status
	return Rollout{Image: d.Spec.Template.Spec.Containers[0].Image, Desired: s.DesiredNumberScheduled, Updated: s.UpdatedNumberScheduled,
		Available: s.NumberAvailable, Total: s.CurrentNumberScheduled, Current: s.ObservedGeneration >= d.Metadata.Generation}, nil
}

// Deployment reads a Deployment's first container image and rollout.
func (c *Client) Deployment(ctx context.Context, namespace, name string) (Rollout, error) {
	var d workload
	if err := c.get(ctx, "apps", namespace, "deployments", name, &d); err != nil {
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
		Available: s.AvailableReplicas, Total: s.Replicas, Current: s.ObservedGeneration >= d.Metadata.Generation}, nil
}

// Node reads a Node's kubelet version and readiness.
func (c *Client) Node(ctx context.Context, name string) (NodeInfo, error) {
	if name == "" {
		return NodeInfo{}, errors.New("node name unknown")
	}
	var n node
	if err := c.get(ctx, "", "", "nodes", name, &n); err != nil {
		return NodeInfo{}, fmt.Errorf("get node %s: %w", name, err)
	}
	v, err := version.ParseReported(n.Status.NodeInfo.KubeletVersion)
	if err != nil {
		return NodeInfo{}, fmt.Errorf("node %s kubeletVersion: %w", name, err)
	}
	ni := NodeInfo{UID: n.Metadata.UID, KubeletVersion: v}
	ni.Ready, ni.ReadyReason, ni.ReadyMessage = n.ready()
	return ni, nil
}
