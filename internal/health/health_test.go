package health

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

func TestReadyzTrustsOnlyTheGivenCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	host := strings.TrimPrefix(srv.URL, "https://")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := (Prober{}).Readyz(ctx, host, "example.com", ca); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pki(t, dir)
	otherCA, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := (Prober{}).Readyz(ctx, host, "example.com", otherCA); err == nil {
		t.Fatal("trusted an apiserver signed by another CA")
	}
	// The certificate must carry the name asked for (kubeadm's has
	// "kubernetes", never a loopback address).
	if err := (Prober{}).Readyz(ctx, host, APIServerName, ca); err == nil || !strings.Contains(err.Error(), "kubernetes") {
		t.Fatalf("a certificate without the name passed: %v", err)
	}
	if err := (Prober{}).Readyz(ctx, host, "example.com", []byte("junk")); err == nil {
		t.Fatal("no CA accepted")
	}
}

func TestKubeletProbeNamesTheStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "[-]syncloop failed", http.StatusInternalServerError)
	}))
	defer srv.Close()
	err := (Prober{}).Kubelet(context.Background(), srv.URL+"/healthz")
	if err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "syncloop") {
		t.Fatalf("%v", err)
	}
	srv.Close()
	if err := (Prober{}).Kubelet(context.Background(), srv.URL+"/healthz"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("%v", err)
	}
}

// pki writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, as kubeadm's etcd PKI has them.
func pki(t *testing.T, dir string) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name string, typ string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	caKey := key()
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write("ca.crt", "CERTIFICATE", caDER)
	for i, name := range []string{"server", "healthcheck-client"} {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(k)
		write(name+".crt", "CERTIFICATE", der)
		write(name+".key", "EC PRIVATE KEY", kb)
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// A real embedded etcd with TLS and client certificate auth.
func startEtcd(t *testing.T, dir string) string {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "data")
	cfg.Logger, cfg.LogLevel = "zap", "panic"
	client := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	cu, _ := url.Parse(client)
	pu, _ := url.Parse(peer)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + peer
	cfg.ClientTLSInfo.CertFile = filepath.Join(dir, "server.crt")
	cfg.ClientTLSInfo.KeyFile = filepath.Join(dir, "server.key")
	cfg.ClientTLSInfo.TrustedCAFile = filepath.Join(dir, "ca.crt")
	cfg.ClientTLSInfo.ClientCertAuth = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd did not start")
	}
	return client
}

func TestEtcdMembersAgainstARealEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	dir := t.TempDir()
	pki(t, dir)
	ep := startEtcd(t, dir)
	tlsCfg, err := EtcdTLS(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "healthcheck-client.crt"), filepath.Join(dir, "healthcheck-client.key"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := EtcdMembers(ctx, ep, tlsCfg); err != nil {
		t.Fatalf("healthy single member: %v", err)
	}
	// A client certificate from another CA is refused by etcd.
	other := t.TempDir()
	pki(t, other)
	bad, err := EtcdTLS(filepath.Join(dir, "ca.crt"), filepath.Join(other, "healthcheck-client.crt"), filepath.Join(other, "healthcheck-client.key"))
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	if err := EtcdMembers(actx, ep, bad); err == nil {
		t.Fatal("a foreign client certificate passed")
	}
	acancel()
	// A member added but never started: the cluster is not healthy.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, TLS: tlsCfg, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.MemberAddAsLearner(ctx, []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}); err != nil {
		t.Fatal(err)
	}
	actx, acancel = context.WithTimeout(ctx, 3*time.Second)
	defer acancel()
	if err := EtcdMembers(actx, ep, tlsCfg); err == nil || !strings.Contains(err.Error(), "not started") {
		t.Fatalf("unstarted member: %v", err)
	}
}

func TestEtcdTLSRefusesASymlinkedKey(t *testing.T) {
	dir := t.TempDir()
	pki(t, dir)
	if err := os.Rename(filepath.Join(dir, "healthcheck-client.key"), filepath.Join(dir, "real.key")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "real.key"), filepath.Join(dir, "healthcheck-client.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := EtcdTLS(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "healthcheck-client.crt"), filepath.Join(dir, "healthcheck-client.key")); err == nil {
		t.Fatal("followed a symlinked key")
	}
}
