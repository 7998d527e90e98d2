package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pluggable "github.com/mudler/go-pluggable"

	"github.com/kairos-io/provider-kubernetes/internal/etcdsnap"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/plugin"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// cliLimit bounds one command over a sandbox with a special file planted:
// a hang guard (the process is killed), far above what the refusal takes.
const cliLimit = 30 * time.Second

type cliRun struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// execCLI runs the test binary as the command line (TestMain hands it to
// entry) in its own process, so a command that hangs is killed at the
// bound instead of taking the test binary with it.
func execCLI(t *testing.T, args ...string) cliRun {
	t.Helper()
	cmd := testutil.Command(t, cliLimit, os.Args[0], args...)
	cmd.Env = append(os.Environ(), pluginRootEnv+"=/")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := cliRun{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	if err != nil && r.code == -1 {
		t.Fatalf("%v: killed after %s (hung?): %v\n%s", args, r.took, err, r.stderr)
	}
	return r
}

// TestCommandsRefuseSpecialFilesAtOnce: a FIFO (or socket, or directory)
// at a path a command reads or appends to is a clear error naming the path,
// within milliseconds; before, the open blocked forever.
func TestCommandsRefuseSpecialFilesAtOnce(t *testing.T) {
	cases := []struct {
		name  string
		setup func(n *testutil.Node)
		path  string
		args  []string
		code  int
		// out is what stdout or stderr must hold besides "<path> is a FIFO".
		out string
	}{
		{"reconcile log", nil, paths.ReconcileLog, []string{"reconcile"}, reconcile.ExitFailed, "open reconcile log"},
		{"cluster file", func(n *testutil.Node) { n.Bundle("v1.37.2") }, paths.ClusterFile, []string{"reconcile"}, reconcile.ExitRefused, "refuse-bootstrap"},
		{"plan's cluster file", func(n *testutil.Node) { n.Bundle("v1.37.2") }, paths.ClusterFile, []string{"plan"}, reconcile.ExitRefused, "REFUSE InvalidPin"},
		{"bundle manifest", func(n *testutil.Node) { n.ClusterFile("init", "v1.37.2", "") }, paths.BundleManifest, []string{"plan"}, reconcile.ExitRefused, "BundledVersionUnknown"},
		{"status file", nil, paths.StatusFile, []string{"status"}, reconcile.ExitFailed, "status:"},
		{"etcd manifest", nil, paths.EtcdManifest, []string{"etcd-snapshot", "--target", "v1.37.2"}, reconcile.ExitFailed, "outcome=failed"},
		{"join-config's cluster file", nil, paths.ClusterFile, []string{"join-config", "--role", "worker"}, reconcile.ExitFailed, "join-config:"},
		{"reset's boot id", func(n *testutil.Node) { n.Write(paths.Kubeadm, "#!/bin/sh\nexit 0\n", 0o755) }, paths.BootID, []string{"reset", "--yes"}, reconcile.ExitOK, "Phase:           Reset"},
	}
	for _, c := range cases {
		for _, kind := range []string{testutil.FIFO, testutil.Socket, testutil.Directory} {
			if kind != testutil.FIFO && c.path != paths.ReconcileLog && c.path != paths.StatusFile {
				continue
			}
			t.Run(c.name+"/"+kind, func(t *testing.T) {
				n := testutil.NewNode(t, "n1")
				testutil.ShortRoot(t, n)
				if c.setup != nil {
					c.setup(n)
				}
				full := n.Path(c.path)
				_ = os.Remove(full)
				testutil.Plant(t, full, kind)
				r := execCLI(t, append(c.args, "--root", n.Root)...)
				t.Logf("%s: exit %d in %s", c.args[0], r.code, r.took)
				all := r.stdout + r.stderr
				if r.code != c.code || !strings.Contains(all, c.out) {
					t.Fatalf("exit %d (want %d), want %q in:\n%s", r.code, c.code, c.out, all)
				}
				if c.path == paths.BootID {
					return // optional: the reset goes on without it
				}
				what := map[string]string{testutil.FIFO: "a FIFO", testutil.Socket: "a socket", testutil.Directory: "a directory"}[kind]
				if !strings.Contains(all, full+" is "+what) {
					t.Fatalf("nothing names %q:\n%s", full+" is "+what, all)
				}
			})
		}
	}
}

// The event file kairos-agent hands over for data over 8 KiB: a FIFO there
// is refused at once, naming it.
func TestPluginRefusesAFIFOAsTheEventFile(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "pluggable123")
	testutil.Plant(t, fifo, testutil.FIFO)
	root := t.TempDir()
	start := time.Now()
	r := execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", pluggable.Event{Name: plugin.EventBoot, File: fifo})
	if r.code == 0 || !strings.Contains(r.resp.Error, fifo+" is a FIFO") {
		t.Fatalf("%+v", r)
	}
	if took := time.Since(start); took > cliLimit/2 {
		t.Fatalf("took %s", took)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("wrote %v", entries)
	}
}

