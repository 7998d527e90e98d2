package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/system"
	"github.com/kairos-io/provider-kubernetes/tests/e2e/harness"
)

// Units on real systemd (issue 17): a node upgraded from v0.3.0 still has
// that release's unit copies and .wants links in /etc/systemd/system. On
// the first boot of this image the migration unit removes the byte-identical
// ones with a real reload, keeps an edited one and fails visibly, and the
// image's own units run that same boot. The image's units are static
// (no [Install]); `systemctl mask kubelet` keeps the kubelet off across a
// reboot. No cluster section: no kubeadm, only systemd.
func TestUnitsOnRealSystemd(t *testing.T) {
	harness.Require(t)
	tr := osTrees(t, "1.37")
	c := harness.New(t, harness.Options{Base: base(t)})
	n, err := c.AddNode(context.Background(), harness.NodeSpec{Name: "n1", Tree: tr["1.37"]})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.WriteCloudConfig([]byte("#cloud-config\nhostname: n1\n")); err != nil {
		t.Fatal(err)
	}
	// v0.3.0's copies and links, as that release left them; the import
	// unit's copy edited by the operator.
	rel, ok := system.Shipped().ReleaseNamed("v0.3.0")
	if !ok {
		t.Fatal("no v0.3.0 in shipped.yaml")
	}
	const edited = system.EtcUnitDir + "/" + system.ImageImport
	var editedBytes []byte
	for _, f := range rel.Files {
		b, err := system.History("v0.3.0", f.Path)
		if err != nil {
			t.Fatal(err)
		}
		if f.Path == edited {
			b = append(b, []byte("# an operator's edit: kept, named, and the migration unit fails\n")...)
			editedBytes = b
		}
		if err := n.WriteFile(f.Path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range rel.Links {
		p := filepath.Join(n.Upper(), l.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(l.Target, p); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	progress(t, "n1: booting with v0.3.0's unit copies in /etc/systemd/system")
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if state, err := n.WaitSystem(ctx, 5*time.Minute); err != nil || state != "degraded" {
		t.Fatalf("systemd %q %v, want degraded (the migration unit fails on purpose)", state, err)
	}
	out := func(args ...string) string {
		t.Helper()
		o, _ := n.Output(ctx, args...) // is-enabled and is-failed exit non-zero for some answers
		return o
	}
	failed, err := n.FailedUnits(ctx)
	if err != nil || strings.Join(failed, " ") != system.UnitMigrate {
		t.Fatalf("failed units %v %v, want only %s", failed, err, system.UnitMigrate)
	}
	if j, err := n.UnitJournal(ctx, system.UnitMigrate); err != nil || !strings.Contains(j, edited) || !strings.Contains(j, "outcome=kept-edited") {
		t.Fatalf("the migration's journal does not name the kept copy (%v):\n%s", err, j)
	}
	for _, f := range rel.Files {
		_, err := n.Output(ctx, "test", "-e", f.Path)
		if f.Path == edited {
			if b, rerr := n.ReadFile(f.Path); rerr != nil || string(b) != string(editedBytes) {
				t.Fatalf("the edited copy was not kept as it was: %v", rerr)
			}
			continue
		}
		if err == nil {
			t.Fatalf("%s, byte-identical to v0.3.0's, was not removed", f.Path)
		}
	}
	for _, l := range rel.Links {
		if _, err := n.Output(ctx, "test", "-L", l.Path); err == nil && l.Path != system.EtcUnitDir+"/multi-user.target.wants/"+system.ImageImport {
			t.Fatalf("v0.3.0's link %s was not removed", l.Path)
		}
	}
	// The reload happened this boot: the image's units are what systemd
	// runs now, the kept copy still shadows its own.
	for unit, want := range map[string]string{
		system.Kubelet:     system.UnitDir + "/" + system.Kubelet,
		system.Reconcile:   system.UnitDir + "/" + system.Reconcile,
		system.ImageImport: edited,
	} {
		if got := out("systemctl", "show", "-p", "FragmentPath", "--value", unit); merged(got) != want {
			t.Fatalf("%s runs from %q, want %s", unit, got, want)
		}
	}
	if got := out("systemctl", "show", "-p", "DropInPaths", "--value", system.Kubelet); merged(got) != system.UnitDir+"/"+system.KubeadmDropIn {
		t.Fatalf("kubelet's drop-ins %q, want the image's only", got)
	}
	if got := out("systemctl", "show", "-p", "Result", "--value", system.ImageImport); got != "success" {
		t.Fatalf("the (kept) import unit: %q", got)
	}
	// Static: no [Install]; disable is a no-op, mask works.
	for _, u := range []string{system.Reconcile, system.UnitMigrate, system.Publish} {
		if got := out("systemctl", "is-enabled", u); got != "static" {
			t.Fatalf("systemctl is-enabled %s: %q, want static", u, got)
		}
	}
	if got := out("systemctl", "is-enabled", system.Kubelet); got != "static" {
		t.Fatalf("systemctl is-enabled kubelet: %q, want static", got)
	}
	if _, err := n.Output(ctx, "systemctl", "mask", system.Kubelet); err != nil {
		t.Fatal(err)
	}
	progress(t, "n1: kubelet masked; rebooting")
	if err := n.Reboot(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.WaitSystem(ctx, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := out("systemctl", "is-enabled", system.Kubelet); got != "masked" {
		t.Fatalf("after the reboot kubelet is %q, want masked", got)
	}
	if got := out("systemctl", "show", "-p", "ActiveState", "--value", system.Kubelet); got != "inactive" {
		t.Fatalf("a masked kubelet is %q after the reboot", got)
	}
	if l, err := n.Output(ctx, "readlink", system.EtcUnitDir+"/"+system.Kubelet); err != nil || l != "/dev/null" {
		t.Fatalf("the mask is gone after the reboot's migration: %q %v", l, err)
	}
	progress(t, "n1: v0.3.0 copies migrated on real systemd, edited copy kept, units static, mask held across a reboot")
}

// merged is a path as merged-/usr names it: systemd may report
// /lib/systemd/system (a symlink to usr/lib in the base) for /usr/lib/systemd/system.
func merged(p string) string {
	if strings.HasPrefix(p, "/lib/") {
		return "/usr" + p
	}
	return p
}
