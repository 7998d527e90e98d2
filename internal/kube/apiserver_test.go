package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/testutil/apiservertest"
)

// realAPIServer starts the real kube-apiserver v1.37.2 (apiservertest)
// and returns an admin kubeconfig (system:masters) for it and its address.
func realAPIServer(t *testing.T) (kubeconfig, addr string) {
	t.Helper()
	s := apiservertest.Start(t)
	return s.Admin, s.Addr
}

// TestAgainstTheRealAPIServer: every call the provider makes, through
// client-go, against the real kube-apiserver v1.37.2: what it reads back
// is what was written, a missing object is NotFound, lists page, Events
// and annotations land on the Node, its endpoints name it, and At reaches
// it with the same credentials.
func TestAgainstTheRealAPIServer(t *testing.T) {
	kubeconfig, addr := realAPIServer(t)
	c := clientFor(t, kubeconfig, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if v, err := c.ServerVersion(ctx); err != nil || v.String() != "v1.37.2" {
		t.Fatalf("server version %v %v", v, err)
	}
	// Its own endpoints give the address it advertises, with its port.
	// (written by its endpoint reconciler shortly after it is ready).
	servers, err := c.APIServers(ctx)
	for wait := time.Now().Add(30 * time.Second); err != nil && IsNotFound(errors.Unwrap(err)) && time.Now().Before(wait); {
		time.Sleep(200 * time.Millisecond)
		servers, err = c.APIServers(ctx)
	}
	if want := strings.Replace(addr, "127.0.0.1", apiservertest.Advertised, 1); err != nil || len(servers) != 1 || servers[0] != want {
		t.Fatalf("apiservers %v %v, want [%s]", servers, err, want)
	}
	at, err := c.At(addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := at.Readyz(ctx); err != nil {
		t.Fatal(err)
	}

	// kubeadm-config, as kubeadm writes it.
	if _, err := c.ClusterVersion(ctx); !IsNotFound(err) {
		t.Fatalf("no kubeadm-config yet: %v", err)
	}
	cm := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "kubeadm-config"},
		"data": map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: v1.36.3\n"}}
	if err := c.Create(ctx, "kube-system", "configmaps", cm); err != nil {
		t.Fatal(err)
	}
	if v, err := c.ClusterVersion(ctx); err != nil || v.String() != "v1.36.3" {
		t.Fatalf("cluster version %v %v", v, err)
	}
	if err := c.Create(ctx, "kube-system", "configmaps", cm); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("a second create: %v", err)
	}

	// Nodes: more than a page of them, one control plane, Ready or not.
	const nodes = MaxPage + 20
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("n%04d", i)
		labels := map[string]string{}
		if i == 7 {
			labels["node-role.kubernetes.io/control-plane"] = ""
		}
		node := map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name, "labels": labels}}
		if err := c.createCluster(ctx, "nodes", node); err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
	}
	// The kubelet reports its version in the status subresource.
	status := `{"status":{"nodeInfo":{"kubeletVersion":"v1.37.2"},"conditions":[{"type":"Ready","status":"False","reason":"KubeletNotReady","message":"container runtime network not ready: cni config uninitialized"}],"addresses":[{"type":"InternalIP","address":"10.0.0.7"}]}}`
	if _, err := raw(c.core.Patch("application/merge-patch+json").Resource("nodes").Name("n0007").SubResource("status").Body([]byte(status)).Do(ctx)); err != nil {
		t.Fatal(err)
	}
	all, err := c.Nodes(ctx)
	if err != nil || len(all) != nodes || all[0].Name != "n0000" || all[nodes-1].Name != fmt.Sprintf("n%04d", nodes-1) {
		t.Fatalf("%d nodes listed (want %d): %v", len(all), nodes, err)
	}
	if !all[7].ControlPlane || all[7].KubeletVersion != "v1.37.2" || all[7].Ready || all[6].ControlPlane {
		t.Fatalf("node records %+v %+v", all[6], all[7])
	}
	cps, err := c.ControlPlaneNodes(ctx)
	if err != nil || len(cps) != 1 || cps[0].Name != "n0007" || !reflect.DeepEqual(cps[0].Addresses, []string{"10.0.0.7"}) || cps[0].Ready || !cps[0].NoCNI ||
		cps[0].NotReady != "KubeletNotReady: container runtime network not ready: cni config uninitialized" {
		t.Fatalf("control planes %+v %v", cps, err)
	}
	ni, err := c.Node(ctx, "n0007")
	if err != nil || ni.KubeletVersion.String() != "v1.37.2" || ni.Ready || !ni.NoCNI() || ni.UID == "" {
		t.Fatalf("node %+v %v", ni, err)
	}
	if _, err := c.Node(ctx, "absent"); !IsNotFound(err) {
		t.Fatalf("a missing node: %v", err)
	}

	// Annotations merge; an Event lands on the Node.
	if err := c.Annotate(ctx, "n0007", map[string]string{"provider-kubernetes.kairos.io/phase": "Converged"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Annotate(ctx, "n0007", map[string]string{"provider-kubernetes.kairos.io/outcome": "ok"}); err != nil {
		t.Fatal(err)
	}
	all, _ = c.Nodes(ctx)
	if a := all[7].Annotations; a["provider-kubernetes.kairos.io/phase"] != "Converged" || a["provider-kubernetes.kairos.io/outcome"] != "ok" {
		t.Fatalf("annotations %v", a)
	}
	if err := c.NodeEvent(ctx, "n0007", "Warning", "UpgradeRefused", "a message", time.Now()); err != nil {
		t.Fatal(err)
	}
	var events struct {
		Items []struct {
			Reason         string `json:"reason"`
			Type           string `json:"type"`
			InvolvedObject struct {
				Name string `json:"name"`
				UID  string `json:"uid"`
			} `json:"involvedObject"`
		} `json:"items"`
	}
	b, err := raw(c.core.Get().Namespace("default").Resource("events").Do(ctx))
	if err != nil || decode(b, &events) != nil || len(events.Items) != 1 || events.Items[0].Reason != "UpgradeRefused" ||
		events.Items[0].InvolvedObject.Name != "n0007" || events.Items[0].InvolvedObject.UID != ni.UID {
		t.Fatalf("events %+v %v", events, err)
	}

	// A Secret created, read and deleted (join-config's bootstrap token).
	secret := map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "bootstrap-token-abcdef"},
		"type": "bootstrap.kubernetes.io/token", "stringData": map[string]string{"token-id": "abcdef", "token-secret": "0123456789abcdef"}}
	if err := c.Create(ctx, "kube-system", "secrets", secret); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "kube-system", "secrets", "bootstrap-token-abcdef"); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "kube-system", "secrets", "bootstrap-token-abcdef"); !IsNotFound(err) {
		t.Fatalf("a second delete: %v", err)
	}

	// A mirror pod's image and owner; a DaemonSet and a Deployment as
	// the add-on gate reads them.
	pod := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "kube-apiserver-n0007",
		"labels":          map[string]string{"component": "kube-apiserver", "tier": "control-plane"},
		"annotations":     map[string]string{mirrorAnnotation: "0123456789abcdef", AdvertiseAnnotation: "[fec0:0::0:1]:6443"},
		"ownerReferences": []map[string]any{{"apiVersion": "v1", "kind": "Node", "name": "n0007", "uid": ni.UID}}},
		"spec": map[string]any{"nodeName": "n0007", "containers": []map[string]any{{"name": "kube-apiserver", "image": "registry.k8s.io/kube-apiserver:v1.37.2"}}}}
	if err := c.Create(ctx, "kube-system", "pods", pod); err != nil {
		t.Fatal(err)
	}
	pi, err := c.Pod(ctx, "kube-system", "kube-apiserver-n0007")
	if err != nil || pi.Image != "registry.k8s.io/kube-apiserver:v1.37.2" || pi.NodeUID != ni.UID || pi.Running || !pi.OfNode(ni.UID) {
		t.Fatalf("pod %+v %v", pi, err)
	}
	// The endpoint each control plane's kube-apiserver advertises, from
	// kubeadm's annotation on its mirror pod (n0007's above): only a mirror pod of that
	// node, named for it, with an ip:port, counts; an IPv6 endpoint is
	// made canonical; a node with two such pods counts none.
	apiserverPod := func(name, nodeName, endpoint string, mirror bool, labels map[string]string) {
		t.Helper()
		ann := map[string]string{AdvertiseAnnotation: endpoint}
		if mirror {
			ann[mirrorAnnotation] = "0123456789abcdef"
		}
		pod := map[string]any{"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": name, "labels": labels, "annotations": ann},
			"spec":     map[string]any{"nodeName": nodeName, "containers": []map[string]any{{"name": "kube-apiserver", "image": "registry.k8s.io/kube-apiserver:v1.37.2"}}}}
		if err := c.Create(ctx, "kube-system", "pods", pod); err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
	}
	cpLabels := map[string]string{"component": "kube-apiserver", "tier": "control-plane"}
	apiserverPod("kube-apiserver-n0008", "n0008", "10.0.0.8:6443", false, cpLabels)                                        // not a mirror pod
	apiserverPod("kube-apiserver-n0009", "n0009", "10.0.0.9:6443", true, map[string]string{"component": "kube-apiserver"}) // not kubeadm's labels
	apiserverPod("kube-apiserver-other", "n0010", "10.0.0.10:6443", true, cpLabels)                                        // not named for its node
	apiserverPod("kube-apiserver-n0011", "n0011", "cp11.example:6443", true, cpLabels)                                     // a name, not an address
	apiserverPod("kube-apiserver-n0012", "n0012", "10.0.0.12", true, cpLabels)                                             // no port
	advertised, err := c.AdvertisedAPIServers(ctx)
	if want := map[string]Advertised{"n0007": {Endpoint: "[fec0::1]:6443", NodeUID: ni.UID}}; err != nil || !reflect.DeepEqual(advertised, want) {
		t.Fatalf("advertised %+v %v, want %+v", advertised, err, want)
	}
	tmpl := map[string]any{"metadata": map[string]any{"labels": map[string]string{"k8s-app": "x"}},
		"spec": map[string]any{"containers": []map[string]any{{"name": "c", "image": "registry.k8s.io/kube-proxy:v1.37.2"}}}}
	sel := map[string]any{"matchLabels": map[string]string{"k8s-app": "x"}}
	ds := map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": map[string]any{"name": "kube-proxy"}, "spec": map[string]any{"selector": sel, "template": tmpl}}
	if _, err := raw(c.apps.Post().Namespace("kube-system").Resource("daemonsets").SetHeader("Content-Type", "application/json").Body(mustJSON(t, ds)).Do(ctx)); err != nil {
		t.Fatal(err)
	}
	ro, err := c.DaemonSet(ctx, "kube-system", "kube-proxy")
	if err != nil || ro.Image != "registry.k8s.io/kube-proxy:v1.37.2" || ro.Done() {
		t.Fatalf("daemonset %+v %v", ro, err)
	}
	if _, err := c.Deployment(ctx, "kube-system", "coredns"); !IsNotFound(err) {
		t.Fatalf("a missing deployment: %v", err)
	}
	data, err := c.ConfigMapData(ctx, "kube-system", "kubeadm-config")
	if err != nil || !strings.Contains(data["ClusterConfiguration"], "v1.36.3") {
		t.Fatalf("configmap data %v %v", data, err)
	}
	// The apiserver refuses what its API does not allow (a Secret's name
	// with an upper-case letter passes the client's RFC 1123 check only
	// if lower-case: refused before it is sent).
	if err := c.Delete(ctx, "kube-system", "secrets", "Bootstrap"); err == nil || !strings.Contains(err.Error(), "not an RFC 1123 name") {
		t.Fatalf("an upper-case name: %v", err)
	}
}

// createCluster creates a cluster-scoped core object (a Node).
func (c *Client) createCluster(ctx context.Context, resource string, obj any) error {
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	_, err = raw(c.core.Post().Resource(resource).SetHeader("Content-Type", "application/json").Body(b).Do(ctx))
	return err
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
