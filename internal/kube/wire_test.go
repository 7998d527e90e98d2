package kube

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// sent is one request as the server saw it.
type sent struct {
	Method, Path, Query, ContentType, Accept, UserAgent string
	Auth, ClientCN                                      string
	Impersonate                                         string // every Impersonate-* header, sorted
	Body                                                any    // decoded JSON, nulls dropped
}

// recorder answers every request with answer(path) and records it.
type recorder struct {
	mu     sync.Mutex
	got    []sent
	answer func(r *http.Request) (int, string, any)
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var body any
	if len(b) > 0 {
		if err := json.Unmarshal(b, &body); err != nil {
			body = string(b)
		}
	}
	rc.mu.Lock()
	cn := ""
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		cn = r.TLS.PeerCertificates[0].Subject.CommonName
	}
	var imp []string
	for k, vs := range r.Header {
		if strings.HasPrefix(k, "Impersonate-") {
			imp = append(imp, k+"="+strings.Join(vs, ","))
		}
	}
	sort.Strings(imp)
	rc.got = append(rc.got, sent{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), r.Header.Get("Accept"), r.Header.Get("User-Agent"),
		r.Header.Get("Authorization"), cn, strings.Join(imp, ";"), dropNulls(body)})
	rc.mu.Unlock()
	code, ctype, obj := rc.answer(r)
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(code)
	if s, ok := obj.(string); ok {
		_, _ = io.WriteString(w, s)
		return
	}
	_ = json.NewEncoder(w).Encode(obj)
}

func (rc *recorder) take() []sent {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := rc.got
	rc.got = nil
	return out
}

// dropNulls removes null members: the typed clientset sends zero
// timestamps and nil slices as null, which the apiserver reads as absent.
func dropNulls(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if x == nil {
				delete(t, k)
				continue
			}
			t[k] = dropNulls(x)
			if m, ok := t[k].(map[string]any); ok && len(m) == 0 && k == "metadata" {
				delete(t, k)
			}
		}
	case []any:
		for i := range t {
			t[i] = dropNulls(t[i])
		}
	}
	return v
}

