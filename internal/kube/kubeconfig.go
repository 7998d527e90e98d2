package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// kubeconfig is a kubeconfig file (clientcmd/api/v1 Config), the fields
// the provider uses.
type kubeconfig struct {
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
	Clusters   []struct {
		Name    string      `json:"name"`
		Cluster clusterInfo `json:"cluster"`
	} `json:"clusters"`
	AuthInfos []struct {
		Name     string   `json:"name"`
		AuthInfo authInfo `json:"user"`
	} `json:"users"`
	Contexts []struct {
		Name    string      `json:"name"`
		Context contextInfo `json:"context"`
	} `json:"contexts"`
	CurrentContext string `json:"current-context"`
}

type clusterInfo struct {
	Server                   string `json:"server"`
	TLSServerName            string `json:"tls-server-name,omitempty"`
	InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify,omitempty"`
	CertificateAuthority     string `json:"certificate-authority,omitempty"`
	CertificateAuthorityData []byte `json:"certificate-authority-data,omitempty"`
	ProxyURL                 string `json:"proxy-url,omitempty"`
	DisableCompression       bool   `json:"disable-compression,omitempty"`
	Extensions               []struct {
		Name      string          `json:"name"`
		Extension json.RawMessage `json:"extension"`
	} `json:"extensions,omitempty"`
}

type authInfo struct {
	ClientCertificate     string              `json:"client-certificate,omitempty"`
	ClientCertificateData []byte              `json:"client-certificate-data,omitempty"`
	ClientKey             string              `json:"client-key,omitempty"`
	ClientKeyData         []byte              `json:"client-key-data,omitempty"`
	Token                 string              `json:"token,omitempty"`
	TokenFile             string              `json:"tokenFile,omitempty"`
	Impersonate           string              `json:"as,omitempty"`
	ImpersonateUID        string              `json:"as-uid,omitempty"`
	ImpersonateGroups     []string            `json:"as-groups,omitempty"`
	ImpersonateUserExtra  map[string][]string `json:"as-user-extra,omitempty"`
	Username              string              `json:"username,omitempty"`
	Password              string              `json:"password,omitempty"`
	AuthProvider          *struct {
		Name string `json:"name"`
	} `json:"auth-provider,omitempty"`
	Exec *execConfig `json:"exec,omitempty"`
}

