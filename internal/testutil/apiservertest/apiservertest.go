// Package apiservertest starts the real kube-apiserver v1.37.2 (built from
// modules by testbin, cached) on loopback over a real embedded etcd, as a
// kubeadm control plane runs it where it matters to the provider: Node and
// RBAC authorization, the NodeRestriction admission. It mints client
// kubeconfigs from its client CA: an admin's (system:masters) and a node's
// own (system:node:NAME in system:nodes, as a kubelet.conf carries).
//
// No controller manager and no scheduler run: what their controllers
// would write (a PodDisruptionBudget's status, a pod's deletion after its
// kubelet stopped it) a test writes itself, and says so.
package apiservertest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
)

// Version is the kube-apiserver the tests run.
const Version = "v1.37.2"

// Advertised is the address the apiserver puts in its endpoints: it
// refuses to advertise a loopback address, so it advertises a
// documentation address (TEST-NET-1) it never sends to, and serves on
// loopback.
const Advertised = "192.0.2.10"

// Server is a running kube-apiserver.
type Server struct {
	Addr string // 127.0.0.1:port
	// Admin is a kubeconfig of system:masters.
	Admin     string
	ca        *x509.Certificate
	caKey     *ecdsa.PrivateKey
	servingCA []byte
	serial    int64
}

