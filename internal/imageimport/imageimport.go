// Package imageimport imports the control-plane images an OS image bundles
// into containerd's k8s.io namespace, exactly those its lock file lists and
// under their exact references, before the kubelet starts.
//
// Most boots change nothing: one bounded `ctr images check` first lists what
// containerd holds under the locked references, and an image containerd
// holds complete at the manifest digest the lock file names is skipped
// (present), its tarball neither read nor imported. Anything else (missing,
// at another digest, incomplete, a lock file without manifest digests, no
// usable list) is verified and imported: a tarball is refused, never
// imported, when it is a symlink, not a regular file, not owned by root,
// group- or other-writable, or when its size, sha256, the reference its index
// names or that manifest's digest differ from the lock file. The verified
// open file itself is what `ctr images import -` reads (no re-open by path),
// and the result is checked in containerd's list. Everything is bounded.
package imageimport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/imagelock"
	"github.com/kairos-io/provider-kubernetes/internal/oci"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
)

// Namespace is containerd's namespace the CRI plugin (and so the kubelet) uses.
const Namespace = "k8s.io"

// The labels a bundled image carries in containerd once a run has it there.
const (
	// PinLabel=PinValue is the CRI's pin: containerd 2's CRI reports the
	// image Pinned, and the kubelet's image garbage collection (like
	// `crictl rmi --prune`) never removes a pinned image.
	PinLabel = "io.cri-containerd.pinned"
	PinValue = "pinned"
	// BundledLabel=BundledValue marks an image a run pinned: a later run
	// (another OS image, another minor) releases those its own lock file
	// does not list, so an upgrade leaves the previous minor's images to
	// the garbage collection instead of pinning them forever.
	BundledLabel = "provider-kubernetes.kairos.io/bundled"
	BundledValue = "true"
)

// PinKey is the providerConfig key that turns the pins off: "false" makes
// every reconcile pass take off the pins import-images set (the boot's
// import-images runs before the cluster section is read, so it pins
// regardless) and pin nothing before kubeadm.
const PinKey = "images.pin"

// PinWanted reads PinKey from providerConfig: true when the key is absent
// or "true", false for "false"; anything else is an error naming the key,
// never quoting the value.
func PinWanted(providerConfig map[string]string) (bool, error) {
	v, ok := providerConfig[PinKey]
	if !ok {
		return true, nil
	}
	switch strings.TrimSpace(v) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return true, fmt.Errorf("providerConfig %s is neither \"true\" nor \"false\"", PinKey)
}

// Budgets bound a run.
type Budgets struct {
	Total          time.Duration // the whole run
	WaitContainerd time.Duration // containerd answering `ctr version`
	PerImage       time.Duration // one `ctr images import`
}

// DefaultBudgets are the defaults; the import unit's TimeoutStartSec (15min) is above Total.
func DefaultBudgets() Budgets {
	return Budgets{Total: 12 * time.Minute, WaitContainerd: 60 * time.Second, PerImage: 3 * time.Minute}
}

// Options configure a run.
type Options struct {
	Root    paths.Root    // where the images directory is read
	Runner  runner.Runner // runs ctr
	Ctr     string        // absolute path of ctr (default /usr/bin/ctr)
	Address string        // containerd's socket (default /run/containerd/containerd.sock)
	Budgets Budgets
	Clock   wait.Clock
	Log     *slog.Logger
	// NoPin pins nothing and takes off every pin an earlier run set
	// (providerConfig images.pin: "false").
	NoPin bool
}

// Refusal is an image not imported, and why.
type Refusal struct {
	Ref, File, Reason string
}

// Result is what a run did.
type Result struct {
	Imported  []string
	Present   []string  // already in containerd at the locked digest: not read, not imported
	Refused   []Refusal // failed a check: never handed to containerd
	Failed    []Refusal // passed the checks, but the import or its verification failed
	Pinned    []string  // in containerd and pinned by this run (the others were pinned already)
	Released  []string  // pin and mark taken off: an earlier run's, not in this lock file (with NoPin, all)
	PinFailed []Refusal // in containerd but not pinned, or not released, and why
	Err       error     // the run could not start (lock file, images directory, containerd)
	ExitCode  int       // 0 when every image is in containerd, else 1
}

