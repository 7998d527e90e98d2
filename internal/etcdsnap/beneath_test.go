package etcdsnap

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
)

// fakeTools plays etcdctl and etcdutl without building them: etcdctl
// writes a snapshot with a valid sha256 trailer where it is told (its
// .part, then a rename, as the real one does), after hook ran; etcdutl
// reports an empty keyspace that fits the file.
type fakeTools struct {
	hook func() // runs when etcdctl starts: a wrapper's doing
}

func (r *fakeTools) Run(_ context.Context, c runner.Cmd) (runner.Result, error) {
	switch c.Path {
	case paths.Etcdctl:
		if r.hook != nil {
			r.hook()
		}
		out := c.Args[len(c.Args)-1]
		body := make([]byte, 512)
		copy(body, "a fake bbolt database")
		sum := sha256.Sum256(body)
		if err := os.WriteFile(out+".part", append(body, sum[:]...), 0o600); err != nil {
			return runner.Result{ExitCode: 1}, err
		}
		return runner.Result{}, os.Rename(out+".part", out)
	case paths.Etcdutl:
		return runner.Result{Stdout: []byte(`{"hash":1,"revision":0,"totalKey":0,"totalSize":512,"version":"3.6.0"}`)}, nil
	}
	return runner.Result{ExitCode: 1}, fmt.Errorf("unexpected %s", c)
}

// fakeToolsFixture: a stacked etcd (embedded), an encrypted persistent
// partition and fake etcdctl/etcdutl (so it runs in -short mode).
func fakeToolsFixture(t *testing.T) (*fixture, *fakeTools) {
	testutil.RequireRoot(t)
	f := &fixture{t: t, node: testutil.NewNode(t, "cp1"), log: &testutil.SyncBuffer{}, now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
	for _, p := range []string{paths.Etcdctl, paths.Etcdutl} {
		f.node.Write(p, "#!/bin/sh\nexit 1\n", 0o755)
	}
	f.fs = etcdtest.EncryptedPersistent(t, f.node)
	f.etcd = etcdtest.Start(t, f.node, etcdtest.Config{})
	return f, &fakeTools{}
}

func (f *fixture) takeWith(r runner.Runner) Result {
	o := Options{Root: f.node.R(), Runner: r, Log: slog.New(slog.NewTextHandler(f.log, nil)), FS: f.fs,
		Now: func() time.Time { return f.now }, Total: 60 * time.Second, Request: 5 * time.Second}
	return Take(context.Background(), o, v1372)
}

// TestBackupDirSwappedDuringTheSaveNeverCounts: a wrapper around etcdctl
// moves the checked backup directory away and puts a symlink to another
// directory at its name before etcdctl writes. Nothing lands at the
// link's target and the outcome is not taken.
func TestBackupDirSwappedDuringTheSaveNeverCounts(t *testing.T) {
	f, tools := fakeToolsFixture(t)
	dir := f.node.Path(paths.EtcdBackupDir)
	elsewhere := f.node.Path(paths.PersistDir + "/elsewhere") // on the same confirmed partition
	if err := os.MkdirAll(elsewhere, 0o700); err != nil {
		t.Fatal(err)
	}
	// The fake works: a first snapshot is taken where it belongs.
	f.now = f.now.Add(-time.Hour)
	if r := f.takeWith(tools); r.Outcome != Taken {
		t.Fatalf("the fake tools: %s %s", r.Outcome, r.Reason)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	f.now = f.now.Add(time.Hour)
	tools.hook = func() {
		if err := os.Rename(dir, dir+".moved"); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(elsewhere, dir); err != nil {
			t.Error(err)
		}
	}
	r := f.takeWith(tools)
	if r.Outcome == Taken || r.Outcome == SkippedAlreadyTaken {
		t.Errorf("counted after the swap: %s %s %s", r.Outcome, r.Path, r.Reason)
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("written through the swapped-in symlink: %v", names)
	}
	t.Logf("%s: %s", r.Outcome, r.Reason)
}

// TestMountPointAtASnapshotNameIsNotEmptied: a directory bind-mounted at a
// snapshot's name (it does not verify, so the step removes what is there)
// is refused as a mount point; nothing under it is removed. The test
// re-runs itself in a private mount namespace.
func TestMountPointAtASnapshotNameIsNotEmptied(t *testing.T) {
	if !testutil.InPrivateMountNamespace(t) {
		return
	}
	f, tools := fakeToolsFixture(t)
	dir := f.node.Path(paths.EtcdBackupDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("etcd-%016x-v1.37-20261129T080000Z.db", f.etcd.ClusterID())
	precious := t.TempDir()
	if err := os.WriteFile(filepath.Join(precious, "precious"), []byte("someone's data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(precious, filepath.Join(dir, name), "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(filepath.Join(dir, name), unix.MNT_DETACH) })
	r := f.takeWith(tools)
	if _, err := os.Stat(filepath.Join(precious, "precious")); err != nil {
		t.Fatalf("the mounted directory was emptied (%s %s): %v", r.Outcome, r.Reason, err)
	}
	if r.Outcome != Failed || !strings.Contains(r.Reason, "mount point") {
		t.Fatalf("%s %s", r.Outcome, r.Reason)
	}
}
