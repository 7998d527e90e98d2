package etcdsnap

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// Endpoint is how to reach this node's stacked etcd, read from the static
// pod manifest kubeadm wrote. Paths are host paths.
type Endpoint struct {
	URL     string // https client URL, loopback preferred
	CA      string // --trusted-ca-file
	Cert    string // kubeadm's healthcheck-client certificate next to the CA
	Key     string
	DataDir string // --data-dir
}

// kubeadm's healthcheck-client file names, in the etcd PKI directory
// (constants.EtcdHealthcheckClientCertName / KeyName).
const (
	healthcheckCert = "healthcheck-client.crt"
	healthcheckKey  = "healthcheck-client.key"
)

// ErrManifest marks a manifest the provider cannot use.
var ErrManifest = errors.New("etcd manifest")

// ParseManifest reads the etcd container's flags from etcd.yaml.
func ParseManifest(b []byte) (Endpoint, error) {
	flags, err := observe.ManifestFlags(b, "etcd")
	if err != nil {
		return Endpoint{}, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	ep := Endpoint{CA: flags["trusted-ca-file"], DataDir: flags["data-dir"]}
	if ep.DataDir == "" {
		ep.DataDir = paths.EtcdDir
	}
	for _, p := range []string{ep.CA, ep.DataDir} {
		if !path.IsAbs(p) || path.Clean(p) != p {
			return Endpoint{}, fmt.Errorf("%w: %q is not a clean absolute path (--trusted-ca-file, --data-dir)", ErrManifest, p)
		}
	}
	ep.Cert = path.Join(path.Dir(ep.CA), healthcheckCert)
	ep.Key = path.Join(path.Dir(ep.CA), healthcheckKey)
	u, err := clientURL(flags["listen-client-urls"], flags["advertise-client-urls"])
	if err != nil {
		return Endpoint{}, err
	}
	ep.URL = u
	return ep, nil
}

// clientURL picks a loopback https URL from --listen-client-urls, else the
// first https --advertise-client-urls.
func clientURL(listen, advertise string) (string, error) {
	var first string
	for i, list := range []string{listen, advertise} {
		for _, s := range strings.Split(list, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			u, err := url.Parse(s)
			if err != nil || u.Scheme != "https" || u.User != nil || u.Port() == "" || (u.Path != "" && u.Path != "/") {
				continue
			}
			ip := net.ParseIP(u.Hostname())
			if i == 0 && (u.Hostname() == "localhost" || ip != nil && ip.IsLoopback()) {
				return "https://" + u.Host, nil
			}
			if i == 1 && first == "" {
				first = "https://" + u.Host
			}
		}
	}
	if first == "" {
		return "", fmt.Errorf("%w: no usable https client URL (--listen-client-urls, --advertise-client-urls)", ErrManifest)
	}
	return first, nil
}