// Outcome names the result in one word.
func (r Result) Outcome() string {
	switch {
	case r.Err != nil || len(r.Failed) > 0:
		return "failed"
	case len(r.Refused) > 0:
		return "refused"
	case len(r.PinFailed) > 0:
		return "unpinned"
	default:
		return "ok"
	}
}

// Bundles reports whether the image at root bundles images at all: false,
// nil when its images directory or its lock file does not exist (an image
// built without them); any other error opening them is returned.
func Bundles(root paths.Root) (bool, error) {
	dir, err := fsutil.OpenDirNoFollow(root.Path("/"), paths.ImagesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer dir.Close()
	f, err := fsutil.OpenAtNoFollow(dir, "lock.yaml")
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	f.Close()
	return true, nil
}

// NotInContainerd is nil when every image of the lock file is in
// containerd; otherwise an error naming each one that is not (refused or
// failed: the run's own lines say why), or why the run could not start.
func (r Result) NotInContainerd() error {
	if r.Err != nil {
		return fmt.Errorf("the bundled images: %w", r.Err)
	}
	var refs []string
	for _, x := range slices.Concat(r.Refused, r.Failed) {
		refs = append(refs, x.Ref)
	}
	if len(refs) == 0 {
		return nil
	}
	return fmt.Errorf("bundled images not in containerd: %s (msg=image-refused or msg=image-import-failed says why)", strings.Join(refs, ", "))
}

// withDefaults fills what o leaves empty: no log, /usr/bin/ctr, the
// system socket, DefaultBudgets.
func (o Options) withDefaults() Options {
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Ctr == "" {
		o.Ctr = paths.Ctr
	}
	if o.Address == "" {
		o.Address = paths.ContainerdSocket
	}
	if o.Budgets == (Budgets{}) {
		o.Budgets = DefaultBudgets()
	}
	return o
}

// Sentinel reasons a tarball is refused for.
var (
	ErrSymlink    = errors.New("a symlink: not followed")
	ErrNotRegular = errors.New("not a regular file")
	ErrOwner      = errors.New("not owned by root")
	ErrWritable   = errors.New("group- or other-writable")
	ErrSize       = errors.New("size differs from the lock file")
	ErrDigest     = errors.New("sha256 differs from the lock file")
	ErrRef        = errors.New("names another image than the lock file")
	ErrManifest   = errors.New("names another manifest digest than the lock file")
	ErrMissing    = errors.New("missing")
)

// Run imports the lock file's images and logs one summary line plus one
// line per image not imported.
func Run(ctx context.Context, o Options) Result {
	start := time.Now()
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Budgets.Total)
	defer cancel()
	res := run(ctx, o)
	if res.Err != nil || len(res.Refused) > 0 || len(res.Failed) > 0 || len(res.PinFailed) > 0 {
		res.ExitCode = 1
	}
	for _, r := range res.Refused {
		o.Log.Warn("image-refused", "ref", r.Ref, "file", r.File, "reason", runner.Sanitize(r.Reason, 300))
	}
	for _, r := range res.Failed {
		o.Log.Warn("image-import-failed", "ref", r.Ref, "file", r.File, "reason", runner.Sanitize(r.Reason, 300))
	}
	for _, r := range res.PinFailed {
		o.Log.Warn("image-pin-failed", "ref", runner.Sanitize(r.Ref, 200), "reason", runner.Sanitize(r.Reason, 300))
	}
	attrs := []any{"outcome", res.Outcome(), "imported", len(res.Imported), "present", len(res.Present), "refused", len(res.Refused),
		"failed", len(res.Failed), "pinned", len(res.Pinned), "released", len(res.Released), "pin_failed", len(res.PinFailed),
		"duration", time.Since(start).Round(time.Millisecond).String()}
	if res.Err != nil {
		attrs = append(attrs, "error", runner.Sanitize(res.Err.Error(), 500))
	}
	if res.ExitCode != 0 {
		o.Log.Warn("import-images", attrs...)
	} else {
		o.Log.Info("import-images", attrs...)
	}
	return res
}

