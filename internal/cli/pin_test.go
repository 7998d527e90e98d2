package cli

import (
	"os"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

const pinCloudConfig = "#cloud-config\ncluster:\n  role: init\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: 'v1.36.3'\n"

// pin show and pin set through the command line: what they print and
// their exit codes (0 done, 1 failed, 2 usage, 3 refused).
func TestPinCommand(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	n.Write("/oem/90_custom.yaml", pinCloudConfig, 0o600)
	code, out, errOut := run("pin", "show", "--root", n.Root)
	if code != reconcile.ExitOK || out != "Pin:  v1.36.3\nFile: /oem/90_custom.yaml\n" || errOut != "" {
		t.Fatalf("show: exit %d %q %q", code, out, errOut)
	}

	code, out, errOut = run("pin", "set", "v1.37.2", "--dry-run", "--root", n.Root)
	if code != reconcile.ExitOK || !strings.Contains(out, "-      kubernetesVersion: 'v1.36.3'\n+      kubernetesVersion: 'v1.37.2'\n") || errOut != "dry run: nothing written\n" {
		t.Fatalf("dry run: exit %d %q %q", code, out, errOut)
	}
	if n.Read("/oem/90_custom.yaml") != pinCloudConfig {
		t.Fatal("the dry run wrote")
	}
	// The version after the flags, as well as before them.
	code, out, errOut = run("pin", "set", "--root", n.Root, "v1.37.2")
	if code != reconcile.ExitOK || out != "/oem/90_custom.yaml: pin v1.36.3 -> v1.37.2 (the next boot decides what it does with it)\n" {
		t.Fatalf("set: exit %d %q %q", code, out, errOut)
	}
	if got := n.Read("/oem/90_custom.yaml"); got != strings.Replace(pinCloudConfig, "v1.36.3", "v1.37.2", 1) {
		t.Fatalf("set left:\n%s", got)
	}
	code, out, _ = run("pin", "set", "v1.37.2", "--root", n.Root)
	if code != reconcile.ExitOK || out != "/oem/90_custom.yaml already pins v1.37.2: nothing changed\n" {
		t.Fatalf("again: exit %d %q", code, out)
	}
	// A downgrade or a skip is the boot's to decide (pkg/plan): set here.
	for _, v := range []string{"v1.35.0", "v1.37.2"} {
		if code, _, errOut := run("pin", "set", v, "--root", n.Root); code != reconcile.ExitOK {
			t.Fatalf("%s: exit %d %s", v, code, errOut)
		}
	}

	// Refused: nothing changed, exit 3, the reason on stderr.
	n.Write("/oem/91_second.yaml", pinCloudConfig, 0o600)
	for _, args := range [][]string{{"pin", "show"}, {"pin", "set", "v1.36.3"}} {
		code, out, errOut = run(append(args, "--root", n.Root)...)
		if code != reconcile.ExitRefused || out != "" || !strings.HasPrefix(errOut, args[0]+" "+args[1]+": refused: 2 cloud-configs set the cluster: section's config") {
			t.Fatalf("%v: exit %d %q %q", args, code, out, errOut)
		}
	}
	if err := os.Remove(n.Path("/oem/91_second.yaml")); err != nil {
		t.Fatal(err)
	}

	// Usage: exit 2, nothing read.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pin"}, "pin: show or set vX.Y.Z"},
		{[]string{"pin", "get"}, "pin: show or set vX.Y.Z"},
		{[]string{"pin", "set"}, "pin set: the version to pin is missing"},
		{[]string{"pin", "set", "1.38"}, "pin set: the version (<a value of 4 characters, not shown>) is not an exact vMAJOR.MINOR.PATCH release"},
		{[]string{"pin", "set", "v1.38.0"}, "pin set: v1.38.0 is outside the supported window 1.35, 1.36, 1.37"},
		{[]string{"pin", "set", "v1.37.2", "v1.36.3"}, "unexpected arguments: [v1.36.3 "},
		{[]string{"pin", "show", "v1.37.2"}, "unexpected arguments: [v1.37.2 "},
		{[]string{"pin", "show", "--dry-run"}, "flag provided but not defined: -dry-run"},
		{[]string{"pin", "set", "v1.37.2", "--root", "relative"}, `--root must be an absolute path, got "relative"`},
		{[]string{"pin", "show", "--root", "relative"}, `--root must be an absolute path, got "relative"`},
	} {
		code, out, errOut := run(append(c.args, "--root", n.Root)...)
		if c.args[len(c.args)-1] == "relative" {
			code, out, errOut = run(c.args...)
		}
		if code != reconcile.ExitUsage || out != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d %q %q", c.args, code, out, errOut)
		}
	}
	if got := n.Read("/oem/90_custom.yaml"); got != strings.Replace(pinCloudConfig, "v1.36.3", "v1.37.2", 1) {
		t.Fatalf("a usage error changed the file:\n%s", got)
	}
}

// What pin prints from the file is escaped: a pin that is not a version
// is described, a file name holding control characters is shown escaped.
func TestPinPrintsSafely(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	n.Write("/oem/\x1b[2J\n.yaml", strings.Replace(pinCloudConfig, "'v1.36.3'", "\"\\e[2Kv1.36.3\\nPin:  v9.9.9\"", 1), 0o600)
	code, out, errOut := run("pin", "show", "--root", n.Root)
	if code != reconcile.ExitOK || out != "Pin:  <a value of 24 characters, not shown>\nFile: /oem/\\x1b[2J\\n.yaml\n" {
		t.Fatalf("exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = run("pin", "set", "v1.37.2", "--root", n.Root)
	if code != reconcile.ExitRefused || strings.ContainsAny(errOut[:len(errOut)-1], "\x1b\n") || !strings.Contains(errOut, "spans several lines") {
		t.Fatalf("exit %d %q %q", code, out, errOut)
	}
}
