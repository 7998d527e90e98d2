package etcdsnap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// A .part a crashed attempt left (etcdctl's output before it was verified:
// it never counted) is removed by the next attempt before it saves, so a
// full dump that was never verified does not stay on the node; the new
// snapshot is taken and is the only file left.
func TestStalePartIsRemovedBeforeASave(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	f.etcd.PutKeys("/registry/a/", 20, 100)

	// A first snapshot makes the directory as the step makes it.
	f.before(version.MustParse("v1.36.3"))
	if r := f.take(version.MustParse("v1.36.3")); r.Outcome != Taken {
		t.Fatalf("%s %s", r.Outcome, r.Reason)
	}
	f.before(v1372)
	dir := f.node.Path(paths.EtcdBackupDir)
	first := f.snapshots()
	if len(first) != 1 {
		t.Fatalf("backup dir holds %q", first)
	}
	// What a kill during an earlier attempt at v1.37 left: the .part under
	// an earlier time, and etcdctl's own temporary name next to it.
	id := first[0][len("etcd-") : len("etcd-")+16]
	stale := []string{
		"etcd-" + id + "-v1.37-20261129T080000Z.db.part",
		"etcd-" + id + "-v1.37-20261129T080000Z.db.part.part",
	}
	for _, name := range stale {
		write(t, filepath.Join(dir, name), []byte("half of a database"), 0o600, 0)
	}

	r := f.take(v1372)
	if r.Outcome != Taken {
		t.Fatalf("%s %s", r.Outcome, r.Reason)
	}
	got := f.snapshots()
	for _, name := range stale {
		if slices.Contains(got, name) {
			t.Fatalf("the stale %s is still there: backup dir holds %q", name, got)
		}
		if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if want := []string{filepath.Base(r.Path)}; !slices.Equal(got, want) {
		t.Fatalf("backup dir holds %q, want only %q", got, want)
	}
}

// The etcd-snapshot command hands the step no deadline: the attempt is
// still bounded at two minutes (upgrades.md: "It is bounded at two
// minutes"), which etcdctl's own budget shows.
func TestAttemptWithoutADeadlineIsBoundedAtTwoMinutes(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	f.etcd.PutKeys("/registry/a/", 5, 100)
	o := f.opts()
	o.Total = 0 // as the command calls it: the context's deadline, else the default
	r := Take(context.Background(), o, v1372)
	if r.Outcome != Taken {
		t.Fatalf("%s %s", r.Outcome, r.Reason)
	}
	var save *runner.Cmd
	for i, c := range f.run.cmds {
		if c.Path == paths.Etcdctl {
			save = &f.run.cmds[i]
		}
	}
	if save == nil {
		t.Fatalf("etcdctl never ran: %q", f.run.paths())
	}
	const bound = 2 * time.Minute
	if save.Timeout <= 0 || save.Timeout > bound {
		t.Fatalf("etcdctl's budget %s, want within the attempt's %s", save.Timeout, bound)
	}
	for _, a := range save.Args {
		if s, ok := strings.CutPrefix(a, "--command-timeout="); ok {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 || d > bound {
				t.Fatalf("etcdctl %s, want within %s", a, bound)
			}
			return
		}
	}
	t.Fatalf("etcdctl without --command-timeout: %q", save.Args)
}

// etcdctlFails makes etcdctl fail with what a hostile or broken etcdctl
// could print: key material, several lines, far more than a log line holds.
type etcdctlFails struct {
	inner runner.Runner
	err   error
}

func (r etcdctlFails) Run(ctx context.Context, c runner.Cmd) (runner.Result, error) {
	if c.Path == paths.Etcdctl {
		return runner.Result{}, r.err
	}
	return r.inner.Run(ctx, c)
}

// A failed attempt's reason is one sanitized line of at most 300 bytes
// (docs/how-it-works.md: "one line, sanitized, at most 300 bytes: no key
// material"), in the result and in the outcome line, whatever the failure
// said.
func TestFailedReasonIsOneBoundedSanitizedLine(t *testing.T) {
	testutil.RequireRoot(t)
	f := newFixture(t)
	const key = "MHcCAQEEIBkFsZ3pKx9q7Wm2vT8rLnYc4dHeGf6uJiOpQwErTyUAoAoGCCqGSM49"
	long := "snapshot failed\n" + strings.Repeat("and more detail ", 100) + "\n-----BEGIN EC PRIVATE KEY-----\n" + key + "\n-----END EC PRIVATE KEY-----\n"
	o := f.opts()
	o.Runner = etcdctlFails{inner: f.run, err: errors.New(long)}
	r := Take(context.Background(), o, v1372)
	if r.Outcome != Failed {
		t.Fatalf("%s %s", r.Outcome, r.Reason)
	}
	if len(r.Reason) > 303 || strings.ContainsAny(r.Reason, "\n\r") || strings.Contains(r.Reason, key[:20]) || strings.Contains(r.Reason, "BEGIN") {
		t.Fatalf("reason (%d bytes) is not one sanitized line of at most 300 bytes: %q", len(r.Reason), r.Reason)
	}
	line := f.oneLine(1, Failed, "reason=")
	if strings.Contains(line, key[:20]) || len(line) > 600 {
		t.Fatalf("the outcome line carries the failure unbounded: %q", line)
	}
}
