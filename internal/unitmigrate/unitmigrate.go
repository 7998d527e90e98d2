// Package unitmigrate retires the unit copies and .wants links that releases
// up to v0.3.0 put in /etc/systemd/system, now that the units live in the
// image's /usr/lib/systemd/system. A copy is removed only when its bytes (or
// a link's target) equal exactly what this project shipped at that exact
// path (system/shipped.yaml); anything else is kept and named in the journal,
// and an edited copy makes the run fail on purpose so it shows in
// `systemctl --failed`: also an edited copy of a drop-in a release shipped
// whose name the image still ships (v0.3.0's kubelet.service.d/10-kubeadm.conf),
// which would replace the image's drop-in for good. Drop-ins an operator
// added under <unit>.d/ with names of their own are never read or touched. No symlink is ever followed. systemd is reloaded only when
// something was removed.
//
// The decision is the pure function Decide over what Observe saw; Run acts.
package unitmigrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/dbus"
	"github.com/coreos/go-systemd/v22/journal"
	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/system"
)

// MaxUnitSize bounds what is read of a candidate file: anything larger than
// this cannot be a unit this project shipped.
const MaxUnitSize = 1 << 20

// ReloadBudget bounds the D-Bus reload.
const ReloadBudget = 30 * time.Second

// Kind is what was found at a candidate path.
type Kind string

// Kinds.
const (
	Absent  Kind = "absent"
	Regular Kind = "file"
	Symlink Kind = "symlink"
	Other   Kind = "other"  // a directory, FIFO, device...
	Unsafe  Kind = "unsafe" // a directory on the way is a symlink, or it cannot be read
)

// Observed is one candidate path as found, without following any symlink.
type Observed struct {
	Path   string // host path
	Kind   Kind
	SHA256 string // Regular: digest of the content (empty when larger than MaxUnitSize)
	Target string // Symlink: the link's target as written
	Detail string // Unsafe/Other: why
}

// Action is what Decide chose.
type Action string

// Actions.
const (
	Nothing    Action = "nothing"     // absent
	Remove     Action = "remove"      // exactly something shipped at this path
	KeepEdited Action = "keep-edited" // ours by path, not by content (or an edited drop-in that shadows the image's): kept, reported, the run fails
	KeepDropIn Action = "keep-dropin" // an operator's version of a drop-in name a release shipped that the image no longer ships: kept, reported, not a failure
	KeepMasked Action = "keep-masked" // a link to /dev/null: the operator masked the unit
)

// Decision is the verdict for one path.
type Decision struct {
	Path   string
	Action Action
	Reason string
}

// Fails reports whether the decision makes the run fail.
func (d Decision) Fails() bool { return d.Action == KeepEdited }