// TestSameRequestsAsTheClientset: every call the provider makes sends what
// client-go's typed clientset sent for it (method, path, query, headers,
// JSON body), reads the same fields out of the same answers, and an
// apiserver's refusal is the same error (message and NotFound-ness).
func TestSameRequestsAsTheClientset(t *testing.T) {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "container runtime network not ready: cni config uninitialized"}
	nodeObj := corev1.Node{
		TypeMeta:   metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-1", Labels: map[string]string{"node-role.kubernetes.io/control-plane": ""}, Annotations: map[string]string{"a": "b"}},
		Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"}, Conditions: []corev1.NodeCondition{ready},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "n1"}, {Type: corev1.NodeInternalIP, Address: "10.0.0.11"}}},
	}
	replicas := int32(2)
	rec := &recorder{answer: func(r *http.Request) (int, string, any) {
		const j = "application/json"
		p := r.URL.Path
		switch {
		case p == "/readyz":
			return 500, "text/plain", "[-]etcd failed: reason withheld\nreadyz check failed\n"
		case p == "/version":
			return 200, j, map[string]string{"gitVersion": "v1.37.2"}
		case strings.HasSuffix(p, "/missing"):
			return 404, j, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Reason: metav1.StatusReasonNotFound, Code: 404, Message: `secrets "missing" not found`}
		case strings.HasSuffix(p, "/plain404"):
			return 404, "text/plain", "404 page not found"
		case strings.HasSuffix(p, "/forbidden"):
			return 403, j, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Reason: metav1.StatusReasonForbidden, Code: 403,
				Message: `nodes "forbidden" is forbidden: User "system:node:n1" cannot get resource "nodes"`}
		case strings.HasSuffix(p, "/unavailable"):
			return 503, "text/plain", "apiserver is shutting down"
		case p == "/api/v1/nodes":
			return 200, j, corev1.NodeList{Items: []corev1.Node{nodeObj, {ObjectMeta: metav1.ObjectMeta{Name: "a0"}}}}
		case strings.HasPrefix(p, "/api/v1/nodes/"):
			return 200, j, nodeObj
		case p == "/api/v1/namespaces/kube-system/configmaps/kubeadm-config":
			return 200, j, corev1.ConfigMap{Data: map[string]string{"ClusterConfiguration": "kubernetesVersion: v1.36.3\n"}}
		case p == "/api/v1/namespaces/default/endpoints/kubernetes":
			return 200, j, corev1.Endpoints{Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "10.0.0.12"}, {IP: "10.0.0.11"}},
				Ports: []corev1.EndpointPort{{Name: "https", Port: 6443}}}}}
		case strings.HasPrefix(p, "/api/v1/namespaces/kube-system/pods/"):
			return 200, j, corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "n1", UID: "uid-1"}}},
				Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-apiserver", Image: "registry.k8s.io/kube-apiserver:v1.37.2"}}},
				Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "kube-apiserver", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}}
		case strings.HasPrefix(p, "/apis/apps/v1/namespaces/kube-system/daemonsets/"):
			d := appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Status: appsv1.DaemonSetStatus{ObservedGeneration: 3, DesiredNumberScheduled: 3, UpdatedNumberScheduled: 2, NumberAvailable: 3, CurrentNumberScheduled: 3}}
			d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:v1.37.2"}}
			return 200, j, d
		case strings.HasPrefix(p, "/apis/apps/v1/namespaces/kube-system/deployments/"):
			d := appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: 2}, Spec: appsv1.DeploymentSpec{Replicas: &replicas},
				Status: appsv1.DeploymentStatus{ObservedGeneration: 1, UpdatedReplicas: 2, AvailableReplicas: 2, Replicas: 3}}
			d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "coredns", Image: "registry.k8s.io/coredns/coredns:v1.14.2"}}
			return 200, j, d
		case r.Method == http.MethodPost:
			return 201, j, map[string]any{"kind": "Event", "apiVersion": "v1"}
		case r.Method == http.MethodDelete:
			return 200, j, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Success"}
		}
		return 200, j, nodeObj
	}}
	srv := tlsServer(t, rec)

	n := testutil.NewNode(t, "n1")
	n.Write("/etc/kubernetes/ca.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})), 0o644)
	n.Write("/etc/kubernetes/token", "s3cret\n", 0o600)
	n.Write(paths.AdminConf, `apiVersion: v1
kind: Config
clusters:
- cluster: {server: '`+srv.URL+`', certificate-authority: /etc/kubernetes/ca.crt}
  name: c
contexts:
- context: {cluster: c, user: u}
  name: x
current-context: x
users:
- name: u
  user: {tokenFile: /etc/kubernetes/token}
`, 0o600)
	lean, err := Load(n.R(), 5*time.Second, paths.AdminConf)
	if err != nil {
		t.Fatal(err)
	}
	// The clientset on what the kubeconfig said, as the provider built it.
	cs := typedFor(t, `apiVersion: v1
kind: Config
clusters:
- cluster: {server: '`+srv.URL+`', certificate-authority-data: `+base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))+`}
  name: c
contexts:
- context: {cluster: c, user: u}
  name: x
current-context: x
users:
- name: u
  user: {token: s3cret}
`, 5*time.Second)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 11, 55, 0, 0, time.UTC)
	get := metav1.GetOptions{}

	compare := func(name string, leanCall, typedCall func() error) {
		t.Helper()
		lerr := leanCall()
		lgot := rec.take()
		terr := typedCall()
		tgot := rec.take()
		if !reflect.DeepEqual(lgot, tgot) {
			t.Errorf("%s: requests differ\nlean:  %+v\ntyped: %+v", name, lgot, tgot)
		}
		if (lerr == nil) != (terr == nil) || lerr != nil && !strings.Contains(lerr.Error(), terr.Error()) {
			t.Errorf("%s: errors differ\nlean:  %v\ntyped: %v", name, lerr, terr)
		}
		if lerr != nil && IsNotFound(lerr) != apierrors.IsNotFound(terr) {
			t.Errorf("%s: NotFound differs: lean %v, typed %v", name, IsNotFound(lerr), apierrors.IsNotFound(terr))
		}
	}
	expect := func(name string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: read %+v, want %+v", name, got, want)
		}
	}

	compare("node", func() error {
		ni, err := lean.Node(ctx, "n1")
		expect("node", []any{ni.UID, ni.KubeletVersion.String(), ni.Ready, ni.ReadyReason, ni.ReadyMessage, ni.NoCNI()},
			[]any{"uid-1", "v1.37.2", false, ready.Reason, ready.Message, true})
		return err
	}, func() error { _, err := cs.CoreV1().Nodes().Get(ctx, "n1", get); return err })
	compare("nodes", func() error {
		l, err := lean.Nodes(ctx)
		expect("nodes", l, []NodeRecord{{Name: "a0"}, {Name: "n1", UID: "uid-1", ControlPlane: true, KubeletVersion: "v1.37.2", Annotations: map[string]string{"a": "b"}}})
		return err
	}, func() error { _, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err })
	compare("control-plane nodes", func() error {
		l, err := lean.ControlPlaneNodes(ctx)
		expect("control-plane nodes", l, []NodeAddr{{Name: "a0"}, {Name: "n1", IP: "10.0.0.11"}})
		return err
	}, func() error {
		_, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "node-role.kubernetes.io/control-plane"})
		return err
	})
	compare("cluster version", func() error {
		v, err := lean.ClusterVersion(ctx)
		expect("cluster version", v.String(), "v1.36.3")
		return err
	}, func() error {
		_, err := cs.CoreV1().ConfigMaps("kube-system").Get(ctx, "kubeadm-config", get)
		return err
	})
	compare("apiservers", func() error {
		l, err := lean.APIServers(ctx)
		expect("apiservers", l, []string{"10.0.0.11:6443", "10.0.0.12:6443"})
		return err
	}, func() error { _, err := cs.CoreV1().Endpoints("default").Get(ctx, "kubernetes", get); return err })
	compare("pod", func() error {
		p, err := lean.Pod(ctx, "kube-system", "kube-apiserver-n1")
		expect("pod", p, PodInfo{Image: "registry.k8s.io/kube-apiserver:v1.37.2", Running: true, Ready: true, NodeUID: "uid-1"})
		return err
	}, func() error { _, err := cs.CoreV1().Pods("kube-system").Get(ctx, "kube-apiserver-n1", get); return err })
	compare("daemonset", func() error {
		r, err := lean.DaemonSet(ctx, "kube-system", "kube-proxy")
		expect("daemonset", r, Rollout{Image: "registry.k8s.io/kube-proxy:v1.37.2", Desired: 3, Updated: 2, Available: 3, Total: 3, Current: true})
		return err
	}, func() error { _, err := cs.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", get); return err })
	compare("deployment", func() error {
		r, err := lean.Deployment(ctx, "kube-system", "coredns")
		expect("deployment", r, Rollout{Image: "registry.k8s.io/coredns/coredns:v1.14.2", Desired: 2, Updated: 2, Available: 2, Total: 3, Current: false})
		return err
	}, func() error { _, err := cs.AppsV1().Deployments("kube-system").Get(ctx, "coredns", get); return err })
	compare("server version", func() error {
		v, err := lean.ServerVersion(ctx)
		expect("server version", v.String(), "v1.37.2")
		return err
	}, func() error { _, err := cs.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(ctx); return err })
	compare("readyz", func() error { return lean.Readyz(ctx) },
		func() error { _, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); return err })
	compare("annotate", func() error { return lean.Annotate(ctx, "n1", map[string]string{"k": "v"}) }, func() error {
		_, err := cs.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, []byte(`{"metadata":{"annotations":{"k":"v"}}}`), metav1.PatchOptions{FieldManager: "provider-kubernetes"})
		return err
	})
	compare("event", func() error { return lean.NodeEvent(ctx, "n1", "Warning", "UpgradeFailed", "it failed", now) }, func() error {
		// What NodeEvent sent through the clientset.
		nd, err := cs.CoreV1().Nodes().Get(ctx, "n1", get)
		if err != nil {
			return err
		}
		tm := metav1.NewTime(now)
		_, err = cs.CoreV1().Events("default").Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: "n1.provider-kubernetes.", Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "n1", UID: nd.UID, APIVersion: "v1"},
			Reason:         "UpgradeFailed", Message: "it failed", Type: "Warning",
			Source:         corev1.EventSource{Component: "provider-kubernetes", Host: "n1"},
			FirstTimestamp: tm, LastTimestamp: tm, Count: 1,
			ReportingController: "provider-kubernetes", ReportingInstance: "n1",
		}, metav1.CreateOptions{})
		return err
	})
	compare("create secret", func() error {
		return lean.Create(ctx, "kube-system", "secrets", map[string]any{"apiVersion": "v1", "kind": "Secret",
			"metadata": map[string]string{"name": "bootstrap-token-abcdef", "namespace": "kube-system"},
			"type":     "bootstrap.kubernetes.io/token", "stringData": map[string]string{"token-id": "abcdef"}})
	}, func() error {
		_, err := cs.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-abcdef", Namespace: "kube-system"},
			Type:       corev1.SecretTypeBootstrapToken, StringData: map[string]string{"token-id": "abcdef"}}, metav1.CreateOptions{})
		return err
	})
	compare("delete", func() error { return lean.Delete(ctx, "kube-system", "secrets", "bootstrap-token-abcdef") },
		func() error {
			return cs.CoreV1().Secrets("kube-system").Delete(ctx, "bootstrap-token-abcdef", metav1.DeleteOptions{})
		})
	// Refusals: a Status, a plain 404, a Status 403, a 503 without Retry-After.
	for _, name := range []string{"missing", "plain404", "forbidden", "unavailable"} {
		compare("refused "+name, func() error { return lean.Delete(ctx, "kube-system", "secrets", name) },
			func() error { return cs.CoreV1().Secrets("kube-system").Delete(ctx, name, metav1.DeleteOptions{}) })
		compare("refused get "+name, func() error { _, err := lean.Node(ctx, name); return err },
			func() error { _, err := cs.CoreV1().Nodes().Get(ctx, name, get); return err })
	}
	if err := lean.Delete(ctx, "kube-system", "secrets", "missing"); !IsNotFound(err) {
		t.Errorf("a NotFound Status: %v", err)
	}
	if _, err := lean.Node(ctx, "forbidden"); err == nil || IsNotFound(err) || !strings.Contains(err.Error(), "is forbidden") {
		t.Errorf("a Forbidden Status: %v", err)
	}

	// At: the same credentials against another apiserver.
	rec.take()
	other, err := lean.At(strings.TrimPrefix(srv.URL, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := other.ServerVersion(ctx); err != nil || v.String() != "v1.37.2" {
		t.Errorf("At: %v %v", v, err)
	}
	if got := rec.take(); len(got) != 1 || !strings.Contains(got[0].Query, "timeout=5s") || got[0].UserAgent != "provider-kubernetes" {
		t.Errorf("At sent %+v", got)
	}
}

// tlsServer serves h over TLS, asking for (not requiring) a client certificate.
func tlsServer(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// typedFor is the typed clientset the provider built from a kubeconfig
// (files already inlined) before it dropped client-go.
func typedFor(t *testing.T, kubeconfig string, timeout time.Duration) *kubernetes.Clientset {
	t.Helper()
	cfg, err := clientcmd.Load([]byte(kubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	rc.Timeout = timeout
	rc.UserAgent = "provider-kubernetes"
	rc.QPS = -1
	rc.ContentType, rc.AcceptContentTypes = "application/json", "application/json"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestCredentialsAsClientGo: a client certificate, basic auth with
// impersonation, an exec credential plugin, a server behind a path
// prefix: each sends what client-go sent for the same kubeconfig.
func TestCredentialsAsClientGo(t *testing.T) {
	rec := &recorder{answer: func(r *http.Request) (int, string, any) {
		if strings.HasSuffix(r.URL.Path, "/missing") {
			return 404, "application/json", metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Reason: metav1.StatusReasonNotFound, Code: 404, Message: `nodes "missing" not found`}
		}
		return 200, "application/json", corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"}}}
	}}
	srv := tlsServer(t, rec)
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	cert, key := testutil.ClientCert(t, "system:node:n1")
	plugin := filepath.Join(t.TempDir(), "plugin")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\ncase \"$KUBERNETES_EXEC_INFO\" in *'\"server\":\"'"+srv.URL+"/prefix'\"'*) ;; *) exit 3;; esac\n"+
		"echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"from-exec-'\"$EXTRA\"'\"}}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	kc := func(server, user string) string {
		return "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: '" + server + "', certificate-authority-data: " + ca + "}\n  name: c\n" +
			"contexts:\n- context: {cluster: c, user: u}\n  name: x\ncurrent-context: x\nusers:\n- name: u\n  user: " + user + "\n"
	}
	for _, tc := range []struct{ name, kubeconfig string }{
		{"client certificate", kc(srv.URL, "{client-certificate-data: "+base64.StdEncoding.EncodeToString(cert)+", client-key-data: "+base64.StdEncoding.EncodeToString(key)+"}")},
		{"basic auth, impersonating", kc(srv.URL, "{username: admin, password: pw, as: someone, as-groups: [g1, g2], as-uid: u-1, as-user-extra: {scopes: [a, b]}}")},
		{"exec plugin", kc(srv.URL+"/prefix", "{exec: {apiVersion: client.authentication.k8s.io/v1, command: "+plugin+", env: [{name: EXTRA, value: x}], provideClusterInfo: true, interactiveMode: Never}}")},
		{"path prefix, token", kc(srv.URL+"/prefix/", "{token: t0k}")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := testutil.NewNode(t, "n1")
			n.Write(paths.AdminConf, tc.kubeconfig, 0o600)
			lean, err := Load(n.R(), 3*time.Second, paths.AdminConf)
			if err != nil {
				t.Fatal(err)
			}
			cs := typedFor(t, tc.kubeconfig, 3*time.Second)
			ctx := context.Background()
			for _, name := range []string{"n1", "missing"} {
				_, lerr := lean.Node(ctx, name)
				lgot := rec.take()
				_, terr := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				tgot := rec.take()
				if !reflect.DeepEqual(lgot, tgot) || len(lgot) != 1 {
					t.Errorf("%s: requests differ\nlean:  %+v\ntyped: %+v", name, lgot, tgot)
				}
				if (lerr == nil) != (terr == nil) || lerr != nil && !strings.Contains(lerr.Error(), terr.Error()) {
					t.Errorf("%s: errors differ\nlean:  %v\ntyped: %v", name, lerr, terr)
				}
				if lgot != nil && lgot[0].Auth == "" && lgot[0].ClientCN == "" {
					t.Errorf("%s: no credentials sent: %+v", name, lgot)
				}
			}
			if tc.name == "client certificate" && lean.NodeName != "n1" {
				t.Errorf("node name %q from the certificate", lean.NodeName)
			}
		})
	}
}

// TestRetriesAsClientGo: a 429 or 5xx with a Retry-After is tried again,
// up to client-go's ten retries, and so is a GET whose connection broke;
// other refusals are not. Each case makes as many requests as client-go's
// and ends in the same error.
func TestRetriesAsClientGo(t *testing.T) {
	var mu sync.Mutex
	served := map[string]int{}
	rec := &recorder{answer: func(r *http.Request) (int, string, any) {
		mu.Lock()
		served[r.URL.Path]++
		n := served[r.URL.Path]
		mu.Unlock()
		busy := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Reason: metav1.StatusReasonTooManyRequests, Code: 429, Message: "too many requests, please try again later"}
		switch path.Base(r.URL.Path) {
		case "busy-twice": // then fine
			if n%3 != 0 {
				return 429, "application/json", busy
			}
		case "busy-always":
			return 429, "application/json", busy
		case "down-no-retry-after":
			return 503, "text/plain", "down"
		}
		return 200, "application/json", corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"}}}
	}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if path.Base(r.URL.Path) != "down-no-retry-after" && r.URL.Path != "/api/v1/nodes/n1" {
			w.Header().Set("Retry-After", "0")
		}
		if path.Base(r.URL.Path) == "reset-once" {
			mu.Lock()
			served[r.URL.Path]++
			first := served[r.URL.Path]%2 == 1
			mu.Unlock()
			if first { // the connection breaks under the GET
				hj, _ := w.(http.Hijacker)
				c, _, _ := hj.Hijack()
				c.Close()
				return
			}
		}
		rec.ServeHTTP(w, r)
	})
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = false // a hijackable connection
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	kubeconfig := "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: '" + srv.URL + "', certificate-authority-data: " + ca + "}\n  name: c\n" +
		"contexts:\n- context: {cluster: c, user: u}\n  name: x\ncurrent-context: x\nusers:\n- name: u\n  user: {token: t}\n"
	n := testutil.NewNode(t, "n1")
	n.Write(paths.AdminConf, kubeconfig, 0o600)
	lean, err := Load(n.R(), 20*time.Second, paths.AdminConf)
	if err != nil {
		t.Fatal(err)
	}
	cs := typedFor(t, kubeconfig, 20*time.Second)
	ctx := context.Background()
	for _, name := range []string{"busy-twice", "busy-always", "down-no-retry-after", "reset-once"} {
		_, lerr := lean.Node(ctx, name)
		lgot := rec.take()
		_, terr := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		tgot := rec.take()
		if len(lgot) != len(tgot) || !reflect.DeepEqual(lgot, tgot) {
			t.Errorf("%s: %d requests, client-go %d\nlean:  %+v\ntyped: %+v", name, len(lgot), len(tgot), lgot, tgot)
		}
		if (lerr == nil) != (terr == nil) || lerr != nil && !strings.Contains(lerr.Error(), terr.Error()) {
			t.Errorf("%s: errors differ\nlean:  %v\ntyped: %v", name, lerr, terr)
		}
		t.Logf("%s: %d requests, %v", name, len(lgot), lerr)
	}
}

