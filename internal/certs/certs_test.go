package certs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

func TestApplies(t *testing.T) {
	for _, c := range []struct {
		member, controlPlane, want bool
	}{
		{true, true, true},
		// A worker: its only certificate is the kubelet's, which the
		// kubelet rotates itself.
		{true, false, false},
		// Not a member: nothing kubeadm wrote yet.
		{false, false, false},
		{false, true, false},
	} {
		if got := Applies(c.member, c.controlPlane); got != c.want {
			t.Errorf("Applies(member %v, control plane %v) = %v, want %v", c.member, c.controlPlane, got, c.want)
		}
	}
}

func TestJudge(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	for _, c := range []struct {
		left time.Duration
		days int
		warn bool
	}{
		{365 * day, 365, false},
		{30*day + time.Second, 30, false},
		{30 * day, 30, false},
		{30*day - time.Second, 29, true},
		{day + time.Hour, 1, true},
		{time.Hour, 0, true},
		{0, 0, true},
		{-time.Hour, -1, true},
		{-day, -1, true},
		{-day - time.Second, -2, true},
	} {
		days, warn := Judge(Cert{Name: "apiserver", NotAfter: now.Add(c.left)}, now)
		if days != c.days || warn != c.warn {
			t.Errorf("%s left: days %d warn %v, want %d %v", c.left, days, warn, c.days, c.warn)
		}
	}
}

func TestCarryKeepsWhatAFailedReadKnew(t *testing.T) {
	at := func(h int) time.Time { return time.Date(2027, 1, 1, h, 0, 0, 0, time.UTC) }
	read := []Cert{{Name: "etcd-server", NotAfter: at(3)}, {Name: "apiserver", NotAfter: at(5)}}
	last := []Cert{
		{Name: "apiserver", NotAfter: at(1)},                // read again now: this pass's wins
		{Name: "admin.conf", NotAfter: at(2)},               // failed now: carried
		{Name: "ca", NotAfter: at(9), CA: true},             // failed now: carried, still a CA
		{Name: "scheduler.conf", NotAfter: at(4)},           // not failed (gone): not carried
		{Name: "../../etc/shadow", NotAfter: at(0)},         // not a name Read looks for
		{Name: "front-proxy-client", NotAfter: time.Time{}}, // no expiry known
	}
	got := Carry(read, []string{"admin.conf", "ca", "../../etc/shadow", "front-proxy-client"}, last)
	want := []Cert{
		{Name: "admin.conf", NotAfter: at(2), Carried: true},
		{Name: "apiserver", NotAfter: at(5)},
		{Name: "ca", NotAfter: at(9), CA: true, Carried: true},
		{Name: "etcd-server", NotAfter: at(3)},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Carry:\n got %+v\nwant %+v", got, want)
	}
	if s, _ := Soonest(got, false); s.Name != "admin.conf" {
		t.Fatalf("soonest leaf %+v: the carried admin.conf expires first", s)
	}
	if s, _ := Soonest(got, true); s.Name != "ca" {
		t.Fatalf("soonest CA %+v", s)
	}
	if _, ok := Soonest(read[:0], false); ok {
		t.Fatal("a soonest of nothing")
	}
}

// kubeadmPKI makes a control plane's certificates and kubeconfigs under
// root with the real kubeadm, every leaf valid for leaf and every
// authority for ca.
func kubeadmPKI(t *testing.T, kubeadm, root string, leaf, ca time.Duration, phases ...string) {
	t.Helper()
	testutil.KubeadmInitPhases(t, kubeadm, fmt.Sprintf("certificatesDir: %s\ncertificateValidityPeriod: %s\ncaCertificateValidityPeriod: %s\n",
		filepath.Join(root, paths.PKIDir), leaf, ca), filepath.Join(root, paths.KubernetesDir), phases...)
}

