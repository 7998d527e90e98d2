// Package certs reads when the certificates kubeadm manages on a control
// plane expire: the PEM files under /etc/kubernetes/pki and the client
// certificates embedded in the kubeconfigs kubeadm writes, named as
// `kubeadm certs check-expiration` names them. Reading is bounded and
// never follows a symlink (fsutil.ReadFileBeneath); what to report is
// decided by the pure functions Applies, Judge and Carry.
package certs

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// Cert is one certificate's expiry.
type Cert struct {
	// Name is kubeadm's name for it (`kubeadm certs check-expiration`):
	// apiserver, etcd-server, admin.conf, ca, ...
	Name     string
	NotAfter time.Time
	// CA: a certificate authority (ten years by default, not renewed by
	// `kubeadm certs renew`).
	CA bool
	// Carried: not read by this pass (its read failed); the last known
	// expiry, from the status mirror.
	Carried bool
}

// source is where one certificate lives: a PEM file, or the client
// certificate embedded in a kubeconfig.
type source struct {
	name, path string
	kubeconfig bool
	ca         bool
}

// sources are the certificates kubeadm manages on a control plane, as
// kubeadm v1.37's `certs check-expiration` lists them.
var sources = func() []source {
	pki := func(name, file string, ca bool) source {
		return source{name: name, path: paths.PKIDir + "/" + file, ca: ca}
	}
	conf := func(name string) source {
		return source{name: name, path: paths.KubernetesDir + "/" + name, kubeconfig: true}
	}
	return []source{
		conf("admin.conf"),
		pki("apiserver", "apiserver.crt", false),
		pki("apiserver-etcd-client", "apiserver-etcd-client.crt", false),
		pki("apiserver-kubelet-client", "apiserver-kubelet-client.crt", false),
		conf("controller-manager.conf"),
		pki("etcd-healthcheck-client", "etcd/healthcheck-client.crt", false),
		pki("etcd-peer", "etcd/peer.crt", false),
		pki("etcd-server", "etcd/server.crt", false),
		pki("front-proxy-client", "front-proxy-client.crt", false),
		conf("scheduler.conf"),
		conf("super-admin.conf"),
		pki("ca", "ca.crt", true),
		pki("etcd-ca", "etcd/ca.crt", true),
		pki("front-proxy-ca", "front-proxy-ca.crt", true),
	}
}()

// Names are the names of every certificate Read looks for, in its order.
func Names() []string {
	out := make([]string, len(sources))
	for i, s := range sources {
		out[i] = s.name
	}
	return out
}

// Bounds of a read.
const (
	MaxPEM        = 64 << 10
	MaxKubeconfig = 1 << 20
)

// ReadError is one certificate that could not be read.
type ReadError struct {
	Name string
	Err  error
}

func (e *ReadError) Error() string { return fmt.Sprintf("certificate %s: %v", e.Name, e.Err) }
func (e *ReadError) Unwrap() error { return e.Err }

// Read reads every certificate kubeadm manages under root. A missing file
// is not an error (external etcd has no etcd certificates, only the node
// that ran kubeadm init has super-admin.conf); every other failure is one
// ReadError, and the rest are still read.
func Read(root paths.Root) ([]Cert, []*ReadError) {
	var out []Cert
	var errs []*ReadError
	for _, s := range sources {
		na, err := s.read(root)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, &ReadError{Name: s.name, Err: err})
			continue
		}
		out = append(out, Cert{Name: s.name, NotAfter: na, CA: s.ca})
	}
	return out, errs
}

func (s source) read(root paths.Root) (time.Time, error) {
	limit := int64(MaxPEM)
	if s.kubeconfig {
		limit = MaxKubeconfig
	}
	b, err := fsutil.ReadFileBeneath(rootDir(root), s.path, limit)
	if err != nil {
		return time.Time{}, err
	}
	if s.kubeconfig {
		if b, err = clientCert(b); err != nil {
			return time.Time{}, fmt.Errorf("%s: %w", s.path, err)
		}
	}
	na, err := notAfter(b)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", s.path, err)
	}
	return na, nil
}

func rootDir(root paths.Root) string {
	if root == "" {
		return "/"
	}
	return string(root)
}

// clientCert is the embedded client certificate of a kubeconfig's
// current context (client-go's clientcmd parses it; a file it names is
// never opened: kubeadm embeds its own).
func clientCert(b []byte) ([]byte, error) {
	cfg, err := clientcmd.Load(b)
	if err != nil {
		return nil, fmt.Errorf("not a kubeconfig: %w", err)
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok || ctx == nil {
		return nil, errors.New("no current context")
	}
	user, ok := cfg.AuthInfos[ctx.AuthInfo]
	if !ok || user == nil {
		return nil, errors.New("the current context names no user")
	}
	if len(user.ClientCertificateData) == 0 {
		return nil, errors.New("no embedded client certificate")
	}
	return user.ClientCertificateData, nil
}

// notAfter is the expiry of the first certificate in a PEM file (the
// leaf of a chain).
func notAfter(b []byte) (time.Time, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return time.Time{}, errors.New("no PEM certificate")
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return time.Time{}, fmt.Errorf("parse certificate: %w", err)
		}
		return c.NotAfter.UTC(), nil
	}
}

// Applies reports whether a pass reads the certificates of this node:
// only on a member running a control plane. A worker holds no certificate
// kubeadm renews: its only one is the kubelet's client certificate
// (/var/lib/kubelet/pki/kubelet-client-current.pem), which the kubelet
// rotates itself before it expires.
func Applies(member, controlPlane bool) bool { return member && controlPlane }

// WarnBefore is how long before a certificate expires a pass warns
// (a Warning Event on the Node and a warning log line).
const WarnBefore = 30 * 24 * time.Hour

// Judge is what a pass says about a certificate at now: the whole days
// left (negative once expired) and whether to warn (under WarnBefore).
func Judge(c Cert, now time.Time) (days int, warn bool) {
	left := c.NotAfter.Sub(now)
	days = int(left / (24 * time.Hour))
	if left < 0 && left%(24*time.Hour) != 0 {
		days-- // expired part of a day ago: -1, not 0
	}
	return days, left < WarnBefore
}

// Carry is this pass's certificates with the ones whose read failed taken
// from the last known list (marked Carried), so a failed read never
// erases what the node knew. Only names Read looks for are carried, each
// once; the result is sorted by name.
func Carry(read []Cert, failed []string, last []Cert) []Cert {
	out := slices.Clone(read)
	have := map[string]bool{}
	for _, c := range read {
		have[c.Name] = true
	}
	known := Names()
	for _, l := range last {
		if have[l.Name] || !slices.Contains(failed, l.Name) || !slices.Contains(known, l.Name) || l.NotAfter.IsZero() {
			continue
		}
		l.Carried = true
		out = append(out, l)
		have[l.Name] = true
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Soonest is the certificate of cs that expires first among the leaves
// (ca false) or the authorities (ca true); ok is false when there is none.
func Soonest(cs []Cert, ca bool) (c Cert, ok bool) {
	for _, x := range cs {
		if x.CA != ca {
			continue
		}
		if !ok || x.NotAfter.Before(c.NotAfter) {
			c, ok = x, true
		}
	}
	return c, ok
}