// Candidates are the host paths the migration looks at, sorted: every path
// under /etc/systemd/system the manifest lists, plus /etc/systemd/system/<unit>
// for every unit the image ships (a copy an operator made of a current unit
// shadows the image's one just the same).
func Candidates(m system.Manifest) []string {
	set := map[string]bool{}
	for p := range m.EtcFiles() {
		set[p] = true
	}
	for p := range m.EtcLinks() {
		set[p] = true
	}
	for _, f := range system.Units() {
		rel := strings.TrimPrefix(f.Path, system.UnitDir+"/")
		if !strings.Contains(rel, "/") {
			set[path.Join(system.EtcUnitDir, rel)] = true
		}
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Decide is the pure verdict for one observed path against the manifest.
func Decide(o Observed, m system.Manifest) Decision {
	d := Decision{Path: o.Path}
	inDropInDir := strings.HasSuffix(path.Dir(o.Path), ".d")
	switch o.Kind {
	case Absent:
		d.Action = Nothing
	case Regular:
		for _, s := range m.EtcFiles()[o.Path] {
			if o.SHA256 != "" && o.SHA256 == s {
				d.Action, d.Reason = Remove, "identical to a shipped version"
				return d
			}
		}
		if inDropInDir {
			if img, ok := imageDropIn(o.Path); ok {
				// systemd reads one drop-in per name, /etc's before
				// /usr/lib's: this one silently replaces the image's.
				d.Action, d.Reason = KeepEdited, "an edited copy of a drop-in an earlier release shipped here: it replaces the image's "+img+
					" of the same name, so the image's version never applies; move your changes into a drop-in of your own name in "+path.Dir(o.Path)+"/ (e.g. 20-local.conf) and remove this file"
				return d
			}
			d.Action, d.Reason = KeepDropIn, "differs from every shipped version: an operator drop-in, left as it is"
			return d
		}
		d.Action, d.Reason = KeepEdited, "differs from every version this project shipped at this path: convert your changes into a drop-in under "+dropInDir(o.Path)
	case Symlink:
		for _, t := range m.EtcLinks()[o.Path] {
			if o.Target == t {
				d.Action, d.Reason = Remove, "a link this project shipped"
				return d
			}
		}
		if o.Target == "/dev/null" {
			d.Action, d.Reason = KeepMasked, "masked"
			return d
		}
		d.Action, d.Reason = KeepEdited, "a symlink to "+runner.Sanitize(o.Target, 200)+" this project did not ship here: not followed, kept"
	default: // Other, Unsafe
		d.Action, d.Reason = KeepEdited, runner.Sanitize(o.Detail, 200)
	}
	return d
}

// imageDropIn returns the image's drop-in that the /etc drop-in at p
// shadows: the same <unit>.d/<name> under the image's unit directory.
func imageDropIn(p string) (string, bool) {
	img := path.Join(system.UnitDir, strings.TrimPrefix(p, system.EtcUnitDir+"/"))
	for _, f := range system.Units() {
		if f.Path == img {
			return img, true
		}
	}
	return "", false
}

func dropInDir(p string) string {
	return path.Join(system.EtcUnitDir, path.Base(p)+".d") + "/"
}

// Observe looks at one host path under root without following a symlink
// anywhere on the way.
func Observe(root paths.Root, hostPath string) Observed {
	o := Observed{Path: hostPath}
	dir, err := fsutil.OpenDirNoFollow(root.Path("/"), path.Dir(hostPath))
	switch {
	case errors.Is(err, os.ErrNotExist):
		o.Kind = Absent
		return o
	case errors.Is(err, fsutil.ErrSymlink):
		o.Kind, o.Detail = Unsafe, "a directory on the way is a symlink: not followed, kept"
		return o
	case err != nil:
		o.Kind, o.Detail = Unsafe, fmt.Sprintf("cannot open its directory: %v", err)
		return o
	}
	defer dir.Close()
	name := path.Base(hostPath)
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			o.Kind = Absent
			return o
		}
		o.Kind, o.Detail = Unsafe, fmt.Sprintf("stat: %v", err)
		return o
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		t, err := readlinkat(int(dir.Fd()), name)
		if err != nil {
			o.Kind, o.Detail = Unsafe, fmt.Sprintf("readlink: %v", err)
			return o
		}
		o.Kind, o.Target = Symlink, t
	case unix.S_IFREG:
		f, err := fsutil.OpenAtNoFollow(dir, name)
		if err != nil {
			o.Kind, o.Detail = Unsafe, fmt.Sprintf("open: %v", err)
			return o
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, MaxUnitSize+1))
		if err != nil {
			o.Kind, o.Detail = Unsafe, fmt.Sprintf("read: %v", err)
			return o
		}
		o.Kind = Regular
		if len(b) <= MaxUnitSize {
			o.SHA256 = system.Digest(b)
		}
	default:
		o.Kind, o.Detail = Other, fmt.Sprintf("not a regular file or symlink (mode %o): kept", st.Mode&unix.S_IFMT)
	}
	return o
}

func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	if n >= len(buf) {
		return "", fmt.Errorf("link target longer than %d bytes", len(buf)-1)
	}
	return string(buf[:n]), nil
}

// remove unlinks hostPath when it is still exactly what was observed.
func remove(root paths.Root, o Observed) error {
	dir, err := fsutil.OpenDirNoFollow(root.Path("/"), path.Dir(o.Path))
	if err != nil {
		return err
	}
	defer dir.Close()
	name := path.Base(o.Path)
	again := Observe(root, o.Path)
	if again != o {
		return fmt.Errorf("%s changed while being migrated: kept", o.Path)
	}
	if err := unix.Unlinkat(int(dir.Fd()), name, 0); err != nil {
		return &os.PathError{Op: "unlink", Path: o.Path, Err: err}
	}
	return dir.Sync()
}

// Journal is the seam for naming kept copies in the journal.
type Journal interface {
	Send(message string, priority journal.Priority, vars map[string]string) error
}

// Reloader is the seam for `systemctl daemon-reload` over D-Bus.
type Reloader interface {
	Reload(ctx context.Context) error
}

// Options configure a run.
type Options struct {
	Root     paths.Root
	Manifest system.Manifest
	Journal  Journal
	// Reloader reloads systemd; nil skips the reload (the root is not this
	// host's, as with --root in tests).
	Reloader Reloader
	Log      *slog.Logger
}

