package restore_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kairos-io/provider-kubernetes/internal/cli"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/restore"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
)

// The etcd a 1.36 control plane runs (kubeadm 1.36.3 deploys 3.6.8-0), and
// the tools its image bundles.
const (
	etcdVersion = "v3.6.8"
	etcdImage   = "registry.k8s.io/etcd:3.6.8-0"
	k8sVersion  = "v1.36.3"
	// Stopped is where the tests move the static pod manifests to.
	stopped = "/etc/kubernetes/manifests.stopped"
	// snapshotFile is where the operator's snapshot sits on every node (tmpfs).
	snapshotFile = "/run/etcd-backup/etcd.db"
)

// member is one control plane node: its sandbox root with kubeadm's
// manifests, and a real etcd process on loopback ports.
type member struct {
	t                      *testing.T
	n                      *testutil.Node
	pki                    *testutil.Node // whose etcd PKI every member uses (one CA)
	client, peer, metrics  int
	cmd                    *exec.Cmd
	log                    string
	etcd                   string
	initialCluster, joined string
}

func (m *member) name() string       { return m.n.Name }
func (m *member) peerURL() string    { return fmt.Sprintf("https://127.0.0.1:%d", m.peer) }
func (m *member) clientURL() string  { return fmt.Sprintf("https://127.0.0.1:%d", m.client) }
func (m *member) entry() string      { return m.name() + "=" + m.peerURL() }
func (m *member) dataDir() string    { return m.n.Path(paths.EtcdDir) }
func (m *member) memberDir() string  { return m.n.Path(paths.EtcdDir + "/member") }
func (m *member) manifestsOut() bool { return !m.n.Exists(paths.EtcdManifest) }

// newMembers lays out n control planes with kubeadm's manifests (the first
// lists only itself, each joined one the members before it and itself),
// a 1.36 kube-apiserver manifest and the bundled etcdutl at etcdutl.
func newMembers(t *testing.T, count int, etcdutl string) []*member {
	t.Helper()
	var ms []*member
	var pki *testutil.Node
	for i := 1; i <= count; i++ {
		n := testutil.NewNode(t, fmt.Sprintf("cp%d", i))
		if pki == nil {
			etcdtest.NewPKI(t, n)
			pki = n
		}
		m := &member{t: t, n: n, pki: pki, client: etcdtest.FreePort(t), peer: etcdtest.FreePort(t), metrics: etcdtest.FreePort(t),
			etcd: testbin.Etcd(t, etcdVersion)}
		ms = append(ms, m)
	}
	for i, m := range ms {
		var known []string
		for _, o := range ms[:i+1] {
			known = append(known, o.entry())
		}
		m.n.Write(paths.EtcdManifest, restore.KubeadmManifest(m.name(), etcdImage, "127.0.0.1", m.client, m.peer, m.metrics, strings.Join(known, ","), i > 0), 0o600)
		m.n.Write(paths.APIServerManifest, testutil.APIServerManifest(k8sVersion), 0o600)
		bundle(t, m.n, etcdutl)
	}
	return ms
}

// bundle puts the real etcdutl at the node's /usr/bin, as the image does.
func bundle(t *testing.T, n *testutil.Node, etcdutl string) {
	t.Helper()
	_ = os.Remove(n.Path(paths.Etcdutl))
	if err := os.MkdirAll(n.Path("/usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(testbin.Etcdutl(t, etcdutl), n.Path(paths.Etcdutl)); err != nil {
		t.Fatal(err)
	}
}

func initialCluster(ms []*member) string {
	var e []string
	for _, m := range ms {
		e = append(e, m.entry())
	}
	return strings.Join(e, ",")
}

// start runs the member's etcd with its manifest's flags (paths re-based)
// and the given --initial-cluster (ignored by etcd once the data dir holds
// a member, as after a restore). Killed at the end of the test.
func (m *member) start(initialCluster string) {
	t := m.t
	t.Helper()
	p := m.pki.Path
	args := []string{"--name=" + m.name(), "--data-dir=" + m.dataDir(),
		"--listen-client-urls=" + m.clientURL(), "--advertise-client-urls=" + m.clientURL(),
		"--listen-peer-urls=" + m.peerURL(), "--initial-advertise-peer-urls=" + m.peerURL(),
		"--initial-cluster=" + initialCluster, "--initial-cluster-state=new",
		fmt.Sprintf("--listen-metrics-urls=http://127.0.0.1:%d", m.metrics),
		"--cert-file=" + p(etcdtest.ServerCert), "--key-file=" + p(etcdtest.ServerKey), "--trusted-ca-file=" + p(etcdtest.CACert), "--client-cert-auth=true",
		"--peer-cert-file=" + p(etcdtest.PeerCert), "--peer-key-file=" + p(etcdtest.PeerKey), "--peer-trusted-ca-file=" + p(etcdtest.CACert), "--peer-client-cert-auth=true",
		"--snapshot-count=10000", "--log-level=warn"}
	m.cmd = testutil.Command(t, 10*time.Minute, m.etcd, args...)
	m.log = filepath.Join(t.TempDir(), "etcd.log")
	f, err := os.Create(m.log)
	if err != nil {
		t.Fatal(err)
	}
	m.cmd.Stdout, m.cmd.Stderr = f, f
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	cmd := m.cmd
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
}

// stop ends the member as the kubelet does (SIGTERM), bounded.
func (m *member) stop() {
	m.t.Helper()
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- m.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = m.cmd.Process.Kill()
		<-done
	}
	m.cmd = nil
}

