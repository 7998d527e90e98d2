package metrics

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// parse reads a textfile as Prometheus (and node_exporter) does.
func parse(t *testing.T, b []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not the text exposition format: %v\n%s", err, b)
	}
	return fams
}

// value is the gauge of family name whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no %s", name)
	}
	if f.GetType() != dto.MetricType_GAUGE || f.GetHelp() == "" {
		t.Fatalf("%s: type %s help %q", name, f.GetType(), f.GetHelp())
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		match := len(got) == len(want)
		for k, v := range want {
			match = match && got[k] == v
		}
		if match {
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("%s has no series %v", name, want)
	return 0
}

func controlPlaneDoc() status.Document {
	return status.Document{Phase: status.PhaseConverged, Member: true, Pin: "v1.37.2", NodeVersion: "v1.37.2", Time: "2026-12-03T12:00:00Z",
		Certificates: &status.Certificates{
			Soonest:   &status.Certificate{Name: "apiserver", NotAfter: "2027-12-03T11:00:00Z", DaysLeft: 364},
			SoonestCA: &status.Certificate{Name: "ca", NotAfter: "2036-12-01T11:00:00Z", CA: true},
		}}
}

func TestRender(t *testing.T) {
	fams := parse(t, Render(controlPlaneDoc()))
	for _, p := range phases {
		want := 0.0
		if p == status.PhaseConverged {
			want = 1
		}
		if got := value(t, fams, "provider_kubernetes_phase", map[string]string{"phase": p}); got != want {
			t.Errorf("phase %s = %v, want %v", p, got, want)
		}
	}
	for _, o := range outcomes {
		want := 0.0
		if o == "converged" {
			want = 1
		}
		if got := value(t, fams, "provider_kubernetes_outcome", map[string]string{"outcome": o}); got != want {
			t.Errorf("outcome %s = %v, want %v", o, got, want)
		}
	}
	for name, want := range map[string]float64{"provider_kubernetes_outcome_timestamp_seconds": 1796299200, "provider_kubernetes_at_pin": 1} {
		if got := value(t, fams, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	exp := "provider_kubernetes_certificate_expiry_timestamp_seconds"
	if got := value(t, fams, exp, map[string]string{"certificate": "apiserver", "ca": "false"}); got != 1827831600 {
		t.Errorf("apiserver expiry %v", got)
	}
	if got := value(t, fams, exp, map[string]string{"certificate": "ca", "ca": "true"}); got != 2111742000 {
		t.Errorf("ca expiry %v", got)
	}

	// A worker upgrading, not at its pin yet: no certificates.
	d := status.Document{Phase: status.PhaseUpgrading, Pin: "v1.37.2", NodeVersion: "v1.36.5", Time: "2026-12-03T12:00:00Z"}
	fams = parse(t, Render(d))
	if value(t, fams, "provider_kubernetes_at_pin", nil) != 0 || value(t, fams, "provider_kubernetes_outcome", map[string]string{"outcome": "running"}) != 1 {
		t.Fatal("an upgrading worker")
	}
	if _, ok := fams[exp]; ok {
		t.Fatal("a worker's textfile has a certificate expiry")
	}
}

// TestRenderEscapesLabels: whatever a document holds, the textfile parses
// and the label says it escaped, on one line.
func TestRenderEscapesLabels(t *testing.T) {
	d := controlPlaneDoc()
	d.Phase = "Odd\"phase\\\nwith a line"
	d.Certificates.Soonest.Name = "a\"b\\c\nd"
	b := Render(d)
	fams := parse(t, b)
	if got := value(t, fams, "provider_kubernetes_phase", map[string]string{"phase": status.Printable(d.Phase)}); got != 1 {
		t.Fatalf("the document's own phase is not the one at 1:\n%s", b)
	}
	value(t, fams, "provider_kubernetes_certificate_expiry_timestamp_seconds", map[string]string{"certificate": status.Printable(d.Certificates.Soonest.Name), "ca": "false"})
	if got := value(t, fams, "provider_kubernetes_phase", map[string]string{"phase": status.PhaseConverged}); got != 0 {
		t.Fatal("converged")
	}
}

func TestDir(t *testing.T) {
	for _, c := range []struct {
		cfg  map[string]string
		want string
		bad  bool
	}{
		{nil, DefaultDir, false},
		{map[string]string{"budget.verify": "6m"}, DefaultDir, false},
		{map[string]string{Key: "off"}, "", false},
		{map[string]string{Key: " /srv/textfiles "}, "/srv/textfiles", false},
		{map[string]string{Key: "srv/textfiles"}, "", true},
		{map[string]string{Key: "/srv/../etc"}, "", true},
		{map[string]string{Key: "/srv/textfiles/"}, "", true},
		{map[string]string{Key: "/"}, "", true},
		{map[string]string{Key: ""}, "", true},
		{map[string]string{Key: "/srv/a b"}, "", true},
		{map[string]string{Key: "/srv/\x1b[2J"}, "", true},
		{map[string]string{Key: "/" + strings.Repeat("a", 300)}, "", true},
	} {
		got, err := Dir(c.cfg)
		if got != c.want || (err != nil) != c.bad {
			t.Errorf("Dir(%q) = %q, %v", c.cfg, got, err)
		}
		if err != nil && (strings.Contains(err.Error(), "\x1b") || !strings.Contains(err.Error(), Key)) {
			t.Errorf("error %q quotes the value or does not name the key", err)
		}
	}
}

func TestWrite(t *testing.T) {
	root := t.TempDir()
	d := controlPlaneDoc()
	if err := Write(paths.Root(root), DefaultDir, d); err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(root, DefaultDir, File)
	b, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	parse(t, b)
	if st, err := os.Stat(full); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v %v", st.Mode(), err)
	}
	if st, err := os.Stat(filepath.Dir(full)); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("dir mode %v %v", st.Mode(), err)
	}
	// Rewritten in place, atomically (no .part left).
	d.Phase = status.PhaseFailed
	if err := Write(paths.Root(root), DefaultDir, d); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(full)); len(ents) != 1 {
		t.Fatalf("left %v", ents)
	}
	// Off: nothing written.
	if err := Write(paths.Root(root), "", d); err != nil {
		t.Fatal(err)
	}

	// A directory others may write, another user's, or reached through a
	// symlink is not written.
	loose := filepath.Join(root, "loose")
	if err := os.Mkdir(loose, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := Write(paths.Root(root), "/loose", d); err == nil || fileExists(filepath.Join(loose, File)) {
		t.Fatalf("wrote into a world-writable directory: %v", err)
	}
	// reference.md: "a directory that is not root's own or that group or
	// others may write is not written".
	group := filepath.Join(root, "group")
	if err := os.Mkdir(group, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(group, 0o775); err != nil {
		t.Fatal(err)
	}
	if err := Write(paths.Root(root), "/group", d); err == nil || fileExists(filepath.Join(group, File)) {
		t.Fatalf("wrote into a group-writable directory: %v", err)
	}
	if os.Geteuid() == 0 {
		foreign := filepath.Join(root, "foreign")
		if err := os.Mkdir(foreign, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(foreign, 1000, 1000); err != nil {
			t.Fatal(err)
		}
		if err := Write(paths.Root(root), "/foreign", d); err == nil || fileExists(filepath.Join(foreign, File)) {
			t.Fatalf("wrote into another user's directory: %v", err)
		}
	}
	target := t.TempDir()
	if err := os.Symlink(target, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := Write(paths.Root(root), "/link/textfiles", d); !errors.Is(err, fsutil.ErrSymlink) || fileExists(filepath.Join(target, "textfiles")) {
		t.Fatalf("followed a symlink: %v", err)
	}
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
