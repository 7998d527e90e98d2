// Package kube reads and writes the few API objects the provider needs: the
// cluster version from kube-system/kubeadm-config, Nodes, a few kube-system
// workloads, Events, bootstrap-token Secrets.
//
// Requests go through client-go's REST client (k8s.io/client-go/rest) and
// kubeconfigs are resolved by client-go's clientcmd, from bytes the
// provider reads itself: the kubeconfig and every file it names are read
// under the root without following a symlink, bounded, and only for the
// context used (kubeconfig.go). What the provider adds around client-go:
// every answer's body is bounded (MaxAnswer, counted after decompression),
// a redirect to another scheme or host is never followed with the
// credentials, a credential plugin runs bounded (plugin.go), a list is
// read in pages and bounded in objects (MaxObjects), warnings are printed
// escaped. The objects read are decoded into the few fields the provider
// uses; client-go's typed clientset is not linked (its init registers
// every API group).
package kube

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// userAgent is what every request says it comes from.
const userAgent = "provider-kubernetes"

// MaxAnswer bounds the body of one answer from an apiserver, counted as
// read (after any decompression): a page of MaxPage Nodes is a few MiB.
const MaxAnswer = 32 << 20

// MaxPage is the page size of a list; MaxObjects bounds the objects of a
// whole list (Kubernetes supports 5,000 Nodes in a cluster).
const (
	MaxPage    = 500
	MaxObjects = 10000
)

// Client talks to one apiserver, and says where its kubeconfig came from.
type Client struct {
	Kubeconfig string // host path (a list: joined by ':')
	NodeName   string // from the kubeconfig's client certificate, if it is a node's
	Server     string // the API server URL the kubeconfig points at
	cfg        *rest.Config
	core       *rest.RESTClient // /api/v1
	apps       *rest.RESTClient // /apis/apps/v1
	policy     *rest.RESTClient // /apis/policy/v1
	timeout    time.Duration    // each call's bound
}

// ErrNoKubeconfig is returned when none of the kubeconfigs tried is
// readable; the error wrapping it names exactly those files.
var ErrNoKubeconfig = errors.New("no readable kubeconfig")

// Load builds a client from the first readable kubeconfig (host paths under
// root). The per-request timeout bounds every call made through it.
func Load(root paths.Root, timeout time.Duration, kubeconfigs ...string) (*Client, error) {
	return LoadFirst(root, timeout, "", kubeconfigs...)
}

// LoadFirst is Load with a context chosen by name ("": each file's current
// context).
func LoadFirst(root paths.Root, timeout time.Duration, context string, kubeconfigs ...string) (*Client, error) {
	var errs []error
	for _, kc := range kubeconfigs {
		c, err := LoadSource(root, timeout, Source{Files: []string{kc}, Context: context})
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("%w (tried %s): %v", ErrNoKubeconfig, strings.Join(kubeconfigs, ", "), errors.Join(errs...))
}

// LoadSource builds a client from a kubeconfig source: a KUBECONFIG-style
// list merged as kubectl merges it, a context chosen by name.
func LoadSource(root paths.Root, timeout time.Duration, src Source) (*Client, error) {
	rc, origin, err := loadSource(root, src, timeout)
	if err != nil {
		return nil, err
	}
	c, err := newClient(rc, timeout)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", origin, err)
	}
	c.Kubeconfig = origin
	return c, nil
}

// codecs decode the one object client-go itself reads of an answer, a
// failure's Status.
var codecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	return serializer.NewCodecFactory(s)
}()

// newClient is a client over rc with the provider's bounds.
func newClient(rc *rest.Config, timeout time.Duration) (*Client, error) {
	rc = rest.CopyConfig(rc)
	rc.Timeout = timeout
	rc.UserAgent = userAgent
	rc.QPS, rc.Burst = 50, 100
	rc.WarningHandler, rc.WarningHandlerWithContext = nil, warnings{}
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return boundBodies{rt} })
	rc.ContentConfig = rest.ContentConfig{ContentType: "application/json", AcceptContentTypes: "application/json",
		NegotiatedSerializer: codecs.WithoutConversion()}
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, err
	}
	h := *hc
	h.CheckRedirect = sameOrigin
	c := &Client{Server: rc.Host, cfg: rc, timeout: timeout, NodeName: nodeName(rc.TLSClientConfig.CertData)}
	core := *rc
	core.APIPath, core.GroupVersion = "/api", &schema.GroupVersion{Version: "v1"}
	if c.core, err = rest.RESTClientForConfigAndClient(&core, &h); err != nil {
		return nil, err
	}
	apps := *rc
	apps.APIPath, apps.GroupVersion = "/apis", &schema.GroupVersion{Group: "apps", Version: "v1"}
	if c.apps, err = rest.RESTClientForConfigAndClient(&apps, &h); err != nil {
		return nil, err
	}
	policy := *rc
	policy.APIPath, policy.GroupVersion = "/apis", &schema.GroupVersion{Group: "policy", Version: "v1"}
	if c.policy, err = rest.RESTClientForConfigAndClient(&policy, &h); err != nil {
		return nil, err
	}
	return c, nil
}

