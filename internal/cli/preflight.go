package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/preflight"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// defaultHostRoot is where the node's root is when --host-root is not
// given, found as kairos-agent finds it under Kubernetes (v2.31.4,
// pkg/utils/k8s): HOST_DIR (the Kairos operator sets it to the NodeOp's
// hostMountPath, /host by default), else /host inside a Pod, else /.
func defaultHostRoot() string {
	if d := os.Getenv("HOST_DIR"); d != "" {
		return d
	}
	if _, inPod := os.LookupEnv("KUBERNETES_SERVICE_HOST"); inPod {
		return "/host"
	}
	return "/"
}

// cmdPreflight is `provider-kubernetes preflight`: exit 0 when the upgrade
// may swap the image, 3 when it refuses (the code on its one structured
// line on stderr and in the output).
func cmdPreflight(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("preflight", stdout, stderr)
	hostRoot := fs.String("host-root", defaultHostRoot(), "the node's root (default: $HOST_DIR, else /host in a Pod, else /)")
	imageRoot := fs.String("image-root", "/", "the root of the image being upgraded to: this binary's own")
	out := outputFlag(fs)
	if code, ok := parse(fs, args); !ok {
		return code
	}
	for flag, v := range map[string]string{"--host-root": *hostRoot, "--image-root": *imageRoot} {
		if !filepath.IsAbs(v) {
			return fs.usageError(fmt.Sprintf("%s must be an absolute path, got %q", flag, v))
		}
	}
	r := preflight.Run(ctx, preflight.Options{HostRoot: paths.Root(*hostRoot), ImageRoot: paths.Root(*imageRoot), Runner: runner.Exec{Root: *imageRoot}})

	acts := make([]string, len(r.Plan.Actions))
	for i, a := range r.Plan.Actions {
		acts[i] = string(a)
	}
	attrs := []any{"outcome", r.Outcome, "code", string(r.Refusal), "role", r.Facts.Role, "pin", r.Facts.Pin, "bundled", r.Facts.Bundled,
		"node", r.Facts.Node, "cluster", r.Facts.Cluster, "actions", strings.Join(acts, ","), "host_root", *hostRoot,
		"message", runner.Sanitize(r.Message, 600)}
	log := slog.New(slog.NewTextHandler(fieldsOnly{stderr}, nil))
	if r.Refused() {
		log.Error(preflight.Event, attrs...)
	} else {
		log.Info(preflight.Event, attrs...)
	}

	err := emit(stdout, *out, r, func(w io.Writer) error {
		fmt.Fprintf(w, "Preflight: %s\n", r)
		if r.Refused() {
			fmt.Fprintf(w, "Why:      %s\n", status.Printable(r.Message))
		}
		if r.NoSection {
			fmt.Fprintf(w, "Message:  %s\n", status.Printable(r.Message))
			for _, n := range r.Notes {
				fmt.Fprintf(w, "Observed: %s\n", status.Printable(runner.Sanitize(n, 300)))
			}
		} else {
			printPlan(w, r.Observation, r.Plan)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "preflight: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	if r.Refused() {
		return reconcile.ExitRefused
	}
	return reconcile.ExitOK
}
