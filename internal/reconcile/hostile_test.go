package reconcile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// hangLimit bounds a pass over a sandbox with a special file planted: a
// hang guard, far above the milliseconds the refusal takes.
const hangLimit = 20 * time.Second

// TestSpecialFilesDoNotHangThePass plants a FIFO (and the other special
// files) at every path a pass reads, locks or appends to. The pass must
// end within the bound; where the file is needed, with an error naming
// the path and what is there.
func TestSpecialFilesDoNotHangThePass(t *testing.T) {
	clientCert := "/var/lib/kubelet/pki/kubelet-client-current.pem"
	cases := []struct {
		role string
		path string
		// named: the pass's log or error must name the path as a FIFO
		// (false where the file is optional and the pass goes on without it).
		named bool
	}{
		{"worker", paths.ClusterFile, true},
		{"worker", paths.BundleManifest, true},
		{"worker", paths.KubeletConf, true},
		{"worker", clientCert, true},
		{"worker", testutil.KubeletClientCert, true}, // the rotation link's target
		{"worker", paths.LockFile, true},
		{"worker", paths.KubeadmLog, true},
		{"worker", paths.StatusMirror, false}, // the worker's record: the Node answers instead
		{"worker", paths.BootID, false},
		{"worker", paths.Hostname, false},
		{"controlplane", paths.APIServerManifest, true},
		{"controlplane", paths.ManifestsDir + "/kube-scheduler.yaml", true},
		{"controlplane", paths.AdminConf, false},    // kubelet.conf answers
		{"controlplane", paths.KubeadmTmpDir, true}, // kubeadm's backups, counted in every status
	}
	for _, c := range cases {
		for _, kind := range []string{testutil.FIFO, testutil.Socket, testutil.Directory} {
			if kind != testutil.FIFO && c.path != paths.ClusterFile && c.path != paths.KubeadmLog {
				continue // every path gets a FIFO; two get the other kinds too
			}
			t.Run(c.role+c.path+"/"+kind, func(t *testing.T) {
				e := newEnv(t, c.role, "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "  upgradeConfiguration:\n    node:\n      ignorePreflightErrors: [all]\n")
				testutil.ShortRoot(t, e.node)
				full := e.node.Path(c.path)
				if err := os.RemoveAll(full); err != nil {
					t.Fatal(err)
				}
				testutil.Plant(t, full, kind)
				var res Result
				took := testutil.Within(t, hangLimit, "a pass with a "+kind+" at "+c.path, func() { res = e.run(Steps{}) },
					func() { testutil.Unblock(full) })
				t.Logf("%s at %s: exit %d in %s", kind, c.path, res.ExitCode, took)
				if !c.named {
					return
				}
				all := e.logBuf.String()
				if res.Err != nil {
					all += res.Err.Error()
				}
				if b, err := os.ReadFile(e.node.Path(paths.StatusFile)); err == nil {
					all += string(b) // the status' warnings
				}
				want := c.path + " is " + map[string]string{testutil.FIFO: "a FIFO", testutil.Socket: "a socket", testutil.Directory: "a directory"}[kind]
				if !strings.Contains(all, want) {
					t.Fatalf("nothing names %q:\nerr %v\n%s", want, res.Err, e.logBuf.String())
				}
			})
		}
	}
}

// victim is a file outside the provider's paths (a copy of /etc/passwd)
// that a hard link planted at a written path points to.
type victim struct {
	path string
	data string
}

func plantLink(t *testing.T, e *env, hostPath string) victim {
	t.Helper()
	v := victim{path: filepath.Join(t.TempDir(), "passwd"), data: "root:x:0:0:root:/root:/bin/sh\n"}
	if err := os.WriteFile(v.path, []byte(v.data), 0o644); err != nil {
		t.Fatal(err)
	}
	full := e.node.Path(hostPath)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(full)
	if err := os.Link(v.path, full); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v victim) intact(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(v.path)
	st, _ := os.Stat(v.path)
	if err != nil || string(b) != v.data || st.Mode().Perm() != 0o644 {
		t.Fatalf("the hard-linked file was written through: %q mode %v %v", b, st.Mode(), err)
	}
}

func modeOf(t *testing.T, p string) (os.FileMode, uint64, uint32) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return os.FileMode(st.Mode & 0o7777), uint64(st.Nlink), st.Uid
}