// Result is what a run did.
type Result struct {
	Decisions []Decision
	Removed   []string
	Kept      []string // kept and failing (edited, unrecognised, not followed)
	Noted     []string // kept and fine (operator drop-ins, masks)
	Reloaded  bool
	Err       error // an I/O or reload failure
	ExitCode  int   // 0 clean or migrated; 1 something kept on purpose or a failure
}

// Outcome names the result in one word.
func (r Result) Outcome() string {
	switch {
	case r.Err != nil:
		return "failed"
	case len(r.Kept) > 0:
		return "kept-edited"
	case len(r.Removed) > 0:
		return "migrated"
	default:
		return "clean"
	}
}

// Run observes every candidate, removes what it recognises, names what it
// keeps in the journal, reloads systemd when something was removed, and logs
// one summary line.
func Run(ctx context.Context, o Options) Result {
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var res Result
	var errs []error
	for _, p := range Candidates(o.Manifest) {
		obs := Observe(o.Root, p)
		d := Decide(obs, o.Manifest)
		res.Decisions = append(res.Decisions, d)
		switch d.Action {
		case Remove:
			if err := remove(o.Root, obs); err != nil {
				errs = append(errs, err)
				res.Kept = append(res.Kept, p)
				continue
			}
			res.Removed = append(res.Removed, p)
		case KeepEdited:
			res.Kept = append(res.Kept, p)
			o.journal(journal.PriWarning, "provider-kubernetes migrate-units: kept "+p+": "+d.Reason, p, d.Action)
		case KeepDropIn:
			res.Noted = append(res.Noted, p)
			o.journal(journal.PriNotice, "provider-kubernetes migrate-units: left "+p+": "+d.Reason, p, d.Action)
		case KeepMasked:
			res.Noted = append(res.Noted, p)
		}
	}
	if len(res.Removed) > 0 && o.Reloader != nil {
		rctx, cancel := context.WithTimeout(ctx, ReloadBudget)
		err := o.Reloader.Reload(rctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("reload systemd: %w", err))
		} else {
			res.Reloaded = true
		}
	}
	res.Err = errors.Join(errs...)
	if res.Err != nil || len(res.Kept) > 0 {
		res.ExitCode = 1
	}
	attrs := []any{"outcome", res.Outcome(), "removed", len(res.Removed), "kept", len(res.Kept), "noted", len(res.Noted),
		"reloaded", res.Reloaded}
	if len(res.Removed) > 0 {
		attrs = append(attrs, "removed_paths", runner.Sanitize(strings.Join(res.Removed, ","), 1000))
	}
	if len(res.Kept) > 0 {
		attrs = append(attrs, "kept_paths", runner.Sanitize(strings.Join(res.Kept, ","), 1000))
	}
	if len(res.Removed) > 0 && o.Reloader == nil {
		attrs = append(attrs, "reload", "skipped: not the host root")
	}
	if res.Err != nil {
		attrs = append(attrs, "error", runner.Sanitize(res.Err.Error(), 500))
	}
	if res.ExitCode != 0 {
		o.Log.Warn("migrate-units", attrs...)
	} else {
		o.Log.Info("migrate-units", attrs...)
	}
	return res
}

func (o Options) journal(p journal.Priority, msg, hostPath string, a Action) {
	if o.Journal == nil {
		return
	}
	// A journal that cannot be written to must not change the outcome.
	_ = o.Journal.Send(runner.Sanitize(msg, 600), p, map[string]string{
		"SYSLOG_IDENTIFIER":             "provider-kubernetes",
		"PROVIDER_KUBERNETES_UNIT_PATH": hostPath,
		"PROVIDER_KUBERNETES_ACTION":    string(a),
	})
}

// SystemJournal writes to the systemd journal, or to W (stderr) when no
// journal is reachable.
type SystemJournal struct{ W io.Writer }

// Send implements Journal.
func (s SystemJournal) Send(message string, p journal.Priority, vars map[string]string) error {
	if journal.Enabled() {
		return journal.Send(message, p, vars)
	}
	if s.W != nil {
		_, err := fmt.Fprintln(s.W, message)
		return err
	}
	return nil
}

// SystemdReloader reloads systemd through its private D-Bus socket
// (/run/systemd/private, root only): it needs no dbus-daemon, which matters
// because the migration runs before most of the boot.
type SystemdReloader struct{}

// Reload implements Reloader.
func (SystemdReloader) Reload(ctx context.Context) error {
	conn, err := dbus.NewSystemdConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("connect to systemd: %w", err)
	}
	defer conn.Close()
	return conn.ReloadContext(ctx)
}
