package kube

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// The bounds on what a kubeconfig makes the provider read: the kubeconfig
// files themselves (a KUBECONFIG list), each file one names, and all of
// those together. Only the files of the context used are read at all.
const (
	maxKubeconfigFile = 1 << 20
	maxKubeconfigs    = 16
	maxNamedFile      = 1 << 20
	maxNamedTotal     = 2 << 20
)

// Source says where a client's kubeconfig comes from: one file (or the
// first readable of several, Load), or a KUBECONFIG-style list merged as
// kubectl merges it, with a context chosen by name.
type Source struct {
	// Files are host paths (under the root). Merged: the first file to
	// name a cluster, user or context wins it, and the first
	// current-context set is the one; a missing file is skipped, as
	// kubectl skips it.
	Files []string
	// Context overrides the current context (kubectl's --context).
	Context string
}

// SourceFromEnv is the source kubectl would use: an explicit file, else
// the KUBECONFIG list (colon-separated), else def.
func SourceFromEnv(explicit, kubeconfigEnv, context string, def ...string) Source {
	if explicit != "" {
		return Source{Files: []string{explicit}, Context: context}
	}
	var files []string
	for _, f := range filepath.SplitList(kubeconfigEnv) {
		if f != "" {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		files = def
	}
	return Source{Files: files, Context: context}
}

// loadSource reads, merges and resolves a source into the rest.Config of
// its context: every file read through the provider's checked open
// (no symlink, no FIFO or device, bounded), relative paths resolved
// against the file that names them, the context's own files read the
// same way and inlined, its credential plugin bounded. clientcmd then
// validates and builds the config from bytes alone.
func loadSource(root paths.Root, src Source, timeout time.Duration) (*rest.Config, string, error) {
	if len(src.Files) == 0 {
		return nil, "", errors.New("no kubeconfig named")
	}
	if len(src.Files) > maxKubeconfigs {
		return nil, "", fmt.Errorf("%d kubeconfig files named, more than %d", len(src.Files), maxKubeconfigs)
	}
	merged := clientcmdapi.NewConfig()
	var origin []string
	for _, f := range src.Files {
		if !filepath.IsAbs(f) {
			return nil, "", fmt.Errorf("kubeconfig %s: not an absolute path", describePath(f))
		}
		b, err := fsutil.ReadFileNoFollow(root.Path(f), maxKubeconfigFile)
		if err != nil {
			if len(src.Files) > 1 && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, "", fmt.Errorf("read %s: %w", f, err)
		}
		cfg, err := clientcmd.Load(b)
		if err != nil {
			return nil, "", fmt.Errorf("parse %s: %w", f, err)
		}
		if err := clientcmd.ResolveConfigPaths(cfg, filepath.Dir(f)); err != nil {
			return nil, "", fmt.Errorf("%s: %w", f, err)
		}
		mergeFirstWins(merged, cfg)
		origin = append(origin, f)
	}
	if len(origin) == 0 {
		return nil, "", fmt.Errorf("none of the kubeconfigs exists: %s", strings.Join(src.Files, ", "))
	}
	name := merged.CurrentContext
	if src.Context != "" {
		name = src.Context
	}
	cfg, err := only(merged, name)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", strings.Join(origin, ", "), err)
	}
	if err := inline(root, cfg); err != nil {
		return nil, "", fmt.Errorf("%s: %w", strings.Join(origin, ", "), err)
	}
	for _, a := range cfg.AuthInfos {
		if a.Exec != nil {
			boundPluginFor(a.Exec, timeout)
		}
	}
	rc, err := clientcmd.NewNonInteractiveClientConfig(*cfg, name, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("client config %s: %w", strings.Join(origin, ", "), err)
	}
	return rc, strings.Join(origin, ":"), nil
}

// mergeFirstWins is clientcmd's merge of a kubeconfig list.
func mergeFirstWins(into, cfg *clientcmdapi.Config) {
	for k, v := range cfg.Clusters {
		if _, ok := into.Clusters[k]; !ok {
			into.Clusters[k] = v
		}
	}
	for k, v := range cfg.AuthInfos {
		if _, ok := into.AuthInfos[k]; !ok {
			into.AuthInfos[k] = v
		}
	}
	for k, v := range cfg.Contexts {
		if _, ok := into.Contexts[k]; !ok {
			into.Contexts[k] = v
		}
	}
	if into.CurrentContext == "" {
		into.CurrentContext = cfg.CurrentContext
	}
}