// TestWrittenPathsRefuseHardLinksAndLooseModes: a hard link planted at the
// kubeadm log or a status file never makes the pass write into the linked
// file; files found with a looser mode get their documented one; the
// kubeadm work directory owned by another user is not reused.
func TestWrittenPathsRefuseHardLinksAndLooseModes(t *testing.T) {
	testutil.RequireRoot(t)
	t.Run("hard links", func(t *testing.T) {
		e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "  upgradeConfiguration:\n    apply:\n      ignorePreflightErrors: [all]\n")
		victims := map[string]victim{}
		for _, p := range []string{paths.KubeadmLog, paths.StatusFile, paths.StatusMirror, UpgradeConfigPath} {
			victims[p] = plantLink(t, e, p)
		}
		res := e.run(Steps{})
		if res.ExitCode != ExitOK {
			t.Fatalf("exit %d: %v\n%s", res.ExitCode, res.Err, e.logBuf.String())
		}
		for p, v := range victims {
			t.Logf("%s: checking the linked file", p)
			v.intact(t)
		}
		// The kubeadm log is refused (a warning names it), not appended through.
		e.logHas(t, "msg=kubeadm-log-unwritable", e.node.Path(paths.KubeadmLog), "hard link")
		for _, p := range []string{paths.StatusFile, paths.StatusMirror} {
			if mode, nlink, uid := modeOf(t, e.node.Path(p)); mode != 0o644 || nlink != 1 || uid != 0 {
				t.Fatalf("%s: mode %o, %d links, uid %d", p, mode, nlink, uid)
			}
		}
	})
	t.Run("a hard link at the lock file refuses the pass", func(t *testing.T) {
		e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
		v := plantLink(t, e, paths.LockFile)
		res := e.run(Steps{})
		if res.ExitCode != ExitFailed || !errors.Is(res.Err, fsutil.ErrHardLink) || len(e.lines()) != 0 {
			t.Fatalf("exit %d %v, ran %q", res.ExitCode, res.Err, e.lines())
		}
		v.intact(t)
	})
	t.Run("loose modes are tightened", func(t *testing.T) {
		e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "")
		for _, p := range []string{paths.KubeadmLog, paths.StatusFile, paths.StatusMirror, paths.LockFile} {
			e.node.Write(p, "", 0o666)
			if err := os.Chmod(e.node.Path(p), 0o666); err != nil {
				t.Fatal(err)
			}
		}
		for _, d := range []string{paths.RunDir, paths.PersistDir} {
			if err := os.Chmod(e.node.Path(d), 0o777); err != nil {
				t.Fatal(err)
			}
		}
		if res := e.run(Steps{}); res.ExitCode != ExitOK {
			t.Fatalf("exit %d: %v", res.ExitCode, res.Err)
		}
		for p, want := range map[string]os.FileMode{paths.KubeadmLog: 0o600, paths.StatusFile: 0o644, paths.StatusMirror: 0o644,
			paths.LockFile: 0o600, paths.RunDir: 0o755, paths.PersistDir: 0o755} {
			if mode, _, _ := modeOf(t, e.node.Path(p)); mode != want {
				t.Errorf("%s: mode %o, want %o", p, mode, want)
			}
		}
		if b := e.node.Read(paths.KubeadmLog); !strings.Contains(b, "upgrade apply") {
			t.Fatalf("kubeadm log %q", b)
		}
	})
	t.Run("a work directory owned by another user is replaced", func(t *testing.T) {
		e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.36.3", "v1.36.3", "  upgradeConfiguration:\n    apply:\n      ignorePreflightErrors: [all]\n")
		tmp := e.node.Path(paths.TmpDir)
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			t.Fatal(err)
		}
		planted := filepath.Join(tmp, "planted")
		if err := os.WriteFile(planted, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(tmp, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		// The config kubeadm is handed lives in a directory only root can write.
		var dirUID uint32 = 1 << 31
		var dirMode os.FileMode
		inner := e.rec.Reply
		e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
			if strings.HasPrefix(c.String(), "/usr/bin/kubeadm upgrade apply") {
				dirMode, _, dirUID = modeOf(t, filepath.Dir(c.Args[len(c.Args)-1]))
			}
			return inner(ctx, c)
		}
		if res := e.run(Steps{}); res.ExitCode != ExitOK {
			t.Fatalf("exit %d: %v", res.ExitCode, res.Err)
		}
		if dirUID != 0 || dirMode != 0o700 {
			t.Fatalf("kubeadm's config was in a directory of uid %d mode %o", dirUID, dirMode)
		}
		if _, err := os.Stat(planted); !os.IsNotExist(err) {
			t.Fatalf("the foreign directory was reused: %v", err)
		}
	})
}

