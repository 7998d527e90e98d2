// Package etcdtest runs real etcd for tests the way kubeadm lays out stacked
// etcd on a node: a PKI generated in the test under
// /etc/kubernetes/pki/etcd (CA, server, peer and the healthcheck-client
// certificate), a data dir under /var/lib/etcd and a static pod manifest at
// /etc/kubernetes/manifests/etcd.yaml naming them. The server is either
// embedded (go.etcd.io/etcd/server/v3/embed) or a real etcd binary.
package etcdtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// kubeadm's file names under /etc/kubernetes/pki.
const (
	PKIDir     = paths.KubernetesDir + "/pki/etcd"
	CACert     = PKIDir + "/ca.crt"
	CAKey      = PKIDir + "/ca.key"
	ServerCert = PKIDir + "/server.crt"
	ServerKey  = PKIDir + "/server.key"
	PeerCert   = PKIDir + "/peer.crt"
	PeerKey    = PKIDir + "/peer.key"
	HCCert     = PKIDir + "/healthcheck-client.crt"
	HCKey      = PKIDir + "/healthcheck-client.key"
	DataDir    = "/var/lib/etcd"
)

// PKI is a CA and the certificates kubeadm issues for stacked etcd.
type PKI struct {
	CA    *x509.Certificate
	CAKey *ecdsa.PrivateKey
}