// sameOrigin follows a redirect only to the scheme and host the request
// went to: client-go's credentials (a bearer token, a client certificate)
// go with every request the transport sends, a redirected one included.
func sameOrigin(req *http.Request, via []*http.Request) error {
	first := via[0].URL
	if req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
		return errors.New("the apiserver redirected to another scheme or host: not followed, the credentials stay")
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

// ErrAnswerTooLarge is an answer past MaxAnswer.
var ErrAnswerTooLarge = fmt.Errorf("the apiserver's answer is larger than %d bytes", MaxAnswer)

// boundBodies bounds every answer's body as it is read.
type boundBodies struct{ rt http.RoundTripper }

func (b boundBodies) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.rt.RoundTrip(req)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	if resp.ContentLength > MaxAnswer {
		resp.Body.Close()
		return nil, ErrAnswerTooLarge
	}
	resp.Body = &boundedBody{rc: resp.Body, left: MaxAnswer}
	return resp, nil
}

type boundedBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, ErrAnswerTooLarge
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n, ErrAnswerTooLarge
	}
	return n, err
}

func (b *boundedBody) Close() error { return b.rc.Close() }

// raw is a result's body, and its error as client-go's typed clients
// give it: the Status an apiserver's refusal carries, when it carries one.
func raw(res rest.Result) ([]byte, error) {
	b, err := res.Raw()
	if err != nil {
		err = res.Error()
	}
	return b, err
}

// WrappedRoundTripper lets client-go cancel through the bound.
func (b boundBodies) WrappedRoundTripper() http.RoundTripper { return b.rt }

// checkName refuses a name that is not one Kubernetes allows for the
// objects the provider names (an RFC 1123 subdomain: Nodes, Pods,
// ConfigMaps, Secrets), before it becomes part of a URL path. The name
// comes from a hostname or a file: described, never quoted.
func checkName(kind, name string) error {
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return nil
	}
	return fmt.Errorf("a %s name of %d bytes that is not an RFC 1123 name (not shown)", kind, len(name))
}

// shown is a name as an error may show it: itself when it is one
// Kubernetes allows, else a description.
func shown(name string) string {
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	return "(a name that is not RFC 1123, not shown)"
}

// warnings prints an apiserver's Warning headers escaped and bounded, to
// w (nil: the process's stderr), each text once per process (a gate that
// polls would print the same deprecation every few seconds).
type warnings struct{ w io.Writer }

var warned = struct {
	sync.Mutex
	seen map[string]bool
}{seen: map[string]bool{}}

func (h warnings) HandleWarningHeaderWithContext(_ context.Context, code int, _ string, text string) {
	if code != 299 || text == "" {
		return
	}
	if len(text) > 512 {
		text = text[:512] + "..."
	}
	warned.Lock()
	seen := warned.seen[text]
	if !seen && len(warned.seen) < 64 {
		warned.seen[text] = true
	}
	warned.Unlock()
	if seen {
		return
	}
	w := h.w
	if w == nil {
		w = os.Stderr
	}
	fmt.Fprintln(w, "Warning: "+status.Printable(text))
}

// At is a client for the apiserver at addr ("host:port") with the same
// credentials and trust: each apiserver of an HA control plane answers for
// itself, where the kubeconfig's server may be any of them (the endpoint).
func (c *Client) At(addr string) (*Client, error) {
	if c.cfg == nil {
		return nil, errors.New("client has no connection config")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || net.ParseIP(host) == nil && !dnsName(host) || !validPort(port) {
		return nil, fmt.Errorf("client for an apiserver address of %d bytes that is not host:port (not shown)", len(addr))
	}
	rc := rest.CopyConfig(c.cfg)
	rc.Host = "https://" + net.JoinHostPort(host, port)
	out, err := newClient(rc, c.timeout)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", addr, err)
	}
	out.Kubeconfig, out.NodeName = c.Kubeconfig, c.NodeName
	return out, nil
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n < 65536 && strconv.Itoa(n) == p
}

