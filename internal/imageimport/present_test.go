package imageimport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/imagelock"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

func TestDecide(t *testing.T) {
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	im := imagelock.Image{Ref: "registry.k8s.io/pause:3.10.2", File: "pause_3.10.2.tar", Manifest: d("a")}
	old := im
	old.Manifest = ""
	for name, tc := range map[string]struct {
		im      imagelock.Image
		listed  map[string]Listed
		listErr error
		want    Reason
	}{
		"present":                {im, map[string]Listed{im.Ref: {d("a"), true}}, nil, Present},
		"missing":                {im, map[string]Listed{}, nil, Missing},
		"only others listed":     {im, map[string]Listed{"registry.k8s.io/etcd:3.7.0-0": {d("a"), true}}, nil, Missing},
		"other digest":           {im, map[string]Listed{im.Ref: {d("b"), true}}, nil, OtherDigest},
		"other digest, partial":  {im, map[string]Listed{im.Ref: {d("b"), false}}, nil, OtherDigest},
		"incomplete":             {im, map[string]Listed{im.Ref: {d("a"), false}}, nil, Incomplete},
		"list failed":            {im, nil, errors.New("exit status 1"), NoList},
		"list failed, with data": {im, map[string]Listed{im.Ref: {d("a"), true}}, errors.New("x"), NoList},
		"no list":                {im, nil, nil, NoList},
		"earlier lock":           {old, map[string]Listed{im.Ref: {d("a"), true}}, nil, NoLockedDigest},
		"earlier lock, no list":  {old, nil, errors.New("x"), NoLockedDigest},
	} {
		t.Run(name, func(t *testing.T) {
			got := Decide([]imagelock.Image{tc.im}, tc.listed, tc.listErr)
			if len(got) != 1 || got[0].Image != tc.im || got[0].Reason != tc.want {
				t.Fatalf("%+v, want %v", got, tc.want)
			}
		})
	}
	// One action per image, in the lock file's order.
	other := imagelock.Image{Ref: "registry.k8s.io/etcd:3.7.0-0", File: "etcd_3.7.0-0.tar", Manifest: d("c")}
	got := Decide([]imagelock.Image{other, im}, map[string]Listed{im.Ref: {d("a"), true}}, nil)
	if len(got) != 2 || got[0].Image != other || got[0].Reason != Missing || got[1].Image != im || got[1].Reason != Present {
		t.Fatalf("%+v", got)
	}
}

// What `ctr images check` prints (captured from containerd 1.6.20; 2.3.4's
// ctr prints the same columns, and the real-containerd tests parse it).
const checkOut = `REF                          TYPE                                       DIGEST                                                                  STATUS           SIZE             UNPACKED 
registry.k8s.io/etcd:3.7.0-0 application/vnd.oci.image.manifest.v1+json sha256:71e17618fe56aea810d3a53ffeacdc74d85ee0f45ea884ef20c695bec68e150e incomplete (1/2) 275.0 B/23.7 MiB true
registry.k8s.io/pause:3.10.2 application/vnd.oci.image.manifest.v1+json sha256:9fd31472f36c5c33fde0a9ce559be422ab69e852ab3d47e34e06ccd172f65448 complete (2/2)   1.5 MiB/1.5 MiB  true
`

