// Package testutil holds what the hermetic tests share: a sandbox node root
// with real files and modes, an HTTPS API endpoint on loopback that answers
// the few reads the provider makes, and a clock that does not sleep.
package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
)

// API is a loopback HTTPS endpoint serving kube-system/kubeadm-config and
// Nodes the way kube-apiserver does, with state a test can change. It also
// stores what clients create the way the apiserver does for the objects the
// provider and kubeadm write (Secrets, Roles, RoleBindings: POST creates or
// answers 409 AlreadyExists, PUT replaces, GET reads), and answers /readyz
// and the public kube-public/cluster-info.
type API struct {
	mu sync.Mutex
	// Clock, when set, stamps what the fake's kubelets post (a Node's Ready
	// heartbeat): the pass's clock, so that posts and the pass agree on
	// what came first. Unset: the real time.
	Clock          interface{ Now() time.Time }
	clusterVersion string
	clusterConfig  string // the whole ClusterConfiguration, when set
	nodes          map[string]*corev1.Node
	objects        map[string][]byte // item path → JSON
	down           bool
	notReady       bool
	requests       int
	paths          []string
	// OnRequest runs before each request is answered (state changes over time).
	OnRequest func(n int)
	// Forbid, when set, answers 403 Forbidden to the requests it returns
	// true for (an apiserver just started, its RBAC cache not synced yet).
	Forbid func(method, path string) bool
	// Pod answers GET of a kube-system pod (static pods mirror what is on disk).
	Pod func(name string) (*corev1.Pod, bool)
	// serverVersion is what /version serves ("" follows the cluster version);
	// apiservers are the addresses the default/kubernetes endpoints list
	// (nil: this endpoint alone).
	serverVersion string
	apiservers    []string
	workloads     map[string]any // "daemonsets/NAME" or "deployments/NAME" in kube-system
	pods          []corev1.Pod   // what a list of kube-system pods gives
	events        []corev1.Event
	srv           *httptest.Server
}

// NodeAnnotations returns a Node's annotations (nil when there is no such Node).
func (a *API) NodeAnnotations(name string) map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.nodes[name]
	if !ok {
		return nil
	}
	out := map[string]string{}
	for k, v := range n.Annotations {
		out[k] = v
	}
	return out
}

// NodeConditions returns a Node's conditions (nil when there is no such Node).
func (a *API) NodeConditions(name string) []corev1.NodeCondition {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.nodes[name]
	if !ok {
		return nil
	}
	return append([]corev1.NodeCondition(nil), n.Status.Conditions...)
}

// Events returns the Events created so far.
func (a *API) Events() []corev1.Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]corev1.Event(nil), a.events...)
}

// SetDaemonSet serves kube-system DaemonSet name with image and status.
func (a *API) SetDaemonSet(name, image string, desired, updated, current, available int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.workloads == nil {
		a.workloads = map[string]any{}
	}
	ds := appsv1.DaemonSet{TypeMeta: metav1.TypeMeta{Kind: "DaemonSet", APIVersion: "apps/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Generation: 2},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: desired, UpdatedNumberScheduled: updated, CurrentNumberScheduled: current,
			NumberAvailable: available, ObservedGeneration: 2}}
	ds.Spec.Template.Spec.Containers = []corev1.Container{{Name: name, Image: image}}
	a.workloads["daemonsets/"+name] = ds
}