// TestInterruptedPassSaysSo: a pass whose context is cancelled (what
// SIGTERM does through main's signal.NotifyContext) while a command runs
// ends with status Failed, reason Interrupted, naming the action, and runs
// nothing after it. (cmd/provider-kubernetes proves the signal, the
// process group and the lock with the real binary.)
func TestInterruptedPassSaysSo(t *testing.T) {
	e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
	ctx, cancel := context.WithCancelCause(context.Background())
	inner := e.rec.Reply
	e.rec.Reply = func(c context.Context, cmd runner.Cmd) (runner.Result, error) {
		if strings.HasPrefix(cmd.String(), "/usr/bin/kubeadm upgrade node") {
			cancel(errors.New("terminated signal received"))
			<-c.Done()
			return runner.Result{ExitCode: -1}, &runner.ExitError{Cmd: cmd.Short(), Code: -1, Canceled: true}
		}
		return inner(c, cmd)
	}
	res := Run(ctx, Options{Root: e.node.R(), Runner: e.rec, Clock: e.clock, Log: e.logger(), Steps: Steps{},
		EtcdHealthy: func(context.Context) error { return nil }})
	if res.ExitCode != ExitFailed {
		t.Fatalf("exit %d", res.ExitCode)
	}
	st := e.status(t)
	if st.Phase != status.PhaseFailed || st.Reason != ReasonInterrupted || st.LastAction != "upgrade-node" ||
		!strings.Contains(st.Message, "interrupted (terminated signal received) during upgrade-node") {
		t.Fatalf("status %+v", st)
	}
	if got := e.lines(); got[len(got)-1] != "/usr/bin/kubeadm upgrade node" {
		t.Fatalf("ran after the interruption: %q", got)
	}
	e.logHas(t, "msg="+EventDone, "outcome=failed", "reason="+ReasonInterrupted)
}

// Hostile host, round 2, class 4: a root-owned verified-version record (or
// a worker's status mirror) inside a directory uid 1000 owns, or that is
// 0777, could have been planted by uid 1000: it is not trusted. A control
// plane whose apply was interrupted (manifests at the pin, the cluster
// still behind) resumes the apply instead of reporting converged; a worker
// whose planted mirror says it is at the pin asks the API instead.
func TestRecordsInAnUntrustedDirectoryAreNotTrusted(t *testing.T) {
	testutil.RequireRoot(t)
	untrust := map[string]func(string) error{
		"chowned-1000": func(p string) error { return os.Chown(p, 1000, 1000) },
		"0777":         func(p string) error { return os.Chmod(p, 0o777) },
	}
	for name, mod := range untrust {
		for _, dir := range []string{paths.PersistDir, "/usr/local"} {
			t.Run("controlplane/"+name+dir, func(t *testing.T) {
				e := newEnv(t, "controlplane", "v1.37.2", "v1.37.2", "v1.37.2", "v1.36.3", "")
				e.node.Write(paths.VerifiedRecord, "v1.37.2\n", 0o644)
				if err := mod(e.node.Path(dir)); err != nil {
					t.Fatal(err)
				}
				res := e.run(Steps{})
				if res.ExitCode != ExitOK || !res.Plan.Has(plan.ActionUpgradeApply) {
					t.Fatalf("exit %d %v plan %v %s: want the interrupted apply resumed", res.ExitCode, res.Err, res.Plan.Actions, res.Plan.Message)
				}
				e.logHas(t, "verified version", "not root")
			})
			t.Run("worker/"+name+dir, func(t *testing.T) {
				// The worker is at v1.36.3 (its Node says so); the planted
				// mirror and record say v1.37.2, the pin.
				e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
				e.node.Write(paths.VerifiedRecord, "v1.37.2\n", 0o644)
				if err := status.Write(e.node.R(), status.Document{Phase: status.PhaseConverged, Member: true, NodeVersion: "v1.37.2"}); err != nil {
					t.Fatal(err)
				}
				if err := mod(e.node.Path(dir)); err != nil {
					t.Fatal(err)
				}
				res := e.run(Steps{})
				if res.ExitCode != ExitOK || !res.Plan.Has(plan.ActionUpgradeNode) {
					t.Fatalf("exit %d %v plan %v %s: want the upgrade the planted records hid", res.ExitCode, res.Err, res.Plan.Actions, res.Plan.Message)
				}
			})
		}
	}
}

