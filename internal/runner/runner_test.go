package runner

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestExecClosedEnvironment(t *testing.T) {
	t.Setenv("ETCDCTL_ENDPOINTS", "https://evil:2379")
	t.Setenv("KUBECONFIG", "/tmp/evil")
	res, err := Exec{}.Run(context.Background(), Cmd{Path: "/usr/bin/env", Env: []string{"EXTRA=1"}})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Fields(string(res.Stdout))
	want := append(append([]string{}, BaseEnv...), "EXTRA=1")
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("env %q, want exactly %q", got, want)
	}
}

func TestExecRefusesARelativePath(t *testing.T) {
	if _, err := (Exec{}).Run(context.Background(), Cmd{Path: "kubeadm"}); !errors.Is(err, ErrNotAbsolute) {
		t.Fatalf("%v", err)
	}
}

// A binary that is not there never ran: the error says it is missing,
// not an exit status (the never-set one read "exit status 0").
func TestExecMissingBinaryIsNotAnExitStatus(t *testing.T) {
	root := t.TempDir()
	res, err := Exec{Root: root}.Run(context.Background(), Cmd{Path: "/usr/bin/kubeadm", Args: []string{"reset", "-f"}})
	var ee *ExitError
	if !errors.Is(err, ErrMissing) || errors.As(err, &ee) || strings.Contains(err.Error(), "exit status") || res.ExitCode != -1 {
		t.Fatalf("exit %d: %v", res.ExitCode, err)
	}
	if want := "run /usr/bin/kubeadm reset: binary missing: no file at /usr/bin/kubeadm"; err.Error() != want {
		t.Fatalf("%q, want %q", err, want)
	}
	// One that is there but cannot start is not called missing.
	if err := os.WriteFile(root+"/noexec", []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Exec{Root: root}.Run(context.Background(), Cmd{Path: "/noexec"})
	if err == nil || errors.Is(err, ErrMissing) || errors.As(err, &ee) || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("%v", err)
	}
}

func TestExecFailureCarriesTheLastLine(t *testing.T) {
	_, err := Exec{}.Run(context.Background(), Cmd{Path: "/bin/sh", Args: []string{"-c", "echo first >&2; echo 'second --token abcdef.0123456789abcdef' >&2; exit 7"}})
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 7 || ee.TimedOut {
		t.Fatalf("%#v", err)
	}
	if !strings.Contains(ee.Tail, "second") || strings.Contains(ee.Error(), "0123456789abcdef") {
		t.Fatalf("tail %q", ee.Tail)
	}
}

// A hung command and the children it spawned die at the command's budget.
func TestExecKillsTheProcessGroupAtItsBudget(t *testing.T) {
	pidFile := t.TempDir() + "/child"
	start := time.Now()
	_, err := Exec{}.Run(context.Background(), Cmd{Path: "/bin/sh", Args: []string{"-c", "sleep 60 & echo $! > " + pidFile + "; wait"}, Timeout: 300 * time.Millisecond})
	var ee *ExitError
	if !errors.As(err, &ee) || !ee.TimedOut {
		t.Fatalf("%v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("took %s", time.Since(start))
	}
	b, _ := os.ReadFile(pidFile)
	pid := strings.TrimSpace(string(b))
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			return // gone or a zombie awaiting its reaper
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %s of a killed command still runs", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A cancelled caller (a signal ended the pass) is told apart from a
// command that ran out of its budget.
func TestExecCanceledIsNotATimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err := Exec{}.Run(ctx, Cmd{Path: "/bin/sh", Args: []string{"-c", "sleep 60"}, Timeout: time.Minute})
	var ee *ExitError
	if !errors.As(err, &ee) || ee.TimedOut || !ee.Canceled || !strings.Contains(err.Error(), "killed: interrupted") {
		t.Fatalf("%v %+v", err, ee)
	}
}

func TestTailBufferKeepsTheEnd(t *testing.T) {
	var b tailBuffer
	for i := 0; i < 3; i++ {
		b.Write([]byte(strings.Repeat("x", MaxOutput/2)))
	}
	b.Write([]byte("END"))
	got := b.Bytes()
	if len(got) != MaxOutput || !strings.HasSuffix(string(got), "END") {
		t.Fatalf("len %d", len(got))
	}
}

func TestSanitize(t *testing.T) {
	for in, banned := range map[string]string{
		"kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash sha256:aaaa": "0123456789abcdef",
		"certificateKey: 0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9":                      "0a1b2c3d4e5f",
		"-----BEGIN EC PRIVATE KEY----- MHcCAQEEIB":                                                             "MHcCAQEEIB",
		"--certificate-key=deadbeef --key /etc/kubernetes/pki/x.key":                                            "deadbeef",
		// Each pattern alone: a bare bootstrap token, a bare long hex key, a
		// bare base64 run, a secret flag's value after a space and a
		// secret-bearing key without a flag.
		"error: bootstrap token abcdef.0123456789abcdef is not valid":           "0123456789abcdef",
		"uploaded under 0a1b2c3d4e5f60718293a4b5c6d7e8f9":                       "0a1b2c3d4e5f",
		"login --password s3cretvalue":                                          "s3cretvalue",
		"data MHcCAQEEIBkFsZ3pKx9q7Wm2vT8rLnYc4dHeGf6uJiOpQwErTyUAoAoGCCqGSM49": "MHcCAQEEIBkFsZ3pKx9q",
		`{"password": "hunter2-is-not-hex"}`:                                    "hunter2",
	} {
		out := Sanitize(in, 500)
		if strings.Contains(out, banned) || strings.Contains(out, "\n") {
			t.Errorf("Sanitize(%q) = %q", in, out)
		}
	}
	if got := Sanitize(strings.Repeat("a ", 500), 50); len(got) > 53 {
		t.Fatalf("not bounded: %d", len(got))
	}
}

func TestLastLinePrefersTheError(t *testing.T) {
	r := Result{Stderr: []byte("[upgrade] Running cluster health checks\n[ERROR CreateJob]: Job \"upgrade-health-check-x\" did not complete in 1m0s\nerror: error execution phase preflight: preflight checks failed\nTo see the stack trace of this error execute with --v=5 or higher\n")}
	if got := LastLine(r); !strings.HasPrefix(got, "[ERROR CreateJob]") {
		t.Fatalf("%q", got)
	}
	if got := LastLine(Result{Stdout: []byte("a\nb\n")}); got != "b" {
		t.Fatalf("%q", got)
	}
}

func TestTranscriptIsSanitized(t *testing.T) {
	r := Result{Stdout: []byte("kubeadm join 10.0.0.11:6443 --token abcdef.0123456789abcdef\n"), Stderr: []byte("warning\n")}
	got := string(r.Transcript())
	if strings.Contains(got, "0123456789abcdef") || !strings.Contains(got, "warning") {
		t.Fatalf("%q", got)
	}
}
