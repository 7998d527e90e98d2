package clusterconfig

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Token strength: the cluster token is the root secret every bootstrap
// token and certificate key is derived from, so it must carry real entropy.
const (
	MinTokenLength   = 20
	MinTokenDistinct = 10
)

// Bootstrap token lifetimes the provider accepts: bounded, never "forever".
const (
	DefaultTokenTTL = 24 * time.Hour
	MaxTokenTTL     = 7 * 24 * time.Hour
)

// Roles, as the Kairos cluster section names them.
const (
	RoleInit         = "init"
	RoleControlPlane = "controlplane"
	RoleWorker       = "worker"
)

// DefaultAPIPort is the port used when control_plane_host names none.
const DefaultAPIPort = "6443"

var (
	bootstrapTokenRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`) })
	caHashRE         = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^sha256:[0-9a-f]{64}$`) })
	certKeyRE        = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{64}$`) })
)

// ValidBootstrapToken reports whether s has kubeadm's bootstrap token form.
func ValidBootstrapToken(s string) bool { return bootstrapTokenRE().MatchString(s) }

// ValidCAHash reports whether s is "sha256:" and 64 lowercase hex digits.
func ValidCAHash(s string) bool { return caHashRE().MatchString(s) }

// ValidCertificateKey reports whether s is 32 bytes in lowercase hex (AES-256).
func ValidCertificateKey(s string) bool { return certKeyRE().MatchString(s) }

// documents: key in the config string → the apiVersion and kind kubeadm expects.
var documents = []struct{ key, apiVersion, kind string }{
	{"initConfiguration", "kubeadm.k8s.io/v1beta4", "InitConfiguration"},
	{"clusterConfiguration", "kubeadm.k8s.io/v1beta4", "ClusterConfiguration"},
	{"joinConfiguration", "kubeadm.k8s.io/v1beta4", "JoinConfiguration"},
	{"upgradeConfiguration", "kubeadm.k8s.io/v1beta4", "UpgradeConfiguration"},
	{"kubeletConfiguration", "kubelet.config.k8s.io/v1beta1", "KubeletConfiguration"},
	{"kubeProxyConfiguration", "kubeproxy.config.k8s.io/v1alpha1", "KubeProxyConfiguration"},
}

// TypeMeta returns the apiVersion and kind of the document under key.
func TypeMeta(key string) (apiVersion, kind string) {
	for _, d := range documents {
		if d.key == key {
			return d.apiVersion, d.kind
		}
	}
	return "", ""
}

// Documents returns each document of the config string by key.
func (k *Kubeadm) Documents() map[string]map[string]any {
	return map[string]map[string]any{
		"initConfiguration":      k.InitConfiguration,
		"clusterConfiguration":   k.ClusterConfiguration,
		"joinConfiguration":      k.JoinConfiguration,
		"upgradeConfiguration":   k.UpgradeConfiguration,
		"kubeletConfiguration":   k.KubeletConfiguration,
		"kubeProxyConfiguration": k.KubeProxyConfiguration,
	}
}

// Validate checks everything about a cluster section that can be checked
// without the node, the network or the API: the keys the provider needs,
// the token's strength, the endpoint, and the kubeadm documents in config.
// The first problem is returned, naming its key and never quoting a secret.
// It returns the parsed config string on success.
func (c *Cluster) Validate() (*Kubeadm, error) {
	k, problems := c.Problems()
	if len(problems) > 0 {
		return nil, problems[0]
	}
	return k, nil
}

// Problems is every problem Validate finds, in the order it checks (the
// first is the one Validate returns), each wrapping ErrInvalid, and the
// parsed config string when it parses.
func (c *Cluster) Problems() (*Kubeadm, []error) {
	var problems []error
	bad := func(format string, a ...any) {
		problems = append(problems, fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...)))
	}
	switch c.Role {
	case "":
		bad("role is missing: set role: init, controlplane or worker")
	case RoleInit, RoleControlPlane, RoleWorker:
	default:
		bad("role is not init, controlplane or worker")
	}
	if err := TokenStrength(c.ClusterToken); err != nil {
		problems = append(problems, err)
	}
	if c.ControlPlaneHost == "" {
		bad("control_plane_host is missing: set the address (host or host:port) every node reaches the API at")
	} else if _, err := Endpoint(c.ControlPlaneHost); err != nil {
		bad("control_plane_host: %v", err)
	}
	for i, pemText := range c.CACerts {
		if _, err := CertHashes(pemText); err != nil {
			bad("ca_certs[%d]: %v", i, err)
		}
	}
	k, err := c.Kubeadm()
	if err != nil {
		return nil, append(problems, err)
	}
	return k, append(problems, k.problems()...)
}

// TokenStrength refuses a cluster token too weak to derive secrets from.
func TokenStrength(tok string) error {
	if tok == "" {
		return fmt.Errorf("%w: cluster_token is missing: set a random secret of at least %d characters (e.g. openssl rand -hex 24)", ErrInvalid, MinTokenLength)
	}
	if strings.ContainsAny(tok, "<>") {
		return fmt.Errorf("%w: cluster_token is still a placeholder: replace it with a random secret (e.g. openssl rand -hex 24)", ErrInvalid)
	}
	// A space inside is a paste gone wrong as surely as one at either end
	// (every node must carry the same bytes); a control character cannot
	// be told apart on screen.
	if strings.IndexFunc(tok, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return fmt.Errorf("%w: cluster_token has leading, trailing or embedded whitespace or a control character", ErrInvalid)
	}
	if len(tok) < MinTokenLength {
		return fmt.Errorf("%w: cluster_token is too short (%d characters, at least %d): use a random secret (e.g. openssl rand -hex 24)", ErrInvalid, len(tok), MinTokenLength)
	}
	distinct := map[rune]bool{}
	for _, r := range tok {
		distinct[r] = true
	}
	if len(distinct) < MinTokenDistinct {
		return fmt.Errorf("%w: cluster_token is too repetitive (%d distinct characters, at least %d): use a random secret (e.g. openssl rand -hex 24)", ErrInvalid, len(distinct), MinTokenDistinct)
	}
	return nil
}

// Endpoint turns a host or host:port (IPv6 in brackets with a port) into
// host:port, adding the default API port. A missing host, a scheme, a path
// or a bad port is an error.
func Endpoint(s string) (string, error) {
	if strings.Contains(s, "://") || strings.ContainsAny(s, "/ \t\n") {
		return "", errors.New("not a host or host:port (no scheme, no path)")
	}
	host, port := s, DefaultAPIPort
	if h, p, err := net.SplitHostPort(s); err == nil {
		host, port = h, p
	} else if strings.Count(s, ":") > 1 && net.ParseIP(strings.Trim(s, "[]")) != nil {
		host = strings.Trim(s, "[]") // a bare IPv6 address
	} else if strings.Contains(s, ":") {
		return "", errors.New("not a host or host:port (an IPv6 address goes in brackets: [fd00::1]:6443)")
	}
	if host == "" {
		return "", errors.New("no host")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", errors.New("the port is not 1-65535")
	}
	return net.JoinHostPort(host, port), nil
}

// CertHashes returns kubeadm's CA pin ("sha256:" + hex of the SPKI) of every
// certificate in a PEM text.
func CertHashes(pemText string) ([]string, error) {
	var out []string
	rest := []byte(pemText)
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d does not parse: %v", len(out)+1, err)
		}
		out = append(out, SPKIHash(cert))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no PEM CERTIFICATE block")
	}
	return out, nil
}

// SPKIHash is kubeadm's public key pin of a certificate.
func SPKIHash(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// problems lists every problem of the kubeadm documents.
func (k *Kubeadm) problems() []error {
	var problems []error
	bad := func(format string, a ...any) {
		problems = append(problems, fmt.Errorf("%w: config: %s", ErrInvalid, fmt.Sprintf(format, a...)))
	}
	check := func(err error) {
		if err != nil {
			bad("%v", err)
		}
	}
	docs := k.Documents()
	for _, d := range documents {
		doc := docs[d.key]
		if doc == nil {
			continue
		}
		if v, ok := doc["apiVersion"]; ok && v != d.apiVersion {
			bad("%s.apiVersion must be %s (or left out)", d.key, d.apiVersion)
		}
		if v, ok := doc["kind"]; ok && v != d.kind {
			bad("%s.kind must be %s (or left out)", d.key, d.kind)
		}
	}
	switch pin, err := k.Pin(); {
	case err != nil:
		problems = append(problems, err)
	case pin == "":
		bad("clusterConfiguration.kubernetesVersion is missing: pin an exact version such as v1.37.2")
	default:
		if _, err := version.Parse(pin); err != nil {
			bad("clusterConfiguration.kubernetesVersion is not an exact vMAJOR.MINOR.PATCH release such as v1.37.2")
		}
	}
	if v, ok := k.ClusterConfiguration["controlPlaneEndpoint"]; ok {
		if s, isStr := v.(string); !isStr {
			bad("clusterConfiguration.controlPlaneEndpoint must be a string")
		} else if _, err := Endpoint(s); err != nil {
			bad("clusterConfiguration.controlPlaneEndpoint: %v", err)
		}
	}

	// initConfiguration: explicit bootstrap tokens and certificate key.
	if raw, ok := k.InitConfiguration["bootstrapTokens"]; ok {
		list, isList := raw.([]any)
		if !isList {
			bad("initConfiguration.bootstrapTokens must be a list")
		}
		for i, item := range list {
			m, isMap := item.(map[string]any)
			if !isMap {
				bad("initConfiguration.bootstrapTokens[%d] must be a map", i)
				continue
			}
			check(checkToken(m["token"], fmt.Sprintf("initConfiguration.bootstrapTokens[%d].token", i), true))
			check(checkTTL(m["ttl"], fmt.Sprintf("initConfiguration.bootstrapTokens[%d].ttl", i)))
			if _, ok := m["expires"]; ok {
				bad("initConfiguration.bootstrapTokens[%d].expires is not supported: use ttl (at most %s)", i, MaxTokenTTL)
			}
		}
	}
	check(checkCertKey(k.InitConfiguration["certificateKey"], "initConfiguration.certificateKey"))

	// joinConfiguration: discovery always pins the CA.
	jc := k.JoinConfiguration
	if v, ok := jc["discovery"]; ok {
		if disc, isMap := v.(map[string]any); !isMap {
			bad("joinConfiguration.discovery must be a map")
		} else {
			discoveryProblems(disc, bad, check)
		}
	}
	if v, ok := jc["controlPlane"]; ok && v != nil {
		if cp, isMap := v.(map[string]any); !isMap {
			bad("joinConfiguration.controlPlane must be a map")
		} else {
			check(checkCertKey(cp["certificateKey"], "joinConfiguration.controlPlane.certificateKey"))
		}
	}
	return problems
}

// discoveryProblems reports, through bad and check, every problem of
// joinConfiguration.discovery.
func discoveryProblems(disc map[string]any, bad func(string, ...any), check func(error)) {
	if _, ok := lookupFold(disc, "file"); ok {
		bad("joinConfiguration.discovery.file is not supported: the provider joins with bootstrap token discovery pinned by caCertHashes")
	}
	check(checkToken(disc["tlsBootstrapToken"], "joinConfiguration.discovery.tlsBootstrapToken", false))
	v, ok := disc["bootstrapToken"]
	if !ok {
		return
	}
	bt, isMap := v.(map[string]any)
	if !isMap {
		bad("joinConfiguration.discovery.bootstrapToken must be a map")
		return
	}
	if skip, ok := lookupFold(bt, "unsafeSkipCAVerification"); ok && skip != false {
		bad("joinConfiguration.discovery.bootstrapToken.unsafeSkipCAVerification must not be set: the provider never joins without pinning the cluster CA")
	}
	check(checkToken(bt["token"], "joinConfiguration.discovery.bootstrapToken.token", false))
	if ep, ok := bt["apiServerEndpoint"]; ok {
		if s, isStr := ep.(string); !isStr {
			bad("joinConfiguration.discovery.bootstrapToken.apiServerEndpoint must be a string")
		} else if _, err := Endpoint(s); err != nil {
			bad("joinConfiguration.discovery.bootstrapToken.apiServerEndpoint: %v", err)
		}
	}
	if hs, ok := bt["caCertHashes"]; ok {
		list, isList := hs.([]any)
		if !isList {
			bad("joinConfiguration.discovery.bootstrapToken.caCertHashes must be a list")
		}
		for i, h := range list {
			if s, isStr := h.(string); !isStr || !ValidCAHash(s) {
				bad("joinConfiguration.discovery.bootstrapToken.caCertHashes[%d] is not sha256:<64 lowercase hex digits>", i)
			}
		}
	}
}

func checkToken(v any, key string, required bool) error {
	if v == nil {
		if required {
			return fmt.Errorf("%s is missing", key)
		}
		return nil
	}
	s, ok := v.(string)
	if !ok || !ValidBootstrapToken(s) {
		return fmt.Errorf("%s is not a bootstrap token ([a-z0-9]{6}.[a-z0-9]{16})", key)
	}
	return nil
}

func checkTTL(v any, key string) error {
	if v == nil {
		return nil
	}
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("%s must be a duration string such as 24h", key)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%s is not a duration such as 24h", key)
	}
	if d <= 0 || d > MaxTokenTTL {
		return fmt.Errorf("%s is not bounded: want more than 0 and at most %s", key, MaxTokenTTL)
	}
	return nil
}

func checkCertKey(v any, key string) error {
	if v == nil {
		return nil
	}
	s, ok := v.(string)
	if !ok || !ValidCertificateKey(s) {
		return fmt.Errorf("%s is not 64 lowercase hex digits", key)
	}
	return nil
}

// lookupFold finds key in m in any spelling of its letters' case. kubeadm
// reads its keys case-sensitively, so another spelling may well be
// ignored there; for the keys that would weaken a join the provider
// refuses every spelling rather than guess how a reader will take it.
func lookupFold(m map[string]any, key string) (any, bool) {
	if v, ok := m[key]; ok {
		return v, true
	}
	for k, v := range m {
		if strings.EqualFold(k, key) {
			return v, true
		}
	}
	return nil, false
}
