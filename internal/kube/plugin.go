package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// A kubeconfig's credential plugin is run by client-go's exec
// authenticator (the ExecCredential protocol, its caching, its re-runs on
// 401 and expiry), which bounds neither its run time nor its output. The
// provider bounds both by putting itself in front of the plugin: the
// kubeconfig's command becomes this binary with PluginBoundArg, which runs
// the real plugin with the same arguments and environment (client-go's
// KUBERNETES_EXEC_INFO included) within PluginTimeout, keeps at most
// MaxCredential bytes of what it prints, passes at most maxPluginStderr
// bytes of its stderr on escaped, and kills its process group when either
// bound is crossed.
const (
	// PluginBoundArg is the first argument that makes the provider the
	// bound around a credential plugin (main dispatches on it).
	PluginBoundArg = "__bounded-credential-plugin"
	// MaxCredential bounds what a plugin may print (an ExecCredential
	// with a certificate and key is a few KiB).
	MaxCredential   = 1 << 20
	maxPluginStderr = 64 << 10
	// PluginTimeout is the longest a plugin may run when the client has
	// no request bound of its own.
	PluginTimeout = time.Minute
)

// self is what runs the bound: this very binary, whatever its path.
const self = "/proc/self/exe"

// boundPluginFor puts the bound in front of a kubeconfig's plugin, with the
// request bound of the client being loaded: a plugin never holds a
// request longer than the request may take.
func boundPluginFor(e *clientcmdapi.ExecConfig, timeout time.Duration) {
	if timeout <= 0 || timeout > PluginTimeout {
		timeout = PluginTimeout
	}
	args := append([]string{PluginBoundArg, timeout.String(), "--", e.Command}, e.Args...)
	e.Command, e.Args = self, args
}

// IsPluginBound reports whether args (os.Args[1:]) ask for the bound.
func IsPluginBound(args []string) bool { return len(args) > 0 && args[0] == PluginBoundArg }

// RunPluginBound runs the plugin args name ([PluginBoundArg, timeout, "--",
// command, args...]) within its bounds and returns the exit code: the
// plugin's own, 1 when a bound was crossed or it could not start.
func RunPluginBound(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) < 4 || args[0] != PluginBoundArg || args[2] != "--" {
		fmt.Fprintln(stderr, "credential plugin bound: usage: "+PluginBoundArg+" TIMEOUT -- COMMAND [ARG...]")
		return 2
	}
	timeout, err := time.ParseDuration(args[1])
	if err != nil || timeout <= 0 || timeout > PluginTimeout {
		timeout = PluginTimeout
	}
	name := args[3]
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args[4:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	cmd.Stdin = stdin
	out := &capped{max: MaxCredential, over: cancel}
	errOut := &capped{max: maxPluginStderr}
	cmd.Stdout, cmd.Stderr = out, errOut
	runErr := cmd.Run()
	if errOut.buf.Len() > 0 {
		fmt.Fprintln(stderr, "credential plugin "+describePath(name)+" said: "+status.Printable(errOut.buf.String()))
	}
	switch {
	case out.exceeded:
		fmt.Fprintf(stderr, "credential plugin %s: printed more than %d bytes, stopped\n", describePath(name), MaxCredential)
		return 1
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		fmt.Fprintf(stderr, "credential plugin %s: ran past its bound of %s, stopped\n", describePath(name), timeout)
		return 1
	case runErr != nil:
		var ee *exec.ExitError
		if errors.As(runErr, &ee) && ee.ExitCode() > 0 {
			return ee.ExitCode()
		}
		if errors.Is(runErr, exec.ErrNotFound) || errors.Is(runErr, os.ErrNotExist) {
			fmt.Fprintf(stderr, "credential plugin %s: not found\n", describePath(name))
		} else {
			fmt.Fprintf(stderr, "credential plugin %s: %s\n", describePath(name), status.Printable(runErr.Error()))
		}
		return 1
	}
	if _, err := stdout.Write(out.buf.Bytes()); err != nil {
		return 1
	}
	return 0
}

// capped keeps at most max bytes; past that it calls over (when set) and
// drops the rest.
type capped struct {
	buf      bytes.Buffer
	max      int
	exceeded bool
	over     func()
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); len(p) > room {
		c.buf.Write(p[:max(room, 0)])
		if !c.exceeded && c.over != nil {
			c.over()
		}
		c.exceeded = true
		return len(p), nil
	}
	return c.buf.Write(p)
}