func TestParseCheck(t *testing.T) {
	pause, etcd := "registry.k8s.io/pause:3.10.2", "registry.k8s.io/etcd:3.7.0-0"
	refs := []string{pause, etcd, "registry.k8s.io/kube-apiserver:v1.37.2"}
	got, err := parseCheck(checkOut, refs)
	if err != nil || len(got) != 2 ||
		got[pause] != (Listed{"sha256:9fd31472f36c5c33fde0a9ce559be422ab69e852ab3d47e34e06ccd172f65448", true}) ||
		got[etcd] != (Listed{"sha256:71e17618fe56aea810d3a53ffeacdc74d85ee0f45ea884ef20c695bec68e150e", false}) {
		t.Fatalf("%+v %v", got, err)
	}
	// No image matched: ctr prints nothing, not even the header.
	if got, err := parseCheck("", refs); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("%+v %v", got, err)
	}
	header, _, _ := strings.Cut(checkOut, "\n")
	line := func(ref, digest, status, size, unpacked string) string {
		return header + "\n" + ref + " application/vnd.oci.image.manifest.v1+json " + digest + " " + status + " " + size + " " + unpacked + "\n"
	}
	dg := "sha256:" + strings.Repeat("a", 64)
	for name, tc := range map[string]struct {
		in       string
		complete bool
	}{
		"unavailable":  {line(pause, dg, "unavailable (1/?)", "1.0 KiB/?", "false"), false},
		"error":        {line(pause, dg, "error", "-", "false"), false},
		"partial":      {line(pause, dg, "complete (1/2)", "1.5 MiB/1.5 MiB", "true"), false},
		"not unpacked": {line(pause, dg, "complete (2/2)", "1.5 MiB/1.5 MiB", "false"), true},
	} {
		got, err := parseCheck(tc.in, refs)
		if err != nil || got[pause] != (Listed{dg, tc.complete}) {
			t.Errorf("%s: %+v %v", name, got, err)
		}
	}
	// Strict: anything unexpected makes the whole list unusable.
	for name, in := range map[string]string{
		"ls output":       "REF TYPE DIGEST SIZE PLATFORMS LABELS\n" + pause + " application/vnd.oci.image.manifest.v1+json " + dg + " 1.5 MiB linux/amd64 -\n",
		"no header":       strings.SplitN(checkOut, "\n", 2)[1],
		"not asked for":   line("registry.k8s.io/other:1", dg, "complete (2/2)", "1 B/1 B", "true"),
		"listed twice":    line(pause, dg, "complete (2/2)", "1 B/1 B", "true") + pause + " t " + dg + " complete (2/2) 1 B/1 B true\n",
		"short digest":    line(pause, "sha256:abc", "complete (2/2)", "1 B/1 B", "true"),
		"other algorithm": line(pause, "sha512:"+strings.Repeat("a", 64), "complete (2/2)", "1 B/1 B", "true"),
		"unknown status":  line(pause, dg, "ready (2/2)", "1 B/1 B", "true"),
		"no count":        line(pause, dg, "complete", "1 B/1 B", "true"),
		"bad unpacked":    line(pause, dg, "complete (2/2)", "1 B/1 B", "yes"),
		"short line":      header + "\n" + pause + " " + dg + " complete\n",
		"blank line":      line(pause, dg, "complete (2/2)", "1 B/1 B", "true") + "\n" + line(etcd, dg, "complete (2/2)", "1 B/1 B", "true")[len(header)+1:],
	} {
		if got, err := parseCheck(in, refs); err == nil {
			t.Errorf("%s: accepted %+v", name, got)
		}
	}
}

// countImports is runner.Exec recording every command line.
func countImports(r *runner.Recorder) (imports, total int) {
	for _, l := range r.Lines() {
		if strings.Contains(l, " images import ") {
			imports++
		}
		total++
	}
	return imports, total
}