// SetDeployment serves kube-system Deployment name with image and status.
func (a *API) SetDeployment(name, image string, replicas, updated, total, available int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.workloads == nil {
		a.workloads = map[string]any{}
	}
	d := appsv1.Deployment{TypeMeta: metav1.TypeMeta{Kind: "Deployment", APIVersion: "apps/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Generation: 3},
		Spec:       appsv1.DeploymentSpec{Replicas: &replicas},
		Status:     appsv1.DeploymentStatus{UpdatedReplicas: updated, Replicas: total, AvailableReplicas: available, ObservedGeneration: 3}}
	d.Spec.Template.Spec.Containers = []corev1.Container{{Name: name, Image: image}}
	a.workloads["deployments/"+name] = d
}

// SetServerVersion makes /version serve v ("" follows the cluster version).
func (a *API) SetServerVersion(v string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.serverVersion = v
}

// SetAPIServers sets the addresses ("ip:port") the default/kubernetes
// endpoints list: other API instances play the other control planes'
// apiservers (every httptest TLS server shares one certificate, so one
// kubeconfig trusts them all).
func (a *API) SetAPIServers(addrs ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.apiservers = addrs
}

// SetControlPlaneNode labels a Node as kubeadm labels control planes and
// gives it an InternalIP.
func (a *API) SetControlPlaneNode(name, ip string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.node(name)
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels["node-role.kubernetes.io/control-plane"] = ""
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
}

// SetNodeUID gives a Node another uid (the Node deleted and registered
// again, as after a reset and join).
func (a *API) SetNodeUID(name, uid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.node(name).UID = types.UID(uid)
}

// SetAPIServerPod adds the mirror pod of the kube-apiserver static pod
// kubeadm writes on a control plane, with the endpoint ("ip:port") it
// advertises in kubeadm's annotation.
func (a *API) SetAPIServerPod(node, endpoint string) {
	ctrl := true
	a.AddPod(corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-apiserver-" + node, Namespace: "kube-system",
			Labels: map[string]string{"component": "kube-apiserver", "tier": "control-plane"},
			Annotations: map[string]string{"kubernetes.io/config.mirror": "0123456789abcdef",
				"kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint": endpoint},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: NodeUID(node), Controller: &ctrl}}},
		Spec: corev1.PodSpec{NodeName: node},
	})
}

// AddPod adds a pod to what a list of kube-system pods gives (a list's
// labelSelector of "k=v" terms is applied).
func (a *API) AddPod(p corev1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods = append(a.pods, p)
}

// SetNodeAnnotations merges annotations into a Node's (as another node's
// publish would), creating the Node when there is none.
func (a *API) SetNodeAnnotations(name string, annotations map[string]string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.node(name)
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	for k, v := range annotations {
		n.Annotations[k] = v
	}
}

// node is the Node of that name, made when there is none (a.mu held).
func (a *API) node(name string) *corev1.Node {
	n, ok := a.nodes[name]
	if !ok {
		n = &corev1.Node{TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: name, UID: NodeUID(name)}}
		a.nodes[name] = n
	}
	return n
}

// NewAPI starts the endpoint; it stops at the end of the test.
func NewAPI(t testing.TB, clusterVersion string) *API {
	a := &API{clusterVersion: clusterVersion, nodes: map[string]*corev1.Node{}, objects: map[string][]byte{}}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close)
	return a
}

// URL is the endpoint.
// Close stops serving: connections to the endpoint are refused from now on.
func (a *API) Close() { a.srv.Close() }

func (a *API) URL() string { return a.srv.URL }

// CAPEM is the serving certificate in PEM, to trust as the cluster CA.
func (a *API) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw})
}

// SetClusterVersion changes kubeadm-config's kubernetesVersion.
func (a *API) SetClusterVersion(v string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.clusterVersion = v
}

// ClusterVersion returns it.
func (a *API) ClusterVersion() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.clusterVersion
}

func (a *API) now() time.Time {
	if a.Clock != nil {
		return a.Clock.Now()
	}
	return time.Now()
}

// NodeUID is the uid the fake API gives the Node of that name.
func NodeUID(name string) types.UID { return types.UID("uid-node-" + name) }

// SetNode sets a Node's kubelet version and readiness.
func (a *API) SetNode(name, kubeletVersion string, ready bool) {
	msg := "kubelet is posting ready status"
	if !ready {
		msg = "container runtime status check may not have completed yet"
	}
	a.SetNodeCondition(name, kubeletVersion, ready, msg)
}

// SetNodeCondition sets a Node with the Ready condition's message, e.g.
// "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized".
func (a *API) SetNodeCondition(name, kubeletVersion string, ready bool, message string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	a.nodes[name] = &corev1.Node{
		TypeMeta:   metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: NodeUID(name)},
		Status: corev1.NodeStatus{
			NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: kubeletVersion},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st, Message: message, LastHeartbeatTime: metav1.NewTime(a.now())}},
		},
	}
}

// SetDown makes every request fail with 503, as an apiserver that is not ready.
func (a *API) SetDown(down bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down = down
}

