package joinconfig

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/bootstrap"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

const clusterToken = "Zq8-r4Nd0m-cluster-T0ken-9f3a"

type env struct {
	node   *testutil.Node
	api    *testutil.API
	rec    *runner.Recorder
	caPEM  []byte
	caHash string
	now    time.Time
}

// newEnv is a control plane: its cluster file, admin.conf pointing at the
// loopback API, the cluster CA and the other control-plane certificates.
func newEnv(t *testing.T) *env {
	e := &env{node: testutil.NewNode(t, "cp1"), api: testutil.NewAPI(t, "v1.37.2"), now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	e.node.Write(paths.ClusterFile, "cluster_token: "+clusterToken+"\ncontrol_plane_host: 10.0.0.11\nrole: init\nconfig: |\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n", 0o600)
	e.caPEM = selfSigned(t, "kubernetes")
	hs, err := clusterconfig.CertHashes(string(e.caPEM))
	if err != nil {
		t.Fatal(err)
	}
	e.caHash = hs[0]
	pki := paths.PKIDir
	e.node.Write(pki+"/ca.crt", string(e.caPEM), 0o644)
	for _, f := range []string{"ca.key", "front-proxy-ca.crt", "front-proxy-ca.key", "sa.pub", "sa.key", "etcd/ca.crt", "etcd/ca.key"} {
		e.node.Write(pki+"/"+f, "material of "+f+"\n", 0o600)
	}
	cert, key := testutil.ClientCert(t, "kubernetes-admin")
	e.node.Write(paths.AdminConf, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: %s
    server: %s
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: kubernetes-admin
  name: kubernetes-admin@kubernetes
current-context: kubernetes-admin@kubernetes
users:
- name: kubernetes-admin
  user:
    client-certificate-data: %s
    client-key-data: %s
`, base64.StdEncoding.EncodeToString(e.api.CAPEM()), e.api.URL(), base64.StdEncoding.EncodeToString(cert), base64.StdEncoding.EncodeToString(key)), 0o600)
	// The cluster's own ClusterConfiguration; its certificatesDir is the
	// sandbox's, so a real kubeadm reads the sandbox's certificates.
	e.api.SetClusterConfiguration(fmt.Sprintf("apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: v1.37.2\n"+
		"controlPlaneEndpoint: cp.example.com:6443\ncertificatesDir: %s\nclusterName: kubernetes\n", e.node.Path(pki)))
	e.rec = &runner.Recorder{}
	return e
}

func (e *env) opts(role string) Options {
	return Options{Root: e.node.R(), Runner: e.rec, Role: role, TTL: 2 * time.Hour, Now: func() time.Time { return e.now }}
}

// parseSection reads the printed cloud-config back the way the plugin does.
func parseSection(t *testing.T, out []byte) (*clusterconfig.Cluster, map[string]any) {
	t.Helper()
	if !strings.HasPrefix(string(out), "#cloud-config\n") {
		t.Fatalf("not a cloud-config:\n%s", out)
	}
	var doc struct {
		Cluster map[string]any `json:"cluster"`
	}
	if err := yaml.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	b, _ := yaml.Marshal(doc.Cluster)
	c, err := clusterconfig.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.Validate()
	if err != nil {
		t.Fatal(err)
	}
	return c, k.JoinConfiguration
}

func TestMintWorker(t *testing.T) {
	e := newEnv(t)
	m, err := Mint(context.Background(), e.opts("worker"))
	if err != nil {
		t.Fatal(err)
	}
	c, join := parseSection(t, m.Section)
	if c.Role != "worker" || c.ControlPlaneHost != "cp.example.com:6443" || c.ClusterToken != clusterToken {
		t.Fatalf("%+v", c)
	}
	bt := join["discovery"].(map[string]any)["bootstrapToken"].(map[string]any)
	token := bt["token"].(string)
	if !clusterconfig.ValidBootstrapToken(token) || token == bootstrap.DeriveToken(clusterToken) || token[:6] != m.TokenID {
		t.Fatalf("token %q id %q", token, m.TokenID)
	}
	if fmt.Sprint(bt["caCertHashes"]) != "["+e.caHash+"]" || bt["apiServerEndpoint"] != "cp.example.com:6443" || join["controlPlane"] != nil {
		t.Fatalf("join %v", join)
	}
	// The token exists in the cluster, as kubeadm would have created it.
	var s struct {
		Type       string            `json:"type"`
		StringData map[string]string `json:"stringData"`
		Data       map[string]string `json:"data"`
	}
	if !e.api.Object("/api/v1/namespaces/kube-system/secrets/bootstrap-token-"+m.TokenID, &s) {
		t.Fatalf("no token secret: %v", e.api.ObjectPaths())
	}
	want := map[string]string{"token-id": token[:6], "token-secret": token[7:], "expiration": "2026-11-29T14:00:00Z",
		"usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true", "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token"}
	for k, v := range want {
		if s.StringData[k] != v {
			t.Errorf("secret %s = %q, want %q", k, s.StringData[k], v)
		}
	}
	if s.Type != "bootstrap.kubernetes.io/token" {
		t.Errorf("type %q", s.Type)
	}
	if len(e.rec.Lines()) != 0 {
		t.Fatalf("a worker's material needs no kubeadm: ran %q", e.rec.Lines())
	}
	if !strings.Contains(string(m.Section), "expires at 2026-11-29T14:00:00Z") {
		t.Fatalf("%s", m.Section)
	}
	// The next node's join step accepts it.
	if _, err := bootstrap.RenderJoin(c); err != nil {
		t.Fatal(err)
	}
}

func TestMintRefusesUnboundedTTLAndUnknownRole(t *testing.T) {
	e := newEnv(t)
	for _, o := range []Options{
		func() Options { o := e.opts("worker"); o.TTL = 0; return o }(),
		func() Options { o := e.opts("worker"); o.TTL = 30 * 24 * time.Hour; return o }(),
		e.opts("init"),
	} {
		if _, err := Mint(context.Background(), o); err == nil {
			t.Fatalf("%+v accepted", o)
		}
	}
	if len(e.api.ObjectPaths()) != 0 {
		t.Fatal("a refused minting created a token")
	}
}

func TestMintNeedsAControlPlane(t *testing.T) {
	e := newEnv(t)
	if err := os.Remove(e.node.Path(paths.AdminConf)); err != nil {
		t.Fatal(err)
	}
	e.node.Write(paths.KubeletConf, "apiVersion: v1\nkind: Config\n", 0o600)
	_, err := Mint(context.Background(), e.opts("worker"))
	if err == nil || !strings.Contains(err.Error(), "runs on a control plane") {
		t.Fatalf("%v", err)
	}
	// Only admin.conf is missing (and only it is read): the message names
	// it, and not kubelet.conf, which this node may well have.
	msg := err.Error()
	if !strings.Contains(msg, "no readable kubeconfig (tried "+paths.AdminConf+"): read "+paths.AdminConf+": ") || strings.Contains(msg, "kubelet.conf") {
		t.Fatalf("%q", msg)
	}
	t.Log(msg)
}

// A control plane's material: the certificate key reaches kubeadm only in a
// 0600 file, never on its command line, and the file is gone afterwards.
func TestMintControlPlaneKeepsTheKeyOffTheCommandLine(t *testing.T) {
	e := newEnv(t)
	var seen string
	var mode os.FileMode
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		f := c.Args[5]
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := os.Stat(f)
		seen, mode = string(b), st.Mode()
		return runner.Result{}, nil
	}
	m, err := Mint(context.Background(), e.opts("controlplane"))
	if err != nil {
		t.Fatal(err)
	}
	_, join := parseSection(t, m.Section)
	key := join["controlPlane"].(map[string]any)["certificateKey"].(string)
	if !clusterconfig.ValidCertificateKey(key) {
		t.Fatalf("key %q", key)
	}
	cfgPath := e.node.Path(UploadCertsConfigPath)
	want := "/usr/bin/kubeadm init phase upload-certs --upload-certs --config " + cfgPath + " --kubeconfig " + e.node.Path(paths.AdminConf) + " --skip-certificate-key-print"
	if got := e.rec.Lines(); len(got) != 1 || got[0] != want {
		t.Fatalf("ran %q\nwant %q", got, want)
	}
	if strings.Contains(e.rec.Lines()[0], key) || !strings.Contains(seen, "certificateKey: "+key) || mode.Perm() != 0o600 {
		t.Fatalf("key handling: mode %v", mode)
	}
	if e.node.Exists(UploadCertsConfigPath) {
		t.Fatal("config left behind")
	}
	if !strings.Contains(string(m.Section), "deleted by kubeadm after 2h0m0s") {
		t.Fatalf("%s", m.Section)
	}
}

// The real kubeadm 1.37.2 uploads the control-plane certificates to the
// loopback API from the config file the provider wrote; the Secret it
// stores decrypts with the key printed for the next node, so the printed
// material really admits a control plane.
func TestRealKubeadmUploadsCertsUnderThePrintedKey(t *testing.T) {
	kubeadm := testbin.Kubeadm(t, "v1.37.2")
	e := newEnv(t)
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		cfg, err := os.ReadFile(c.Args[5])
		if err != nil {
			t.Fatal(err)
		}
		// The file is a configuration kubeadm accepts on its own...
		if out, err := exec.CommandContext(ctx, kubeadm, "config", "validate", "--config", c.Args[5]).CombinedOutput(); err != nil {
			t.Fatalf("kubeadm config validate: %v\n%s", err, out)
		}
		// ...and the one the command runs with.
		cmd := exec.CommandContext(ctx, kubeadm, c.Args...)
		cmd.Env = runner.BaseEnv
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("real kubeadm: %v\n%s", err, out)
		}
		var doc struct {
			CertificateKey string `json:"certificateKey"`
		}
		if err := yaml.Unmarshal([]byte(strings.Split(string(cfg), "\n---\n")[0]), &doc); err != nil || len(doc.CertificateKey) != 64 {
			t.Fatalf("config: %v", err)
		}
		if strings.Contains(string(out), doc.CertificateKey) {
			t.Fatalf("kubeadm printed the certificate key:\n%s", out)
		}
		return runner.Result{Stdout: out}, nil
	}
	m, err := Mint(context.Background(), e.opts("controlplane"))
	if err != nil {
		t.Fatal(err)
	}
	_, join := parseSection(t, m.Section)
	key, _ := hex.DecodeString(join["controlPlane"].(map[string]any)["certificateKey"].(string))
	var s struct {
		Data map[string][]byte `json:"data"`
	}
	if !e.api.Object("/api/v1/namespaces/kube-system/secrets/kubeadm-certs", &s) {
		t.Fatalf("kubeadm stored no kubeadm-certs: %v", e.api.ObjectPaths())
	}
	for name, want := range map[string]string{"ca.crt": string(e.caPEM), "ca.key": "material of ca.key\n", "etcd-ca.key": "material of etcd/ca.key\n"} {
		got, err := decrypt(s.Data[name], key)
		if err != nil || string(got) != want {
			t.Fatalf("%s: %v %q", name, err, got)
		}
	}
	for _, p := range []string{"/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles/kubeadm:kubeadm-certs",
		"/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings/kubeadm:kubeadm-certs"} {
		var x map[string]any
		if !e.api.Object(p, &x) {
			t.Fatalf("no %s: %v", p, e.api.ObjectPaths())
		}
	}
	// And the JoinConfiguration a control plane renders from it is accepted by kubeadm.
	c, _ := parseSection(t, m.Section)
	r, err := bootstrap.RenderJoin(c)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "join.yaml")
	if err := os.WriteFile(f, r.Config, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := testutil.Command(t, time.Minute, kubeadm, "config", "validate", "--config", f).CombinedOutput(); err != nil {
		t.Fatalf("kubeadm config validate: %v %s", err, out)
	}
}

// decrypt is kubeadm's cryptoutil.DecryptBytes: AES-GCM, nonce first.
func decrypt(data, key []byte) ([]byte, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	n := gcm.NonceSize()
	if len(data) < n {
		return nil, fmt.Errorf("short")
	}
	return gcm.Open(nil, data[:n], data[n:], nil)
}

func selfSigned(t *testing.T, cn string) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// A join-config that fails after the bootstrap token was created (here
// kubeadm's upload-certs) deletes it: no live 24-hour token nobody was given.
func TestFailedMintDeletesItsToken(t *testing.T) {
	e := newEnv(t)
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if n := len(e.api.ObjectPaths()); n != 1 {
			t.Errorf("when kubeadm runs the token should exist: %v", e.api.ObjectPaths())
		}
		return runner.Result{ExitCode: 1}, &runner.ExitError{Cmd: c.Short(), Code: 1, Tail: "error execution phase upload-certs: boom"}
	}
	o := e.opts("controlplane")
	o.TTL = 24 * time.Hour
	_, err := Mint(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "upload the control-plane certificates") {
		t.Fatalf("%v", err)
	}
	if got := e.api.ObjectPaths(); len(got) != 0 {
		t.Fatalf("the failed join-config left %v", got)
	}
}

// join-config follows the pass's rules: a /run/provider-kubernetes another
// user owns (who could swap the upload-certs config under kubeadm) is
// refused before anything is minted or run.
func TestMintRefusesARunDirAnotherUserOwns(t *testing.T) {
	e := newEnv(t)
	if err := os.MkdirAll(e.node.Path(paths.RunDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(e.node.Path(paths.RunDir), 1000, 1000); err != nil {
		t.Skipf("chown needs root: %v", err)
	}
	_, err := Mint(context.Background(), e.opts("controlplane"))
	if !errors.Is(err, fsutil.ErrForeignOwner) {
		t.Fatalf("want a refusal of the foreign run dir, got %v", err)
	}
	if got := e.rec.Lines(); len(got) != 0 {
		t.Fatalf("ran %q", got)
	}
	if got := e.api.ObjectPaths(); len(got) != 0 {
		t.Fatalf("minted %v", got)
	}
	if e.node.Exists(paths.TmpDir) {
		t.Fatal("wrote under the foreign run dir")
	}
}

// join-config takes the pass's lock: while a pass (or a reset, a restore)
// holds it, nothing is minted or run.
func TestMintRefusesWhileTheLockIsHeld(t *testing.T) {
	e := newEnv(t)
	unlock, err := reconcile.Lock(e.node.R())
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	_, err = Mint(context.Background(), e.opts("controlplane"))
	if !errors.Is(err, reconcile.ErrLocked) {
		t.Fatalf("want ErrLocked, got %v", err)
	}
	if got := e.rec.Lines(); len(got) != 0 {
		t.Fatalf("ran %q", got)
	}
	if got := e.api.ObjectPaths(); len(got) != 0 {
		t.Fatalf("minted %v", got)
	}
}

// A --ttl shorter than the certificates' lifetime is the real deadline of
// a control plane's join: the printed comment says so.
func TestMintControlPlaneCommentStatesAShorterTTL(t *testing.T) {
	e := newEnv(t)
	o := e.opts("controlplane")
	o.TTL = 30 * time.Minute
	m, err := Mint(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	deadline := e.now.Add(30 * time.Minute).Format(time.RFC3339)
	if !m.Expires.Equal(e.now.Add(30*time.Minute)) || !strings.Contains(string(m.Section), "join before "+deadline+".") {
		t.Fatalf("want the join deadline %s:\n%s", deadline, m.Section)
	}
	if later := e.now.Add(CertsLifetime).Format(time.RFC3339); strings.Contains(string(m.Section), later) {
		t.Fatalf("states %s, after the token expires:\n%s", later, m.Section)
	}
}