// TestRealKubeadmPKI reads what the real kubeadm writes: every
// certificate it manages is found, the soonest is the one made shortest,
// and the authorities are told apart.
func TestRealKubeadmPKI(t *testing.T) {
	kubeadm := testbin.Kubeadm(t, "v1.37.2")
	root := t.TempDir()
	start := time.Now().Add(-time.Second)
	kubeadmPKI(t, kubeadm, root, 72*time.Hour, 240*time.Hour, "certs all", "kubeconfig all")
	mid := time.Now().Add(time.Second)
	// One kubeconfig's embedded certificate made shorter: it must be the
	// soonest, which proves the kubeconfigs are read, not only the PEMs.
	if err := os.Remove(filepath.Join(root, paths.KubernetesDir, "scheduler.conf")); err != nil {
		t.Fatal(err)
	}
	kubeadmPKI(t, kubeadm, root, 36*time.Hour, 240*time.Hour, "kubeconfig scheduler")
	end := time.Now().Add(time.Second)

	got, errs := Read(paths.Root(root))
	if len(errs) != 0 {
		t.Fatalf("read errors: %v", errs)
	}
	var names []string
	for _, c := range got {
		names = append(names, c.Name)
		lo, hi := start.Add(72*time.Hour), mid.Add(72*time.Hour)
		switch {
		case c.CA:
			lo, hi = start.Add(240*time.Hour), mid.Add(240*time.Hour)
		case c.Name == "scheduler.conf":
			lo, hi = mid.Add(36*time.Hour-2*time.Second), end.Add(36*time.Hour)
		}
		// x509 times are whole seconds.
		if c.NotAfter.Before(lo.Truncate(time.Second)) || c.NotAfter.After(hi) {
			t.Errorf("%s expires %s, want between %s and %s", c.Name, c.NotAfter, lo, hi)
		}
	}
	if !slices.Equal(names, Names()) {
		t.Fatalf("read %q, want every certificate kubeadm manages: %q", names, Names())
	}
	for _, c := range got {
		if want := slices.Contains([]string{"ca", "etcd-ca", "front-proxy-ca"}, c.Name); c.CA != want {
			t.Errorf("%s: CA %v", c.Name, c.CA)
		}
	}
	s, ok := Soonest(got, false)
	if !ok || s.Name != "scheduler.conf" {
		t.Fatalf("soonest leaf %+v, want scheduler.conf", s)
	}
	days, warn := Judge(s, time.Now())
	if days != 1 || !warn {
		t.Fatalf("scheduler.conf: %d days, warn %v; want 1 day and a warning", days, warn)
	}
	ca, ok := Soonest(got, true)
	if !ok || !ca.CA || ca.NotAfter.Before(start.Add(240*time.Hour).Truncate(time.Second)) {
		t.Fatalf("soonest CA %+v", ca)
	}

	// A failed read is one error naming the certificate; the others are
	// still read. A symlink is not followed, a FIFO does not block, a
	// file that is not a certificate is said so.
	pki := filepath.Join(root, paths.PKIDir)
	if err := os.Remove(filepath.Join(pki, "apiserver.crt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(pki, "ca.crt"), filepath.Join(pki, "apiserver.crt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(pki, "etcd/peer.crt")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(pki, "etcd/peer.crt"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, paths.KubernetesDir, "admin.conf"), []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Missing is not an error: a joined control plane has no super-admin.conf.
	if err := os.Remove(filepath.Join(root, paths.KubernetesDir, "super-admin.conf")); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var after []Cert
	go func() {
		after, errs = Read(paths.Root(root))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Read blocked (on the FIFO?)")
	}
	failed := map[string]error{}
	for _, e := range errs {
		failed[e.Name] = e
	}
	if len(failed) != 3 || !errors.Is(failed["apiserver"], fsutil.ErrSymlink) || !errors.Is(failed["etcd-peer"], fsutil.ErrNotRegular) ||
		!strings.Contains(fmt.Sprint(failed["admin.conf"]), "no current context") {
		t.Fatalf("read errors %v", errs)
	}
	if len(after) != len(Names())-4 {
		t.Fatalf("read %d certificates after breaking 4, want %d: %+v", len(after), len(Names())-4, after)
	}
}

// TestReadBounded: a PEM file over its bound is refused, not read whole.
func TestReadBounded(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	cert, _ := testutil.ClientCert(t, "kube-apiserver")
	n.Write(paths.PKIDir+"/apiserver.crt", string(cert), 0o644)
	n.Write(paths.PKIDir+"/front-proxy-client.crt", strings.Repeat("#", MaxPEM+1), 0o644)
	// Another block before the certificate is passed over.
	cert2, key := testutil.ClientCert(t, "etcd-peer")
	n.Write(paths.PKIDir+"/etcd/peer.crt", string(key)+string(cert2), 0o644)
	got, errs := Read(n.R())
	if len(got) != 2 || got[0].Name != "apiserver" || got[1].Name != "etcd-peer" || len(errs) != 1 || !errors.Is(errs[0], fsutil.ErrTooLarge) {
		t.Fatalf("got %+v errs %v", got, errs)
	}
}
