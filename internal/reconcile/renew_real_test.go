package reconcile

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/certs"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/staticpods"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// TestRealKubeadmRenewal runs the pass on a control plane whose PKI,
// kubeconfigs and manifests the real kubeadm 1.37.2 made with a 48h
// certificateValidityPeriod: with certificates.renewBefore 24h nothing
// runs and nothing changes; with 72h the pass runs the real `kubeadm certs
// renew all --config ...`, every leaf certificate (PEM and kubeconfig)
// expires 48h from the renewal (the cluster's validity, not kubeadm's
// one-year default), the authorities, the service-account keys,
// kubelet.conf and the manifests are byte-identical. The kubelet is
// faked at its one seam (which ports listen); the restart of the static
// pods is the real code.
//
// kubeadm renews the kubeconfigs in /etc/kubernetes whatever its
// configuration says: the test re-runs itself in a private mount
// namespace where the sandbox's /etc/kubernetes is bind-mounted there
// (over an overlay of /etc: the host's is not touched).
func TestRealKubeadmRenewal(t *testing.T) {
	const env = "PROVIDER_KUBERNETES_TEST_RENEW_KUBEADM"
	kubeadm := os.Getenv(env)
	if kubeadm == "" {
		kubeadm = testbin.Kubeadm(t, "v1.37.2")
		t.Setenv(env, kubeadm)
	}
	if !testutil.InPrivateMountNamespace(t) {
		return
	}
	n := testutil.NewNode(t, "n1")
	etcK8s := n.Path(paths.KubernetesDir)
	if err := os.MkdirAll(etcK8s, 0o755); err != nil {
		t.Fatal(err)
	}
	scratch := t.TempDir()
	if err := unix.Mount("tmpfs", scratch, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatalf("tmpfs: %v", err)
	}
	// Undone before the temporary directories go (cleanups run last first).
	t.Cleanup(func() { _ = unix.Unmount(scratch, unix.MNT_DETACH) })
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(scratch, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("overlay", "/etc", "overlay", 0, "lowerdir=/etc,upperdir="+scratch+"/upper,workdir="+scratch+"/work"); err != nil {
		t.Fatalf("overlay on /etc: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount("/etc", unix.MNT_DETACH) })
	if err := os.MkdirAll(paths.KubernetesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(etcK8s, paths.KubernetesDir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s: %v", paths.KubernetesDir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(paths.KubernetesDir, unix.MNT_DETACH) })

	// The control plane, as kubeadm init makes it.
	testutil.KubeadmInitPhases(t, kubeadm, fmt.Sprintf("certificatesDir: %s\ncertificateValidityPeriod: 48h0m0s\netcd:\n  local:\n    dataDir: %s\n",
		paths.PKIDir, n.Path(paths.EtcdDir)), "", "certs all", "kubeconfig all", "control-plane all", "etcd local")
	n.Bundle("v1.37.2")
	n.Write(paths.VerifiedRecord, "v1.37.2\n", 0o644)
	n.Write(paths.Kubeadm, "", 0o755)
	if err := os.Remove(n.Path(paths.Kubeadm)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(kubeadm, n.Path(paths.Kubeadm)); err != nil {
		t.Fatal(err)
	}
	created := readLeaves(t, n.R())

	pass := func(renewBefore string) (Result, []string, time.Time, time.Time) {
		t.Helper()
		n.Write(paths.ClusterFile, testutil.ClusterSection("init", "v1.37.2", "    certificateValidityPeriod: 48h0m0s\n")+
			"providerConfig:\n  certificates.renewBefore: "+renewBefore+"\n", 0o600)
		clk := testutil.NewClock()
		clk.Advance(time.Since(clk.Now()))
		rec := &runner.Recorder{Reply: runner.Exec{Root: n.Root}.Run}
		start := time.Now()
		logBuf := &testutil.SyncBuffer{}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("pass with renewBefore %s:\n%s", renewBefore, logBuf.String())
			}
		})
		res := Run(context.Background(), Options{Root: n.R(), Runner: rec, Clock: clk, Log: slog.New(slog.NewTextHandler(logBuf, nil)),
			EtcdHealthy: func(context.Context) error { return nil },
			Listening:   manifestsListen(n),
			LocalAPIReady: func(context.Context) error {
				return nil
			}})
		return res, rec.Lines(), start, time.Now()
	}

	// Not within renewBefore: nothing runs, nothing changes.
	time.Sleep(1100 * time.Millisecond) // x509 times are whole seconds
	before := tree(t, etcK8s)
	res, lines, _, _ := pass("24h")
	if res.ExitCode != ExitOK || res.Plan.Verdict != "none" || len(lines) != 0 {
		t.Fatalf("renewBefore 24h: exit %d, plan %+v, ran %q", res.ExitCode, res.Plan, lines)
	}
	if d := diff(before, tree(t, etcK8s)); len(d) != 0 {
		t.Fatalf("renewBefore 24h changed %v", d)
	}

	// Within it: renewed, and nothing else changed.
	res, lines, start, end := pass("72h")
	want := []string{"/usr/bin/kubeadm certs renew all --config " + n.Path(certs.RenewConfigPath)}
	if res.ExitCode != ExitOK || !slices.Equal(lines, want) {
		t.Fatalf("renewBefore 72h: exit %d (%v), ran %q, want %q", res.ExitCode, res.Err, lines, want)
	}
	renewed := readLeaves(t, n.R())
	for name, old := range created {
		na := renewed[name]
		lo, hi := start.Add(48*time.Hour).Truncate(time.Second), end.Add(48*time.Hour)
		if !na.After(old) || na.Before(lo) || na.After(hi) {
			t.Errorf("%s: expired %s, now %s; want moved forward to 48h after the renewal (%s..%s)", name, old, na, lo, hi)
		}
	}
	if len(created) != 11 || len(renewed) != 11 {
		t.Fatalf("leaves %d before, %d after, want 11: %v", len(created), len(renewed), renewed)
	}
	changed := diff(before, tree(t, etcK8s))
	var leafFiles []string
	for _, f := range []string{"apiserver", "apiserver-etcd-client", "apiserver-kubelet-client", "front-proxy-client", "etcd/server", "etcd/peer", "etcd/healthcheck-client"} {
		leafFiles = append(leafFiles, "pki/"+f+".crt", "pki/"+f+".key")
	}
	leafFiles = append(leafFiles, "admin.conf", "super-admin.conf", "controller-manager.conf", "scheduler.conf")
	sort.Strings(leafFiles)
	if !slices.Equal(changed, leafFiles) {
		t.Fatalf("changed under /etc/kubernetes:\n%q\nwant only the leaves:\n%q", changed, leafFiles)
	}
	if n.Exists(staticpods.ParkDir) || n.Exists(certs.RenewConfigPath) {
		t.Fatal("the park directory or the renewal config stayed")
	}
}

// readLeaves is the expiry of every leaf certificate kubeadm manages.
func readLeaves(t *testing.T, root paths.Root) map[string]time.Time {
	t.Helper()
	cs, errs := certs.Read(root)
	if len(errs) > 0 {
		t.Fatalf("read: %v", errs)
	}
	out := map[string]time.Time{}
	for _, c := range cs {
		if !c.CA {
			out[c.Name] = c.NotAfter
		}
	}
	return out
}

// manifestsListen plays the kubelet: the ports of the components whose
// manifest is in place listen.
func manifestsListen(n *testutil.Node) func() (map[int]bool, error) {
	return func() (map[int]bool, error) {
		out := map[int]bool{}
		for _, c := range staticpods.Components {
			if b, err := os.ReadFile(n.Path(paths.ManifestsDir + "/" + c + ".yaml")); err == nil {
				for _, p := range staticpods.Ports(c, b) {
					out[p] = true
				}
			}
		}
		return out, nil
	}
}

// tree is every file and directory under dir with its content.
func tree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			out[rel+"/"] = nil
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// diff names what was added, removed or changed between two trees.
func diff(a, b map[string][]byte) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