func run(ctx context.Context, o Options) Result {
	var res Result
	dir, err := fsutil.OpenDirNoFollow(o.Root.Path("/"), paths.ImagesDir)
	if err != nil {
		res.Err = fmt.Errorf("open %s: %w", paths.ImagesDir, err)
		return res
	}
	defer dir.Close()
	if err := trusted(dir, true); err != nil {
		res.Err = fmt.Errorf("%s: %w", paths.ImagesDir, err)
		return res
	}
	lock, err := readLock(dir)
	if err != nil {
		res.Err = fmt.Errorf("%s: %w", paths.ImageLock, err)
		return res
	}
	err = wait.Poll(ctx, o.Clock, wait.Budget{Total: o.Budgets.WaitContainerd, Interval: time.Second, PerAttempt: 5 * time.Second},
		"containerd", func(ctx context.Context) (bool, error) {
			_, err := o.Runner.Run(ctx, o.ctr(5*time.Second, "version"))
			return err == nil, err
		})
	if err != nil {
		res.Err = err
		return res
	}
	var known []string // references the lock file ties to a manifest digest
	for _, im := range lock.Images {
		if im.Manifest != "" {
			known = append(known, im.Ref)
		}
	}
	var before map[string]Listed
	var listErr error
	if len(known) > 0 {
		before, listErr = o.list(ctx, known)
	}
	digests := map[string]string{}
	for _, a := range Decide(lock.Images, before, listErr) {
		im := a.Image
		if a.Reason == Present {
			res.Present = append(res.Present, im.Ref)
			continue
		}
		if err := ctx.Err(); err != nil {
			res.Failed = append(res.Failed, Refusal{im.Ref, im.File, "not attempted: " + err.Error()})
			continue
		}
		f, ref, err := Check(ctx, dir, im)
		if err != nil {
			res.Refused = append(res.Refused, Refusal{im.Ref, im.File, err.Error()})
			continue
		}
		c := o.ctr(o.Budgets.PerImage, "images", "import", "-")
		c.Stdin = f
		_, err = o.Runner.Run(ctx, c)
		f.Close()
		if err != nil {
			res.Failed = append(res.Failed, Refusal{im.Ref, im.File, err.Error()})
			continue
		}
		digests[im.Ref] = ref.ManifestDigest
	}
	if len(digests) == 0 {
		o.pin(ctx, lock, &res)
		return res
	}
	// What containerd now lists under each reference must be the manifest
	// the tarball carried, with all of its content.
	var imported []string
	for _, im := range lock.Images {
		if _, ok := digests[im.Ref]; ok {
			imported = append(imported, im.Ref)
		}
	}
	listed, err := o.list(ctx, imported)
	for _, im := range lock.Images {
		want, ok := digests[im.Ref]
		if !ok {
			continue
		}
		got, ok := listed[im.Ref]
		switch {
		case err != nil:
			res.Failed = append(res.Failed, Refusal{im.Ref, im.File, "containerd's list: " + err.Error()})
		case !ok:
			res.Failed = append(res.Failed, Refusal{im.Ref, im.File, "not listed by containerd after import"})
		case got.Digest != want:
			res.Failed = append(res.Failed, Refusal{im.Ref, im.File, fmt.Sprintf("containerd lists %s, the tarball carries %s", got.Digest, want)})
		case !got.Complete:
			res.Failed = append(res.Failed, Refusal{im.Ref, im.File, "containerd lists it incomplete after import"})
		default:
			res.Imported = append(res.Imported, im.Ref)
		}
	}
	o.pin(ctx, lock, &res)
	return res
}

// pin labels every image of the lock file that is now in containerd at its
// locked digest (present or imported) with the CRI's pin and the bundled
// mark, unless it has both already; then it takes both off every image an
// earlier run marked that this lock file does not list. One bounded list
// each, one `ctr images label` per image that changes.
func (o Options) pin(ctx context.Context, lock imagelock.Lock, res *Result) {
	in := slices.Concat(res.Present, res.Imported)
	if o.NoPin {
		o.release(ctx, func(string) bool { return false }, res)
		return
	}
	if len(in) > 0 {
		var filters []string
		for _, ref := range in {
			// references are checked by imagelock: no quote, no backslash
			filters = append(filters, `name=="`+ref+`",labels."`+PinLabel+`"==`+PinValue+`,labels."`+BundledLabel+`"==`+BundledValue)
		}
		pinned, err := o.names(ctx, filters)
		for _, ref := range in {
			switch {
			case err != nil:
				res.PinFailed = append(res.PinFailed, Refusal{Ref: ref, Reason: "containerd's list of pinned images: " + err.Error()})
				continue
			case slices.Contains(pinned, ref):
				continue
			}
			if err := o.label(ctx, ref, PinValue, BundledValue); err != nil {
				res.PinFailed = append(res.PinFailed, Refusal{Ref: ref, Reason: "pin: " + err.Error()})
				continue
			}
			res.Pinned = append(res.Pinned, ref)
		}
	}
	o.release(ctx, func(name string) bool {
		return slices.ContainsFunc(lock.Images, func(im imagelock.Image) bool { return im.Ref == name })
	}, res)
}

