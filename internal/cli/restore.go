package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/restore"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

func cmdRestoreEtcd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("restore-etcd", stderr)
	root := fs.String("root", "/", "host root every path is read and written under")
	snapshot := fs.String("snapshot", "", "the etcd snapshot (etcdctl snapshot save), root's and 0600")
	manifests := fs.String("manifests", "", "the directory holding this node's static pod manifests to put back (etcd.yaml among them)")
	initialCluster := fs.String("initial-cluster", "", "every member of the restored cluster, NAME=PEER-URL,... (the same on every member)")
	token := fs.String("cluster-token", "", "the restored cluster's --initial-cluster-token, the same on every member (default: a new one, printed)")
	yes := fs.Bool("yes", false, "confirm: restore (without it, only show what would be done)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	for _, f := range []struct{ name, v string }{{"--snapshot", *snapshot}, {"--manifests", *manifests}} {
		if !filepath.IsAbs(f.v) || filepath.Clean(f.v) != f.v {
			fmt.Fprintf(stderr, "%s must be a clean absolute path, got %q\n", f.name, f.v)
			return reconcile.ExitUsage
		}
	}
	if filepath.Clean(*manifests) == paths.ManifestsDir {
		fmt.Fprintf(stderr, "--manifests is where the manifests were moved to, not %s (the kubelet's directory)\n", paths.ManifestsDir)
		return reconcile.ExitUsage
	}
	r := paths.Root(*root)
	log, logFile, err := reconcileLogger(r, nil)
	if err != nil {
		fmt.Fprintln(stderr, status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	defer logFile.Close()
	res := restore.Run(ctx, restore.Options{Root: r, Runner: runner.Exec{Root: *root}, Log: log},
		restore.Request{Snapshot: *snapshot, Manifests: *manifests, InitialCluster: *initialCluster, Token: *token}, *yes)
	if res.Preview || res.Restored {
		restore.Report(stdout, res)
	}
	if res.Preview {
		fmt.Fprintln(stderr, "restore-etcd: nothing changed: run it with --yes")
	}
	if res.Err != nil {
		what := "failed"
		if res.ExitCode == reconcile.ExitRefused {
			what = "refused, nothing changed"
		}
		fmt.Fprintf(stderr, "restore-etcd: %s:\n", what)
		for _, l := range strings.Split(res.Err.Error(), "\n") {
			fmt.Fprintf(stderr, "  - %s\n", status.Printable(l))
		}
	}
	return res.ExitCode
}
