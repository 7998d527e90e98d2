package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/clusterview"
	"github.com/kairos-io/provider-kubernetes/internal/kube"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// kubeSource is where status --cluster reads its kubeconfig, as kubectl
// does: --kubeconfig, else the KUBECONFIG list, else (no files) the node's
// own; a relative path is the working directory's.
func kubeSource(explicit, env, context string) kube.Source {
	src := kube.SourceFromEnv(explicit, env, context)
	for i, f := range src.Files {
		if !filepath.IsAbs(f) {
			if abs, err := filepath.Abs(f); err == nil {
				src.Files[i] = abs
			}
		}
	}
	return src
}

// clusterStatus is `status --cluster`: every node's versions and last
// pass, and what the rollout needs next. Exit 0 when every node is
// converged at one version, 1 otherwise (or when the API cannot be read).
func clusterStatus(ctx context.Context, root paths.Root, src kube.Source, format string, stdout, stderr io.Writer) int {
	timeout := reconcile.DefaultBudgets().APIRequest
	var client *kube.Client
	var err error
	if len(src.Files) == 0 {
		// The node's own: admin.conf on a control plane (a node's
		// kubelet.conf may not list Nodes), kubelet.conf elsewhere.
		client, err = kube.LoadFirst(root, timeout, src.Context, paths.AdminConf, paths.KubeletConf)
	} else {
		client, err = kube.LoadSource(root, timeout, src)
	}
	if err != nil {
		fmt.Fprintf(stderr, "status --cluster: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	ctx, cancel := context.WithTimeout(ctx, 6*timeout)
	defer cancel()
	recs, err := client.Nodes(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "status --cluster: %s (a node's own kubelet.conf may not list Nodes: use --kubeconfig with read access, e.g. admin.conf on a control plane)\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	cluster, err := client.ClusterVersion(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "status --cluster: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	nodes := make([]clusterview.Node, 0, len(recs))
	for _, r := range recs {
		n := clusterview.Node{Name: r.Name, ControlPlane: r.ControlPlane, Kubelet: r.KubeletVersion, Ready: r.Ready, Annotations: r.Annotations}
		if r.ControlPlane {
			if pod, err := client.Pod(ctx, "kube-system", "kube-apiserver-"+r.Name); err == nil && pod.OfNode(r.UID) {
				n.APIServer = observe.ImageTag(pod.Image)
			}
		}
		nodes = append(nodes, n)
	}
	v := clusterview.Build(images.Window(), cluster, nodes, time.Now())
	if err := emit(stdout, format, v, func(w io.Writer) error { return clusterview.Print(w, v, "text") }); err != nil {
		fmt.Fprintf(stderr, "status --cluster: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	if v.Converged {
		return reconcile.ExitOK
	}
	return reconcile.ExitFailed
}