// TestReconcileLogHardLinkAndLooseMode: a hard link planted at the
// reconcile log never makes the provider append to the linked file, and a
// log that existed world-writable (anyone could forge its
// "etcd-snapshot outcome=" lines) gets its 0640 back.
func TestReconcileLogHardLinkAndLooseMode(t *testing.T) {
	t.Run("hard link", func(t *testing.T) {
		n := testutil.NewNode(t, "n1")
		victim := filepath.Join(t.TempDir(), "passwd")
		const data = "root:x:0:0:root:/root:/bin/sh\n"
		if err := os.WriteFile(victim, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(n.Path("/var/log"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(victim, n.Path(paths.ReconcileLog)); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"reconcile"}, {"reset", "--yes"}, {"etcd-snapshot", "--target", "v1.37.2"}} {
			code, _, errOut := run(append(args, "--root", n.Root)...)
			if code != reconcile.ExitFailed || !strings.Contains(errOut, "open reconcile log") || !strings.Contains(errOut, "hard link") {
				t.Fatalf("%v: exit %d %s", args, code, errOut)
			}
		}
		if b, _ := os.ReadFile(victim); string(b) != data {
			t.Fatalf("appended to the linked file: %q", b)
		}
	})
	t.Run("loose mode", func(t *testing.T) {
		n := testutil.NewNode(t, "n1")
		n.Write(paths.ReconcileLog, "forged etcd-snapshot outcome=taken\n", 0o666)
		if err := os.Chmod(n.Path(paths.ReconcileLog), 0o666); err != nil {
			t.Fatal(err)
		}
		var before syscall.Stat_t
		if err := syscall.Stat(n.Path(paths.ReconcileLog), &before); err != nil {
			t.Fatal(err)
		}
		// Opened while it was 0666: a chmod would not take this back.
		held, err := os.OpenFile(n.Path(paths.ReconcileLog), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		run("reconcile", "--root", n.Root)
		if _, err := held.WriteString("msg=etcd-snapshot outcome=taken forged-after-the-pass\n"); err != nil {
			t.Fatal(err)
		}
		var after syscall.Stat_t
		if err := syscall.Stat(n.Path(paths.ReconcileLog), &after); err != nil {
			t.Fatal(err)
		}
		if after.Mode&0o7777 != 0o640 || after.Ino == before.Ino {
			t.Fatalf("log mode %o, inode %d -> %d: not replaced", after.Mode&0o7777, before.Ino, after.Ino)
		}
		if b := n.Read(paths.ReconcileLog); strings.Contains(b, "outcome=taken") || !strings.Contains(b, "msg=reconcile-start") {
			t.Fatalf("log:\n%s", b)
		}
	})
}

// hostile holds what a file can smuggle into a value: a carriage return,
// cursor movement, erase-line, a newline starting a fake line, a bidi
// override, a C1 control and a byte that is not UTF-8.
const hostile = "v1.37.2\r\x1b[1A\x1b[2KVerdict:  nothing to do\nMessage:  converged\u202e\u0085\xff"

// printedSafely: every line the person sees starts with one of the labels,
// and no control or format character reaches the terminal.
func printedSafely(t *testing.T, out string, labels ...string) {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		ok := false
		for _, p := range labels {
			ok = ok || strings.HasPrefix(l, p)
		}
		if !ok {
			t.Errorf("a line no label starts (injected?): %q", l)
		}
		for _, r := range l {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u202e' {
				t.Errorf("control character %U printed in %q", r, l)
			}
		}
	}
	if strings.Contains(out, "\nVerdict:  nothing to do") {
		t.Errorf("a fake verdict was printed:\n%s", out)
	}
}

// TestPlanEscapesValuesReadFromFiles: a pin holding newlines and escape
// codes cannot print a fake "nothing to do" over the real refusal: it
// fails validation, so it is described, never printed.
func TestPlanEscapesValuesReadFromFiles(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	yamlEscaped := `"v1.37.2\r\e[1A\e[2KVerdict:  nothing to do\nMessage:  converged\u202e\x85"`
	n.ClusterFile("init", yamlEscaped, "")
	n.Bundle("v1.37.2")
	code, out, errOut := run("plan", "--root", n.Root)
	if code != reconcile.ExitRefused || !strings.Contains(out, "REFUSE InvalidPin") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	printedSafely(t, out, "Facts:", "Verdict:", "Actions:", "Message:", "Warning:", "Observed:", "          ")
	// A pin that fails validation is described, not printed (escaped or not).
	if strings.Contains(out, "nothing to do") || !strings.Contains(out, "pin=<a value of 64 characters, not shown>") {
		t.Fatalf("the pin is not described:\n%s", out)
	}
}

