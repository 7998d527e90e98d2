package imageimport

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/imagelock"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// criImages is what the CRI (the kubelet's view) reports: reference ->
// pinned, from real crictl.
func criImages(t *testing.T, crictl, address string) map[string]bool {
	t.Helper()
	out, err := testutil.Command(t, time.Minute, crictl, "--runtime-endpoint", "unix://"+address, "--image-endpoint", "unix://"+address,
		"images", "-o", "json").Output()
	if err != nil {
		t.Fatalf("crictl images: %v", err)
	}
	var l struct {
		Images []struct {
			RepoTags []string `json:"repoTags"`
			Pinned   bool     `json:"pinned"`
		} `json:"images"`
	}
	if err := json.Unmarshal(out, &l); err != nil {
		t.Fatalf("crictl images: %v: %s", err, out)
	}
	m := map[string]bool{}
	for _, im := range l.Images {
		for _, tag := range im.RepoTags {
			m[tag] = im.Pinned
		}
	}
	return m
}

// The kubelet's image garbage collection removes every image no container
// uses unless the CRI reports it pinned; `crictl rmi --prune` applies the
// same rule on demand, so it is the forced garbage collection here, against
// real containerd with its CRI on.
func TestBundledImagesAreKeptFromTheImageGC(t *testing.T) {
	address := testutil.ContainerdCRI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	crictl, err := testbin.Crictl(ctx, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctr := func(args ...string) string { t.Helper(); return ctrOut(t, address, args...) }
	// waitCRI waits (30 s at most) until the CRI reports exactly want
	// (reference -> pinned): it learns of containerd's changes by events.
	waitCRI := func(what string, want map[string]bool) {
		t.Helper()
		var got map[string]bool
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if got = criImages(t, crictl, address); len(got) == len(want) && func() bool {
				for r, p := range want {
					if v, ok := got[r]; !ok || v != p {
						return false
					}
				}
				return true
			}() {
				return
			}
		}
		t.Fatalf("%s: the CRI reports %v, want %v", what, got, want)
	}
	prune := func() {
		t.Helper()
		if out, err := testutil.Command(t, time.Minute, crictl, "--runtime-endpoint", "unix://"+address, "--image-endpoint", "unix://"+address,
			"rmi", "--prune").CombinedOutput(); err != nil {
			t.Fatalf("crictl rmi --prune: %v: %s", err, out)
		}
	}

	old, pause, etcd := "registry.k8s.io/pause:3.10.1", "registry.k8s.io/pause:3.10.2", "registry.k8s.io/etcd:3.7.0-0"
	b := newBundle(t)
	for _, r := range []string{old, pause, etcd} {
		b.add(r, imagelock.FileName(r), "content of "+r)
	}
	b.writeLock()
	// An image the operator loaded, nobody's to keep: the collection's to take.
	ctrImport(t, address, newBundle(t).add("example.com/stray:v1", "stray.tar", "stray"))
	run := func(want string) (Result, *runner.Recorder) { t.Helper(); return b.runWant(address, want) }

	// Imported and pinned: the CRI reports each bundled image pinned and the
	// stray one not; the forced collection takes only the stray one.
	res, _ := run("outcome=ok imported=3 present=0 refused=0 failed=0 pinned=3 released=0 pin_failed=0")
	sort.Strings(res.Pinned)
	if want := []string{etcd, old, pause}; !slices.Equal(res.Pinned, want) {
		t.Fatalf("pinned %v, want %v", res.Pinned, want)
	}
	waitCRI("after the import", map[string]bool{old: true, pause: true, etcd: true, "example.com/stray:v1": false})
	prune()
	waitCRI("after the forced collection", map[string]bool{old: true, pause: true, etcd: true})

	// Pinned already: one list says so, nothing is labelled again.
	res, rec := run("outcome=ok imported=0 present=3 refused=0 failed=0 pinned=0 released=0 pin_failed=0")
	for _, l := range rec.Lines() {
		if strings.Contains(l, " images label ") {
			t.Fatalf("labelled again: %v", rec.Lines())
		}
	}
	if res.ExitCode != 0 {
		t.Fatalf("%+v", res)
	}

	// Someone takes the pin off etcd (and the kubelet's collection would then
	// take it): the next run pins it again, only it.
	ctr("images", "label", etcd, PinLabel+"=")
	waitCRI("etcd unpinned", map[string]bool{old: true, pause: true, etcd: false})
	res, _ = run("outcome=ok imported=0 present=3 refused=0 failed=0 pinned=1 released=0 pin_failed=0")
	if !slices.Equal(res.Pinned, []string{etcd}) {
		t.Fatalf("pinned %v", res.Pinned)
	}
	waitCRI("etcd pinned again", map[string]bool{old: true, pause: true, etcd: true})

	// The next OS image bundles pause 3.10.2 and etcd, not 3.10.1: its run
	// releases 3.10.1 (its own pin, and nothing else), and the collection
	// takes it.
	b.lock.Images = slices.DeleteFunc(b.lock.Images, func(im imagelock.Image) bool { return im.Ref == old })
	b.writeLock()
	res, _ = run("outcome=ok imported=0 present=2 refused=0 failed=0 pinned=0 released=1 pin_failed=0")
	if !slices.Equal(res.Released, []string{old}) {
		t.Fatalf("released %v", res.Released)
	}
	if got := ctr("images", "ls", `name=="`+old+`"`); strings.Contains(got, PinLabel) || strings.Contains(got, BundledLabel) {
		t.Fatalf("3.10.1 keeps a label: %s", got)
	}
	waitCRI("3.10.1 released", map[string]bool{old: false, pause: true, etcd: true})
	prune()
	waitCRI("after the second collection", map[string]bool{pause: true, etcd: true})

	// providerConfig images.pin: "false": before kubeadm, the pass's run
	// pins nothing and takes off every pin import-images set; what no
	// container uses is then the collection's. (The CRI pins its default
	// sandbox image, pause 3.10.2 here, itself.)
	b.noPin = true
	res, _ = run("outcome=ok imported=0 present=2 refused=0 failed=0 pinned=0 released=2 pin_failed=0")
	sort.Strings(res.Released)
	if want := []string{etcd, pause}; !slices.Equal(res.Released, want) {
		t.Fatalf("released %v, want %v", res.Released, want)
	}
	waitCRI("pins off", map[string]bool{pause: true, etcd: false})
	prune()
	waitCRI("pins off, collected", map[string]bool{pause: true})

	// The boot's import-images cannot know the setting (it runs before the
	// cluster section is read) and pins; the pass's Release takes the pins
	// off again, and a second Release finds nothing to do.
	b.noPin = false
	run("outcome=ok imported=1 present=1 refused=0 failed=0 pinned=2 released=0 pin_failed=0")
	waitCRI("pinned by the boot's import", map[string]bool{pause: true, etcd: true})
	release := func(want string) Result {
		t.Helper()
		var log strings.Builder
		res := Release(context.Background(), Options{Runner: runner.Exec{}, Ctr: testutil.Ctr(t), Address: address,
			Log: slog.New(slog.NewTextHandler(&log, nil))})
		if !strings.Contains(log.String(), want) {
			t.Fatalf("want %q:\n%s", want, log.String())
		}
		return res
	}
	if res := release("msg=release-image-pins outcome=ok released=2 pin_failed=0"); res.ExitCode != 0 {
		t.Fatalf("%+v", res)
	}
	waitCRI("released by the pass", map[string]bool{pause: true, etcd: false})
	release("msg=release-image-pins outcome=ok released=0 pin_failed=0")
}

// A pin that containerd refuses is a failed run that names the image; the
// images themselves are in containerd, so the pass's check does not count
// it as missing.
func TestAPinNotTakenFailsTheRunButNoImageIsMissing(t *testing.T) {
	address := testutil.Containerd(t)
	b := newBundle(t)
	b.add("registry.k8s.io/pause:3.10.2", "pause_3.10.2.tar", "pause")
	b.writeLock()
	rec := &runner.Recorder{Reply: func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if slices.Contains(c.Args, "label") {
			return runner.Result{}, &runner.ExitError{Cmd: "ctr", Code: 1, Tail: "ctr: refused"}
		}
		return runner.Exec{}.Run(ctx, c)
	}}
	res, log := b.run(address, rec, nil)
	if res.ExitCode != 1 || res.Outcome() != "unpinned" || len(res.PinFailed) != 1 || res.PinFailed[0].Ref != "registry.k8s.io/pause:3.10.2" ||
		len(res.Imported) != 1 || res.NotInContainerd() != nil {
		t.Fatalf("%+v", res)
	}
	if !strings.Contains(log, "msg=image-pin-failed ref=registry.k8s.io/pause:3.10.2") || !strings.Contains(log, "outcome=unpinned") {
		t.Fatal(log)
	}
}