// Hostile host, round 2, class 8: a DEL or C1 control in the pin or in
// kubeadm's error line made the status write fail, and `status` showed the
// previous boot's Converged. The status of a pass is that pass's, escaped.
func TestControlBytesInPinAndKubeadmErrorStillWriteThisPassStatus(t *testing.T) {
	for _, bad := range []string{"\x7f", "\u009b", "\u0085"} {
		t.Run("pin"+status.Printable(bad), func(t *testing.T) {
			// YAML's double-quoted escapes put the byte in the parsed pin.
			e := newEnv(t, "worker", `"v1.37.2`+strings.TrimPrefix(strconv.QuoteToASCII(bad), `"`), "v1.37.2", "v1.36.3", "v1.37.2", "")
			res := e.run(Steps{})
			d, src, err := status.ReadCurrent(e.node.R())
			if err != nil || src != paths.StatusFile {
				t.Fatalf("status: %s %v", src, err)
			}
			if d.Phase != res.Status.Phase || d.Time == "" || d.Time != res.Status.Time {
				t.Fatalf("status shows %s (%s), the pass ended %s: want this pass's", d.Phase, d.Message, res.Status.Phase)
			}
			if strings.ContainsAny(d.Pin+d.Message, bad) {
				t.Fatalf("unescaped %q in the status: pin %q message %q", bad, d.Pin, d.Message)
			}
			e.status(t)
		})
		t.Run("kubeadm"+status.Printable(bad), func(t *testing.T) {
			e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.36.3", "v1.37.2", "")
			line := "[ERROR CreateJob]: boom" + bad + "[2J"
			e.rec = &runner.Recorder{Reply: func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
				if strings.HasPrefix(c.String(), "/usr/bin/kubeadm upgrade node") {
					return runner.Result{ExitCode: 1, Stderr: []byte(line)}, &runner.ExitError{Cmd: c.String(), Code: 1, Tail: line}
				}
				return e.reply(ctx, c)
			}}
			res := e.run(Steps{})
			if res.ExitCode != ExitFailed {
				t.Fatalf("exit %d %v", res.ExitCode, res.Err)
			}
			d, src, err := status.ReadCurrent(e.node.R())
			if err != nil || src != paths.StatusFile || d.Phase != status.PhaseFailed || d.Reason != ReasonKubeadmFailed {
				t.Fatalf("status: %s %+v %v; want this pass's Failed/KubeadmFailed", src, d, err)
			}
			if strings.ContainsAny(d.Message, bad) || !strings.Contains(d.Message, "boom"+status.Printable(bad)+"[2J") && bad != "\u0085" {
				t.Fatalf("message %q: want the error line with %q escaped", d.Message, bad)
			}
			e.status(t)
		})
	}
}

// TestPastedSecretsAreNeverEchoed: a passphrase-style token (words and
// dashes, so it looks like any plain name) pasted as the role, the pin or
// a providerConfig key fails validation; the pass describes it and never
// copies it into the log, the 0644 status files or its error.
func TestPastedSecretsAreNeverEchoed(t *testing.T) {
	const secret = "correct-horse-battery-staple-galaxy"
	for _, tc := range []struct{ name, role, pin, nodeV, providerKey string }{
		{"role, not a member", secret, "v1.37.2", "", ""},
		{"role, a member worker", "worker", "v1.37.2", "v1.36.3", "role"},
		{"pin, control plane", "controlplane", secret, "v1.36.3", ""},
		{"pin, not a member", "init", secret, "", ""},
		{"providerConfig key", "controlplane", "v1.37.2", "v1.36.3", secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.role, tc.pin, "v1.37.2", tc.nodeV, "v1.36.3", "")
			switch tc.providerKey {
			case "":
			case "role": // a worker member whose cluster file's role is the secret
				e.node.Write(paths.ClusterFile, strings.Replace(e.node.Read(paths.ClusterFile), "role: worker", "role: "+secret, 1), 0o600)
			default:
				e.node.Write(paths.ClusterFile, e.node.Read(paths.ClusterFile)+"providerConfig:\n  "+tc.providerKey+": 1s\n", 0o600)
			}
			res := e.run(Steps{})
			all := map[string]string{"log": e.logBuf.String(), "status": e.node.Read(paths.StatusFile), "plan": res.Plan.Message}
			if b, err := os.ReadFile(e.node.Path(paths.StatusMirror)); err == nil {
				all["mirror"] = string(b)
			}
			if res.Err != nil {
				all["error"] = res.Err.Error()
			}
			for what, s := range all {
				if strings.Contains(s, secret) || strings.Contains(s, "correct-horse") {
					t.Errorf("%s quotes the value:\n%s", what, s)
				}
			}
			if !strings.Contains(all["status"], "35 characters") {
				t.Errorf("the status does not describe the value:\n%s", all["status"])
			}
		})
	}
}
