package system

import (
	"io/fs"
	"sort"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// The manifest's entries for the release being built must be exactly the
// units and links in this package: editing a unit without recording its new
// digest fails here, so the manifest keeps every shipped version.
func TestManifestMatchesShippedUnits(t *testing.T) {
	m := Shipped()
	rel := images.Get().Release
	r, ok := m.ReleaseNamed(rel)
	if !ok {
		t.Fatalf("shipped.yaml has no entry for the current release %s (images/versions.yaml)", rel)
	}
	if r.Reconstructed {
		t.Fatalf("the current release %s cannot be reconstructed", rel)
	}
	want := map[string]string{}
	for _, f := range Units() {
		want[f.Path] = Digest(f.Data)
	}
	got := map[string]string{}
	for _, f := range r.Files {
		got[f.Path] = f.SHA256
	}
	for p, d := range want {
		if got[p] != d {
			t.Errorf("%s: shipped.yaml says %q, the unit in units/ has sha256 %s", p, got[p], d)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: in shipped.yaml for %s but not in units/", p, rel)
		}
	}
	wl := map[string]string{}
	for _, l := range WantsLinks() {
		wl[l.Path] = l.Target
	}
	gl := map[string]string{}
	for _, l := range r.Links {
		gl[l.Path] = l.Target
	}
	if len(wl) != len(gl) {
		t.Errorf("links: shipped.yaml %v, image %v", gl, wl)
	}
	for p, target := range wl {
		if gl[p] != target {
			t.Errorf("link %s: shipped.yaml %q, image %q", p, gl[p], target)
		}
	}
}

// Reconstructed releases keep their bytes in history/: each digest must be
// the digest of those bytes, and every history file must be in the manifest.
func TestHistoryMatchesManifest(t *testing.T) {
	m := Shipped()
	seen := map[string]bool{}
	for _, r := range m.Releases {
		if !r.Reconstructed {
			continue
		}
		for _, f := range r.Files {
			b, err := History(r.Release, f.Path)
			if err != nil {
				t.Errorf("%s %s: %v", r.Release, f.Path, err)
				continue
			}
			if Digest(b) != f.SHA256 {
				t.Errorf("%s %s: manifest %s, history bytes %s", r.Release, f.Path, f.SHA256, Digest(b))
			}
			seen["history/"+r.Release+f.Path] = true
		}
	}
	err := fs.WalkDir(content, "history", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !seen[p] {
			t.Errorf("%s is not in shipped.yaml", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) == 0 {
		t.Fatal("no reconstructed history: the migration tests need it")
	}
}

func TestUnitsShape(t *testing.T) {
	var names []string
	for _, f := range Units() {
		names = append(names, strings.TrimPrefix(f.Path, UnitDir+"/"))
		s := string(f.Data)
		if strings.Contains("\n"+s, "\n[Install]") {
			t.Errorf("%s has an [Install] section: the image enables it with a link, is-enabled must say static", f.Path)
		}
	}
	sort.Strings(names)
	want := []string{Containerd, Kubelet, KubeadmDropIn, ImageImport, Reconcile, UnitMigrate, Publish}
	sort.Strings(want)
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("units %v, want %v", names, want)
	}
	unit := func(name string) string {
		for _, f := range Units() {
			if f.Path == UnitDir+"/"+name {
				return string(f.Data)
			}
		}
		t.Fatalf("no %s", name)
		return ""
	}
	for name, lines := range map[string][]string{
		// After Kairos's boot stage, which writes the cluster file; run only
		// when the cloud-config has a cluster: section (either file exists).
		Reconcile: {"Type=oneshot", "TimeoutStartSec=65min", "ExecStart=/usr/bin/provider-kubernetes reconcile",
			"Wants=network-online.target containerd.service provider-kubernetes-publish.service\n",
			"After=network-online.target containerd.service provider-kubernetes-image-import.service provider-kubernetes-unit-migrate.service cos-setup-boot.service\n",
			"ConditionPathExists=|" + paths.ClusterFile + "\n", "ConditionPathExists=|" + paths.ClusterYipFile + "\n"},
		ImageImport: {"After=containerd.service", "Before=kubelet.service", "ExecStart=/usr/bin/provider-kubernetes import-images"},
		// After every pass, never inside it: wanted by the reconcile unit.
		Publish: {"After=provider-kubernetes-reconcile.service\n", "Type=oneshot", "ExecStart=/usr/bin/provider-kubernetes publish --budget 5m",
			"ConditionPathExists=" + paths.StatusFile + "\n"},
		UnitMigrate: {"Before=containerd.service provider-kubernetes-image-import.service kubelet.service",
			"ExecStart=/usr/bin/provider-kubernetes migrate-units", "DefaultDependencies=no"},
		// The tree's containerd, not a Debian package's.
		Containerd: {"ExecStart=/usr/bin/containerd\n", "Type=notify", "Delegate=yes", "KillMode=process"},
		KubeadmDropIn: {"EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env", "EnvironmentFile=-/etc/default/kubelet",
			"ExecStart=\n", "$KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS"},
	} {
		u := unit(name)
		for _, l := range lines {
			if !strings.Contains(u, l) {
				t.Errorf("%s lacks %q", name, l)
			}
		}
	}
}

func TestParseManifestRejects(t *testing.T) {
	d := strings.Repeat("a", 64)
	for name, in := range map[string]string{
		"empty":         "releases: []\n",
		"relative":      "releases:\n- release: v1\n  files:\n  - {path: etc/systemd/system/x.service, sha256: " + d + "}\n",
		"outside":       "releases:\n- release: v1\n  files:\n  - {path: /etc/passwd, sha256: " + d + "}\n",
		"dotdot":        "releases:\n- release: v1\n  files:\n  - {path: /etc/systemd/system/../../passwd, sha256: " + d + "}\n",
		"short digest":  "releases:\n- release: v1\n  files:\n  - {path: /etc/systemd/system/x.service, sha256: abc}\n",
		"upper digest":  "releases:\n- release: v1\n  files:\n  - {path: /etc/systemd/system/x.service, sha256: " + strings.ToUpper(d) + "}\n",
		"empty target":  "releases:\n- release: v1\n  links:\n  - {path: /etc/systemd/system/a.wants/x.service, target: \"\"}\n",
		"file and link": "releases:\n- release: v1\n  files:\n  - {path: /etc/systemd/system/x.service, sha256: " + d + "}\n- release: v2\n  links:\n  - {path: /etc/systemd/system/x.service, target: /dev/null}\n",
		"unknown key":   "releases:\n- release: v1\n  extra: 1\n",
		"nameless":      "releases:\n- files: []\n",
	} {
		if _, err := ParseManifest([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