func (m *member) tls() *tls.Config {
	m.t.Helper()
	kp, err := tls.LoadX509KeyPair(m.pki.Path(etcdtest.HCCert), m.pki.Path(etcdtest.HCKey))
	if err != nil {
		m.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(m.pki.Path(etcdtest.CACert))
	if err != nil {
		m.t.Fatal(err)
	}
	pool.AppendCertsFromPEM(ca)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS12}
}

func (m *member) clientv3() *clientv3.Client {
	m.t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{m.clientURL()}, TLS: m.tls(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		m.t.Fatal(err)
	}
	return c
}

// ready waits (bounded) until the member serves a linearizable read.
func (m *member) ready() {
	m.t.Helper()
	c := m.clientv3()
	defer c.Close()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := c.Get(ctx, "/ready")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(m.log)
			m.t.Fatalf("%s not ready in 90s: %v\n%s", m.name(), err, tail(string(b), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func (m *member) put(k, v string) {
	m.t.Helper()
	c := m.clientv3()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, k, v); err != nil {
		m.t.Fatalf("put %s: %v", k, err)
	}
}

// saveSnapshot takes the operator's own backup exactly as upgrades.md's
// "Your own backup" does, with the real etcdctl, to the node's tmpfs.
func (m *member) saveSnapshot() {
	t := m.t
	t.Helper()
	if err := os.MkdirAll(m.n.Path("/run/etcd-backup"), 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := testutil.Command(t, 2*time.Minute, testbin.Etcdctl(t, etcdVersion), "--endpoints="+m.clientURL(),
		"--cacert="+m.pki.Path(etcdtest.CACert), "--cert="+m.pki.Path(etcdtest.HCCert), "--key="+m.pki.Path(etcdtest.HCKey),
		"--dial-timeout=10s", "--command-timeout=5m", "snapshot", "save", m.n.Path(snapshotFile))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("etcdctl snapshot save: %v\n%s", err, out)
	}
}

// copySnapshot copies the snapshot to another member's node, 0600, as the
// operator does.
func copySnapshot(t *testing.T, from, to *testutil.Node) {
	t.Helper()
	b, err := os.ReadFile(from.Path(snapshotFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(to.Path("/run/etcd-backup"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to.Path(snapshotFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// moveManifestsOut stops the static control plane as the outline says:
// the manifests leave the kubelet's directory.
func (m *member) moveManifestsOut() {
	m.t.Helper()
	if err := os.MkdirAll(m.n.Path(stopped), 0o700); err != nil {
		m.t.Fatal(err)
	}
	for _, f := range []string{"etcd.yaml", "kube-apiserver.yaml"} {
		if err := os.Rename(m.n.Path(paths.ManifestsDir+"/"+f), m.n.Path(stopped+"/"+f)); err != nil {
			m.t.Fatal(err)
		}
	}
}

// restoreEtcd runs the command as an operator would on this node.
func (m *member) restoreEtcd(extra ...string) (int, string, string) {
	args := append([]string{"restore-etcd", "--root", m.n.Root, "--snapshot", snapshotFile, "--manifests", stopped}, extra...)
	var out, errb bytes.Buffer
	code := cli.Main(context.Background(), args, nil, &out, &errb)
	return code, out.String(), errb.String()
}

// names lists a directory's entries.
func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
