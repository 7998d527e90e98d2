package staticpods

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

func TestPorts(t *testing.T) {
	api := testutil.StaticPodManifest("kube-apiserver", "v1.37.2")
	if got := Ports("kube-apiserver", []byte(strings.Replace(api, "6443", "7443", 1))); !slices.Equal(got, []int{7443}) {
		t.Errorf("apiserver %v", got)
	}
	etcd := "spec:\n  containers:\n  - name: etcd\n    command:\n    - etcd\n    - --listen-client-urls=https://127.0.0.1:2379,https://10.0.0.11:2379,https://10.0.0.11:12379\n"
	if got := Ports("etcd", []byte(etcd)); !slices.Equal(got, []int{2379, 12379}) {
		t.Errorf("etcd %v", got)
	}
	for c, want := range map[string]int{"etcd": 2379, "kube-apiserver": 6443, "kube-controller-manager": 10257, "kube-scheduler": 10259} {
		if got := Ports(c, []byte("spec:\n  containers:\n  - name: "+c+"\n    command: [x]\n")); !slices.Equal(got, []int{want}) {
			t.Errorf("%s default %v, want %d", c, got, want)
		}
	}
}

// Listening reads the real /proc/net: a socket this test listens on is
// there, and is gone once closed.
func TestListeningOnThisHost(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	got, err := Listening("/")
	if err != nil || !got[port] {
		t.Fatalf("port %d not seen listening: %v", port, err)
	}
	l.Close()
	if got, err = Listening("/"); err != nil || got[port] {
		t.Fatalf("port %d still seen listening after close: %v", port, err)
	}
	// An established connection's local port is not a listener.
	b := []byte("  sl  local_address rem_address   st\n   0: 0100007F:1A0B 00000000:0000 0A 0\n   1: 0100007F:C350 0100007F:1A0B 01 0\n")
	if p := ListeningPorts(b); len(p) != 1 || !p[0x1A0B] {
		t.Fatalf("parsed %v", p)
	}
}

// kubelet plays the kubelet at the one seam it is seen through (which
// ports listen): a component's ports listen while its manifest is in the
// manifest directory, lag calls after it moved.
type kubelet struct {
	node    *testutil.Node
	lag     int
	calls   map[string]int
	sawDown bool
	never   bool // never stops the pods
}

func (k *kubelet) listening() (map[int]bool, error) {
	out := map[int]bool{}
	down := true
	for _, c := range Components {
		if k.node.Exists(paths.ManifestsDir+"/"+c+".yaml") || k.never {
			k.calls[c] = 0
			out[port(c)] = true
			down = false
			continue
		}
		if k.calls[c]++; k.calls[c] <= k.lag {
			out[port(c)] = true
			down = false
		}
	}
	k.sawDown = k.sawDown || down
	return out, nil
}

func port(c string) int {
	return map[string]int{"etcd": 2379, "kube-apiserver": 6443, "kube-controller-manager": 10257, "kube-scheduler": 10259}[c]
}

func controlPlane(t *testing.T) (*testutil.Node, map[string]string) {
	n := testutil.NewNode(t, "n1")
	want := map[string]string{}
	for _, c := range Components {
		m := "spec:\n  containers:\n  - name: " + c + "\n    command: [" + c + "]\n# " + c + " as kubeadm wrote it\n"
		n.Write(paths.ManifestsDir+"/"+c+".yaml", m, 0o600)
		want[c] = m
	}
	return n, want
}

func sameManifests(t *testing.T, n *testutil.Node, want map[string]string) {
	t.Helper()
	for c, m := range want {
		if got := n.Read(paths.ManifestsDir + "/" + c + ".yaml"); got != m {
			t.Fatalf("%s.yaml changed: %q", c, got)
		}
	}
}

func TestRestart(t *testing.T) {
	n, want := controlPlane(t)
	k := &kubelet{node: n, lag: 3, calls: map[string]int{}}
	ready := 0
	r := &Restarter{Root: n.R(), Clock: testutil.NewClock(), Budget: 5 * time.Minute, Listening: k.listening,
		Ready: func(context.Context) error {
			if ready++; ready < 2 {
				return errors.New("apiserver not ready yet")
			}
			return nil
		}}
	got, err := r.Restart(context.Background())
	if err != nil || !slices.Equal(got, Components) {
		t.Fatalf("restarted %v: %v", got, err)
	}
	if !k.sawDown || ready != 2 {
		t.Fatalf("the pods were not seen stopped (%v) or the apiserver not waited for (%d)", k.sawDown, ready)
	}
	sameManifests(t, n, want)
	if n.Exists(ParkDir) {
		t.Fatal("the park directory stayed")
	}
}