// release takes the pin and the bundled mark off every image an earlier
// run marked, except those keep says to keep.
func (o Options) release(ctx context.Context, keep func(name string) bool, res *Result) {
	marked, err := o.names(ctx, []string{`labels."` + BundledLabel + `"==` + BundledValue})
	if err != nil {
		res.PinFailed = append(res.PinFailed, Refusal{Reason: "containerd's list of the images pinned earlier: " + err.Error()})
		return
	}
	for _, name := range marked {
		if keep(name) {
			continue
		}
		if !imagelock.ValidRef(name) {
			// Never handed to ctr as an argument: it could read as a flag.
			res.PinFailed = append(res.PinFailed, Refusal{Ref: "(not a reference)", Reason: fmt.Sprintf("an image marked %s has a name of %d bytes that is not a reference: left pinned", BundledLabel, len(name))})
			continue
		}
		if err := o.label(ctx, name, "", ""); err != nil {
			res.PinFailed = append(res.PinFailed, Refusal{Ref: name, Reason: "release: " + err.Error()})
			continue
		}
		res.Released = append(res.Released, name)
	}
}

// Release takes off every pin an earlier run set, for a node whose
// providerConfig turns the pins off (PinKey): one bounded list, one
// `ctr images label` per pinned image, one summary line
// (msg=release-image-pins). It reads no lock file and imports nothing.
func Release(ctx context.Context, o Options) Result {
	start := time.Now()
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Budgets.Total)
	defer cancel()
	var res Result
	o.release(ctx, func(string) bool { return false }, &res)
	for _, r := range res.PinFailed {
		o.Log.Warn("image-pin-failed", "ref", runner.Sanitize(r.Ref, 200), "reason", runner.Sanitize(r.Reason, 300))
	}
	attrs := []any{"outcome", "ok", "released", len(res.Released), "pin_failed", len(res.PinFailed), "duration", time.Since(start).Round(time.Millisecond).String()}
	if len(res.PinFailed) > 0 {
		attrs[1] = "failed"
		res.ExitCode = 1
		o.Log.Warn("release-image-pins", attrs...)
	} else {
		o.Log.Info("release-image-pins", attrs...)
	}
	return res
}

// label sets (or, with empty values, removes) the pin and the bundled mark
// of one image.
func (o Options) label(ctx context.Context, ref, pin, bundled string) error {
	_, err := o.Runner.Run(ctx, o.ctr(30*time.Second, "images", "label", ref, PinLabel+"="+pin, BundledLabel+"="+bundled))
	return err
}

// names lists, in one bounded call, the names of the images that match any
// of filters (`ctr images ls -q`: one name per line).
func (o Options) names(ctx context.Context, filters []string) ([]string, error) {
	out, err := o.Runner.Run(ctx, o.ctr(30*time.Second, append([]string{"images", "ls", "-q"}, filters...)...))
	if err != nil {
		return nil, fmt.Errorf("images ls: %w", err)
	}
	var names []string
	for _, l := range strings.Split(string(out.Stdout), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			names = append(names, l)
		}
	}
	return names, nil
}

// Reason is why a run imports an image of the lock file, or skips it.
type Reason int

// Reasons, from the facts Decide weighs.
const (
	Present        Reason = iota + 1 // containerd holds the reference, complete, at the locked manifest digest: skipped
	NoLockedDigest                   // the lock file names no manifest digest (an earlier release's): imported
	NoList                           // containerd's list could not be had or read: imported
	Missing                          // containerd does not hold the reference: imported
	OtherDigest                      // containerd holds the reference at another manifest: imported
	Incomplete                       // containerd holds it at the locked digest but not all of its content: imported
)

