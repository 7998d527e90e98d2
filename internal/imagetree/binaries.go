package imagetree

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
)

// Binary is one build a minor's tree takes binaries from: one Go binary,
// or (Kubernetes) several made by one go build; built from its module at
// the version versions.yaml names, cached by version.
type Binary struct {
	Names []string // kubeadm, kube-apiserver, etcd, coredns, ...
	What  string   // "kubelet v1.37.2", for a person
	Build func(ctx context.Context, log io.Writer) (map[string]string, error)
}

// KubernetesCommands are the Kubernetes binaries of every tree: kubeadm,
// kubelet and kubectl on the node, and the four of its images.
var KubernetesCommands = []string{"kubeadm", "kubelet", "kubectl", APIServer, ControllerManager, Scheduler, Proxy}

// Binaries lists every module build of minor e's tree, in build order:
// the node's containerd (testbin.ContainerdCommands, the same in every
// minor), the Kubernetes release (KubernetesCommands, in one go build), the
// etcd release kubeadm deploys (etcd, etcdctl, etcdutl) and CoreDNS. Build and
// Prebuild both use it, so what is prebuilt is exactly what a tree takes
// from the cache.
func Binaries(e images.MinorEntry) ([]Binary, error) {
	etcdRel, err := EtcdRelease(e.Etcd)
	if err != nil {
		return nil, err
	}
	out := []Binary{{Names: testbin.ContainerdCommands, What: "containerd " + images.Containerd + " (" + strings.Join(testbin.ContainerdCommands, ", ") + ")",
		Build: testbin.Containerd}, {Names: KubernetesCommands, What: "Kubernetes " + e.Kubernetes + " (" + strings.Join(KubernetesCommands, ", ") + ")",
		Build: func(ctx context.Context, log io.Writer) (map[string]string, error) {
			return testbin.KubernetesSet(ctx, e.Kubernetes, KubernetesCommands, log)
		}}}
	for _, n := range []string{Etcd, "etcdctl", "etcdutl"} {
		mod := "go.etcd.io/etcd/" + n + "/v3"
		if n == Etcd {
			mod = "go.etcd.io/etcd/server/v3"
		}
		out = append(out, one(n, n+" "+etcdRel, func(ctx context.Context, log io.Writer) (string, error) {
			return testbin.GoBinary(ctx, mod, etcdRel, mod, n, "", log)
		}))
	}
	out = append(out, one(CoreDNS, "coredns "+e.CoreDNS, func(ctx context.Context, log io.Writer) (string, error) {
		return testbin.GoBinary(ctx, "github.com/coredns/coredns", e.CoreDNS, "github.com/coredns/coredns", "coredns",
			"-s -w -X github.com/coredns/coredns/coremain.GitCommit="+e.CoreDNS, log)
	}))
	return out, nil
}

// one is a build of a single binary.
func one(name, what string, build func(ctx context.Context, log io.Writer) (string, error)) Binary {
	return Binary{Names: []string{name}, What: what, Build: func(ctx context.Context, log io.Writer) (map[string]string, error) {
		p, err := build(ctx, log)
		if err != nil {
			return nil, err
		}
		return map[string]string{name: p}, nil
	}}
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
		if noImages && !slices.ContainsFunc(b.Names, func(n string) bool {
			return n == "kubeadm" || n == "kubelet" || n == "kubectl" || n == "etcdctl" || n == "etcdutl" || n == "containerd"
		}) {
			continue
		}
		build := b.Build
		if noImages && slices.Contains(b.Names, "kubeadm") {
			// A tree without images needs only the node's Kubernetes binaries.
			build = func(ctx context.Context, log io.Writer) (map[string]string, error) {
				return testbin.KubernetesSet(ctx, e.Kubernetes, []string{"kubeadm", "kubelet", "kubectl"}, log)
			}
		}
		ps, err := build(ctx, log)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.What, err)
		}
		for n, p := range ps {
			out[n] = p
		}
	}
	return out, nil
}