// TestStatusInASuccessfulAnswer: a 2xx answer that is a failed Status is
// the error it says, however its kind is spelled; a Success Status or an
// object is not.
func TestStatusInASuccessfulAnswer(t *testing.T) {
	for body, fails := range map[string]bool{
		`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"no","code":500}`:      true,
		`{"kind":"St\u0061tus","apiVersion":"v1","status":"Failure","message":"no","code":500}`: true,
		`{"kind":"Status","apiVersion":"v1","status":"Success"}`:                                false,
		`{"kind":"ConfigMap","data":{"Status":"x"}}`:                                            false,
		`{"kind":"ConfigMap","data":{"a":"\u00e9"}}`:                                            false,
	} {
		if err := statusInBody([]byte(body)); (err != nil) != fails {
			t.Errorf("%s: %v", body, err)
		}
	}
}

// TestExecPluginIsBoundedByTheRequest: a credential plugin that hangs (and
// leaves a child behind) ends with the request's context, its process
// group killed; that cut-short run is not kept, so the next request runs
// the plugin again and authenticates with what it prints.
func TestExecPluginIsBoundedByTheRequest(t *testing.T) {
	rec := &recorder{answer: func(r *http.Request) (int, string, any) {
		return 200, "application/json", corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"}}}
	}}
	srv := tlsServer(t, rec)
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	dir := t.TempDir()
	plugin, marker, child := filepath.Join(dir, "plugin"), filepath.Join(dir, "ran-once"), filepath.Join(dir, "child.pid")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\nif [ ! -e "+marker+" ]; then : > "+marker+"; sleep 300 & echo $! > "+child+"; wait; fi\n"+
		"echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"second-run\"}}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	n := testutil.NewNode(t, "n1")
	n.Write(paths.AdminConf, "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: '"+srv.URL+"', certificate-authority-data: "+ca+"}\n  name: c\n"+
		"contexts:\n- context: {cluster: c, user: u}\n  name: x\ncurrent-context: x\nusers:\n- name: u\n  user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: "+plugin+", interactiveMode: Never}}\n", 0o600)
	c, err := Load(n.R(), 3*time.Second, paths.AdminConf)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := c.Node(ctx, "n1"); errc <- err }()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "deadline exceeded") {
			t.Fatalf("a hanging plugin: %v, want the request's deadline", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the hanging plugin held the request past its 1 s deadline")
	}
	if len(rec.take()) != 0 {
		t.Fatal("a request went out without credentials")
	}
	if b, err := os.ReadFile(child); err == nil {
		var pid int
		fmt.Sscan(string(b), &pid)
		for deadline := time.Now().Add(5 * time.Second); pid > 0 && syscall.Kill(pid, 0) == nil; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the plugin's child %d outlived it", pid)
			}
		}
	}
	if _, err := c.Node(context.Background(), "n1"); err != nil {
		t.Fatalf("the next request: %v", err)
	}
	if got := rec.take(); len(got) != 1 || got[0].Auth != "Bearer second-run" {
		t.Fatalf("the next request sent %+v, want the second run's token", got)
	}
}