// dnsName is an RFC 1123 host name.
func dnsName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r >= 'A' && r <= 'Z') {
				return false
			}
		}
	}
	return true
}

func unmarshalCaseSensitive(b []byte, out any) error {
	return kjson.UnmarshalCaseSensitivePreserveInts(b, out)
}

// IsNotFound reports an apiserver's answer that the object does not exist.
func IsNotFound(err error) bool { return apierrors.IsNotFound(err) }

// client is the REST client of a group ("" core, "apps", "policy").
func (c *Client) client(group string) *rest.RESTClient {
	switch group {
	case "apps":
		return c.apps
	case "policy":
		return c.policy
	}
	return c.core
}

// get is a GET of a named object (namespace "" for a cluster resource),
// bounded by the client's timeout, as the typed clients' Get.
func (c *Client) get(ctx context.Context, group, namespace, resource, name string, out any) error {
	if err := checkName(resource, name); err != nil {
		return err
	}
	r := c.client(group).Get().Resource(resource).Name(name).Timeout(c.timeout)
	if namespace != "" {
		r = r.Namespace(namespace)
	}
	b, err := raw(r.Do(ctx))
	if err == nil {
		err = statusInBody(b)
	}
	if err != nil {
		return err
	}
	return decode(b, out)
}

// decode reads a successful answer into out: field names matched
// case-sensitively, as client-go's JSON serializer does.
func decode(body []byte, out any) error {
	if len(body) == 0 {
		return errors.New("empty answer")
	}
	return unmarshalCaseSensitive(body, out)
}

// statusInBody is the failure a successful answer may still carry: a
// Status that is not Success, where an object was expected.
func statusInBody(b []byte) error {
	var st metav1.Status
	if unmarshalCaseSensitive(b, &st) != nil || st.Kind != "Status" || st.Status == metav1.StatusSuccess {
		return nil
	}
	return &apierrors.StatusError{ErrStatus: st}
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
	b, err := raw(c.core.Post().Namespace(namespace).Resource(resource).Timeout(c.timeout).
		SetHeader("Content-Type", "application/json").Body(body).Do(ctx))
	if err != nil {
		return err
	}
	return statusInBody(b)
}

// Delete deletes a named object of a namespaced core resource.
func (c *Client) Delete(ctx context.Context, namespace, resource, name string) error {
	if err := checkName(resource, name); err != nil {
		return err
	}
	_, err := raw(c.core.Delete().Namespace(namespace).Resource(resource).Name(name).Timeout(c.timeout).
		SetHeader("Content-Type", "application/json").Body([]byte(`{"kind":"DeleteOptions","apiVersion":"v1"}`)).Do(ctx))
	return err
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
	body, err := raw(c.core.Get().AbsPath("/version").Timeout(c.timeout).Do(ctx))
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
	// ReadyHeartbeat is when a kubelet last posted the Ready condition
	// (whole seconds, as the API keeps it; zero when absent).
	ReadyHeartbeat time.Time
}

// NoCNI reports whether a NotReady node is waiting only for a network
// plugin: a known state on a cluster without a CNI yet, not a hang.
func (n NodeInfo) NoCNI() bool { return noCNI(n.Ready, n.ReadyMessage) }

func noCNI(ready bool, message string) bool {
	m := strings.ToLower(message)
	return !ready && (strings.Contains(m, "cni") || strings.Contains(m, "network plugin"))
}