func (r Reason) String() string {
	switch r {
	case Present:
		return "present"
	case NoLockedDigest:
		return "no manifest digest in the lock file"
	case NoList:
		return "containerd's list unavailable"
	case Missing:
		return "not in containerd"
	case OtherDigest:
		return "at another digest in containerd"
	case Incomplete:
		return "incomplete in containerd"
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// Action is what a run does with one image of the lock file.
type Action struct {
	Image  imagelock.Image
	Reason Reason // Present: skipped; anything else: verified and imported
}

// Listed is what containerd reports for one reference. Whether the image is
// unpacked is not weighed: that is about ctr's default snapshotter, not
// necessarily the CRI's, which unpacks complete content when it needs to.
type Listed struct {
	Digest   string // the manifest digest the reference points at
	Complete bool   // every blob the image needs on this platform is in the content store
}

// Decide maps the facts to one action per image of the lock file, in its
// order: an image is skipped only when the lock file names its manifest
// digest and containerd lists the reference at exactly that digest with all
// of its content. containerd's content is addressed by digest and verified
// as it is written, so that manifest digest ties what containerd holds to
// the lock file. listed is containerd's list (nil with listErr when it could
// not be had); anything else is imported.
func Decide(images []imagelock.Image, listed map[string]Listed, listErr error) []Action {
	out := make([]Action, 0, len(images))
	for _, im := range images {
		got, ok := listed[im.Ref]
		var r Reason
		switch {
		case im.Manifest == "":
			r = NoLockedDigest
		case listErr != nil || listed == nil:
			r = NoList
		case !ok:
			r = Missing
		case got.Digest != im.Manifest:
			r = OtherDigest
		case !got.Complete:
			r = Incomplete
		default:
			r = Present
		}
		out = append(out, Action{Image: im, Reason: r})
	}
	return out
}

// list asks containerd, in one bounded call, which of refs it holds, at
// which manifest digest and whether with all of their content. Only refs are
// listed (a filter per reference): other images, whatever their state, do
// not matter.
func (o Options) list(ctx context.Context, refs []string) (map[string]Listed, error) {
	args := []string{"images", "check"}
	for _, r := range refs {
		args = append(args, `name=="`+r+`"`) // references are checked by imagelock: no quote, no backslash
	}
	out, err := o.Runner.Run(ctx, o.ctr(30*time.Second, args...))
	if err != nil {
		return nil, fmt.Errorf("images check: %w", err)
	}
	l, err := parseCheck(string(out.Stdout), refs)
	if err != nil {
		return nil, fmt.Errorf("images check: %w", err)
	}
	return l, nil
}

var (
	checkHeader    = []string{"REF", "TYPE", "DIGEST", "STATUS", "SIZE", "UNPACKED"}
	manifestDigest = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^sha256:[0-9a-f]{64}$`) })
	checkCount     = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\(([0-9]+)/([0-9]+)\)$`) })
)

// parseCheck reads `ctr images check` output (containerd 1.6: a header, then
// REF TYPE DIGEST STATUS SIZE UNPACKED per image, STATUS "complete (n/n)",
// "incomplete (n/m)", "unavailable (n/?)" or "error"; nothing at all when no
// image matched). Strict: anything else, or a reference that was not asked
// for or listed twice, makes the whole list unusable.
func parseCheck(s string, refs []string) (map[string]Listed, error) {
	out := map[string]Listed{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if !slices.Equal(strings.Fields(lines[0]), checkHeader) {
		return nil, fmt.Errorf("unexpected header %q", runner.Sanitize(lines[0], 200))
	}
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		if len(f) < len(checkHeader) {
			return nil, fmt.Errorf("unexpected line %q", runner.Sanitize(line, 200))
		}
		ref, digest, status, unpacked := f[0], f[2], f[3], f[len(f)-1]
		_, dup := out[ref]
		switch {
		case !slices.Contains(refs, ref):
			return nil, fmt.Errorf("lists %q, not asked for", runner.Sanitize(ref, 200))
		case dup:
			return nil, fmt.Errorf("lists %s twice", ref)
		case !manifestDigest().MatchString(digest):
			return nil, fmt.Errorf("%s: digest %q", ref, runner.Sanitize(digest, 100))
		case unpacked != "true" && unpacked != "false":
			return nil, fmt.Errorf("unexpected line %q", runner.Sanitize(line, 200))
		}
		complete := false
		switch status {
		case "complete":
			m := checkCount().FindStringSubmatch(f[4])
			if m == nil {
				return nil, fmt.Errorf("unexpected line %q", runner.Sanitize(line, 200))
			}
			complete = m[1] == m[2]
		case "incomplete", "unavailable", "error":
		default:
			return nil, fmt.Errorf("%s: status %q", ref, runner.Sanitize(status, 100))
		}
		out[ref] = Listed{Digest: digest, Complete: complete}
	}
	return out, nil
}

