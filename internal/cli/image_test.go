package cli

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/journal"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/unitmigrate"
	"github.com/kairos-io/provider-kubernetes/system"
)

type recJournal struct{ msgs []string }

func (r *recJournal) Send(m string, _ journal.Priority, _ map[string]string) error {
	r.msgs = append(r.msgs, m)
	return nil
}

type countReloader struct{ n int }

func (c *countReloader) Reload(context.Context) error { c.n++; return nil }

func TestMigrateUnitsCommand(t *testing.T) {
	j, rl := &recJournal{}, &countReloader{}
	oldJ, oldR := newJournal, newReloader
	newJournal = func(io.Writer) unitmigrate.Journal { return j }
	newReloader = func() unitmigrate.Reloader { return rl }
	defer func() { newJournal, newReloader = oldJ, oldR }()

	root := t.TempDir()
	r, _ := system.Shipped().ReleaseNamed("v0.3.0")
	for _, f := range r.Files {
		b, err := system.History("v0.3.0", f.Path)
		if err != nil {
			t.Fatal(err)
		}
		p := paths.Root(root).Path(f.Path)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, b, 0o644)
	}
	code, _, errOut := run("migrate-units", "--root", root)
	if code != reconcile.ExitOK || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "msg=migrate-units") ||
		!strings.Contains(errOut, "removed=4") || !strings.Contains(errOut, "skipped: not the host root") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if rl.n != 0 {
		t.Fatal("reloaded the host's systemd for a sandbox root")
	}
	// An edited copy: kept, named in the journal, exit 1.
	p := paths.Root(root).Path("/etc/systemd/system/kubelet.service")
	os.WriteFile(p, []byte("[Service]\nExecStart=/usr/bin/kubelet --mine\n"), 0o644)
	code, _, errOut = run("migrate-units", "--root", root)
	if code != reconcile.ExitFailed || len(j.msgs) != 1 || !strings.Contains(j.msgs[0], "/etc/systemd/system/kubelet.service") ||
		!strings.Contains(errOut, "outcome=kept-edited") {
		t.Fatalf("exit %d: %s %v", code, errOut, j.msgs)
	}
	if code, _, _ := run("migrate-units", "--root", "relative"); code != reconcile.ExitUsage {
		t.Fatalf("relative root: %d", code)
	}
	if code, _, _ := run("migrate-units", "extra"); code != reconcile.ExitUsage {
		t.Fatalf("extra argument: %d", code)
	}
}

func TestImportImagesCommandWithoutBundle(t *testing.T) {
	code, _, errOut := run("import-images", "--root", t.TempDir(), "--address", "/nonexistent.sock")
	if code != reconcile.ExitFailed || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "msg=import-images") ||
		!strings.Contains(errOut, paths.ImagesDir) {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if code, _, _ := run("import-images", "--bogus"); code != reconcile.ExitUsage {
		t.Fatalf("bad flag: %d", code)
	}
}