// Requests counts the requests served.
func (a *API) Requests() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests
}

// Paths returns the request paths served so far, in order.
func (a *API) Paths() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.paths...)
}

func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.requests++
	a.paths = append(a.paths, r.URL.Path)
	n, hook := a.requests, a.OnRequest
	a.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if a.down {
		status(w, http.StatusServiceUnavailable, "apiserver is shutting down")
		return
	}
	if a.Forbid != nil && a.Forbid(r.Method, r.URL.Path) {
		status(w, http.StatusForbidden, fmt.Sprintf("%s %q is forbidden", strings.ToLower(r.Method), r.URL.Path))
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/version":
		v := a.serverVersion
		if v == "" {
			v = a.clusterVersion
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"gitVersion": v, "major": "1"})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/default/endpoints/kubernetes":
		addrs := a.apiservers
		if addrs == nil {
			addrs = []string{a.Addr()}
		}
		// One subset per address: the test apiservers differ by port (on a
		// cluster they share 6443 and one subset lists every address).
		var subs []corev1.EndpointSubset
		for _, ad := range addrs {
			host, port, _ := net.SplitHostPort(ad)
			p := 0
			fmt.Sscan(port, &p)
			subs = append(subs, corev1.EndpointSubset{Addresses: []corev1.EndpointAddress{{IP: host}},
				Ports: []corev1.EndpointPort{{Name: "https", Port: int32(p), Protocol: corev1.ProtocolTCP}}})
		}
		_ = json.NewEncoder(w).Encode(corev1.Endpoints{
			TypeMeta:   metav1.TypeMeta{Kind: "Endpoints", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"},
			Subsets:    subs,
		})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes":
		list := corev1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"}}
		sel := r.URL.Query().Get("labelSelector")
		names := make([]string, 0, len(a.nodes))
		for n := range a.nodes {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, name := range names {
			n := a.nodes[name]
			if sel != "" {
				if _, ok := n.Labels[sel]; !ok {
					continue
				}
			}
			list.Items = append(list.Items, *n)
		}
		_ = json.NewEncoder(w).Encode(list)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/apis/apps/v1/namespaces/kube-system/"):
		obj, ok := a.workloads[strings.TrimPrefix(r.URL.Path, "/apis/apps/v1/namespaces/kube-system/")]
		if !ok {
			status(w, http.StatusNotFound, "not found", metav1.StatusReasonNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(obj)
	case r.Method == http.MethodPatch && strings.HasPrefix(r.URL.Path, "/api/v1/nodes/") && strings.HasSuffix(r.URL.Path, "/status"):
		// A strategic merge patch of status.conditions, as the provider
		// sends its condition: each condition given replaces the one of its
		// type, or is added; the others stay (the real apiserver's merge is
		// tested against the real apiserver in internal/publish).
		n, ok := a.nodes[strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/api/v1/nodes/"), "/status")]
		if !ok {
			status(w, http.StatusNotFound, "node not found", metav1.StatusReasonNotFound)
			return
		}
		var patch struct {
			Status struct {
				Conditions []corev1.NodeCondition `json:"conditions"`
			} `json:"status"`
		}
		if r.Header.Get("Content-Type") != "application/strategic-merge-patch+json" || json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&patch) != nil {
			status(w, http.StatusBadRequest, "want a strategic merge patch of status.conditions")
			return
		}
	next:
		for _, c := range patch.Status.Conditions {
			for i := range n.Status.Conditions {
				if n.Status.Conditions[i].Type == c.Type {
					n.Status.Conditions[i] = c
					continue next
				}
			}
			n.Status.Conditions = append(n.Status.Conditions, c)
		}
		_ = json.NewEncoder(w).Encode(n)
	case r.Method == http.MethodPatch && strings.HasPrefix(r.URL.Path, "/api/v1/nodes/"):
		// A JSON merge patch of metadata.annotations, as the provider sends.
		n, ok := a.nodes[strings.TrimPrefix(r.URL.Path, "/api/v1/nodes/")]
		if !ok {
			status(w, http.StatusNotFound, "node not found", metav1.StatusReasonNotFound)
			return
		}
		var patch struct {
			Metadata struct {
				Annotations map[string]*string `json:"annotations"`
			} `json:"metadata"`
		}
		if r.Header.Get("Content-Type") != "application/merge-patch+json" || json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&patch) != nil {
			status(w, http.StatusBadRequest, "want a JSON merge patch")
			return
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		for k, v := range patch.Metadata.Annotations {
			if v == nil {
				delete(n.Annotations, k)
			} else {
				n.Annotations[k] = *v
			}
		}
		_ = json.NewEncoder(w).Encode(n)
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/default/events":
		var ev corev1.Event
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&ev); err != nil {
			status(w, http.StatusBadRequest, err.Error())
			return
		}
		ev.Name = fmt.Sprintf("%s%d", ev.GenerateName, len(a.events))
		a.events = append(a.events, ev)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(ev)
	case r.Method == http.MethodGet && r.URL.Path == "/readyz":
		w.Header().Set("Content-Type", "text/plain")
		if a.notReady {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte("[-]etcd failed: reason withheld\nreadyz check failed\n"))
			return
		}
		_, _ = w.Write([]byte("ok"))
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/kube-system/pods":
		list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
		for _, p := range a.pods {
			if matches(p.Labels, r.URL.Query().Get("labelSelector")) {
				list.Items = append(list.Items, p)
			}
		}
		_ = json.NewEncoder(w).Encode(list)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/kube-system/pods/"):
		var p *corev1.Pod
		ok := false
		if a.Pod != nil {
			p, ok = a.Pod(strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/kube-system/pods/"))
		}
		if !ok {
			status(w, http.StatusNotFound, "pod not found")
			return
		}
		_ = json.NewEncoder(w).Encode(p)
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/kube-public/configmaps/cluster-info":
		kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: %s\n    server: %s\n  name: \"\"\ncontexts: null\ncurrent-context: \"\"\nusers: null\n",
			base64.StdEncoding.EncodeToString(a.CAPEM()), a.srv.URL)
		_ = json.NewEncoder(w).Encode(corev1.ConfigMap{
			TypeMeta:   metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "cluster-info", Namespace: "kube-public"},
			Data:       map[string]string{"kubeconfig": kc},
		})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/kube-system/configmaps/kubeadm-config":
		if a.clusterVersion == "" && a.clusterConfig == "" {
			status(w, http.StatusNotFound, `configmaps "kubeadm-config" not found`)
			return
		}
		cc := a.clusterConfig
		if cc == "" {
			cc = fmt.Sprintf("apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: %s\nclusterName: kubernetes\n", a.clusterVersion)
		}
		cm := corev1.ConfigMap{
			TypeMeta:   metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm-config", Namespace: "kube-system"},
			Data:       map[string]string{"ClusterConfiguration": cc},
		}
		_ = json.NewEncoder(w).Encode(cm)
	case storable(r.URL.Path):
		a.store(w, r)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/api/v1/nodes/"):
		nd, ok := a.nodes[strings.TrimPrefix(r.URL.Path, "/api/v1/nodes/")]
		if !ok {
			status(w, http.StatusNotFound, "node not found")
			return
		}
		_ = json.NewEncoder(w).Encode(nd)
	default:
		status(w, http.StatusNotFound, "not served by the test API: "+r.Method+" "+r.URL.Path)
	}
}

