package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// Host tools the harness runs, each found by absolute path (commands run
// with a closed environment, so nothing is looked up through $PATH).
var hostTools = []string{"systemd-nspawn", "debootstrap", "nsenter", "unshare", "ip", "mount", "journalctl"}

// toolDirs are searched in order.
var toolDirs = []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// Packages names the Debian packages that bring the host tools (what .ci/run installs).
const Packages = "debootstrap systemd-container iproute2 util-linux"

// ErrUnavailable is wrapped when this machine cannot run nodes.
var ErrUnavailable = errors.New("nspawn nodes unavailable")

// tools maps a tool name to its absolute path.
type tools map[string]string

func (t tools) path(name string) string {
	if p, ok := t[name]; ok {
		return p
	}
	// Resolved in Check; a missing entry is a programming error, reported
	// as a path that cannot exist so the command fails loudly.
	return "/nonexistent/" + name
}

// Check reports whether this machine can run nodes: Linux, root, overlayfs,
// and every host tool present. The error says what is missing and how to
// install it.
func Check() (tools, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("%w: needs linux, this is %s", ErrUnavailable, runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: needs root (network namespaces, cgroups, mounts)", ErrUnavailable)
	}
	if b, err := os.ReadFile("/proc/filesystems"); err != nil || !strings.Contains(string(b), "\toverlay\n") {
		return nil, fmt.Errorf("%w: the kernel has no overlayfs", ErrUnavailable)
	}
	t := tools{}
	var missing []string
	for _, name := range hostTools {
		p := findTool(name)
		if p == "" {
			missing = append(missing, name)
			continue
		}
		t[name] = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: missing %s (apt-get install --no-install-recommends %s)", ErrUnavailable, strings.Join(missing, ", "), Packages)
	}
	return t, nil
}

func findTool(name string) string {
	for _, d := range toolDirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// EnvE2E set to "off" skips every end-to-end test; otherwise they run
// wherever nodes can (make test runs them as root).
const EnvE2E = "PROVIDER_KUBERNETES_E2E"

// Require skips t unless nodes can run here (and not in -short mode). Under
// CI (CI=true) a machine that cannot run nodes fails the test instead:
// .ci/run installs everything, so a skip there would hide a broken setup.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots nspawn nodes: not in -short mode")
	}
	if os.Getenv(EnvE2E) == "off" {
		t.Skip(EnvE2E + "=off")
	}
	if _, err := Check(); err != nil {
		testutil.SkipUnlessCI(t, err.Error())
	}
}
