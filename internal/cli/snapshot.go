package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/cryptgate"
	"github.com/kairos-io/provider-kubernetes/internal/etcdsnap"
	"github.com/kairos-io/provider-kubernetes/internal/kubeadmbackup"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// gateFS is the encryption gate's stat seam: nil (the kernel) except in
// this package's tests, whose sandbox cannot have a dm-crypt device.
var gateFS cryptgate.FS

// snapshotStep is the reconcile pass's etcd snapshot step.
func snapshotStep(r paths.Root, run runner.Runner, log *slog.Logger) func(context.Context, version.Version) reconcile.SnapshotReport {
	return func(ctx context.Context, target version.Version) reconcile.SnapshotReport {
		res := etcdsnap.Take(ctx, etcdsnap.Options{Root: r, Runner: run, Log: log, FS: gateFS}, target)
		return reconcile.SnapshotReport{Outcome: string(res.Outcome), Warnings: res.Warnings}
	}
}

func cmdEtcdSnapshot(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("etcd-snapshot", stdout, stderr)
	root := fs.String("root", "/", "host root every path is read and written under")
	target := fs.String("target", "", "the Kubernetes version the upgrade goes to (vX.Y.Z)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	tv, err := version.Parse(*target)
	if err != nil {
		return fs.usageError(fmt.Sprintf("--target: %s", status.Printable(err.Error())))
	}
	r := paths.Root(*root)
	log, logFile, err := reconcileLogger(r, stderr)
	if err != nil {
		fmt.Fprintln(stderr, status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	defer logFile.Close()
	// The pass's rules: its lock (the pass takes the snapshot itself while
	// it holds it) and its directories (the lock refuses a
	// /run/provider-kubernetes another user owns). Refused, the attempt
	// still writes its one line.
	unlock, err := reconcile.Lock(r)
	if err != nil {
		log.Error(etcdsnap.Event, "outcome", string(etcdsnap.Failed), "reason", runner.Sanitize("take the reconcile lock: "+err.Error(), 300))
		return reconcile.ExitFailed
	}
	defer unlock()
	res := etcdsnap.Take(ctx, etcdsnap.Options{Root: r, Runner: runner.Exec{Root: *root}, Log: log, FS: gateFS}, tv)
	if res.Outcome == etcdsnap.Failed {
		return reconcile.ExitFailed
	}
	return reconcile.ExitOK
}

// EventPrune is the log line of prune-kubeadm-backups.
const EventPrune = "prune-kubeadm-backups"

func cmdPruneKubeadmBackups(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("prune-kubeadm-backups", stdout, stderr)
	root := fs.String("root", "/", "host root")
	keep := fs.Int("keep", 1, "how many of the newest copies to keep")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *keep < 0 {
		return fs.usageError(fmt.Sprintf("--keep must be 0 or more, got %d", *keep))
	}
	r := paths.Root(*root)
	log, logFile, err := reconcileLogger(r, nil)
	if err != nil {
		fmt.Fprintln(stderr, status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	defer logFile.Close()
	// The pass's lock: nothing is pruned while a pass (whose upgrade makes
	// these copies) or a reset or restore works on the node.
	unlock, err := reconcile.Lock(r)
	if err != nil {
		msg := runner.Sanitize(err.Error(), 400)
		fmt.Fprintf(stderr, "prune-kubeadm-backups: refusing to remove anything: %s\n", status.Printable(msg))
		if errors.Is(err, reconcile.ErrLocked) {
			log.Warn(EventPrune, "outcome", "refused", "reason", msg)
			return reconcile.ExitRefused
		}
		log.Error(EventPrune, "outcome", "failed", "error", msg)
		return reconcile.ExitFailed
	}
	defer unlock()

	s, err := kubeadmbackup.List(r)
	if err != nil {
		fmt.Fprintf(stderr, "prune-kubeadm-backups: %s\n", status.Printable(err.Error()))
		log.Error(EventPrune, "outcome", "failed", "error", runner.Sanitize(err.Error(), 300))
		return reconcile.ExitFailed
	}
	for _, n := range s.Skipped {
		fmt.Fprintf(stdout, "left alone: %s/%s (not a directory, or a symlink)\n", s.Dir, status.Printable(n))
	}
	rm := kubeadmbackup.Plan(s, *keep)
	if len(rm) == 0 {
		fmt.Fprintf(stdout, "nothing to remove: %d kubeadm etcd backup(s), %s, in %s (keeping the newest %d)\n", s.Count, status.HumanBytes(s.Bytes), s.Dir, *keep)
		log.Info(EventPrune, "outcome", "nothing-to-remove", "count", s.Count, "bytes", s.Bytes, "keep", *keep)
		return reconcile.ExitOK
	}
	facts, err := verifyFacts(ctx, r)
	if err == nil {
		err = kubeadmbackup.Verified(facts)
	}
	if err != nil {
		msg := runner.Sanitize(err.Error(), 400)
		fmt.Fprintf(stderr, "prune-kubeadm-backups: refusing to remove anything: %s\n", msg)
		log.Warn(EventPrune, "outcome", "refused", "count", s.Count, "reason", msg)
		// Unverified, or unverifiable: either way nothing is removed.
		return reconcile.ExitRefused
	}
	var freed int64
	removed := 0
	for _, b := range rm {
		if err := kubeadmbackup.Remove(r, b); err != nil {
			fmt.Fprintf(stderr, "remove %s/%s: %s\n", s.Dir, status.Printable(b.Name), status.Printable(err.Error()))
			log.Error(EventPrune, "outcome", "failed", "removed", removed, "bytes_freed", freed, "error", runner.Sanitize(err.Error(), 300))
			return reconcile.ExitFailed
		}
		removed++
		freed += b.Bytes
		fmt.Fprintf(stdout, "removed %s/%s (%s)\n", s.Dir, status.Printable(b.Name), status.HumanBytes(b.Bytes))
	}
	fmt.Fprintf(stdout, "kept %d, freed %s; this node is at the cluster's version %s\n", s.Count-removed, status.HumanBytes(freed), facts.ClusterVersion)
	log.Info(EventPrune, "outcome", "removed", "removed", removed, "kept", s.Count-removed, "bytes_freed", freed, "cluster", facts.ClusterVersion.String())
	return reconcile.ExitOK
}

// verifyFacts reads what decides whether this node is verified at the
// cluster's version: its kube-apiserver manifest, its Node's kubelet and the
// cluster version, each bounded.
func verifyFacts(ctx context.Context, r paths.Root) (kubeadmbackup.Facts, error) {
	b := reconcile.DefaultBudgets()
	o := &observe.Observer{Root: r, APITimeout: b.APIRequest}
	var f kubeadmbackup.Facts
	_, cp, err := o.Membership()
	if err != nil {
		return f, err
	}
	f.ControlPlane = cp
	if cp {
		if f.NodeVersion, err = o.ControlPlaneVersion(); err != nil {
			return f, fmt.Errorf("this node's control-plane version: %w", err)
		}
	}
	client, err := o.Client()
	if err != nil {
		return f, fmt.Errorf("api client: %w", err)
	}
	if f.ClusterVersion, err = o.ClusterVersion(ctx, client, wait.Budget{Total: 30 * time.Second, Interval: 2 * time.Second, PerAttempt: b.APIRequest}); err != nil {
		return f, fmt.Errorf("cluster version: %w", err)
	}
	name, err := o.NodeName(client.NodeName)
	if err != nil {
		return f, err
	}
	nctx, cancel := context.WithTimeout(ctx, b.APIRequest)
	defer cancel()
	ni, err := client.Node(nctx, name)
	if err != nil {
		return f, fmt.Errorf("node %s: %w", name, err)
	}
	f.KubeletVersion = ni.KubeletVersion
	return f, nil
}