type execConfig struct {
	Command string   `json:"command"`
	Args    []string `json:"args"`
	Env     []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"env"`
	APIVersion         string `json:"apiVersion,omitempty"`
	InstallHint        string `json:"installHint,omitempty"`
	ProvideClusterInfo bool   `json:"provideClusterInfo"`
	InteractiveMode    string `json:"interactiveMode,omitempty"`
}

type contextInfo struct {
	Cluster   string `json:"cluster"`
	AuthInfo  string `json:"user"`
	Namespace string `json:"namespace,omitempty"`
}

// parseKubeconfig decodes a kubeconfig as clientcmd.Load does: YAML or
// JSON, field names matched case-sensitively, unknown fields ignored,
// names unique per list; empty input is an empty config.
func parseKubeconfig(b []byte) (*kubeconfig, error) {
	cfg := &kubeconfig{}
	if len(bytes.TrimSpace(b)) == 0 {
		return cfg, nil
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, err
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(j, cfg); err != nil {
		return nil, err
	}
	if (cfg.Kind != "" && cfg.Kind != "Config") || (cfg.APIVersion != "" && cfg.APIVersion != "v1") {
		return nil, fmt.Errorf("not a kubeconfig: apiVersion %q, kind %q", cfg.APIVersion, cfg.Kind)
	}
	seen := map[string]bool{}
	dup := func(list, name string) error {
		if seen[list+"/"+name] {
			return fmt.Errorf("duplicate name %q in %s", name, list)
		}
		seen[list+"/"+name] = true
		return nil
	}
	for _, c := range cfg.Clusters {
		if err := dup("clusters", c.Name); err != nil {
			return nil, err
		}
	}
	for _, a := range cfg.AuthInfos {
		if err := dup("users", a.Name); err != nil {
			return nil, err
		}
	}
	for _, c := range cfg.Contexts {
		if err := dup("contexts", c.Name); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// conn is what a kubeconfig's current context resolves to: where, and as
// whom.
type conn struct {
	host    string // the server as written (scheme, host, path prefix)
	base    *url.URL
	cluster clusterInfo
	user    authInfo
	tls     *tls.Config // nil over plain http
	proxy   func(*http.Request) (*url.URL, error)
}

// resolve picks the current context's cluster and user and checks them as
// clientcmd's DirectClientConfig does before it builds a client.
func (cfg *kubeconfig) resolve() (*conn, error) {
	var ctx contextInfo
	if cfg.CurrentContext != "" {
		found := false
		for _, c := range cfg.Contexts {
			if c.Name == cfg.CurrentContext {
				ctx, found = c.Context, true
			}
		}
		if !found {
			return nil, fmt.Errorf("context was not found for specified context: %v", cfg.CurrentContext)
		}
	}
	var user authInfo
	if ctx.AuthInfo != "" {
		found := false
		for _, a := range cfg.AuthInfos {
			if a.Name == ctx.AuthInfo {
				user, found = a.AuthInfo, true
			}
		}
		if !found {
			return nil, fmt.Errorf("auth info %q does not exist", ctx.AuthInfo)
		}
	}
	var cl clusterInfo
	if ctx.Cluster != "" {
		found := false
		for _, c := range cfg.Clusters {
			if c.Name == ctx.Cluster {
				cl, found = c.Cluster, true
			}
		}
		if !found {
			return nil, fmt.Errorf("cluster %q does not exist", ctx.Cluster)
		}
	}
	if errs := validate(ctx.Cluster, cl, ctx.AuthInfo, user); len(errs) > 0 {
		return nil, fmt.Errorf("invalid configuration: %w", errors.Join(errs...))
	}

	c := &conn{host: cl.Server, cluster: cl, user: user, proxy: http.ProxyFromEnvironment}
	if cl.ProxyURL != "" {
		u, err := parseProxyURL(cl.ProxyURL)
		if err != nil {
			return nil, err
		}
		c.proxy = http.ProxyURL(u)
	}
	if u, err := url.ParseRequestURI(c.host); err == nil && u.Opaque == "" && len(u.Path) > 1 {
		u.RawQuery, u.Fragment = "", ""
		c.host = u.String()
	}
	base, err := serverURL(c.host)
	if err != nil {
		return nil, err
	}
	c.base = base
	if base.Scheme != "https" {
		// As client-go: no credentials and no TLS but to an https:// server.
		c.user = authInfo{Impersonate: user.Impersonate, ImpersonateUID: user.ImpersonateUID,
			ImpersonateGroups: user.ImpersonateGroups, ImpersonateUserExtra: user.ImpersonateUserExtra}
		return c, nil
	}
	if c.tls, err = tlsConfig(cl, c.user); err != nil {
		return nil, err
	}
	return c, nil
}

// validate is clientcmd's validation of the cluster and user used.
func validate(clusterName string, cl clusterInfo, userName string, u authInfo) []error {
	var errs []error
	var methods []string
	if u.Token != "" {
		methods = append(methods, "token")
	}
	if u.Username != "" || u.Password != "" {
		methods = append(methods, "basicAuth")
	}
	if u.ClientCertificate != "" || len(u.ClientCertificateData) != 0 {
		if u.ClientCertificate != "" && len(u.ClientCertificateData) != 0 {
			errs = append(errs, fmt.Errorf("client-cert-data and client-cert are both specified for %v. client-cert-data will override.", userName))
		}
		if u.ClientKey != "" && len(u.ClientKeyData) != 0 {
			errs = append(errs, fmt.Errorf("client-key-data and client-key are both specified for %v; client-key-data will override", userName))
		}
		if u.ClientKey == "" && len(u.ClientKeyData) == 0 {
			errs = append(errs, fmt.Errorf("client-key-data or client-key must be specified for %v to use the clientCert authentication method.", userName))
		}
	}
	if u.Exec != nil {
		if u.AuthProvider != nil {
			errs = append(errs, fmt.Errorf("authProvider cannot be provided in combination with an exec plugin for %s", userName))
		}
		if u.Exec.Command == "" {
			errs = append(errs, fmt.Errorf("command must be specified for %v to use exec authentication plugin", userName))
		}
		if u.Exec.APIVersion == "" {
			errs = append(errs, fmt.Errorf("apiVersion must be specified for %v to use exec authentication plugin", userName))
		}
		for _, v := range u.Exec.Env {
			if v.Name == "" {
				errs = append(errs, fmt.Errorf("env variable name must be specified for %v to use exec authentication plugin", userName))
			}
		}
		switch u.Exec.InteractiveMode {
		case "":
			// clientcmd's defaulting: IfAvailable, as v1 kubeconfigs may omit it.
			u.Exec.InteractiveMode = "IfAvailable"
		case "Never", "IfAvailable", "Always":
		default:
			errs = append(errs, fmt.Errorf("invalid interactiveMode for %v: %q", userName, u.Exec.InteractiveMode))
		}
	}
	if len(methods) > 1 {
		errs = append(errs, fmt.Errorf("more than one authentication method found for %v; found %v, only one is allowed", userName, methods))
	}
	if (u.ImpersonateUID != "" || len(u.ImpersonateGroups) > 0 || len(u.ImpersonateUserExtra) > 0) && u.Impersonate == "" {
		errs = append(errs, fmt.Errorf("requesting uid, groups or user-extra for %v without impersonating a user", userName))
	}
	if u.AuthProvider != nil {
		// client-go links no auth provider plugin either.
		errs = append(errs, fmt.Errorf("no Auth Provider found for name %q", u.AuthProvider.Name))
	}

	if cl.Server == "" && cl.TLSServerName == "" && !cl.InsecureSkipTLSVerify && cl.CertificateAuthority == "" &&
		len(cl.CertificateAuthorityData) == 0 && cl.ProxyURL == "" && !cl.DisableCompression && len(cl.Extensions) == 0 {
		return append(errs, errors.New("no configuration has been provided"))
	}
	if cl.Server == "" {
		if clusterName == "" {
			errs = append(errs, errors.New("default cluster has no server defined"))
		} else {
			errs = append(errs, fmt.Errorf("no server found for cluster %q", clusterName))
		}
	}
	if cl.ProxyURL != "" {
		if _, err := parseProxyURL(cl.ProxyURL); err != nil {
			errs = append(errs, fmt.Errorf("invalid 'proxy-url' %q for cluster %q: %w", cl.ProxyURL, clusterName, err))
		}
	}
	if cl.CertificateAuthority != "" && len(cl.CertificateAuthorityData) != 0 {
		errs = append(errs, fmt.Errorf("certificate-authority-data and certificate-authority are both specified for %v. certificate-authority-data will override.", clusterName))
	}
	return errs
}

func parseProxyURL(proxyURL string) (*url.URL, error) {
	u, err := url.Parse(proxyURL)
	if err != nil {
		return nil, fmt.Errorf("could not parse: %v", proxyURL)
	}
	switch u.Scheme {
	case "http", "https", "socks5":
	default:
		return nil, fmt.Errorf("unsupported scheme %q, must be http, https, or socks5", u.Scheme)
	}
	return u, nil
}

// serverURL is client-go's DefaultServerURL for a config whose
// credentials are not merged yet: a host without a scheme is http (and
// may not have a path); a path is the prefix of every request.
func serverURL(host string) (*url.URL, error) {
	if host == "" {
		return nil, errors.New("host must be a URL or a host:port pair")
	}
	u, err := url.Parse(host)
	if err != nil || u.Scheme == "" || u.Host == "" {
		if u, err = url.Parse("http://" + host); err != nil {
			return nil, err
		}
		if u.Path != "" && u.Path != "/" {
			return nil, fmt.Errorf("host must be a URL or a host:port pair: %q", host)
		}
	}
	u.RawQuery, u.Fragment = "", ""
	return u, nil
}

// tlsConfig is client-go's TLSConfigFor: TLS 1.2 at least, the cluster's
// CA (else the system's), its server name, the user's certificate.
func tlsConfig(cl clusterInfo, u authInfo) (*tls.Config, error) {
	if cl.InsecureSkipTLSVerify && len(cl.CertificateAuthorityData) > 0 {
		return nil, errors.New("specifying a root certificates file with the insecure flag is not allowed")
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cl.InsecureSkipTLSVerify, ServerName: cl.TLSServerName}
	if len(cl.CertificateAuthorityData) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cl.CertificateAuthorityData) {
			return nil, errors.New("unable to load root certificates: unable to parse bytes as PEM block")
		}
		c.RootCAs = pool
	}
	if len(u.ClientCertificateData) > 0 || len(u.ClientKeyData) > 0 {
		kp, err := tls.X509KeyPair(u.ClientCertificateData, u.ClientKeyData)
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{kp}
	}
	return c, nil
}

// transport is client-go's transport for a config: proxy, dial and TLS
// handshake bounds, HTTP/2 with health-check pings.
func (c *conn) transport() *http.Transport {
	t := &http.Transport{
		Proxy:               c.proxy,
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		TLSClientConfig:     c.tls,
		MaxIdleConnsPerHost: 25,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
		DisableCompression:  c.cluster.DisableCompression,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second},
	}
	return t
}

// execCredential is what an exec credential plugin prints.
type execCredential struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Status     *struct {
		Token                 string `json:"token"`
		ClientCertificateData string `json:"clientCertificateData"`
		ClientKeyData         string `json:"clientKeyData"`
	} `json:"status"`
}

// execPluginBound caps one run of a credential plugin: it is a program
// named by a kubeconfig, and a request must never wait on it forever.
const execPluginBound = time.Minute

// execPlugin runs a kubeconfig's credential plugin once per process, as
// client-go's exec authenticator does on first use; a run cut short by its
// caller's context (or the bound) is not kept, the next call runs it again.
type execPlugin struct {
	cfg     *execConfig
	cluster clusterInfo
	server  string
	mu      sync.Mutex
	done    bool
	token   string
	cert    *tls.Certificate
	err     error
}

func (p *execPlugin) run(ctx context.Context) {
	cfg := p.cfg
	switch cfg.APIVersion {
	case "client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1":
	default:
		p.err = fmt.Errorf("exec plugin: invalid apiVersion %q", cfg.APIVersion)
		return
	}
	interactive := false
	terminal := isTerminal(os.Stdin)
	switch cfg.InteractiveMode {
	case "Never":
	case "Always":
		if !terminal {
			p.err = errors.New("exec plugin cannot support interactive mode: standard input is not a terminal")
			return
		}
		interactive = true
	default: // IfAvailable
		interactive = terminal
	}
	spec := map[string]any{"interactive": interactive}
	if cfg.ProvideClusterInfo {
		cl := map[string]any{"server": p.server}
		if p.cluster.TLSServerName != "" {
			cl["tls-server-name"] = p.cluster.TLSServerName
		}
		if p.cluster.InsecureSkipTLSVerify {
			cl["insecure-skip-tls-verify"] = true
		}
		if len(p.cluster.CertificateAuthorityData) > 0 {
			cl["certificate-authority-data"] = p.cluster.CertificateAuthorityData
		}
		if p.cluster.ProxyURL != "" {
			cl["proxy-url"] = p.cluster.ProxyURL
		}
		if p.cluster.DisableCompression {
			cl["disable-compression"] = true
		}
		for _, e := range p.cluster.Extensions {
			if e.Name == "client.authentication.k8s.io/exec" {
				cl["config"] = e.Extension
			}
		}
		spec["cluster"] = cl
	}
	info, err := json.Marshal(map[string]any{"kind": "ExecCredential", "apiVersion": cfg.APIVersion, "spec": spec})
	if err != nil {
		p.err = err
		return
	}
	ctx, cancel := context.WithTimeout(ctx, execPluginBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, cfg.Command, cfg.Args...)
	// The plugin and whatever it starts end with the bound.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	cmd.Env = os.Environ()
	for _, e := range cfg.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.Env = append(cmd.Env, "KUBERNETES_EXEC_INFO="+string(info))
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if interactive {
		cmd.Stdin = os.Stdin
	}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			p.err = fmt.Errorf("exec: executable %s: %w", cfg.Command, ctx.Err())
			return
		}
		if errors.Is(err, exec.ErrNotFound) {
			p.err = fmt.Errorf("exec: executable %s not found\n\n%s", cfg.Command, cfg.InstallHint)
		} else {
			p.err = fmt.Errorf("exec: executable %s failed: %w", cfg.Command, err)
		}
		return
	}
	var cred execCredential
	if err := kjson.UnmarshalCaseSensitivePreserveInts(stdout.Bytes(), &cred); err != nil {
		p.err = fmt.Errorf("decoding stdout: %v", err)
		return
	}
	if cred.APIVersion != cfg.APIVersion || cred.Kind != "ExecCredential" {
		p.err = fmt.Errorf("exec plugin is configured to use API version %s, plugin returned version %s", cfg.APIVersion, cred.APIVersion)
		return
	}
	st := cred.Status
	switch {
	case st == nil:
		p.err = errors.New("exec plugin didn't return a status field")
	case st.Token == "" && st.ClientCertificateData == "" && st.ClientKeyData == "":
		p.err = errors.New("exec plugin didn't return a token or cert/key pair")
	case (st.ClientCertificateData == "") != (st.ClientKeyData == ""):
		p.err = errors.New("exec plugin returned only certificate or key, not both")
	default:
		p.token = st.Token
		if st.ClientCertificateData != "" {
			kp, err := tls.X509KeyPair([]byte(st.ClientCertificateData), []byte(st.ClientKeyData))
			if err != nil {
				p.err = fmt.Errorf("failed parsing client key/certificate: %v", err)
				return
			}
			p.cert = &kp
		}
	}
}

func (p *execPlugin) credentials(ctx context.Context) (string, *tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done {
		p.token, p.cert, p.err = "", nil, nil
		p.run(ctx)
		p.done = !errors.Is(p.err, context.Canceled) && !errors.Is(p.err, context.DeadlineExceeded)
	}
	return p.token, p.cert, p.err
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// ClusterCAData is the certificate-authority-data of every cluster a
// kubeconfig names (kube-public/cluster-info's, for discovery), parsed as
// clientcmd.Load parses it.
func ClusterCAData(b []byte) ([][]byte, error) {
	cfg, err := parseKubeconfig(b)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for _, c := range cfg.Clusters {
		out = append(out, c.Cluster.CertificateAuthorityData)
	}
	return out, nil
}