func (o Options) ctr(timeout time.Duration, args ...string) runner.Cmd {
	return runner.Cmd{Path: o.Ctr, Args: append([]string{"--address", o.Address, "--namespace", Namespace}, args...), Timeout: timeout}
}

// trusted checks an open file or directory: root-owned and not writable by
// group or others.
func trusted(f *os.File, dir bool) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if dir != st.IsDir() || !dir && !st.Mode().IsRegular() {
		return ErrNotRegular
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("no owner information")
	}
	if sys.Uid != 0 {
		return fmt.Errorf("%w (uid %d)", ErrOwner, sys.Uid)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w (mode %04o)", ErrWritable, st.Mode().Perm())
	}
	return nil
}

func readLock(dir *os.File) (imagelock.Lock, error) {
	f, err := fsutil.OpenAtNoFollow(dir, "lock.yaml")
	if err != nil {
		return imagelock.Lock{}, err
	}
	defer f.Close()
	if err := trusted(f, false); err != nil {
		return imagelock.Lock{}, err
	}
	b, err := io.ReadAll(io.LimitReader(f, 1<<20+1))
	if err != nil {
		return imagelock.Lock{}, err
	}
	if len(b) > 1<<20 {
		return imagelock.Lock{}, fmt.Errorf("larger than 1 MiB")
	}
	return imagelock.Parse(b)
}

// Check opens one tarball of the lock file in dir and verifies it; on
// success the returned file is positioned at its start, ready to be read by
// the import, and ref is what its index names.
func Check(ctx context.Context, dir *os.File, im imagelock.Image) (*os.File, oci.Ref, error) {
	f, err := fsutil.OpenAtNoFollow(dir, im.File)
	switch {
	case errors.Is(err, fsutil.ErrSymlink):
		return nil, oci.Ref{}, ErrSymlink
	case errors.Is(err, os.ErrNotExist):
		return nil, oci.Ref{}, ErrMissing
	case err != nil:
		return nil, oci.Ref{}, err
	}
	ref, err := check(ctx, f, im)
	if err != nil {
		f.Close()
		return nil, oci.Ref{}, err
	}
	return f, ref, nil
}

func check(ctx context.Context, f *os.File, im imagelock.Image) (oci.Ref, error) {
	if err := trusted(f, false); err != nil {
		return oci.Ref{}, err
	}
	st, err := f.Stat()
	if err != nil {
		return oci.Ref{}, err
	}
	if st.Size() != im.Size {
		return oci.Ref{}, fmt.Errorf("%w: %d bytes, lock file %d", ErrSize, st.Size(), im.Size)
	}
	sum, n, err := oci.FileDigest(ctxReader{ctx, io.LimitReader(f, im.Size+1)})
	if err != nil {
		return oci.Ref{}, fmt.Errorf("read: %w", err)
	}
	if n != im.Size {
		return oci.Ref{}, fmt.Errorf("%w: read %d bytes, lock file %d", ErrSize, n, im.Size)
	}
	if sum != im.SHA256 {
		return oci.Ref{}, fmt.Errorf("%w: %s, lock file %s", ErrDigest, sum, im.SHA256)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return oci.Ref{}, err
	}
	ref, err := oci.ReadRef(f)
	if err != nil {
		return oci.Ref{}, err
	}
	if ref.Name != im.Ref {
		return oci.Ref{}, fmt.Errorf("%w: %s", ErrRef, ref.Name)
	}
	if im.Manifest != "" && ref.ManifestDigest != im.Manifest {
		return oci.Ref{}, fmt.Errorf("%w: %s, lock file %s", ErrManifest, runner.Sanitize(ref.ManifestDigest, 100), im.Manifest)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return oci.Ref{}, err
	}
	return ref, nil
}

// ctxReader stops a long read when the context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
