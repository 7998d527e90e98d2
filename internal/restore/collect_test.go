package restore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

var want136 = Want{Kubernetes: version.MustParse("v1.36.3"), EtcdTag: "3.6.8-0"}

func TestChooseSaved(t *testing.T) {
	const (
		d1 = "/etc/kubernetes/tmp/kubeadm-backup-manifests-2026-11-01-10-00-00" // the 1.35 -> 1.36 upgrade
		d2 = "/etc/kubernetes/tmp/kubeadm-backup-manifests-2026-12-01-05-21-10" // 1.36 -> 1.37, cut after etcd
		d3 = "/etc/kubernetes/tmp/kubeadm-backup-manifests-2026-12-01-05-22-40" // run again, cut after the apiserver
		d4 = "/etc/kubernetes/tmp/kubeadm-backup-manifests-2026-12-01-05-24-05" // run again to the end
	)
	// What a first control plane's upgrade cut twice leaves: etcd 3.6 in
	// d2; the 1.36 apiserver in d3; in d4 the 1.37 apiserver (re-applied)
	// and the 1.36 controller-manager and scheduler. d1 holds 1.35's.
	cut := []Saved{
		{Dir: d1, File: "etcd.yaml", Tag: "3.6.5-0"}, {Dir: d1, File: "kube-apiserver.yaml", Tag: "v1.35.4"}, {Dir: d1, File: "kube-controller-manager.yaml", Tag: "v1.35.4"}, {Dir: d1, File: "kube-scheduler.yaml", Tag: "v1.35.4"},
		{Dir: d2, File: "etcd.yaml", Tag: "3.6.8-0"},
		{Dir: d3, File: "kube-apiserver.yaml", Tag: "v1.36.3"},
		{Dir: d4, File: "kube-apiserver.yaml", Tag: "v1.37.2"}, {Dir: d4, File: "kube-controller-manager.yaml", Tag: "v1.36.3"}, {Dir: d4, File: "kube-scheduler.yaml", Tag: "v1.36.3"},
	}
	for _, tc := range []struct {
		name    string
		saved   []Saved
		want    Want
		from    map[string]string // component -> dir
		missing []string
	}{
		{name: "spread over three runs", saved: cut, want: want136,
			from: map[string]string{"etcd": d2, "kube-apiserver": d3, "kube-controller-manager": d4, "kube-scheduler": d4}},
		{name: "the newest copy at the version wins", want: want136,
			saved: []Saved{{Dir: d2, File: "etcd.yaml", Tag: "3.6.8-0"}, {Dir: d3, File: "etcd.yaml", Tag: "3.6.8-0"}, {Dir: d2, File: "kube-apiserver.yaml", Tag: "v1.36.3"}, {Dir: d4, File: "kube-apiserver.yaml", Tag: "v1.36.3"},
				{Dir: d2, File: "kube-controller-manager.yaml", Tag: "v1.36.3"}, {Dir: d2, File: "kube-scheduler.yaml", Tag: "v1.36.3"}},
			from: map[string]string{"etcd": d3, "kube-apiserver": d4, "kube-controller-manager": d2, "kube-scheduler": d2}},
		{name: "the older minor", saved: cut, want: Want{Kubernetes: version.MustParse("v1.35.4"), EtcdTag: "3.6.5-0"},
			from: map[string]string{"etcd": d1, "kube-apiserver": d1, "kube-controller-manager": d1, "kube-scheduler": d1}},
		{name: "a patch release is another version", saved: cut, want: Want{Kubernetes: version.MustParse("v1.36.2"), EtcdTag: "3.6.8-0"},
			missing: []string{"kube-apiserver.yaml at v1.36.2 (saved: v1.37.2 in kubeadm-backup-manifests-2026-12-01-05-24-05, v1.36.3 in", "kube-scheduler.yaml at v1.36.2"}},
		{name: "etcd by its tag", saved: cut, want: Want{Kubernetes: version.MustParse("v1.36.3"), EtcdTag: "3.6.8-1"},
			missing: []string{"etcd.yaml at 3.6.8-1 (saved: 3.6.8-0 in kubeadm-backup-manifests-2026-12-01-05-21-10, 3.6.5-0 in"}},
		{name: "nothing saved", want: want136,
			missing: []string{"etcd.yaml at 3.6.8-0 (none saved)", "kube-apiserver.yaml at v1.36.3 (none saved)", "kube-controller-manager.yaml", "kube-scheduler.yaml"}},
		{name: "a component never saved at that version", want: want136, saved: cut[4:8],
			missing: []string{"kube-scheduler.yaml at v1.36.3 (none saved)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseSaved(tc.saved, tc.want)
			if len(tc.missing) > 0 {
				if !errors.Is(err, ErrNoSavedManifest) {
					t.Fatalf("err %v, want ErrNoSavedManifest", err)
				}
				for _, m := range tc.missing {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("error %q lacks %q", err, m)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for c, dir := range tc.from {
				if got[c].Dir != dir || got[c].File != c+".yaml" {
					t.Errorf("%s from %+v, want %s", c, got[c], dir)
				}
			}
		})
	}
}

func staticPod(container, image string) []byte {
	return []byte(fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n  namespace: kube-system\nspec:\n  containers:\n  - name: %s\n    image: %s\n", container, container, image))
}

// saveManifests lays out kubeadm's saved manifests under root: dir name ->
// component -> image.
func saveManifests(t *testing.T, root string, dirs map[string]map[string]string) {
	t.Helper()
	for d, comps := range dirs {
		full := filepath.Join(root, paths.KubeadmTmpDir, d)
		if err := os.MkdirAll(full, 0o700); err != nil {
			t.Fatal(err)
		}
		for c, img := range comps {
			if err := os.WriteFile(filepath.Join(full, c+".yaml"), staticPod(c, img), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestCollectManifests(t *testing.T) {
	root := t.TempDir()
	saveManifests(t, root, map[string]map[string]string{
		"kubeadm-backup-manifests-2026-12-01-05-21-10": {"etcd": "registry.k8s.io/etcd:3.6.8-0"},
		"kubeadm-backup-manifests-2026-12-01-05-22-40": {"kube-apiserver": "registry.k8s.io/kube-apiserver:v1.36.3"},
		"kubeadm-backup-manifests-2026-12-01-05-24-05": {"kube-apiserver": "registry.k8s.io/kube-apiserver:v1.37.2",
			"kube-controller-manager": "registry.k8s.io/kube-controller-manager:v1.36.3", "kube-scheduler": "registry.k8s.io/kube-scheduler:v1.36.3"},
		// kubeadm's etcd data copy is not a manifests directory.
		"kubeadm-backup-etcd-2026-12-01-05-21-10": {"etcd": "registry.k8s.io/etcd:9.9.9-0"},
	})
	const to = "/etc/kubernetes/tmp/restore-v1.36.3"
	c, err := CollectManifests(paths.Root(root), want136, to)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, to))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("target %v %v, want a 0700 directory", fi, err)
	}
	for comp, img := range map[string]string{"etcd": "registry.k8s.io/etcd:3.6.8-0", "kube-apiserver": "registry.k8s.io/kube-apiserver:v1.36.3",
		"kube-controller-manager": "registry.k8s.io/kube-controller-manager:v1.36.3", "kube-scheduler": "registry.k8s.io/kube-scheduler:v1.36.3"} {
		p := filepath.Join(root, to, comp+".yaml")
		b, err := os.ReadFile(p)
		if err != nil || string(b) != string(staticPod(comp, img)) {
			t.Errorf("%s: %v\n%s", comp, err, b)
		}
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v %v, want 0600", comp, fi, err)
		}
	}
	if c.From["kube-apiserver"].Dir != paths.KubeadmTmpDir+"/kubeadm-backup-manifests-2026-12-01-05-22-40" {
		t.Errorf("apiserver from %+v", c.From["kube-apiserver"])
	}

	// Again into the same, now not empty, directory: refused.
	if _, err := CollectManifests(paths.Root(root), want136, to); !errors.Is(err, ErrCollectTarget) {
		t.Fatalf("into a non-empty directory: %v", err)
	}
	// Into the kubelet's manifests directory, or a parent of it: refused.
	for _, bad := range []string{paths.ManifestsDir, paths.KubernetesDir, "relative/dir", "/etc/kubernetes/tmp/../x"} {
		if _, err := CollectManifests(paths.Root(root), want136, bad); !errors.Is(err, ErrCollectTarget) {
			t.Errorf("into %q: %v", bad, err)
		}
	}
}

// A saved copy someone else could have written, or a symlink, is not used;
// without another copy, the component is missing and nothing is copied.
func TestCollectManifestsSkipsUntrusted(t *testing.T) {
	root := t.TempDir()
	saveManifests(t, root, map[string]map[string]string{
		"kubeadm-backup-manifests-2026-12-01-05-21-10": {"etcd": "registry.k8s.io/etcd:3.6.8-0", "kube-apiserver": "registry.k8s.io/kube-apiserver:v1.36.3",
			"kube-controller-manager": "registry.k8s.io/kube-controller-manager:v1.36.3"},
	})
	dir := filepath.Join(root, paths.KubeadmTmpDir, "kubeadm-backup-manifests-2026-12-01-05-21-10")
	// The scheduler's copy is a symlink to a file with the right image.
	elsewhere := filepath.Join(root, "planted.yaml")
	if err := os.WriteFile(elsewhere, staticPod("kube-scheduler", "registry.k8s.io/kube-scheduler:v1.36.3"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(dir, "kube-scheduler.yaml")); err != nil {
		t.Fatal(err)
	}
	// The controller-manager's is writable by others.
	if err := os.Chmod(filepath.Join(dir, "kube-controller-manager.yaml"), 0o666); err != nil {
		t.Fatal(err)
	}
	const to = "/etc/kubernetes/tmp/restore"
	_, err := CollectManifests(paths.Root(root), want136, to)
	if !errors.Is(err, ErrNoSavedManifest) {
		t.Fatalf("err %v", err)
	}
	for _, w := range []string{"kube-scheduler.yaml at v1.36.3 (none saved)", "kube-controller-manager.yaml at v1.36.3 (none saved)", "skipped: ", "not root's own"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, to)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the target exists after a refusal: %v", err)
	}
}

// TestCollectManifestsNeverUsesAForeignTarget: an empty --to directory
// another user owns (who could swap a manifest between the copy and
// restore-etcd) is moved aside and a fresh root 0700 one holds the copies;
// a symlink at --to is refused and nothing is written through it.
func TestCollectManifestsNeverUsesAForeignTarget(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	saveManifests(t, root, map[string]map[string]string{
		"kubeadm-backup-manifests-2026-12-01-05-21-10": {"etcd": "registry.k8s.io/etcd:3.6.8-0", "kube-apiserver": "registry.k8s.io/kube-apiserver:v1.36.3",
			"kube-controller-manager": "registry.k8s.io/kube-controller-manager:v1.36.3", "kube-scheduler": "registry.k8s.io/kube-scheduler:v1.36.3"},
	})
	const to = "/etc/kubernetes/tmp/restore-v1.36.3"
	full := filepath.Join(root, to)
	if err := os.Mkdir(full, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(full, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if _, err := CollectManifests(paths.Root(root), want136, to); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(full, &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o700 {
		t.Fatalf("target uid %d mode %o (%v), want a fresh root 0700 directory", st.Uid, st.Mode&0o777, err)
	}
	aside, _ := filepath.Glob(full + ".untrusted-*")
	if len(aside) != 1 {
		t.Fatalf("the foreign directory was not moved aside: %v", aside)
	}
	if ents, _ := os.ReadDir(aside[0]); len(ents) != 0 {
		t.Fatalf("a manifest was written into the foreign directory: %v", ents)
	}

	elsewhere := filepath.Join(root, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o700); err != nil {
		t.Fatal(err)
	}
	const link = "/etc/kubernetes/tmp/restore-link"
	if err := os.Symlink(elsewhere, filepath.Join(root, link)); err != nil {
		t.Fatal(err)
	}
	if _, err := CollectManifests(paths.Root(root), want136, link); !errors.Is(err, ErrCollectTarget) {
		t.Fatalf("through a symlink: %v", err)
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
		t.Fatalf("written through the symlink: %v", ents)
	}
}

// TestCollectManifestsNeverFollowsALinkInAParent: --to under a directory
// another user owns, which is a symlink to /etc/kubernetes (or to the
// manifests directory itself), emptied for the restore as the runbook
// says: refused, and nothing lands in the kubelet's manifests directory.
func TestCollectManifestsNeverFollowsALinkInAParent(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tc := range []struct{ link, target, to string }{
		{"/home/bob", paths.KubernetesDir, "/home/bob/manifests"},
		{"/home/bob", paths.ManifestsDir, "/home/bob/restore"},
		{"/home/bob/tmp", paths.KubernetesDir, "/home/bob/tmp/manifests"},
	} {
		t.Run(tc.to+"->"+tc.target, func(t *testing.T) {
			root := t.TempDir()
			saveManifests(t, root, map[string]map[string]string{
				"kubeadm-backup-manifests-2026-12-01-05-21-10": {"etcd": "registry.k8s.io/etcd:3.6.8-0", "kube-apiserver": "registry.k8s.io/kube-apiserver:v1.36.3",
					"kube-controller-manager": "registry.k8s.io/kube-controller-manager:v1.36.3", "kube-scheduler": "registry.k8s.io/kube-scheduler:v1.36.3"},
			})
			manifests := filepath.Join(root, paths.ManifestsDir)
			if err := os.MkdirAll(manifests, 0o700); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(root, tc.link)
			if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(root, tc.target), link); err != nil {
				t.Fatal(err)
			}
			_ = os.Lchown(link, 4242, 4242)
			_ = os.Chown(filepath.Dir(link), 4242, 4242)
			if _, err := CollectManifests(paths.Root(root), want136, tc.to); !errors.Is(err, ErrCollectTarget) || !errors.Is(err, fsutil.ErrSymlink) {
				t.Fatalf("through a symlinked parent: %v", err)
			}
			var found []string
			_ = filepath.WalkDir(manifests, func(p string, d os.DirEntry, err error) error {
				if p != manifests {
					found = append(found, p)
				}
				return nil
			})
			if len(found) != 0 {
				t.Fatalf("written into the manifests directory: %v", found)
			}
		})
	}
}
