package unitmigrate

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/coreos/go-systemd/v22/journal"
	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/system"
)

type entry struct {
	msg  string
	prio journal.Priority
	vars map[string]string
}

type fakeJournal struct {
	mu sync.Mutex
	e  []entry
}

func (j *fakeJournal) Send(m string, p journal.Priority, v map[string]string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.e = append(j.e, entry{m, p, v})
	return nil
}

func (j *fakeJournal) paths() []string {
	var out []string
	for _, e := range j.e {
		out = append(out, e.vars["PROVIDER_KUBERNETES_UNIT_PATH"])
	}
	return out
}

type fakeReloader struct {
	n   int
	err error
}

func (r *fakeReloader) Reload(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		return errors.New("reload without a deadline")
	}
	r.n++
	return r.err
}

type sandbox struct {
	t    *testing.T
	root string
	j    *fakeJournal
	r    *fakeReloader
	log  bytes.Buffer
}

func newSandbox(t *testing.T) *sandbox {
	return &sandbox{t: t, root: t.TempDir(), j: &fakeJournal{}, r: &fakeReloader{}}
}

func (s *sandbox) p(host string) string { return paths.Root(s.root).Path(host) }

func (s *sandbox) write(host string, b []byte) {
	s.t.Helper()
	if err := os.MkdirAll(filepath.Dir(s.p(host)), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(s.p(host), b, 0o644); err != nil {
		s.t.Fatal(err)
	}
}

func (s *sandbox) link(host, target string) {
	s.t.Helper()
	if err := os.MkdirAll(filepath.Dir(s.p(host)), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Symlink(target, s.p(host)); err != nil {
		s.t.Fatal(err)
	}
}

func (s *sandbox) exists(host string) bool {
	_, err := os.Lstat(s.p(host))
	return err == nil
}

// bootOldImage plays an older image's boot: immucore copies the files and
// links of that release that are missing from /etc.
func (s *sandbox) bootOldImage(release string) {
	s.t.Helper()
	r, ok := system.Shipped().ReleaseNamed(release)
	if !ok {
		s.t.Fatalf("no release %s", release)
	}
	for _, f := range r.Files {
		if s.exists(f.Path) {
			continue
		}
		b, err := system.History(release, f.Path)
		if err != nil {
			s.t.Fatal(err)
		}
		s.write(f.Path, b)
	}
	for _, l := range r.Links {
		if !s.exists(l.Path) {
			s.link(l.Path, l.Target)
		}
	}
}

func (s *sandbox) run() Result {
	s.log.Reset()
	return Run(context.Background(), Options{
		Root: paths.Root(s.root), Manifest: system.Shipped(), Journal: s.j, Reloader: s.r,
		Log: slog.New(slog.NewTextHandler(&s.log, nil)),
	})
}

func (s *sandbox) summary() string {
	s.t.Helper()
	lines := strings.Split(strings.TrimSpace(s.log.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "msg=migrate-units") {
		s.t.Fatalf("want exactly one summary line, got %q", s.log.String())
	}
	return lines[0]
}

func v030() system.Release {
	r, _ := system.Shipped().ReleaseNamed("v0.3.0")
	return r
}

func TestClean(t *testing.T) {
	s := newSandbox(t)
	res := s.run()
	if res.ExitCode != 0 || res.Outcome() != "clean" || len(res.Removed)+len(res.Kept) != 0 || s.r.n != 0 || len(s.j.e) != 0 {
		t.Fatalf("%+v reloads=%d journal=%v", res, s.r.n, s.j.e)
	}
	if l := s.summary(); !strings.Contains(l, "outcome=clean") || !strings.Contains(l, "reloaded=false") {
		t.Fatal(l)
	}
}

func TestMigrated(t *testing.T) {
	s := newSandbox(t)
	s.bootOldImage("v0.3.0")
	r := v030()
	res := s.run()
	if res.ExitCode != 0 || res.Outcome() != "migrated" || s.r.n != 1 || !res.Reloaded {
		t.Fatalf("%+v reloads=%d", res, s.r.n)
	}
	if len(res.Removed) != len(r.Files)+len(r.Links) {
		t.Fatalf("removed %v", res.Removed)
	}
	for _, p := range res.Removed {
		if s.exists(p) {
			t.Errorf("%s still there", p)
		}
	}
	if l := s.summary(); !strings.Contains(l, "outcome=migrated") || !strings.Contains(l, "removed=7") ||
		!strings.Contains(l, "/etc/systemd/system/kubelet.service") {
		t.Fatal(l)
	}
	// A second boot of the same image finds nothing and does not reload.
	res = s.run()
	if res.Outcome() != "clean" || s.r.n != 1 {
		t.Fatalf("second run %+v reloads=%d", res, s.r.n)
	}
}

func TestEditedCopyKept(t *testing.T) {
	s := newSandbox(t)
	s.bootOldImage("v0.3.0")
	edited := []byte(strings.Replace(mustHistory(t, "/etc/systemd/system/kubelet.service"), "RestartSec=10", "RestartSec=3", 1))
	s.write("/etc/systemd/system/kubelet.service", edited)
	res := s.run()
	if res.ExitCode == 0 || res.Outcome() != "kept-edited" {
		t.Fatalf("edited copy must fail the run: %+v", res)
	}
	if got, _ := os.ReadFile(s.p("/etc/systemd/system/kubelet.service")); !bytes.Equal(got, edited) {
		t.Fatal("edited copy was changed")
	}
	if len(res.Kept) != 1 || res.Kept[0] != "/etc/systemd/system/kubelet.service" {
		t.Fatalf("kept %v", res.Kept)
	}
	if len(s.j.e) != 1 || s.j.e[0].prio != journal.PriWarning || s.j.e[0].vars["PROVIDER_KUBERNETES_UNIT_PATH"] != "/etc/systemd/system/kubelet.service" ||
		!strings.Contains(s.j.e[0].msg, "/etc/systemd/system/kubelet.service.d/") {
		t.Fatalf("journal %+v", s.j.e)
	}
	// The rest was still migrated and systemd reloaded.
	if len(res.Removed) != 6 || s.r.n != 1 || s.exists("/etc/systemd/system/provider-kubernetes-reconcile.service") {
		t.Fatalf("removed %v reloads %d", res.Removed, s.r.n)
	}
	if l := s.summary(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "kept=1") || !strings.Contains(l, "kept_paths=/etc/systemd/system/kubelet.service") {
		t.Fatal(l)
	}
	// An operator's copy of a current unit in /etc is kept the same way.
	s2 := newSandbox(t)
	for _, f := range system.Units() {
		if strings.HasSuffix(f.Path, "/"+system.Reconcile) {
			s2.write("/etc/systemd/system/"+system.Reconcile, f.Data)
		}
	}
	if res := s2.run(); res.ExitCode == 0 || len(res.Kept) != 1 || s2.r.n != 0 {
		t.Fatalf("copy of the current unit: %+v", res)
	}
}

// Drop-ins of the operator's own names are never read or touched, alone
// or alongside a migration.
func TestDropInsUntouched(t *testing.T) {
	s := newSandbox(t)
	op := []byte("[Service]\nEnvironment=HTTP_PROXY=http://proxy:3128\n")
	s.write("/etc/systemd/system/kubelet.service.d/20-proxy.conf", op)
	s.write("/etc/systemd/system/provider-kubernetes-reconcile.service.d/override.conf", op)
	st0, _ := os.Stat(s.p("/etc/systemd/system/kubelet.service.d/20-proxy.conf"))
	res := s.run()
	if res.ExitCode != 0 || res.Outcome() != "clean" || len(res.Removed) != 0 || s.r.n != 0 || len(s.j.e) != 0 {
		t.Fatalf("%+v reloads=%d journal=%v", res, s.r.n, s.j.e)
	}
	for _, p := range []string{"/etc/systemd/system/kubelet.service.d/20-proxy.conf", "/etc/systemd/system/provider-kubernetes-reconcile.service.d/override.conf"} {
		if got, err := os.ReadFile(s.p(p)); err != nil || !bytes.Equal(got, op) {
			t.Errorf("%s changed: %v", p, err)
		}
	}
	st1, _ := os.Stat(s.p("/etc/systemd/system/kubelet.service.d/20-proxy.conf"))
	if !st0.ModTime().Equal(st1.ModTime()) {
		t.Error("operator drop-in modified")
	}
	// Alongside a migration (which removes v0.3.0's own, unedited
	// kubelet.service.d/10-kubeadm.conf), the operator's drop-ins stay.
	s.bootOldImage("v0.3.0")
	res = s.run()
	if res.ExitCode != 0 || len(res.Removed) != 7 || !s.exists("/etc/systemd/system/kubelet.service.d/20-proxy.conf") ||
		!s.exists("/etc/systemd/system/provider-kubernetes-reconcile.service.d/override.conf") ||
		s.exists("/etc/systemd/system/kubelet.service.d/10-kubeadm.conf") {
		t.Fatalf("%+v", res)
	}
}

// An edited copy of v0.3.0's kubelet.service.d/10-kubeadm.conf has the name
// of the image's own drop-in: systemd reads the /etc one instead of
// /usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf, so the image's
// version would never apply again. It is an edited copy like any other
// (upgrades.md: kept, named in the journal, the unit fails) until the
// changes move into a drop-in of the operator's own name.
func TestEditedShippedDropInFails(t *testing.T) {
	s := newSandbox(t)
	s.bootOldImage("v0.3.0")
	edited := []byte(mustHistory(t, "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf") + "Environment=X=1\n")
	s.write("/etc/systemd/system/kubelet.service.d/10-kubeadm.conf", edited)
	op := []byte("[Service]\nEnvironment=HTTP_PROXY=http://proxy:3128\n")
	s.write("/etc/systemd/system/kubelet.service.d/20-proxy.conf", op)

	res := s.run()
	if res.ExitCode != 1 || res.Outcome() != "kept-edited" {
		t.Fatalf("an edited 10-kubeadm.conf must fail the run: %+v", res)
	}
	if len(res.Kept) != 1 || res.Kept[0] != "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf" {
		t.Fatalf("kept %v", res.Kept)
	}
	if got, err := os.ReadFile(s.p("/etc/systemd/system/kubelet.service.d/10-kubeadm.conf")); err != nil || !bytes.Equal(got, edited) {
		t.Fatalf("the edited copy changed: %v", err)
	}
	if got, err := os.ReadFile(s.p("/etc/systemd/system/kubelet.service.d/20-proxy.conf")); err != nil || !bytes.Equal(got, op) {
		t.Fatalf("the operator's drop-in changed: %v", err)
	}
	if len(s.j.e) != 1 || s.j.e[0].prio != journal.PriWarning ||
		s.j.e[0].vars["PROVIDER_KUBERNETES_UNIT_PATH"] != "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf" ||
		!strings.Contains(s.j.e[0].msg, "replaces the image's /usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf") ||
		!strings.Contains(s.j.e[0].msg, "a drop-in of your own name in /etc/systemd/system/kubelet.service.d/") {
		t.Fatalf("journal %+v", s.j.e)
	}
	// The rest of v0.3.0 is still migrated, systemd reloaded.
	if len(res.Removed) != 6 || s.r.n != 1 {
		t.Fatalf("removed %v reloads %d", res.Removed, s.r.n)
	}
	if l := s.summary(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "outcome=kept-edited") ||
		!strings.Contains(l, "kept_paths=/etc/systemd/system/kubelet.service.d/10-kubeadm.conf") {
		t.Fatal(l)
	}
	// Every boot says it again until the changes move.
	if res := s.run(); res.ExitCode != 1 || len(res.Kept) != 1 {
		t.Fatalf("second boot: %+v", res)
	}

	// Moved into a drop-in of the operator's own name: nothing to say.
	s.write("/etc/systemd/system/kubelet.service.d/20-local.conf", []byte("[Service]\nEnvironment=X=1\n"))
	if err := os.Remove(s.p("/etc/systemd/system/kubelet.service.d/10-kubeadm.conf")); err != nil {
		t.Fatal(err)
	}
	s.j.e = nil
	if res := s.run(); res.ExitCode != 0 || res.Outcome() != "clean" || len(s.j.e) != 0 || !s.exists("/etc/systemd/system/kubelet.service.d/20-local.conf") {
		t.Fatalf("after the move: %+v journal %v", res, s.j.e)
	}
}

func TestSymlinkNotFollowed(t *testing.T) {
	elsewhere := t.TempDir()
	// Byte-identical to what v0.3.0 shipped: following the link would "recognise" it.
	unit := mustHistory(t, "/etc/systemd/system/kubelet.service")
	dropin := mustHistory(t, "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf")
	if err := os.WriteFile(filepath.Join(elsewhere, "kubelet.service"), []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(elsewhere, "10-kubeadm.conf"), []byte(dropin), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newSandbox(t)
	s.link("/etc/systemd/system/kubelet.service", filepath.Join(elsewhere, "kubelet.service"))
	s.link("/etc/systemd/system/kubelet.service.d", elsewhere)
	// A planted directory symlink on the way to a .wants link.
	wantsElsewhere := t.TempDir()
	if err := os.Symlink("/etc/systemd/system/provider-kubernetes-reconcile.service", filepath.Join(wantsElsewhere, "provider-kubernetes-reconcile.service")); err != nil {
		t.Fatal(err)
	}
	s.link("/etc/systemd/system/multi-user.target.wants", wantsElsewhere)
	res := s.run()
	if res.ExitCode == 0 || len(res.Removed) != 0 || s.r.n != 0 {
		t.Fatalf("%+v", res)
	}
	for _, p := range []string{filepath.Join(elsewhere, "kubelet.service"), filepath.Join(elsewhere, "10-kubeadm.conf"),
		filepath.Join(wantsElsewhere, "provider-kubernetes-reconcile.service")} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s removed through a symlink: %v", p, err)
		}
	}
	if !s.exists("/etc/systemd/system/kubelet.service") {
		t.Error("the planted link itself was removed")
	}
	kept := strings.Join(res.Kept, ",")
	for _, p := range []string{"/etc/systemd/system/kubelet.service", "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf",
		"/etc/systemd/system/multi-user.target.wants/provider-kubernetes-reconcile.service"} {
		if !strings.Contains(kept, p) {
			t.Errorf("%s not reported as kept: %s", p, kept)
		}
	}
	// A mask is the operator's choice: kept, not a failure.
	m := newSandbox(t)
	m.link("/etc/systemd/system/kubelet.service", "/dev/null")
	if res := m.run(); res.ExitCode != 0 || len(res.Noted) != 1 || !m.exists("/etc/systemd/system/kubelet.service") {
		t.Fatalf("mask: %+v", res)
	}
}

func TestRollbackRoundTrip(t *testing.T) {
	s := newSandbox(t)
	edited := "[Service]\nExecStart=/usr/bin/kubelet --v=4\n"
	for i := 1; i <= 3; i++ {
		// Boot the older image: it recreates its missing copies and runs them.
		s.bootOldImage("v0.3.0")
		if i == 2 {
			s.write("/etc/systemd/system/provider-kubernetes-image-import.service", []byte(edited))
		}
		if !s.exists("/etc/systemd/system/multi-user.target.wants/kubelet.service") {
			t.Fatal("old image did not recreate its links")
		}
		// Come back to this release: they are removed again, one reload.
		res := s.run()
		if s.r.n != i || !res.Reloaded {
			t.Fatalf("round %d: reloads %d", i, s.r.n)
		}
		wantKept := 0
		if i >= 2 {
			wantKept = 1 // the edited copy keeps being kept, and the unit keeps failing
		}
		if len(res.Kept) != wantKept || (wantKept == 1) != (res.ExitCode != 0) {
			t.Fatalf("round %d: %+v", i, res)
		}
		for _, p := range res.Removed {
			if s.exists(p) {
				t.Fatalf("round %d: %s still there", i, p)
			}
		}
		s.summary()
	}
	if got, _ := os.ReadFile(s.p("/etc/systemd/system/provider-kubernetes-image-import.service")); string(got) != edited {
		t.Fatal("edited copy lost across round trips")
	}
}

func TestReloadFailure(t *testing.T) {
	s := newSandbox(t)
	s.bootOldImage("v0.3.0")
	s.r.err = errors.New("connection refused")
	res := s.run()
	if res.ExitCode == 0 || res.Outcome() != "failed" || res.Reloaded || len(res.Removed) != 7 {
		t.Fatalf("%+v", res)
	}
	if l := s.summary(); !strings.Contains(l, "connection refused") {
		t.Fatal(l)
	}
	// No reloader (--root is not the host): removed, not reloaded, not a failure.
	s2 := newSandbox(t)
	s2.bootOldImage("v0.3.0")
	res = Run(context.Background(), Options{Root: paths.Root(s2.root), Manifest: system.Shipped(), Log: slog.New(slog.NewTextHandler(&s2.log, nil))})
	if res.ExitCode != 0 || res.Reloaded || len(res.Removed) != 7 || !strings.Contains(s2.log.String(), "skipped") {
		t.Fatalf("%+v %s", res, s2.log.String())
	}
}

func TestDecide(t *testing.T) {
	m := system.Shipped()
	r := v030()
	f, l := r.Files[0], r.Links[0]
	for _, c := range []struct {
		o    Observed
		want Action
	}{
		{Observed{Path: f.Path, Kind: Absent}, Nothing},
		{Observed{Path: f.Path, Kind: Regular, SHA256: f.SHA256}, Remove},
		{Observed{Path: f.Path, Kind: Regular, SHA256: strings.Repeat("0", 64)}, KeepEdited},
		{Observed{Path: f.Path, Kind: Regular, SHA256: ""}, KeepEdited}, // too big
		// An edited v0.3.0 drop-in whose name the image ships shadows it.
		{Observed{Path: "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf", Kind: Regular, SHA256: strings.Repeat("0", 64)}, KeepEdited},
		// A drop-in name the image does not ship: the operator's, left.
		{Observed{Path: "/etc/systemd/system/kubelet.service.d/05-old.conf", Kind: Regular, SHA256: strings.Repeat("0", 64)}, KeepDropIn},
		{Observed{Path: f.Path, Kind: Symlink, Target: "/dev/null"}, KeepMasked},
		{Observed{Path: f.Path, Kind: Symlink, Target: "/usr/lib/systemd/system/kubelet.service"}, KeepEdited},
		{Observed{Path: l.Path, Kind: Symlink, Target: l.Target}, Remove},
		{Observed{Path: l.Path, Kind: Symlink, Target: "../kubelet.service"}, KeepEdited},
		{Observed{Path: l.Path, Kind: Regular, SHA256: f.SHA256}, KeepEdited}, // right bytes, wrong path
		{Observed{Path: f.Path, Kind: Other}, KeepEdited},
		{Observed{Path: f.Path, Kind: Unsafe}, KeepEdited},
	} {
		if d := Decide(c.o, m); d.Action != c.want {
			t.Errorf("%+v: %s, want %s", c.o, d.Action, c.want)
		}
	}
}

func mustHistory(t *testing.T, p string) string {
	t.Helper()
	b, err := system.History("v0.3.0", p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Without systemd as PID 1 the real reloader fails at once, bounded, rather
// than hanging the boot (the unit runs before most of it).
func TestSystemdReloaderWithoutSystemd(t *testing.T) {
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		// systemd runs here: hide it (its private socket and the system
		// bus) behind empty tmpfs mounts in a private mount namespace,
		// rather than skip or reload the host's systemd.
		if !testutil.InPrivateMountNamespace(t) {
			return
		}
		for _, d := range []string{"/run/systemd", "/run/dbus"} {
			if _, err := os.Stat(d); err != nil {
				continue
			}
			if err := unix.Mount("tmpfs", d, "tmpfs", 0, "mode=0755"); err != nil {
				t.Fatalf("hide %s: %v", d, err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), ReloadBudget)
	defer cancel()
	if err := (SystemdReloader{}).Reload(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("reload without systemd: %v (ctx %v)", err, ctx.Err())
	}
}
