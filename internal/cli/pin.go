package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/pin"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// cmdPin is `pin show` and `pin set vX.Y.Z`: the node's pin in its /oem
// cloud-config. Exit 0 shown, set or already set; 1 failed; 2 usage; 3
// refused (nothing changed).
func cmdPin(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		// The help of pin: set's flags are show's and --dry-run.
		args = []string{"set", "--help"}
	}
	if len(args) == 0 || args[0] != "show" && args[0] != "set" {
		return usageError(stderr, "pin", "pin: show or set vX.Y.Z")
	}
	sub, args := args[0], args[1:]
	fs := newFlags("pin "+sub, stdout, stderr)
	root := fs.String("root", "/", "host root every path is read and written under")
	dryRun := false
	if sub == "set" {
		fs.BoolVar(&dryRun, "dry-run", false, "print the change, write nothing")
	}
	// set's version is its one argument, before or after the flags.
	arg := ""
	if sub == "set" {
		var code int
		var ok bool
		if arg, code, ok = parseArg(fs, args); !ok {
			return code
		}
	} else if code, ok := parse(fs, args); !ok {
		return code
	}
	r := paths.Root(*root)
	if sub == "show" {
		return pinShow(r, stdout, stderr)
	}
	if arg == "" {
		return fs.usageError("pin set: the version to pin is missing: pin set vX.Y.Z")
	}
	v, err := pin.Target(images.Window(), arg)
	if err != nil {
		return fs.usageError(fmt.Sprintf("pin set: %s", status.Printable(err.Error())))
	}
	ch, err := pin.Set(r, v, dryRun)
	if err != nil {
		return pinFailed("pin set", err, stderr)
	}
	switch {
	case ch.From == v.String():
		fmt.Fprintf(stdout, "%s already pins %s: nothing changed\n", status.Printable(ch.Path), v)
	case dryRun:
		for _, l := range strings.Split(strings.TrimSuffix(ch.Diff, "\n"), "\n") {
			fmt.Fprintln(stdout, status.Printable(l))
		}
		fmt.Fprintln(stderr, "dry run: nothing written")
	default:
		fmt.Fprintf(stdout, "%s: pin %s -> %s (the next boot decides what it does with it)\n", status.Printable(ch.Path), status.Printable(plan.ShownPin(ch.From)), v)
	}
	return reconcile.ExitOK
}

func pinShow(r paths.Root, stdout, stderr io.Writer) int {
	f, err := pin.Find(r)
	if err != nil {
		return pinFailed("pin show", err, stderr)
	}
	defer f.Close()
	shown := plan.ShownPin(f.Pin)
	if shown == "" {
		shown = "(empty)"
	}
	fmt.Fprintf(stdout, "Pin:  %s\nFile: %s\n", status.Printable(shown), status.Printable(f.Path))
	return reconcile.ExitOK
}

// pinFailed reports err: a refusal exits 3, anything else 1.
func pinFailed(what string, err error, stderr io.Writer) int {
	if errors.Is(err, pin.ErrRefused) {
		fmt.Fprintf(stderr, "%s: refused: %s\n", what, status.Printable(err.Error()))
		return reconcile.ExitRefused
	}
	fmt.Fprintf(stderr, "%s: %s\n", what, status.Printable(err.Error()))
	return reconcile.ExitFailed
}