// A converged boot reads no tarball and imports nothing; an image that
// containerd lost, holds at another digest or holds incompletely is
// verified and imported as on a first boot, and the tarball checks still
// stand between a tampered tarball and containerd.
func TestOnlyWhatIsNeededIsImported(t *testing.T) {
	address := testutil.Containerd(t)
	b := newBundle(t)
	refs := []string{
		"registry.k8s.io/kube-apiserver:v1.37.2", "registry.k8s.io/kube-controller-manager:v1.37.2",
		"registry.k8s.io/kube-scheduler:v1.37.2", "registry.k8s.io/kube-proxy:v1.37.2",
		"registry.k8s.io/coredns/coredns:v1.14.6", "registry.k8s.io/etcd:3.7.0-0", "registry.k8s.io/pause:3.10.2",
	}
	for _, r := range refs {
		b.add(r, imagelock.FileName(r), "content of "+r)
	}
	b.writeLock()
	ctr := func(args ...string) string { t.Helper(); return ctrOut(t, address, args...) }
	run := func(want string) (Result, *runner.Recorder) { t.Helper(); return b.runWant(address, want) }
	apiserver, scheduler, etcd := refs[0], refs[2], refs[5]

	// First boot: everything is imported.
	if res, rec := run("outcome=ok imported=7 present=0 refused=0 failed=0 pinned=7 released=0 pin_failed=0"); res.ExitCode != 0 {
		t.Fatalf("%+v", res)
	} else if n, _ := countImports(rec); n != 7 {
		t.Fatalf("%d imports: %v", n, rec.Lines())
	}

	// A converged boot: no tarball is there to read, and none is needed.
	stash := t.TempDir()
	for _, im := range b.lock.Images {
		if err := os.Rename(filepath.Join(b.dir(), im.File), filepath.Join(stash, im.File)); err != nil {
			t.Fatal(err)
		}
	}
	res, rec := run("outcome=ok imported=0 present=7 refused=0 failed=0 pinned=0 released=0 pin_failed=0")
	sort.Strings(res.Present)
	sorted := append([]string(nil), refs...)
	sort.Strings(sorted)
	if res.ExitCode != 0 || strings.Join(res.Present, " ") != strings.Join(sorted, " ") {
		t.Fatalf("%+v", res)
	}
	// containerd answering, one list, the pinned ones among them and those
	// an earlier run pinned: nothing else, nothing labelled.
	if n, total := countImports(rec); n != 0 || total != 4 || !strings.Contains(rec.Lines()[1], " images check ") ||
		!strings.Contains(rec.Lines()[2], " images ls -q ") || !strings.Contains(rec.Lines()[3], " images ls -q ") {
		t.Fatalf("%v", rec.Lines())
	}
	for _, im := range b.lock.Images {
		if err := os.Rename(filepath.Join(stash, im.File), filepath.Join(b.dir(), im.File)); err != nil {
			t.Fatal(err)
		}
	}

	// The apiserver's reference retagged to another image: verified and
	// imported again, and back at the locked digest.
	other := newBundle(t)
	ctrImport(t, address, other.add(apiserver, "other.tar", "not the locked apiserver"))
	if got := listed(t, address)[apiserver]; got != other.mani[apiserver] {
		t.Fatalf("retag: containerd lists %s", got)
	}
	// The scheduler's layer removed from the content store: listed at the
	// locked digest but incomplete.
	var manifest struct {
		Layers []struct{ Digest string } `json:"layers"`
	}
	if err := json.Unmarshal([]byte(ctr("content", "get", b.mani[scheduler])), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("scheduler manifest: %+v %v", manifest, err)
	}
	layer := manifest.Layers[0].Digest
	ctr("content", "rm", layer)
	res, rec = run("outcome=ok imported=2 present=5 refused=0 failed=0")
	sort.Strings(res.Imported)
	if res.ExitCode != 0 || strings.Join(res.Imported, " ") != apiserver+" "+scheduler {
		t.Fatalf("%+v", res)
	}
	if n, _ := countImports(rec); n != 2 {
		t.Fatalf("%d imports: %v", n, rec.Lines())
	}
	if got := listed(t, address)[apiserver]; got != b.mani[apiserver] {
		t.Fatalf("containerd lists %s, the lock file %s", got, b.mani[apiserver])
	}
	if out := ctr("images", "check", `name=="`+scheduler+`"`); !strings.Contains(out, "complete (2/2)") || strings.Contains(out, "incomplete") {
		t.Fatalf("%s", out)
	}

	// etcd's tarball tampered with (same size) while containerd holds the
	// image: not read, present.
	tarball := filepath.Join(b.dir(), imagelock.FileName(etcd))
	data, err := os.ReadFile(tarball)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(data, []byte("content of "))
	data[i] = 'C'
	if err := os.WriteFile(tarball, data, 0o644); err != nil {
		t.Fatal(err)
	}
	run("outcome=ok imported=0 present=7 refused=0 failed=0")
	// ... and once containerd lost it, the tampered tarball is refused, never imported.
	ctr("images", "rm", "--sync", etcd)
	res, rec = run("outcome=refused imported=0 present=6 refused=1 failed=0")
	if res.ExitCode != 1 || len(res.Refused) != 1 || res.Refused[0].Ref != etcd || !strings.Contains(res.Refused[0].Reason, ErrDigest.Error()) {
		t.Fatalf("%+v", res)
	}
	if n, _ := countImports(rec); n != 0 {
		t.Fatalf("imported: %v", rec.Lines())
	}
	if _, ok := listed(t, address)[etcd]; ok {
		t.Fatal("containerd holds the tampered etcd")
	}
}

// rewrittenCheck is runner.Exec except that the output of the nth
// `ctr images check` (from 1) goes through rewrite[n].
type rewrittenCheck struct {
	n       int
	rewrite map[int]func(string) string
}

func (r *rewrittenCheck) Run(ctx context.Context, c runner.Cmd) (runner.Result, error) {
	res, err := runner.Exec{}.Run(ctx, c)
	if len(c.Args) > 5 && c.Args[4] == "images" && c.Args[5] == "check" {
		r.n++
		if f := r.rewrite[r.n]; f != nil {
			res.Stdout = []byte(f(string(res.Stdout)))
		}
	}
	return res, err
}