// matches applies a labelSelector of "k=v" terms joined by commas.
func matches(labels map[string]string, selector string) bool {
	for _, term := range strings.Split(selector, ",") {
		if term == "" {
			continue
		}
		k, v, _ := strings.Cut(term, "=")
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// storable: the collections the API stores objects in.
func storable(p string) bool {
	for _, c := range []string{
		"/api/v1/namespaces/kube-system/secrets",
		"/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles",
		"/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings",
	} {
		if p == c || strings.HasPrefix(p, c+"/") && !strings.Contains(strings.TrimPrefix(p, c+"/"), "/") {
			return true
		}
	}
	return false
}

func (a *API) store(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		status(w, http.StatusBadRequest, err.Error())
		return
	}
	var obj map[string]any
	name := path.Base(r.URL.Path)
	switch r.Method {
	case http.MethodGet:
		b, ok := a.objects[r.URL.Path]
		if !ok {
			status(w, http.StatusNotFound, fmt.Sprintf("%q not found", name))
			return
		}
		_, _ = w.Write(b)
		return
	case http.MethodDelete:
		if _, ok := a.objects[r.URL.Path]; !ok {
			status(w, http.StatusNotFound, fmt.Sprintf("%q not found", name))
			return
		}
		delete(a.objects, r.URL.Path)
		status(w, http.StatusOK, "deleted")
		return
	case http.MethodPost, http.MethodPut:
		// Clients send protobuf or JSON: decode either as the apiserver does.
		o, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		if err != nil {
			status(w, http.StatusBadRequest, "body does not decode: "+err.Error())
			return
		}
		js, _ := json.Marshal(o)
		if err := json.Unmarshal(js, &obj); err != nil {
			status(w, http.StatusBadRequest, err.Error())
			return
		}
	default:
		status(w, http.StatusMethodNotAllowed, r.Method+" not served by the test API")
		return
	}
	meta, _ := obj["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		obj["metadata"] = meta
	}
	item := r.URL.Path
	if r.Method == http.MethodPost {
		n, _ := meta["name"].(string)
		if n == "" {
			status(w, http.StatusUnprocessableEntity, "metadata.name is required")
			return
		}
		item = r.URL.Path + "/" + n
		if _, exists := a.objects[item]; exists {
			status(w, http.StatusConflict, fmt.Sprintf("%q already exists", n), metav1.StatusReasonAlreadyExists)
			return
		}
		meta["uid"] = fmt.Sprintf("uid-%d", len(a.objects)+1)
		meta["creationTimestamp"] = time.Now().UTC().Format(time.RFC3339)
	} else if _, exists := a.objects[item]; !exists {
		status(w, http.StatusNotFound, fmt.Sprintf("%q not found", name))
		return
	} else if meta["uid"] == nil {
		var old map[string]any
		_ = json.Unmarshal(a.objects[item], &old)
		if om, ok := old["metadata"].(map[string]any); ok {
			meta["uid"] = om["uid"]
		}
	}
	meta["namespace"] = "kube-system"
	meta["resourceVersion"] = fmt.Sprint(a.requests)
	b, _ := json.Marshal(obj)
	a.objects[item] = b
	if r.Method == http.MethodPost {
		w.WriteHeader(http.StatusCreated)
	}
	_, _ = w.Write(b)
}

// Object returns a stored object (by item path, e.g.
// "/api/v1/namespaces/kube-system/secrets/NAME") decoded into out.
func (a *API) Object(itemPath string, out any) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.objects[itemPath]
	if !ok {
		return false
	}
	return json.Unmarshal(b, out) == nil
}