// only is the config of one context: that context, its cluster and its
// user, nothing else (what no request uses is never read). A context
// named but absent is clientcmd's error.
func only(cfg *clientcmdapi.Config, name string) (*clientcmdapi.Config, error) {
	out := clientcmdapi.NewConfig()
	out.CurrentContext = name
	if name == "" {
		return out, nil // clientcmd says "no configuration has been provided"
	}
	ctx, ok := cfg.Contexts[name]
	if !ok {
		return nil, fmt.Errorf("context %s: not found in the kubeconfig", describeName(name))
	}
	out.Contexts[name] = ctx
	if c, ok := cfg.Clusters[ctx.Cluster]; ok {
		out.Clusters[ctx.Cluster] = c
	}
	if a, ok := cfg.AuthInfos[ctx.AuthInfo]; ok {
		out.AuthInfos[ctx.AuthInfo] = a
	}
	return out, nil
}

// inline reads every file the config names (CA, client certificate and
// key, token file) under the root through the provider's checked open,
// within maxNamedFile each and maxNamedTotal in all, and puts the content
// into the config: client-go would otherwise open them itself, following
// any symlink, blocking on a planted FIFO and reading them whole. The one
// link followed is the kubelet's own rotation link
// (kubelet-client-current.pem -> kubelet-client-<time>.pem, in its
// root-owned pki directory): fsutil.ReadFileRotated.
func inline(root paths.Root, cfg *clientcmdapi.Config) error {
	total := 0
	read := func(p string) ([]byte, error) {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("%s is not an absolute path", describePath(p))
		}
		b, err := fsutil.ReadFileRotated(string(root), p, maxNamedFile)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		if total += len(b); total > maxNamedTotal {
			return nil, fmt.Errorf("the files the kubeconfig names hold more than %d bytes", maxNamedTotal)
		}
		return b, nil
	}
	// into moves the content of the file *path names into *data.
	into := func(path *string, data *[]byte) error {
		if *path == "" {
			return nil
		}
		b, err := read(*path)
		if err != nil {
			return err
		}
		*data, *path = b, ""
		return nil
	}
	for _, name := range sortedKeys(cfg.Clusters) {
		c := cfg.Clusters[name]
		if err := into(&c.CertificateAuthority, &c.CertificateAuthorityData); err != nil {
			return err
		}
	}
	for _, name := range sortedKeys(cfg.AuthInfos) {
		a := cfg.AuthInfos[name]
		if err := errors.Join(into(&a.ClientCertificate, &a.ClientCertificateData), into(&a.ClientKey, &a.ClientKeyData)); err != nil {
			return err
		}
		var token []byte
		if err := into(&a.TokenFile, &token); err != nil {
			return err
		}
		if token != nil {
			a.Token = strings.TrimSpace(string(token))
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// describePath names a path from a kubeconfig without quoting one that
// is not plain.
func describePath(p string) string {
	if p != "" && len(p) <= 256 && strings.IndexFunc(p, func(r rune) bool { return r < 0x21 || r > 0x7e }) < 0 {
		return p
	}
	return fmt.Sprintf("a path of %d bytes that is not plain (not shown)", len(p))
}

// describeName names a context, cluster or user without quoting one that
// is not a plain name.
func describeName(n string) string {
	if n != "" && len(n) <= 253 && strings.IndexFunc(n, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.@:", r))
	}) < 0 {
		return fmt.Sprintf("%q", n)
	}
	return fmt.Sprintf("of %d bytes that is not a plain name (not shown)", len(n))
}

// ClusterCAData is the certificate-authority-data of every cluster a
// kubeconfig names (kube-public/cluster-info's, for discovery), by
// cluster name; a file it names is never read.
func ClusterCAData(b []byte) ([][]byte, error) {
	if len(b) > maxKubeconfigFile {
		return nil, fmt.Errorf("a kubeconfig of more than %d bytes", maxKubeconfigFile)
	}
	cfg, err := clientcmd.Load(b)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for _, name := range sortedKeys(cfg.Clusters) {
		out = append(out, cfg.Clusters[name].CertificateAuthorityData)
	}
	return out, nil
}