// Start starts the apiserver; it stops at the end of the test. Skipped in
// -short mode; the binary is built when it is not cached yet (minutes).
func Start(t *testing.T) *Server {
	t.Helper()
	bin := testbin.KubernetesBinary(t, Version, "kube-apiserver")
	n := testutil.NewNode(t, "cp1")
	e := etcdtest.Start(t, n, etcdtest.Config{})
	dir := t.TempDir()
	s := &Server{serial: 1}
	s.caKey = newKey(t)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &s.caKey.PublicKey, s.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if s.ca, err = x509.ParseCertificate(caDER); err != nil {
		t.Fatal(err)
	}
	saKey := newKey(t)
	write := func(name string, blocks ...*pem.Block) string {
		var b bytes.Buffer
		for _, blk := range blocks {
			_ = pem.Encode(&b, blk)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	saPubDER, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	clientCA := write("client-ca.crt", &pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	saKeyFile := write("sa.key", keyBlock(t, saKey))
	saPub := write("sa.pub", &pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER})
	port := etcdtest.FreePort(t)
	s.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{"--etcd-servers=" + e.ClientURL,
		"--etcd-cafile=" + n.Path(etcdtest.CACert), "--etcd-certfile=" + n.Path(etcdtest.HCCert), "--etcd-keyfile=" + n.Path(etcdtest.HCKey),
		"--secure-port=" + fmt.Sprint(port), "--bind-address=127.0.0.1", "--advertise-address=" + Advertised,
		"--cert-dir=" + filepath.Join(dir, "certs"), "--client-ca-file=" + clientCA,
		// As kubeadm runs it: a node may act on its own Node and its own pods only.
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKeyFile, "--service-cluster-ip-range=10.96.0.0/12",
		"--endpoint-reconciler-type=lease",
		// No controller manager runs to make the default ServiceAccount a pod
		// would need; a mirror pod, as the kubelet makes one, has none.
		"--disable-admission-plugins=ServiceAccount"}
	cmd := exec.Command(bin, args...)
	logf, err := os.Create(filepath.Join(dir, "apiserver.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		logf.Close()
	})
	// The serving certificate the apiserver made itself is the CA to trust.
	servingCA := filepath.Join(dir, "certs", "apiserver.crt")
	deadline := time.Now().Add(90 * time.Second)
	for {
		if b, err := os.ReadFile(servingCA); err == nil && len(b) > 0 {
			s.servingCA = b
			s.Admin = s.Kubeconfig(t, "kubernetes-admin", "system:masters")
			if s.ready() == nil {
				return s
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("kube-apiserver not ready in 90s:\n%s", testutil.Tail(string(log), 30))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ready asks /readyz with the admin's credentials, through client-go.
func (s *Server) ready() error {
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(s.Admin))
	if err != nil {
		return err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	hc.Timeout = 5 * time.Second
	resp, err := hc.Get("https://" + s.Addr + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil
}

// Kubeconfig is a kubeconfig for a client certificate the apiserver's
// client CA signs, with this common name (the user) and organizations
// (the groups).
func (s *Server) Kubeconfig(t testing.TB, cn string, orgs ...string) string {
	t.Helper()
	key := newKey(t)
	s.serial++
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(s.serial),
		Subject:   pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, s.ca, &key.PublicKey, s.caKey)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString
	return "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: 'https://" + s.Addr + "', certificate-authority-data: " + b64(s.servingCA) + "}\n  name: c\n" +
		"contexts:\n- context: {cluster: c, user: u}\n  name: c\ncurrent-context: c\nusers:\n- name: u\n  user: {client-certificate-data: " +
		b64(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})) + ", client-key-data: " + b64(pem.EncodeToMemory(keyBlock(t, key))) + "}\n"
}

// Do is a test's own hand on the cluster, with the admin's credentials
// (making the objects a scenario needs, playing the controllers and the
// kubelet that do not run): a request through client-go's REST client to
// an API path, body marshalled to JSON (a patch: contentType says which).
// It returns the answer's body, and fails the test on an error.
func (s *Server) Do(t testing.TB, verb, path, contentType string, body any) []byte {
	t.Helper()
	b, err := s.Try(verb, path, contentType, body)
	if err != nil {
		t.Fatalf("%s %s: %v", verb, path, err)
	}
	return b
}

// Try is Do returning the error.
func (s *Server) Try(verb, path, contentType string, body any) ([]byte, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(s.Admin))
	if err != nil {
		return nil, err
	}
	cfg.APIPath, cfg.GroupVersion = "/api", &schema.GroupVersion{Version: "v1"}
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := url.Parse(path)
	if err != nil {
		return nil, err
	}
	r := rc.Verb(verb).AbsPath(u.Path)
	for k, vs := range u.Query() {
		for _, v := range vs {
			r = r.Param(k, v)
		}
	}
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		if contentType == "" {
			contentType = "application/json"
		}
		r = r.SetHeader("Content-Type", contentType).Body(b)
	}
	return r.DoRaw(ctx)
}

// TokenKubeconfig is a kubeconfig with a bearer token (a ServiceAccount's).
func (s *Server) TokenKubeconfig(token string) string {
	return "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: 'https://" + s.Addr + "', certificate-authority-data: " +
		base64.StdEncoding.EncodeToString(s.servingCA) + "}\n  name: c\ncontexts:\n- context: {cluster: c, user: u}\n  name: c\n" +
		"current-context: c\nusers:\n- name: u\n  user: {token: '" + token + "'}\n"
}

// ServiceAccountToken is a token of a ServiceAccount (the TokenRequest
// API, valid an hour).
func (s *Server) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	tr := s.JSON(t, "POST", "/api/v1/namespaces/"+namespace+"/serviceaccounts/"+name+"/token", "",
		map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{"expirationSeconds": 3600}})
	token, _ := tr["status"].(map[string]any)["token"].(string)
	if token == "" {
		t.Fatalf("no token for %s/%s: %v", namespace, name, tr)
	}
	return token
}

// NodeKubeconfig is a node's own kubeconfig, as its kubelet.conf: the
// user system:node:NAME in the group system:nodes.
func (s *Server) NodeKubeconfig(t testing.TB, name string) string {
	return s.Kubeconfig(t, "system:node:"+name, "system:nodes")
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keyBlock(t testing.TB, k *ecdsa.PrivateKey) *pem.Block {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return &pem.Block{Type: "EC PRIVATE KEY", Bytes: der}
}