// ObjectPaths lists the stored objects' item paths.
func (a *API) ObjectPaths() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.objects))
	for p := range a.objects {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// SetClusterConfiguration sets the whole ClusterConfiguration document
// kubeadm-config carries (instead of one built from the cluster version).
func (a *API) SetClusterConfiguration(doc string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.clusterConfig = doc
}

// SetNotReady makes /readyz answer 500.
func (a *API) SetNotReady(notReady bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.notReady = notReady
}

// Addr is the endpoint's host:port.
func (a *API) Addr() string { return strings.TrimPrefix(a.srv.URL, "https://") }

func status(w http.ResponseWriter, code int, msg string, reason ...metav1.StatusReason) {
	st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: "Failure", Message: msg, Code: int32(code)}
	if len(reason) > 0 {
		st.Reason = reason[0]
	}
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(st)
}

// StaticPod is a running, ready mirror pod with one container and image.
func StaticPod(name, container, image string) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: container, Image: image}}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
			Name: container, Image: image, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		}}},
	}
}

// ClientCert returns a self-signed client certificate and key in PEM with
// the given common name (kubelet certificates are "system:node:NAME").
func ClientCert(t testing.TB, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	return ClientCertUntil(t, cn, time.Now().Add(24*time.Hour))
}

// ClientCertUntil is ClientCert expiring at notAfter.
func ClientCertUntil(t testing.TB, cn string, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	notBefore := time.Now().Add(-time.Hour)
	if notAfter.Before(notBefore) {
		notBefore = notAfter.Add(-time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}
