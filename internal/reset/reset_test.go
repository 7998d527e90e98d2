package reset

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// sandbox is a node root (base/root) planted with what a control plane
// leaves, symlinks planted to escape it, and victims outside it
// (base/victim) that must survive.
type sandbox struct {
	t    *testing.T
	base string
	root string
}

func (s *sandbox) path(p string) string { return filepath.Join(s.root, p) }

func (s *sandbox) write(p, content string) {
	s.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

func (s *sandbox) symlink(target, p string) {
	s.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		s.t.Fatal(err)
	}
}

func (s *sandbox) mkdir(p string) {
	s.t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		s.t.Fatal(err)
	}
}

// newSandbox lays out the directories; mount sets up mounts (or nothing)
// on the three emptied directories before they are filled.
func newSandbox(t *testing.T, base string, mount func(s *sandbox)) *sandbox {
	s := &sandbox{t: t, base: base, root: filepath.Join(base, "root")}
	s.write(filepath.Join(base, "victim", "victim.txt"), "victim\n")
	s.write(filepath.Join(base, "victim", "dir", "f"), "victim dir file\n")
	s.write(s.path(paths.BootID), "b007\n")
	s.write(s.path(paths.ClusterFile), "role: init\n")
	s.write(s.path(paths.EtcdBackupDir+"/etcd-v1.37.2.db"), "snapshot\n")
	for _, d := range Emptied {
		s.mkdir(s.path(d))
	}
	if mount != nil {
		mount(s)
	}
	victim := filepath.Join(base, "victim")
	k := s.path(paths.KubernetesDir)
	s.write(k+"/admin.conf", "admin\n")
	s.write(k+"/manifests/etcd.yaml", "etcd\n")
	s.write(k+"/manifests/kube-apiserver.yaml", "apiserver\n")
	s.write(k+"/pki/ca.crt", "ca\n")
	s.write(k+"/pki/etcd/ca.key", "etcd ca key\n")
	s.write(k+"/tmp/kubeadm-backup-etcd-2026-11-29-12-00-00/member/snap/db", "every secret\n")
	s.write(k+"/tmp/kubeadm-backup-manifests-2026-11-29-12-00-00/etcd.yaml", "etcd\n")
	s.symlink(victim, k+"/tmp/kubeadm-backup-etcd-2026-11-30-00-00-00") // a backup-named symlink: unlinked, never followed
	s.symlink(victim, k+"/escape-abs")
	s.symlink("../../../../victim", k+"/pki/escape-rel")
	s.symlink(victim+"/victim.txt", k+"/escape-file")
	if err := os.Link(filepath.Join(victim, "victim.txt"), k+"/hardlink"); err != nil && !isCrossDevice(err) {
		t.Fatal(err)
	}
	kl := s.path(paths.KubeletDir)
	s.write(kl+"/config.yaml", "kubelet\n")
	s.write(kl+"/pods/p1/volumes/kubernetes.io~secret/token/token", "sa token\n")
	s.symlink(s.path(paths.EtcdBackupDir), kl+"/backup-abs")
	s.symlink(paths.EtcdBackupDir, kl+"/backup-host")
	if err := unix.Mkfifo(kl+"/fifo", 0o600); err != nil {
		t.Fatal(err)
	}
	e := s.path(paths.EtcdDir)
	s.write(e+"/member/snap/db", "etcd db\n")
	s.write(e+"/member/wal/0.wal", "wal\n")
	s.symlink("../../../usr/local/provider-kubernetes/etcd-backup", e+"/backup-rel")
	s.symlink(victim+"/dir", e+"/member/escape")
	return s
}

func isCrossDevice(err error) bool { return strings.Contains(err.Error(), "cross-device") }