// Readyz asks the apiserver this client talks to for /readyz.
func (c *Client) Readyz(ctx context.Context) error {
	body, err := raw(c.core.Get().AbsPath("/readyz").Timeout(c.timeout).Do(ctx))
	if err != nil {
		if len(body) > 2048 {
			body = body[:2048]
		}
		return fmt.Errorf("/readyz via %s: %w (%s)", c.Kubeconfig, err, status.Printable(string(body)))
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

// owners are an object's ownerReferences, as far as the provider reads them.
type owners []struct {
	Kind string `json:"kind"`
	UID  string `json:"uid"`
}

// node is the uid of the Node that owns a mirror pod ("" when none does).
func (o owners) node() string {
	uid := ""
	for _, r := range o {
		if r.Kind == "Node" {
			uid = r.UID
		}
	}
	return uid
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
			OwnerReferences owners `json:"ownerReferences"`
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
		return PodInfo{}, fmt.Errorf("get pod %s/%s: %w", namespace, shown(name), err)
	}
	if len(p.Spec.Containers) == 0 {
		return PodInfo{}, fmt.Errorf("pod %s/%s has no container", namespace, name)
	}
	pi := PodInfo{Image: p.Spec.Containers[0].Image, NodeUID: p.Metadata.OwnerReferences.node()}
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
	if err := checkName("node", node); err != nil {
		return fmt.Errorf("annotate node: %w", err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	b, err := raw(c.core.Patch(types.MergePatchType).Resource("nodes").Name(node).Param("fieldManager", "provider-kubernetes").
		Timeout(c.timeout).Body(patch).Do(ctx))
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
		Conditions []nodeCondition `json:"conditions"`
		Addresses  []struct {
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
	if err := checkName("node", nodeName); err != nil {
		return fmt.Errorf("record event %s: %w", reason, err)
	}
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

// NodeRecord is what a list of Nodes gives of each (the cluster view,
// the control-plane gate).
type NodeRecord struct {
	Name           string
	UID            string
	ControlPlane   bool // labelled node-role.kubernetes.io/control-plane
	KubeletVersion string
	Ready          bool
	// NotReady is the Ready condition's reason and message when not Ready;
	// NoCNI says it waits only for a network plugin (NodeInfo.NoCNI).
	NotReady string
	NoCNI    bool
	// Addresses are its InternalIP and ExternalIP addresses, as the kubelet
	// (or a cloud provider) reports them.
	Addresses   []string
	Annotations map[string]string
}

// MaxNotReady bounds a NodeRecord's NotReady (bytes).
const MaxNotReady = 300

// record is a listed Node as a NodeRecord.
func record(n node) NodeRecord {
	_, cp := n.Metadata.Labels["node-role.kubernetes.io/control-plane"]
	r := NodeRecord{Name: n.Metadata.Name, UID: n.Metadata.UID, ControlPlane: cp, KubeletVersion: n.Status.NodeInfo.KubeletVersion, Annotations: n.Metadata.Annotations}
	var reason, message string
	r.Ready, reason, message = n.ready()
	switch {
	case !r.Ready && reason == "" && message == "":
		r.NotReady = "no Ready condition"
	case !r.Ready:
		// The peer's kubelet wrote it: bounded and made one safe line here,
		// before it joins the gate's reasons and the preflight's output.
		r.NotReady = runner.Sanitize(strings.TrimPrefix(reason+": "+message, ": "), MaxNotReady)
		r.NoCNI = noCNI(r.Ready, message)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == "InternalIP" || a.Type == "ExternalIP" {
			r.Addresses = append(r.Addresses, a.Address)
		}
	}
	return r
}

// listNodes lists the Nodes (those matching selector, when given), in
// pages of MaxPage, at most MaxObjects in all.
func (c *Client) listNodes(ctx context.Context, selector string) ([]node, error) {
	return list[node](ctx, "nodes", func() *rest.Request {
		r := c.core.Get().Resource("nodes")
		if selector != "" {
			r = r.Param("labelSelector", selector)
		}
		return r
	})
}

// list reads a list in pages of MaxPage, at most MaxObjects items in all:
// req makes the first request of a page (the paging parameters are
// added), what names the items in an error.
func list[T any](ctx context.Context, what string, req func() *rest.Request) ([]T, error) {
	var out []T
	cont := ""
	for {
		r := req().Param("limit", strconv.Itoa(MaxPage))
		if cont != "" {
			r = r.Param("continue", cont)
		}
		b, err := raw(r.Do(ctx))
		if err == nil {
			err = statusInBody(b)
		}
		var l struct {
			Metadata struct {
				Continue string `json:"continue"`
			} `json:"metadata"`
			Items []T `json:"items"`
		}
		if err == nil {
			err = decode(b, &l)
		}
		if err != nil {
			return nil, err
		}
		if out = append(out, l.Items...); len(out) > MaxObjects {
			return nil, fmt.Errorf("more than %d %s listed", MaxObjects, what)
		}
		if cont = l.Metadata.Continue; cont == "" {
			return out, nil
		}
	}
}

// Nodes lists every Node, sorted by name (needs list on Nodes).
func (c *Client) Nodes(ctx context.Context) ([]NodeRecord, error) {
	items, err := c.listNodes(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list nodes via %s: %w", c.Kubeconfig, err)
	}
	return records(items), nil
}

func records(items []node) []NodeRecord {
	out := make([]NodeRecord, 0, len(items))
	for _, n := range items {
		out = append(out, record(n))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ControlPlaneNodes lists the Nodes labelled node-role.kubernetes.io/control-plane
// (kubeadm labels every control plane), sorted by name. Needs list on
// Nodes: admin.conf has it, a node's own credentials do not.
func (c *Client) ControlPlaneNodes(ctx context.Context) ([]NodeRecord, error) {
	items, err := c.listNodes(ctx, "node-role.kubernetes.io/control-plane")
	if err != nil {
		return nil, fmt.Errorf("list control-plane nodes via %s: %w", c.Kubeconfig, err)
	}
	return records(items), nil
}

// AdvertiseAnnotation is where kubeadm records the address and port a
// control plane's kube-apiserver advertises, on its static pod (and so on
// the mirror pod): kubeadm's own upgrade reads it back to find a node's
// API endpoint (constants.KubeAPIServerAdvertiseAddressEndpointAnnotationKey).
const AdvertiseAnnotation = "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint"

// Advertised is the endpoint one control plane's kube-apiserver mirror
// pod says it advertises.
type Advertised struct {
	Endpoint string // canonical "ip:port" (CanonicalEndpoint)
	NodeUID  string // the Node the mirror pod belongs to, when it says
}

// OfNode: the mirror pod's owner, when it names one, is the Node of uid
// (PodInfo.OfNode's rule: a pod left by an earlier Node of that name says
// nothing of this one).
func (a Advertised) OfNode(uid string) bool { return PodInfo{NodeUID: a.NodeUID}.OfNode(uid) }

// AdvertisedAPIServers maps each node to the endpoint its kube-apiserver
// advertises, read from the mirror pods of kubeadm's kube-apiserver static
// pod in kube-system (labels component=kube-apiserver,tier=control-plane,
// as kubeadm lists them). Only a mirror pod bound to a node, named
// kube-apiserver-NODE, with a valid ip:port annotation counts; a node with
// two such pods counts none. Needs list on pods in kube-system (admin.conf).
func (c *Client) AdvertisedAPIServers(ctx context.Context) (map[string]Advertised, error) {
	type pod struct {
		Metadata struct {
			Name            string            `json:"name"`
			Annotations     map[string]string `json:"annotations"`
			OwnerReferences owners            `json:"ownerReferences"`
		} `json:"metadata"`
		Spec struct {
			NodeName string `json:"nodeName"`
		} `json:"spec"`
	}
	items, err := list[pod](ctx, "pods", func() *rest.Request {
		return c.core.Get().Namespace("kube-system").Resource("pods").
			Param("labelSelector", "component=kube-apiserver,tier=control-plane").Timeout(c.timeout)
	})
	if err != nil {
		return nil, fmt.Errorf("list the kube-apiserver pods via %s: %w", c.Kubeconfig, err)
	}
	out := map[string]Advertised{}
	seen := map[string]int{}
	for _, p := range items {
		m := p.Metadata
		if _, mirror := m.Annotations[mirrorAnnotation]; !mirror || p.Spec.NodeName == "" || m.Name != "kube-apiserver-"+p.Spec.NodeName {
			continue
		}
		ep, ok := CanonicalEndpoint(m.Annotations[AdvertiseAnnotation])
		if !ok {
			continue
		}
		seen[p.Spec.NodeName]++
		out[p.Spec.NodeName] = Advertised{Endpoint: ep, NodeUID: m.OwnerReferences.node()}
	}
	for n, count := range seen {
		if count > 1 {
			delete(out, n)
		}
	}
	return out, nil
}

// CanonicalEndpoint is an "ip:port" (an IPv6 address in brackets) with the
// address in its canonical form, so that one endpoint written two ways
// compares equal; ok is false for anything else (a name, no port).
func CanonicalEndpoint(hostport string) (string, bool) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", false
	}
	ip := net.ParseIP(host)
	n, err := strconv.Atoi(port)
	if ip == nil || err != nil || n < 1 || n > 65535 {
		return "", false
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(n)), true
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
		return Rollout{}, fmt.Errorf("get daemonset %s/%s: %w", namespace, shown(name), err)
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
		return Rollout{}, fmt.Errorf("get deployment %s/%s: %w", namespace, shown(name), err)
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
		return NodeInfo{}, fmt.Errorf("get node %s: %w", shown(name), err)
	}
	v, err := version.ParseReported(n.Status.NodeInfo.KubeletVersion)
	if err != nil {
		return NodeInfo{}, fmt.Errorf("node %s kubeletVersion: %w", name, err)
	}
	ni := NodeInfo{UID: n.Metadata.UID, KubeletVersion: v}
	ni.Ready, ni.ReadyReason, ni.ReadyMessage = n.ready()
	for _, cond := range n.Status.Conditions {
		if cond.Type == "Ready" {
			ni.ReadyHeartbeat = cond.LastHeartbeatTime.Time
		}
	}
	return ni, nil
}