// TestStatusTextEscapesEveryField: status -o text prints every value of
// the document escaped; -o json stays exact to the stored document, which
// holds every value escaped as written (status.Write).
func TestStatusTextEscapesEveryField(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	d := status.Document{Phase: hostile, Reason: hostile, Refusal: hostile, Message: hostile, Warnings: []string{hostile, hostile},
		Role: hostile, Pin: hostile, Bundled: hostile, NodeVersion: hostile, ClusterVersion: hostile, Actions: []string{hostile},
		LastAction: hostile, EtcdSnapshot: hostile, KubeadmEtcdBackups: &status.Backups{Count: 2, Dir: hostile}, Time: hostile, BootID: hostile}
	if err := status.Write(n.R(), d); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run("status", "--root", n.Root)
	if code != 0 {
		t.Fatalf("exit %d %s", code, errOut)
	}
	labels := []string{}
	for _, l := range []string{"Phase", "Reason", "Refusal", "Message", "Role", "Member", "Pin", "Bundled kubeadm", "Node version",
		"Cluster version", "Planned actions", "Last action", "etcd snapshot", "kubeadm backups", "Warning", "Time", "Boot ID"} {
		labels = append(labels, l+":")
	}
	printedSafely(t, out, labels...)
	if got := strings.Count(out, "\n"); got != 18 {
		t.Fatalf("%d lines, want 18:\n%s", got, out)
	}
	code, out, _ = run("status", "--root", n.Root, "-o", "json")
	var back status.Document
	stored, err := status.Read(n.R(), paths.StatusFile)
	if err != nil || code != 0 || json.Unmarshal([]byte(out), &back) != nil || back.Pin != stored.Pin || !strings.Contains(back.Pin, `\x1b[2K`) || strings.Contains(back.Pin, "\x1b") {
		t.Fatalf("json: %q (%v)", out, err)
	}
}

// TestLoggedValuesCannotForgeAField: an etcd error saying
// "x etcd-snapshot outcome=taken" sits in a failed line's error value; the
// grep docs/backups.md gives finds that line once, as failed, and the
// value still reads back whole.
func TestLoggedValuesCannotForgeAField(t *testing.T) {
	page, err := os.ReadFile("../../docs/backups.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`grep '(etcd-snapshot outcome=)' ` + regexp.QuoteMeta(paths.ReconcileLog)).FindSubmatch(page)
	if m == nil {
		t.Fatal("docs/backups.md gives no grep for the etcd-snapshot outcome")
	}
	documented := regexp.MustCompile(string(m[1])) // a basic regular expression without metacharacters
	n := testutil.NewNode(t, "cp1")
	log, f, err := reconcileLogger(n.R(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const forged = "x etcd-snapshot outcome=taken"
	log.Error(etcdsnap.Event, "outcome", string(etcdsnap.Failed), "reason", "snapshot save failed", "error", forged)
	log.Info("note", "detail", `a "quoted" msg=reconcile-done \ level=ERROR`)
	f.Close()
	var hits []string
	for _, l := range strings.Split(strings.TrimSpace(n.Read(paths.ReconcileLog)), "\n") {
		for _, g := range documented.FindAllStringIndex(l, -1) {
			hits = append(hits, l[g[1]:])
		}
		// The other documented greps (msg=..., level=...) neither.
		if strings.Contains(l, "msg=note") && (strings.Contains(l, "msg=reconcile-done") || strings.Contains(l, "level=ERROR")) {
			t.Errorf("a value forged a field: %s", l)
		}
	}
	if len(hits) != 1 || !strings.HasPrefix(hits[0], "failed ") {
		t.Fatalf("the documented grep matched %d times: %q", len(hits), hits)
	}
	q := regexp.MustCompile(` error=("(?:[^"\\]|\\.)*")`).FindStringSubmatch(hits[0])
	if q == nil {
		t.Fatalf("no quoted error in %s", hits[0])
	}
	if v, err := strconv.Unquote(q[1]); err != nil || v != forged {
		t.Fatalf("error value reads back as %q (%v)", v, err)
	}
}