// inventory lists every path under dir (not following symlinks), with a
// type mark, relative to dir.
func inventory(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			rel += "@"
		case d.IsDir():
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func runReset(t *testing.T, root string) (Result, *runner.Recorder, string) {
	t.Helper()
	rec := &runner.Recorder{}
	var logBuf bytes.Buffer
	res := Run(context.Background(), Options{Root: paths.Root(root), Runner: rec, Log: slog.New(slog.NewTextHandler(&logBuf, nil))})
	return res, rec, logBuf.String()
}

// What every reset must leave: the victims, the snapshots, the cluster file.
var survivors = []string{
	"victim/", "victim/dir/", "victim/dir/f", "victim/victim.txt",
	"root/usr/local/provider-kubernetes/etcd-backup/", "root/usr/local/provider-kubernetes/etcd-backup/etcd-v1.37.2.db",
	"root/run/provider-kubernetes/cluster.yaml",
}

func assertSurvivors(t *testing.T, s *sandbox) {
	t.Helper()
	inv := inventory(t, s.base)
	for _, want := range survivors {
		if !contains(inv, want) {
			t.Errorf("%s was removed", want)
		}
	}
	for p, want := range map[string]string{"victim/victim.txt": "victim\n", "victim/dir/f": "victim dir file\n",
		"root/usr/local/provider-kubernetes/etcd-backup/etcd-v1.37.2.db": "snapshot\n"} {
		if b, err := os.ReadFile(filepath.Join(s.base, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// below returns the inventory entries under prefix (excluding prefix itself).
func below(inv []string, prefix string) []string {
	var out []string
	for _, p := range inv {
		if strings.HasPrefix(p, prefix) && p != prefix {
			out = append(out, p)
		}
	}
	return out
}

// On plain directories: everything below the three directories goes, the
// directories stay, no planted symlink is followed.
func TestResetEmptiesWithoutFollowingSymlinks(t *testing.T) {
	s := newSandbox(t, t.TempDir(), nil)
	res, rec, log := runReset(t, s.root)
	if res.ExitCode != 0 || res.Status.Phase != status.PhaseReset {
		t.Fatalf("%d %+v %v", res.ExitCode, res.Status, res.Err)
	}
	if got := rec.Lines(); !reflect.DeepEqual(got, []string{"/usr/bin/kubeadm reset -f"}) {
		t.Fatalf("ran %q", got)
	}
	// reference.md, providerConfig: "Fixed bounds: `kubeadm reset -f` 5m".
	if got := rec.Cmds()[0].Timeout; got != 5*time.Minute {
		t.Fatalf("kubeadm reset -f is bounded at %s, docs/reference.md says 5m", got)
	}
	inv := inventory(t, s.base)
	for _, d := range Emptied {
		rel := "root" + d + "/"
		if !contains(inv, rel) {
			t.Fatalf("%s was removed", d)
		}
		if left := below(inv, rel); len(left) != 0 {
			t.Fatalf("left under %s: %v", d, left)
		}
	}
	assertSurvivors(t, s)
	if len(res.Status.Warnings) != 1 || res.Status.Warnings[0] != EtcdMemberWarning || !strings.Contains(log, "msg=reset-warning") {
		t.Fatalf("stacked etcd warning: %v\n%s", res.Status.Warnings, log)
	}
	st, err := status.Read(paths.Root(s.root), paths.StatusFile)
	if err != nil || st.Phase != status.PhaseReset || st.Member {
		t.Fatalf("status %+v %v", st, err)
	}
	if !strings.Contains(log, "msg=reset outcome=reset") {
		t.Fatalf("log:\n%s", log)
	}
	// Exactly this is left under the root.
	want := []string{"root/", "root/etc/", "root/etc/kubernetes/", "root/proc/", "root/proc/sys/", "root/proc/sys/kernel/",
		"root/proc/sys/kernel/random/", "root/proc/sys/kernel/random/boot_id", "root/run/", "root/run/provider-kubernetes/",
		"root/run/provider-kubernetes/cluster.yaml", "root/run/provider-kubernetes/reconcile.lock", "root/run/provider-kubernetes/status.yaml",
		"root/usr/", "root/usr/local/", "root/usr/local/provider-kubernetes/", "root/usr/local/provider-kubernetes/etcd-backup/",
		"root/usr/local/provider-kubernetes/etcd-backup/etcd-v1.37.2.db", "root/usr/local/provider-kubernetes/status.yaml",
		"root/var/", "root/var/lib/", "root/var/lib/etcd/", "root/var/lib/kubelet/"}
	if got := below(inv, ""); !reflect.DeepEqual(filterRoot(got), want) {
		t.Fatalf("left:\n%s\nwant:\n%s", strings.Join(filterRoot(got), "\n"), strings.Join(want, "\n"))
	}
}

func filterRoot(inv []string) []string {
	var out []string
	for _, p := range inv {
		if strings.HasPrefix(p, "root/") {
			out = append(out, p)
		}
	}
	return out
}

// A symlink in place of one of the directories, or of a parent, is refused
// before kubeadm runs (kubeadm reset -f would empty the directory it points
// to): exit 3, UnsafePath, no command, nothing removed, no status written.
func TestResetRefusesASymlinkedDirectory(t *testing.T) {
	check := func(name string, s *sandbox, named string) {
		t.Helper()
		// The lock file as a pass leaves it, so a reset that changes
		// nothing leaves the tree exactly as it was.
		unlock, err := reconcile.Lock(paths.Root(s.root))
		if err != nil {
			t.Fatal(err)
		}
		unlock()
		before := inventory(t, s.base)
		res, rec, log := runReset(t, s.root)
		if res.ExitCode != reconcile.ExitRefused || res.Status.Reason != ReasonUnsafePath || !errors.Is(res.Err, ErrSymlink) ||
			!strings.Contains(res.Status.Message, named+": is a symlink: not followed") || !strings.Contains(log, "outcome=refused") {
			t.Fatalf("%s: %+v\n%s", name, res, log)
		}
		if len(rec.Lines()) != 0 {
			t.Fatalf("%s: ran %q", name, rec.Lines())
		}
		if after := inventory(t, s.base); !reflect.DeepEqual(after, before) {
			t.Fatalf("%s: a refused reset changed files:\nbefore %v\nafter  %v", name, before, after)
		}
		assertSurvivors(t, s)
	}
	s := newSandbox(t, t.TempDir(), nil)
	s.write(s.path(paths.KubernetesDir+"/admin.conf"), "kubeconfig\n")
	etcd := s.path(paths.EtcdDir)
	if err := os.RemoveAll(etcd); err != nil {
		t.Fatal(err)
	}
	s.symlink(filepath.Join(s.base, "victim"), etcd)
	check("symlinked /var/lib/etcd", s, "/var/lib/etcd")

	// A symlinked parent (/var) is refused the same way.
	s2 := newSandbox(t, t.TempDir(), nil)
	if err := os.Rename(s2.path("/var"), s2.path("/var.real")); err != nil {
		t.Fatal(err)
	}
	s2.symlink("var.real", s2.path("/var"))
	check("symlinked /var", s2, "/var")
}

// A failed kubeadm reset is reported; the directories are emptied anyway.
func TestResetReportsKubeadmFailure(t *testing.T) {
	s := newSandbox(t, t.TempDir(), nil)
	rec := &runner.Recorder{Reply: func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		return runner.Result{ExitCode: 1}, &runner.ExitError{Cmd: c.Short(), Code: 1, Tail: "boom"}
	}}
	res := Run(context.Background(), Options{Root: paths.Root(s.root), Runner: rec})
	if res.Status.Phase != status.PhaseResetFailed || res.Status.Reason != ReasonKubeadmResetFailed || !strings.Contains(res.Status.Message, "boom") {
		t.Fatalf("%+v", res.Status)
	}
	if left := below(inventory(t, s.base), "root/var/lib/etcd/"); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
}

// A node without kubeadm (the real runner, nothing at /usr/bin/kubeadm
// under the root): the status says the binary is missing, not that kubeadm
// exited 0.
func TestResetWithoutKubeadmSaysItIsMissing(t *testing.T) {
	s := newSandbox(t, t.TempDir(), nil)
	res := Run(context.Background(), Options{Root: paths.Root(s.root), Runner: runner.Exec{Root: s.root}})
	if res.ExitCode != reconcile.ExitFailed || res.Status.Reason != ReasonKubeadmResetFailed || !errors.Is(res.Err, runner.ErrMissing) {
		t.Fatalf("exit %d %v: %+v", res.ExitCode, res.Err, res.Status)
	}
	if msg := res.Status.Message; strings.Contains(msg, "exit status") || !strings.Contains(msg, "binary missing: no file at "+paths.Kubeadm) {
		t.Fatalf("message %q", msg)
	}
}

// The private mount namespace test: the child re-executes this test with
// RESET_NS_CHILD set, in its own mount namespace (mounts made there vanish
// with it), as root.
const nsChildEnv = "PROVIDER_KUBERNETES_RESET_NS_CHILD"

func TestResetOnRealMountsInAPrivateMountNamespace(t *testing.T) {
	if dir := os.Getenv(nsChildEnv); dir != "" {
		nsChild(t, dir)
		return
	}
	testutil.RequireRoot(t)
	for _, scenario := range []string{"clean", "busy"} {
		t.Run(scenario, func(t *testing.T) {
			base := t.TempDir()
			cmd := testutil.Command(t, 10*time.Minute, os.Args[0], "-test.run=^TestResetOnRealMountsInAPrivateMountNamespace$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), nsChildEnv+"="+base, "RESET_NS_SCENARIO="+scenario)
			cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // Go also makes / rprivate in the child
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "--- PASS") {
				t.Fatalf("child: %v\n%s", err, out)
			}
			t.Logf("child:\n%s", out)
			// Back in the test's own namespace: what the bind mounts exposed.
			s := &sandbox{t: t, base: base, root: filepath.Join(base, "root")}
			assertSurvivors(t, s)
			// The bind mount sources were emptied through the mounts; in the
			// busy case only the directories leading to the tmpfs mount point stay.
			want := map[string][]string{"binds/etc-kubernetes/": nil, "binds/etcd/": nil}
			if scenario == "busy" {
				want["binds/etc-kubernetes/"] = []string{"binds/etc-kubernetes/pki/", "binds/etc-kubernetes/pki/etcd/"}
			}
			for d, w := range want {
				if left := below(inventory(t, base), d); !reflect.DeepEqual(left, w) {
					t.Fatalf("bind mount source %s: left %v, want %v", d, left, w)
				}
			}
			if scenario == "busy" {
				if b, err := os.ReadFile(filepath.Join(base, "volume", "token")); err != nil || string(b) != "pod secret\n" {
					t.Fatalf("the reset went into a pod volume mount: %q %v", b, err)
				}
			}
		})
	}
}

func mustMount(t *testing.T, src, dst, fstype string, flags uintptr) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, dst, fstype, flags, ""); err != nil {
		t.Fatalf("mount %s on %s: %v", src, dst, err)
	}
}

func nsChild(t *testing.T, base string) {
	scenario := os.Getenv("RESET_NS_SCENARIO")
	s := newSandbox(t, base, func(s *sandbox) {
		// As on Kairos: the three directories are mount points. Two are
		// bind mounts of the same filesystem (same st_dev, another mount).
		for dir, src := range map[string]string{paths.KubernetesDir: "etc-kubernetes", paths.EtcdDir: "etcd"} {
			s.mkdir(filepath.Join(base, "binds", src))
			mustMount(t, filepath.Join(base, "binds", src), s.path(dir), "", unix.MS_BIND)
		}
		mustMount(t, "tmpfs", s.path(paths.KubeletDir), "tmpfs", 0)
	})
	var wantBusy []string
	if scenario == "busy" {
		// A pod volume still mounted (a bind mount of the same filesystem
		// as the sandbox) and a tmpfs inside /etc/kubernetes.
		vol := s.path(paths.KubeletDir + "/pods/p1/volumes/kubernetes.io~secret/token")
		s.write(filepath.Join(base, "volume", "token"), "pod secret\n")
		if err := os.RemoveAll(vol); err != nil {
			t.Fatal(err)
		}
		mustMount(t, filepath.Join(base, "volume"), vol, "", unix.MS_BIND)
		if err := os.RemoveAll(s.path(paths.KubernetesDir + "/pki/etcd")); err != nil {
			t.Fatal(err)
		}
		mustMount(t, "tmpfs", s.path(paths.KubernetesDir+"/pki/etcd"), "tmpfs", 0)
		s.write(s.path(paths.KubernetesDir+"/pki/etcd/ca.key"), "etcd ca key\n")
		wantBusy = []string{"/etc/kubernetes/pki/etcd", "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~secret/token"}
	}
	res, _, _ := runReset(t, s.root)
	inv := inventory(t, s.base)
	assertSurvivors(t, s)
	switch scenario {
	case "clean":
		if res.ExitCode != 0 || res.Status.Phase != status.PhaseReset {
			t.Fatalf("%+v %v", res.Status, res.Err)
		}
		for _, d := range Emptied {
			if left := below(inv, "root"+d+"/"); len(left) != 0 {
				t.Fatalf("left under %s: %v", d, left)
			}
		}
	case "busy":
		if res.ExitCode != 1 || res.Status.Phase != status.PhaseResetFailed || res.Status.Reason != ReasonMountBusy {
			t.Fatalf("%+v", res.Status)
		}
		for _, b := range wantBusy {
			if !strings.Contains(res.Status.Message, b) {
				t.Fatalf("message %q does not name %s", res.Status.Message, b)
			}
		}
		if !strings.Contains(res.Status.Message, "unmount them") {
			t.Fatalf("message %q", res.Status.Message)
		}
		// Exactly the mount points and their contents are left, with the
		// directories leading to them.
		want := map[string][]string{
			"root/etc/kubernetes/": {"root/etc/kubernetes/pki/", "root/etc/kubernetes/pki/etcd/", "root/etc/kubernetes/pki/etcd/ca.key"},
			"root/var/lib/kubelet/": {"root/var/lib/kubelet/pods/", "root/var/lib/kubelet/pods/p1/", "root/var/lib/kubelet/pods/p1/volumes/",
				"root/var/lib/kubelet/pods/p1/volumes/kubernetes.io~secret/", "root/var/lib/kubelet/pods/p1/volumes/kubernetes.io~secret/token/",
				"root/var/lib/kubelet/pods/p1/volumes/kubernetes.io~secret/token/token"},
			"root/var/lib/etcd/": nil,
		}
		for d, w := range want {
			if got := below(inv, d); !reflect.DeepEqual(got, w) {
				t.Fatalf("under %s left %v, want %v", d, got, w)
			}
		}
	}
}

// A reset refused because a pass holds the node's lock changes nothing:
// no command, nothing removed, both status files as they were.
func TestLockedResetChangesNothing(t *testing.T) {
	s := newSandbox(t, t.TempDir(), nil)
	root := paths.Root(s.root)
	if err := status.Write(root, status.Document{Phase: status.PhaseUpgrading, LastAction: "upgrade-apply", Time: "2026-11-29T12:00:00Z"}); err != nil {
		t.Fatal(err)
	}
	unlock, err := reconcile.Lock(root) // the running pass
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	before := inventory(t, s.base)
	var statusBefore []string
	for _, p := range []string{paths.StatusFile, paths.StatusMirror} {
		statusBefore = append(statusBefore, string(mustRead(t, s.path(p))))
	}

	res, rec, log := runReset(t, s.root)
	if res.ExitCode != reconcile.ExitRefused || !errors.Is(res.Err, reconcile.ErrLocked) ||
		res.Status.Phase != status.PhaseResetFailed || res.Status.Reason != ReasonLocked {
		t.Fatalf("%+v", res)
	}
	if len(rec.Lines()) != 0 {
		t.Fatalf("ran %q", rec.Lines())
	}
	if after := inventory(t, s.base); !reflect.DeepEqual(after, before) {
		t.Fatalf("files changed:\nbefore %v\nafter  %v", before, after)
	}
	for i, p := range []string{paths.StatusFile, paths.StatusMirror} {
		if got := string(mustRead(t, s.path(p))); got != statusBefore[i] {
			t.Fatalf("%s rewritten by a refused reset:\n%s", p, got)
		}
	}
	if !strings.Contains(log, "msg=reset outcome=refused reason=Locked") {
		t.Fatalf("log:\n%s", log)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