// A kubelet that never stops the pods: the restart gives up within its
// budget and the manifests are back, byte-identical.
func TestRestartBounded(t *testing.T) {
	n, want := controlPlane(t)
	k := &kubelet{node: n, never: true, calls: map[string]int{}}
	clk := testutil.NewClock()
	start := clk.Now()
	r := &Restarter{Root: n.R(), Clock: clk, Budget: time.Minute, Listening: k.listening}
	_, err := r.Restart(context.Background())
	if err == nil || !strings.Contains(err.Error(), "still listens on port") {
		t.Fatalf("err %v", err)
	}
	if spent := clk.Now().Sub(start); spent > time.Minute+2*time.Second {
		t.Fatalf("spent %s of a 1m budget", spent)
	}
	sameManifests(t, n, want)
}

// A manifest written while the pods were stopped is never overwritten:
// the parked one stays, the error says where.
func TestRestartNeverOverwrites(t *testing.T) {
	n, want := controlPlane(t)
	k := &kubelet{node: n, calls: map[string]int{}}
	r := &Restarter{Root: n.R(), Clock: testutil.NewClock(), Budget: time.Minute, Listening: func() (map[int]bool, error) {
		if !n.Exists(paths.ManifestsDir + "/kube-scheduler.yaml") {
			n.Write(paths.ManifestsDir+"/kube-scheduler.yaml", "someone else's\n", 0o600)
		}
		return k.listening()
	}}
	_, err := r.Restart(context.Background())
	if err == nil || !strings.Contains(err.Error(), "kube-scheduler.yaml back") || !strings.Contains(err.Error(), ParkDir) {
		t.Fatalf("err %v", err)
	}
	if n.Read(paths.ManifestsDir+"/kube-scheduler.yaml") != "someone else's\n" || n.Read(ParkDir+"/kube-scheduler.yaml") != want["kube-scheduler"] {
		t.Fatal("a manifest was overwritten or the parked one lost")
	}
	delete(want, "kube-scheduler")
	sameManifests(t, n, want)
}

// What a killed pass left parked is put back, never over a manifest.
func TestRestoreParked(t *testing.T) {
	n, want := controlPlane(t)
	if err := os.MkdirAll(n.Path(ParkDir), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"kube-apiserver", "etcd"} {
		if err := os.Rename(n.Path(paths.ManifestsDir+"/"+c+".yaml"), n.Path(ParkDir+"/"+c+".yaml")); err != nil {
			t.Fatal(err)
		}
	}
	got, err := RestoreParked(n.R())
	if err != nil || !slices.Equal(got, []string{"etcd", "kube-apiserver"}) {
		t.Fatalf("restored %v: %v", got, err)
	}
	sameManifests(t, n, want)
	if n.Exists(ParkDir) {
		t.Fatal("the park directory stayed")
	}
	if got, err := RestoreParked(n.R()); got != nil || err != nil {
		t.Fatalf("nothing parked: %v %v", got, err)
	}
	// Both there: the manifest directory's wins, the parked one stays.
	if err := os.MkdirAll(n.Path(ParkDir), 0o700); err != nil {
		t.Fatal(err)
	}
	n.Write(ParkDir+"/etcd.yaml", "old\n", 0o600)
	if _, err := RestoreParked(n.R()); err == nil || n.Read(paths.ManifestsDir+"/etcd.yaml") != want["etcd"] || n.Read(ParkDir+"/etcd.yaml") != "old\n" {
		t.Fatalf("overwrote a manifest: %v", err)
	}
}

// A park directory swapped for a symlink while the pods are stopped (to
// a directory holding a forged manifest) is not followed: nothing comes
// back through the link, and the error says the manifests stay parked.
func TestRestartFollowsNoSymlink(t *testing.T) {
	n, _ := controlPlane(t)
	forged := t.TempDir()
	if err := os.WriteFile(forged+"/kube-apiserver.yaml", []byte("forged\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k := &kubelet{node: n, calls: map[string]int{}}
	swapped := false
	r := &Restarter{Root: n.R(), Clock: testutil.NewClock(), Budget: time.Minute, Listening: func() (map[int]bool, error) {
		if !swapped {
			swapped = true
			if err := os.Rename(n.Path(ParkDir), n.Path(ParkDir)+".real"); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(forged, n.Path(ParkDir)); err != nil {
				t.Fatal(err)
			}
		}
		return k.listening()
	}}
	if _, err := r.Restart(context.Background()); err == nil || !strings.Contains(err.Error(), "back into") {
		t.Fatalf("err %v", err)
	}
	if n.Exists(paths.ManifestsDir + "/kube-apiserver.yaml") {
		t.Fatalf("a manifest came back through the link: %q", n.Read(paths.ManifestsDir+"/kube-apiserver.yaml"))
	}
}
