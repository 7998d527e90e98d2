package cli

import (
	"context"
	"errors"
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
	fs := newFlags("restore-etcd", stdout, stderr)
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
			return fs.usageError(fmt.Sprintf("%s must be a clean absolute path, got %q", f.name, f.v))
		}
	}
	if filepath.Clean(*manifests) == paths.ManifestsDir {
		return fs.usageError(fmt.Sprintf("--manifests is where the manifests were moved to, not %s (the kubelet's directory)", paths.ManifestsDir))
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

func cmdCollectManifests(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("collect-manifests", stdout, stderr)
	root := fs.String("root", "/", "host root every path is read and written under")
	to := fs.String("to", "", "the directory to copy them into (created 0700; must be new or empty)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *to == "" {
		return fs.usageError("collect-manifests: --to DIR is required")
	}
	r := paths.Root(*root)
	want, err := restore.WantFromBundle(r)
	if err != nil {
		fmt.Fprintf(stderr, "collect-manifests: the booted image's versions: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	c, err := restore.CollectManifests(r, want, *to)
	if err != nil {
		fmt.Fprintf(stderr, "collect-manifests: refused, nothing copied: %s\n", status.Printable(err.Error()))
		if errors.Is(err, restore.ErrNoSavedManifest) || errors.Is(err, restore.ErrCollectTarget) {
			return reconcile.ExitRefused
		}
		return reconcile.ExitFailed
	}
	fmt.Fprintf(stdout, "collected the Kubernetes %s manifests (etcd %s) into %s:\n", want.Kubernetes, status.Printable(want.EtcdTag), status.Printable(c.To))
	for _, comp := range restore.Components {
		s := c.From[comp]
		fmt.Fprintf(stdout, "  %-28s from %s\n", s.File, status.Printable(s.Dir))
	}
	return reconcile.ExitOK
}