// A list that cannot be read is no reason to skip anything, nor to take an
// import as done; an image containerd lists incomplete after its import is
// not taken as imported either.
func TestContainerdListIsTrustedOnlyWhenRead(t *testing.T) {
	address := testutil.Containerd(t)
	b := newBundle(t)
	b.add("registry.k8s.io/pause:3.10.2", "pause_3.10.2.tar", "pause")
	b.add("registry.k8s.io/etcd:3.7.0-0", "etcd_3.7.0-0.tar", "etcd")
	b.writeLock()
	if res, log := b.run(address, runner.Exec{}, nil); res.ExitCode != 0 || len(res.Imported) != 2 {
		t.Fatalf("%+v\n%s", res, log)
	}
	garbled := func(string) string { return "IMAGE STATE\nregistry.k8s.io/pause:3.10.2 ok\n" }
	// Before the imports: everything verified and imported again.
	res, log := b.run(address, &rewrittenCheck{rewrite: map[int]func(string) string{1: garbled}}, nil)
	if res.ExitCode != 0 || len(res.Imported) != 2 || len(res.Present) != 0 {
		t.Fatalf("%+v\n%s", res, log)
	}
	// After the imports too: they are not taken as done.
	res, log = b.run(address, &rewrittenCheck{rewrite: map[int]func(string) string{1: garbled, 2: garbled}}, nil)
	if res.ExitCode != 1 || len(res.Failed) != 2 || !strings.Contains(res.Failed[0].Reason, "unexpected header") ||
		!strings.Contains(log, "outcome=failed imported=0 present=0 refused=0 failed=2") {
		t.Fatalf("%+v\n%s", res, log)
	}
	// Listed incomplete, before and after the import.
	incomplete := func(s string) string { return strings.ReplaceAll(s, "complete (2/2)", "incomplete (1/2)") }
	res, log = b.run(address, &rewrittenCheck{rewrite: map[int]func(string) string{1: incomplete, 2: incomplete}}, nil)
	if res.ExitCode != 1 || len(res.Failed) != 2 || !strings.Contains(res.Failed[0].Reason, "incomplete after import") ||
		!strings.Contains(log, "outcome=failed imported=0 present=0 refused=0 failed=2") {
		t.Fatalf("%+v\n%s", res, log)
	}
	// how-it-works.md: after an import "containerd must then list the
	// reference complete at the tarball's manifest digest": listed at
	// another digest, or not listed at all, is not imported (exit 1).
	other := "sha256:" + strings.Repeat("a", 64)
	moved := func(s string) string { return regexp.MustCompile(`sha256:[0-9a-f]{64}`).ReplaceAllString(s, other) }
	res, log = b.run(address, &rewrittenCheck{rewrite: map[int]func(string) string{1: incomplete, 2: moved}}, nil)
	if res.ExitCode != 1 || len(res.Failed) != 2 || len(res.Imported) != 0 || !strings.Contains(res.Failed[0].Reason, "containerd lists "+other+", the tarball carries sha256:") {
		t.Fatalf("listed at another digest: %+v\n%s", res, log)
	}
	headerOnly := func(s string) string { return strings.SplitAfter(s, "\n")[0] }
	res, log = b.run(address, &rewrittenCheck{rewrite: map[int]func(string) string{1: incomplete, 2: headerOnly}}, nil)
	if res.ExitCode != 1 || len(res.Failed) != 2 || len(res.Imported) != 0 || !strings.Contains(res.Failed[0].Reason, "not listed by containerd after import") {
		t.Fatalf("not listed after the import: %+v\n%s", res, log)
	}
}

// FuzzParseCheck feeds arbitrary output as `ctr images check`'s: parseCheck
// never panics, and what it accepts names only asked-for references at
// sha256 digests.
func FuzzParseCheck(f *testing.F) {
	f.Add(checkOut)
	f.Add("")
	f.Add("REF TYPE DIGEST STATUS SIZE UNPACKED\nregistry.k8s.io/pause:3.10.2 t sha256:" + strings.Repeat("a", 64) + " unavailable (0/?) 0 B/? false\n")
	refs := []string{"registry.k8s.io/pause:3.10.2", "registry.k8s.io/etcd:3.7.0-0"}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseCheck(s, refs)
		if err != nil {
			return
		}
		for ref, l := range got {
			if !slices.Contains(refs, ref) || !manifestDigest().MatchString(l.Digest) {
				t.Fatalf("accepted %q: %+v", ref, l)
			}
		}
	})
}
