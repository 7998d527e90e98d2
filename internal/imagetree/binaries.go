package imagetree

import (
	"context"
	"fmt"
	"io"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
)

// Binary is one Go binary a minor's tree is assembled from: built from its
// module at the version versions.yaml names, cached by version.
type Binary struct {
	Name  string // kubeadm, kube-apiserver, etcd, coredns, ...
	What  string // "kubelet v1.37.2", for a person
	Build func(ctx context.Context, log io.Writer) (string, error)
}

// Binaries lists every module binary of minor e's tree, in build order:
// the Kubernetes release (kubeadm, kubelet, kubectl and the four image
// binaries), the etcd release kubeadm deploys (etcd, etcdctl, etcdutl) and
// CoreDNS. Build and Prebuild both use it, so what is prebuilt is exactly
// what a tree takes from the cache.
func Binaries(e images.MinorEntry) ([]Binary, error) {
	etcdRel, err := EtcdRelease(e.Etcd)
	if err != nil {
		return nil, err
	}
	var out []Binary
	for _, n := range []string{"kubeadm", "kubelet", "kubectl", APIServer, ControllerManager, Scheduler, Proxy} {
		out = append(out, Binary{Name: n, What: n + " " + e.Kubernetes, Build: func(ctx context.Context, log io.Writer) (string, error) {
			return testbin.Kubernetes(ctx, e.Kubernetes, n, log)
		}})
	}
	for _, n := range []string{Etcd, "etcdctl", "etcdutl"} {
		mod := "go.etcd.io/etcd/" + n + "/v3"
		if n == Etcd {
			mod = "go.etcd.io/etcd/server/v3"
		}
		out = append(out, Binary{Name: n, What: n + " " + etcdRel, Build: func(ctx context.Context, log io.Writer) (string, error) {
			return testbin.GoBinary(ctx, mod, etcdRel, mod, n, "", log)
		}})
	}
	out = append(out, Binary{Name: CoreDNS, What: "coredns " + e.CoreDNS, Build: func(ctx context.Context, log io.Writer) (string, error) {
		return testbin.GoBinary(ctx, "github.com/coredns/coredns", e.CoreDNS, "github.com/coredns/coredns", "coredns",
			"-s -w -X github.com/coredns/coredns/coremain.GitCommit="+e.CoreDNS, log)
	}})
	return out, nil
}

// buildAll builds (or finds cached) every binary of e (skip: the image
// binaries, for a tree without images), by name.
func buildAll(ctx context.Context, e images.MinorEntry, noImages bool, log io.Writer) (map[string]string, error) {
	bs, err := Binaries(e)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, b := range bs {
		if noImages && b.Name != "kubeadm" && b.Name != "kubelet" && b.Name != "kubectl" && b.Name != "etcdctl" && b.Name != "etcdutl" {
			continue
		}
		p, err := b.Build(ctx, log)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.What, err)
		}
		out[b.Name] = p
	}
	return out, nil
}
