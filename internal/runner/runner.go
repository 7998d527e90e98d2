// Package runner is the one seam through which the provider runs external
// binaries (kubeadm, systemctl, etcdctl, kubelet): absolute paths, a closed
// environment, a deadline from the caller plus the command's own budget,
// output captured and bounded. Tests swap in a Recorder and assert the exact
// command lines.
package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BaseEnv is the whole environment a command starts with: nothing is inherited.
var BaseEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"LANG=C.UTF-8",
	"HOME=/root",
}

// Cmd is one command line.
type Cmd struct {
	Path    string        // absolute host path of the binary
	Args    []string      // arguments, never a secret
	Env     []string      // extra KEY=VALUE on top of BaseEnv
	Timeout time.Duration // the command's own budget; 0 means only the caller's deadline
	// Stdin is the command's standard input (nil: none). An *os.File is
	// handed to the child as is, so a file already opened and verified is
	// the exact file the command reads (no re-open by path).
	Stdin io.Reader
}

// String is the command line as logged and as tests assert it.
func (c Cmd) String() string {
	return strings.TrimSpace(c.Path + " " + strings.Join(c.Args, " "))
}

// Short names the command without its arguments beyond the subcommand
// words ("/usr/bin/kubeadm upgrade apply"): what an error message carries.
func (c Cmd) Short() string {
	parts := []string{c.Path}
	for _, a := range c.Args {
		if len(parts) == 3 || strings.HasPrefix(a, "-") || strings.ContainsAny(a, "/=.") {
			break
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// Result is what a command left behind.
type Result struct {
	Stdout, Stderr []byte
	ExitCode       int
	Duration       time.Duration
}

// Runner runs commands.
type Runner interface {
	Run(ctx context.Context, c Cmd) (Result, error)
}

// ErrNotAbsolute is returned for a relative binary path.
var ErrNotAbsolute = errors.New("binary path is not absolute")

// ErrMissing is returned when the binary is not there: the command never
// ran, so there is no exit status.
var ErrMissing = errors.New("binary missing")

// ExitError is a command that ran and failed.
type ExitError struct {
	Cmd      string // Cmd.Short(): never the full command line
	Code     int
	TimedOut bool
	// Canceled: the caller's context was cancelled (a signal ended the
	// pass) and the command killed with its process group.
	Canceled bool
	Tail     string // last line of stderr (or stdout), bounded
}

func (e *ExitError) Error() string {
	what := fmt.Sprintf("exit status %d", e.Code)
	switch {
	case e.TimedOut:
		what = "killed at its time budget"
	case e.Canceled:
		what = "killed: interrupted"
	}
	if e.Tail != "" {
		return fmt.Sprintf("%s: %s: %s", e.Cmd, what, e.Tail)
	}
	return fmt.Sprintf("%s: %s", e.Cmd, what)
}

// MaxOutput bounds what is kept of each stream (the tail).
const MaxOutput = 256 << 10

// Exec runs commands for real. Root re-bases the binary path (tests run a
// real kubeadm from a sandbox root); on a node it is "/".
type Exec struct {
	Root string
}

// Run implements Runner.
func (e Exec) Run(ctx context.Context, c Cmd) (Result, error) {
	if !filepath.IsAbs(c.Path) {
		return Result{}, fmt.Errorf("%s: %w", c.Path, ErrNotAbsolute)
	}
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	bin := c.Path
	if e.Root != "" && e.Root != "/" {
		bin = filepath.Join(e.Root, c.Path)
	}
	cmd := exec.CommandContext(ctx, bin, c.Args...)
	cmd.Env = append(append([]string{}, BaseEnv...), c.Env...)
	cmd.Dir = "/"
	cmd.Stdin = c.Stdin
	var stdout, stderr tailBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Own process group, so a hung command and whatever it spawned die together.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	res := Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), Duration: time.Since(start)}
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	if err == nil {
		return res, nil
	}
	var execErr *exec.Error
	if errors.As(err, &execErr) || cmd.ProcessState == nil && ctx.Err() == nil {
		// It never started: there is no exit status to report (the zero
		// ProcessState.ExitCode would read "exit status 0").
		res.ExitCode = -1
		if _, serr := os.Stat(bin); errors.Is(serr, fs.ErrNotExist) {
			return res, fmt.Errorf("run %s: %w: no file at %s", c.Short(), ErrMissing, c.Path)
		}
		return res, fmt.Errorf("run %s: %w", c.Short(), err)
	}
	ee := &ExitError{Cmd: c.Short(), Code: res.ExitCode, TimedOut: errors.Is(ctx.Err(), context.DeadlineExceeded),
		Canceled: errors.Is(ctx.Err(), context.Canceled), Tail: LastLine(res)}
	return res, ee
}

// LastLine is the last non-empty line of stderr, else of stdout, redacted and bounded.
// The last line that names an error wins over plain last lines (kubeadm
// ends a failure with "To see the stack trace of this error execute with
// --v=5 or higher", which says nothing).
func LastLine(r Result) string {
	for _, b := range [][]byte{r.Stderr, r.Stdout} {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if l := strings.TrimSpace(lines[i]); strings.Contains(l, "[ERROR") {
				return Sanitize(l, 300)
			}
		}
	}
	var plain string
	for _, b := range [][]byte{r.Stderr, r.Stdout} {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			l := strings.TrimSpace(lines[i])
			if l == "" || strings.HasPrefix(l, "To see the stack trace") {
				continue
			}
			if lower := strings.ToLower(l); strings.Contains(lower, "error") || strings.Contains(lower, "fatal") {
				return Sanitize(l, 300)
			}
			if plain == "" {
				plain = l
			}
		}
	}
	return Sanitize(plain, 300)
}

// Transcript is the command's output for an operator's log: stdout then
// stderr, every line sanitized (no token, key or certificate material).
func (r Result) Transcript() []byte {
	var b strings.Builder
	for _, out := range [][]byte{r.Stdout, r.Stderr} {
		for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if l != "" {
				b.WriteString(Sanitize(l, 2000))
				b.WriteByte('\n')
			}
		}
	}
	return []byte(b.String())
}

// tailBuffer keeps the last MaxOutput bytes written.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= MaxOutput {
		t.buf.Reset()
		p = p[len(p)-MaxOutput:]
	} else if t.buf.Len()+len(p) > MaxOutput {
		keep := t.buf.Bytes()[t.buf.Len()+len(p)-MaxOutput:]
		rest := append([]byte(nil), keep...)
		t.buf.Reset()
		t.buf.Write(rest)
	}
	t.buf.Write(p)
	return n, nil
}

func (t *tailBuffer) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf.Bytes()...)
}