// NewPKI generates a CA and writes every etcd certificate under node's root
// with kubeadm's names and modes.
func NewPKI(t testing.TB, node *testutil.Node) *PKI {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &PKI{CA: ca, CAKey: key}
	node.Write(CACert, string(pemCert(der)), 0o644)
	node.Write(CAKey, string(pemKey(t, key)), 0o600)
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	p.issue(t, node, ServerCert, ServerKey, node.Name, both)
	p.issue(t, node, PeerCert, PeerKey, node.Name, both)
	p.issue(t, node, HCCert, HCKey, "kube-etcd-healthcheck-client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	return p
}

func (p *PKI) issue(t testing.TB, node *testutil.Node, certPath, keyPath, cn string, usage []x509.ExtKeyUsage) {
	t.Helper()
	key := newKey(t)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: usage,
		DNSNames: []string{"localhost", node.Name}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CA, &key.PublicKey, p.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	node.Write(certPath, string(pemCert(der)), 0o644)
	node.Write(keyPath, string(pemKey(t, key)), 0o600)
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func pemKey(t testing.TB, k *ecdsa.PrivateKey) []byte {
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b})
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Manifest is etcd.yaml as kubeadm 1.36/1.37 writes it (getEtcdCommand), for
// a member listening on clientPort and peerPort on loopback.
func Manifest(name, image string, clientPort, peerPort int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  annotations:
    kubeadm.kubernetes.io/etcd.advertise-client-urls: https://127.0.0.1:%[3]d
  labels:
    component: etcd
    tier: control-plane
  name: etcd
  namespace: kube-system
spec:
  containers:
  - command:
    - etcd
    - --advertise-client-urls=https://127.0.0.1:%[3]d
    - --cert-file=/etc/kubernetes/pki/etcd/server.crt
    - --client-cert-auth=true
    - --data-dir=/var/lib/etcd
    - --feature-gates=InitialCorruptCheck=true
    - --initial-advertise-peer-urls=https://127.0.0.1:%[4]d
    - --initial-cluster=%[1]s=https://127.0.0.1:%[4]d
    - --key-file=/etc/kubernetes/pki/etcd/server.key
    - --listen-client-urls=https://127.0.0.1:%[3]d,https://127.0.0.1:%[3]d
    - --listen-metrics-urls=http://127.0.0.1:2381
    - --listen-peer-urls=https://127.0.0.1:%[4]d
    - --name=%[1]s
    - --peer-cert-file=/etc/kubernetes/pki/etcd/peer.crt
    - --peer-client-cert-auth=true
    - --peer-key-file=/etc/kubernetes/pki/etcd/peer.key
    - --peer-trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt
    - --snapshot-count=10000
    - --trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt
    - --watch-progress-notify-interval=5s
    image: %[2]s
    name: etcd
    volumeMounts:
    - mountPath: /var/lib/etcd
      name: etcd-data
    - mountPath: /etc/kubernetes/pki/etcd
      name: etcd-certs
  hostNetwork: true
  volumes:
  - hostPath:
      path: /etc/kubernetes/pki/etcd
      type: DirectoryOrCreate
    name: etcd-certs
  - hostPath:
      path: /var/lib/etcd
      type: DirectoryOrCreate
    name: etcd-data
`, name, image, clientPort, peerPort)
}

// Etcd is one running member.
type Etcd struct {
	t          testing.TB
	Node       *testutil.Node
	ClientURL  string
	ClientPort int
	PeerPort   int
	DataDir    string
	QuotaBytes int64
	embedded   *embed.Etcd
	proc       *exec.Cmd
}

// Config tunes Start.
type Config struct {
	// QuotaBackendBytes raises the backend quota (the benchmark's big database).
	QuotaBackendBytes int64
	// DataDir overrides the data dir (a restored snapshot).
	DataDir string
	// PeerPort fixes the peer port (a restored member's peer URL).
	PeerPort int
	// Image is the image etcd.yaml names (default PreUpgradeImage).
	Image string
}

// PreUpgradeImage is the etcd kubeadm 1.36 deploys: what etcd.yaml names on
// a control plane before its upgrade apply to 1.37 replaces it (which is
// what the snapshot step reads as "the apply began").
const PreUpgradeImage = "registry.k8s.io/etcd:3.6.8-0"

// Start writes the PKI (when missing) and the manifest, and starts an
// embedded etcd on the node; it stops at the end of the test.
func Start(t testing.TB, node *testutil.Node, cfg Config) *Etcd {
	t.Helper()
	if !node.Exists(CACert) {
		NewPKI(t, node)
	}
	e := &Etcd{t: t, Node: node, ClientPort: FreePort(t), PeerPort: cfg.PeerPort, DataDir: node.Path(DataDir), QuotaBytes: cfg.QuotaBackendBytes}
	if e.PeerPort == 0 {
		e.PeerPort = FreePort(t)
	}
	if cfg.DataDir != "" {
		e.DataDir = cfg.DataDir
	}
	e.ClientURL = fmt.Sprintf("https://127.0.0.1:%d", e.ClientPort)
	image := cfg.Image
	if image == "" {
		image = PreUpgradeImage
	}
	e.SetImage(image)
	e.startEmbedded()
	t.Cleanup(e.Stop)
	return e
}

func (e *Etcd) startEmbedded() {
	t := e.t
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = e.Node.Name
	cfg.Dir = e.DataDir
	cu, _ := url.Parse(e.ClientURL)
	pu, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d", e.PeerPort))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: e.Node.Path(ServerCert), KeyFile: e.Node.Path(ServerKey), TrustedCAFile: e.Node.Path(CACert), ClientCertAuth: true}
	cfg.PeerTLSInfo = transport.TLSInfo{CertFile: e.Node.Path(PeerCert), KeyFile: e.Node.Path(PeerKey), TrustedCAFile: e.Node.Path(CACert), ClientCertAuth: true}
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(e.t.TempDir(), "etcd.log")}
	if e.QuotaBytes > 0 {
		cfg.QuotaBackendBytes = e.QuotaBytes
	}
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	select {
	case <-srv.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		srv.Close()
		t.Fatal("embedded etcd not ready in 60s")
	}
	e.embedded = srv
}

// StartBinary starts the real etcd binary bin (testbin.Etcd) as the node's
// member, with the manifest naming image; extra are more etcd flags.
func StartBinary(t testing.TB, node *testutil.Node, bin, image string, extra ...string) *Etcd {
	t.Helper()
	return StartBinaryOn(t, node, bin, image, FreePort(t), FreePort(t), extra...)
}

// StartBinaryOn is StartBinary on the given client and peer ports (2379
// and 2380 where a command of the docs names them, in a network namespace
// of the test's own).
func StartBinaryOn(t testing.TB, node *testutil.Node, bin, image string, clientPort, peerPort int, extra ...string) *Etcd {
	t.Helper()
	if !node.Exists(CACert) {
		NewPKI(t, node)
	}
	e := &Etcd{t: t, Node: node, ClientPort: clientPort, PeerPort: peerPort, DataDir: node.Path(DataDir)}
	e.ClientURL = fmt.Sprintf("https://127.0.0.1:%d", e.ClientPort)
	e.SetImage(image)
	peer := fmt.Sprintf("https://127.0.0.1:%d", e.PeerPort)
	args := []string{"--name=" + node.Name, "--data-dir=" + e.DataDir,
		"--listen-client-urls=" + e.ClientURL, "--advertise-client-urls=" + e.ClientURL,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer, "--initial-cluster=" + node.Name + "=" + peer,
		"--cert-file=" + node.Path(ServerCert), "--key-file=" + node.Path(ServerKey), "--trusted-ca-file=" + node.Path(CACert), "--client-cert-auth=true",
		"--peer-cert-file=" + node.Path(PeerCert), "--peer-key-file=" + node.Path(PeerKey), "--peer-trusted-ca-file=" + node.Path(CACert), "--peer-client-cert-auth=true",
		"--log-level=error", "--listen-metrics-urls=http://127.0.0.1:" + fmt.Sprint(FreePort(t))}
	cmd := exec.Command(bin, append(args, extra...)...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.proc = cmd
	t.Cleanup(func() {
		e.Stop()
		logf.Close()
	})
	// Ready when a client can write.
	deadline := time.Now().Add(60 * time.Second)
	for {
		c := e.Client()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.Put(ctx, "/ready", "1")
		cancel()
		c.Close()
		if err == nil {
			return e
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("etcd binary not ready in 60s: %v\n%s", err, testutil.Tail(string(log), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// SetImage rewrites etcd.yaml naming image (as kubeadm replaces it), the
// member itself left as it runs.
func (e *Etcd) SetImage(image string) {
	e.Node.Write(paths.EtcdManifest, Manifest(e.Node.Name, image, e.ClientPort, e.PeerPort), 0o600)
}

// Pause freezes a binary member (SIGSTOP): it accepts connections and never answers.
func (e *Etcd) Pause() { e.signal(syscall.SIGSTOP) }

// Resume undoes Pause.
func (e *Etcd) Resume() { e.signal(syscall.SIGCONT) }

// PID is the binary member's process id.
func (e *Etcd) PID() int {
	if e.proc == nil {
		e.t.Fatal("not a binary member")
	}
	return e.proc.Process.Pid
}

func (e *Etcd) signal(s syscall.Signal) {
	if e.proc == nil {
		e.t.Fatal("only a binary member can be paused")
	}
	if err := syscall.Kill(e.proc.Process.Pid, s); err != nil {
		e.t.Fatal(err)
	}
}

// Stop stops the member (idempotent).
func (e *Etcd) Stop() {
	if e.embedded != nil {
		e.embedded.Close()
		e.embedded = nil
	}
	if e.proc != nil {
		_ = syscall.Kill(e.proc.Process.Pid, syscall.SIGCONT)
		_ = e.proc.Process.Kill()
		_ = e.proc.Wait()
		e.proc = nil
	}
}

// Restart stops the embedded member and starts it again on the same data
// dir and ports: the node rebooted.
func (e *Etcd) Restart() {
	e.t.Helper()
	if e.embedded == nil {
		e.t.Fatal("only a running embedded member can restart")
	}
	e.embedded.Close()
	e.embedded = nil
	e.startEmbedded()
}

// TLS is a client configuration with the healthcheck-client certificate.
func (e *Etcd) TLS() *tls.Config {
	e.t.Helper()
	kp, err := tls.LoadX509KeyPair(e.Node.Path(HCCert), e.Node.Path(HCKey))
	if err != nil {
		e.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(e.Node.Path(CACert))
	if err != nil {
		e.t.Fatal(err)
	}
	pool.AppendCertsFromPEM(ca)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS12}
}

// Client is a client for this member; the caller closes it.
func (e *Etcd) Client() *clientv3.Client {
	e.t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.ClientURL}, TLS: e.TLS(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// PutKeys writes n keys prefix/0000..n-1 with values of size bytes, in
// transactions of up to batch operations.
func (e *Etcd) PutKeys(prefix string, n, size int) {
	e.t.Helper()
	c := e.Client()
	defer c.Close()
	val := strings.Repeat("v", size)
	batch := 128
	if size > 0 && (1<<20)/size < batch {
		batch = max(1, (1<<20)/size)
	}
	for i := 0; i < n; i += batch {
		var ops []clientv3.Op
		for j := i; j < n && j < i+batch; j++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%08d", prefix, j), val))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := c.Txn(ctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			e.t.Fatalf("put keys: %v", err)
		}
	}
}

// ClusterID is the member's cluster id.
func (e *Etcd) ClusterID() uint64 {
	e.t.Helper()
	c := e.Client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx, e.ClientURL)
	if err != nil {
		e.t.Fatal(err)
	}
	return st.Header.ClusterId
}

// StartCluster starts n embedded members on node (one PKI, a data dir
// each, one initial cluster): a real quorum for leader changes and a lost
// member. The members stop at the end of the test.
func StartCluster(t testing.TB, node *testutil.Node, n int) []*Etcd {
	t.Helper()
	if !node.Exists(CACert) {
		NewPKI(t, node)
	}
	var members []*Etcd
	var initial []string
	for i := 0; i < n; i++ {
		e := &Etcd{t: t, Node: node, ClientPort: FreePort(t), PeerPort: FreePort(t),
			DataDir: node.Path(fmt.Sprintf("%s-%d", DataDir, i))}
		e.ClientURL = fmt.Sprintf("https://127.0.0.1:%d", e.ClientPort)
		initial = append(initial, fmt.Sprintf("m%d=https://127.0.0.1:%d", i, e.PeerPort))
		members = append(members, e)
	}
	for i, e := range members {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = e.DataDir
		cu, _ := url.Parse(e.ClientURL)
		pu, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d", e.PeerPort))
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: node.Path(ServerCert), KeyFile: node.Path(ServerKey), TrustedCAFile: node.Path(CACert), ClientCertAuth: true}
		cfg.PeerTLSInfo = transport.TLSInfo{CertFile: node.Path(PeerCert), KeyFile: node.Path(PeerKey), TrustedCAFile: node.Path(CACert), ClientCertAuth: true}
		cfg.LogLevel = "error"
		cfg.LogOutputs = []string{filepath.Join(t.TempDir(), "etcd.log")}
		srv, err := embed.StartEtcd(cfg)
		if err != nil {
			t.Fatalf("start embedded etcd member %d: %v", i, err)
		}
		e.embedded = srv
		t.Cleanup(e.Stop)
	}
	for i, e := range members {
		select {
		case <-e.embedded.Server.ReadyNotify():
		case <-time.After(60 * time.Second):
			t.Fatalf("embedded etcd member %d not ready in 60s", i)
		}
	}
	return members
}

// Embedded is the member's embedded server (nil for a binary).
func (e *Etcd) Embedded() *embed.Etcd { return e.embedded }
