package kubeadmbackup

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// backup writes a kubeadm-backup-etcd-<stamp> copy of an etcd data dir with
// a db of dbBytes.
func backup(t *testing.T, n *testutil.Node, stamp string, dbBytes int) string {
	t.Helper()
	d := paths.KubeadmTmpDir + "/" + Prefix + stamp
	n.Write(d+"/etcd/member/snap/db", strings.Repeat("x", dbBytes), 0o600)
	n.Write(d+"/etcd/member/wal/0000000000000000-0000000000000000.wal", strings.Repeat("w", 1000), 0o600)
	return d
}

func names(bs []Backup) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Name)
	}
	return out
}

func TestListSizesWithoutFollowingSymlinks(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	if s, err := List(n.R()); err != nil || s.Count != 0 {
		t.Fatalf("no tmp dir: %+v %v", s, err)
	}
	backup(t, n, "2026-05-01-10-00-00", 5000)
	backup(t, n, "2026-11-30-09-59-00", 7000)
	newest := backup(t, n, "2026-11-30-10-05-00", 9000)
	// A symlink inside a backup to a big file elsewhere: neither sized nor followed.
	outside := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(outside, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, n.Path(newest+"/etcd/member/link")); err != nil {
		t.Fatal(err)
	}
	// A symlink named like a backup, and a file: skipped.
	elsewhere := t.TempDir()
	if err := os.WriteFile(filepath.Join(elsewhere, "db"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, n.Path(paths.KubeadmTmpDir+"/"+Prefix+"2027-01-01-00-00-00")); err != nil {
		t.Fatal(err)
	}
	n.Write(paths.KubeadmTmpDir+"/"+Prefix+"notes", "x", 0o600)
	// Without kubeadm's timestamp: counted, never pruned. Manifests backups are not etcd copies.
	backup(t, n, "manual", 100)
	n.Write(paths.KubeadmTmpDir+"/kubeadm-backup-manifests-2026-11-30-10-05-00/kube-apiserver.yaml", "x", 0o600)

	s, err := List(n.R())
	if err != nil {
		t.Fatal(err)
	}
	wantNames := []string{Prefix + "manual", Prefix + "2026-05-01-10-00-00", Prefix + "2026-11-30-09-59-00", Prefix + "2026-11-30-10-05-00"}
	if !reflect.DeepEqual(names(s.Backups), wantNames) {
		t.Fatalf("backups %q", names(s.Backups))
	}
	if s.Count != 4 || s.Bytes != 5000+7000+9000+100+4*1000 {
		t.Fatalf("count %d bytes %d", s.Count, s.Bytes)
	}
	if !reflect.DeepEqual(s.Skipped, []string{Prefix + "2027-01-01-00-00-00", Prefix + "notes"}) {
		t.Fatalf("skipped %q", s.Skipped)
	}

	rm := Plan(s, 1)
	if !reflect.DeepEqual(names(rm), wantNames[1:3]) {
		t.Fatalf("plan keep 1: %q", names(rm))
	}
	if got := Plan(s, 0); !reflect.DeepEqual(names(got), wantNames[1:]) {
		t.Fatalf("plan keep 0: %q", names(got))
	}
	if got := Plan(s, 3); got != nil {
		t.Fatalf("plan keep 3: %q", names(got))
	}
	for _, b := range Plan(s, 0) {
		if err := Remove(n.R(), b); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("a symlink's target was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(elsewhere, "db")); err != nil {
		t.Fatalf("the symlinked backup's target was removed: %v", err)
	}
	s, err = List(n.R())
	if err != nil || !reflect.DeepEqual(names(s.Backups), []string{Prefix + "manual"}) {
		t.Fatalf("after: %q %v", names(s.Backups), err)
	}
}

func TestListRefusesASymlinkedTmpDir(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	real := t.TempDir()
	if err := os.MkdirAll(filepath.Join(real, Prefix+"2026-11-30-10-05-00"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(n.Path(paths.KubernetesDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, n.Path(paths.KubeadmTmpDir)); err != nil {
		t.Fatal(err)
	}
	if _, err := List(n.R()); !errors.Is(err, ErrSymlink) {
		t.Fatalf("err %v", err)
	}
}

func TestVerified(t *testing.T) {
	v := version.MustParse
	cases := []struct {
		f    Facts
		want string // "" = verified
	}{
		{Facts{ControlPlane: true, NodeVersion: v("v1.37.2"), KubeletVersion: v("v1.37.2"), ClusterVersion: v("v1.37.2")}, ""},
		{Facts{ControlPlane: false, KubeletVersion: v("v1.37.2"), ClusterVersion: v("v1.37.2")}, ""},
		{Facts{ControlPlane: true, NodeVersion: v("v1.36.3"), KubeletVersion: v("v1.37.2"), ClusterVersion: v("v1.37.2")}, "kube-apiserver manifest at v1.36.3"},
		{Facts{ControlPlane: true, NodeVersion: v("v1.37.2"), KubeletVersion: v("v1.36.3"), ClusterVersion: v("v1.37.2")}, "kubelet at v1.36.3"},
		{Facts{ControlPlane: true, NodeVersion: v("v1.37.2"), KubeletVersion: v("v1.37.2")}, "cluster version is unknown"},
		{Facts{ControlPlane: true, KubeletVersion: v("v1.37.2"), ClusterVersion: v("v1.37.2")}, "manifest at unknown"},
	}
	for _, c := range cases {
		err := Verified(c.f)
		if c.want == "" && err != nil || c.want != "" && (!errors.Is(err, ErrNotVerified) || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("Verified(%+v) = %v, want %q", c.f, err, c.want)
		}
	}
}
