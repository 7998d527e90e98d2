// Package pin reads and sets the node's pin: clusterConfiguration's
// kubernetesVersion in the cluster: section of the node's own cloud-config
// under /oem, the value an upgrade bumps (docs/upgrade.md).
//
// The pass never reads /oem: Kairos merges the cloud-config files and hands
// the section to the plugin at every boot (docs/cloud-config.md). So the
// file is found the way Kairos's collector (kairos-sdk v0.25.3) finds
// cloud-configs: every *.yaml and *.yml file below /oem whose first ten
// lines hold a #cloud-config (or #kairos-config, #node-config) header.
// Exactly one of them may set the section's config; any doubt (several,
// a link, a special file, one too large to read) is a refusal.
//
// Setting it edits the one scalar in place, at the byte offsets a YAML
// parse finds (the rest of the file stays byte-identical: comments, other
// documents, line endings, the value's quoting), checks the result by
// parsing it again, and replaces the file atomically through the held
// directory, keeping its owner, group and mode. Whether the new pin is a
// step the node may take is the boot's decision (pkg/plan), not this one's.
package pin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Bounds of the search below /oem. Kairos's collector skips a file of
// 2 MiB or more; pin reads no more than that, and refuses such a file
// rather than guess what it holds.
const (
	MaxFile     = clusterconfig.MaxCloudConfigFile
	maxDepth    = clusterconfig.MaxCloudConfigDepth
	maxEntries  = clusterconfig.MaxCloudConfigEntries
	maxYAMLRead = 256
)

// ErrRefused marks what cannot be read or done safely: nothing was changed.
var ErrRefused = errors.New("refused")

// Refusal is one reason, for a person; it matches ErrRefused.
type Refusal struct{ Reason string }

func (r *Refusal) Error() string { return r.Reason }

// Is makes a Refusal match ErrRefused.
func (r *Refusal) Is(target error) bool { return target == ErrRefused }

func refuse(format string, a ...any) error { return &Refusal{Reason: fmt.Sprintf(format, a...)} }

// Target checks a pin to set: an exact vMAJOR.MINOR.PATCH release of a
// minor in the supported window. The error describes a malformed value
// without quoting it.
func Target(w version.Window, s string) (version.Version, error) {
	v, err := version.Parse(s)
	if err != nil {
		return version.Version{}, fmt.Errorf("the version (%s) is not an exact vMAJOR.MINOR.PATCH release such as v1.37.2", plan.Described(s))
	}
	if !w.Contains(v.MinorOf()) {
		return version.Version{}, fmt.Errorf("%s is outside the supported window %s", v, w)
	}
	return v, nil
}

// File is the cloud-config file carrying the pin, held open: its
// directory handle is what a change is written through. Close it.
type File struct {
	// Path is the host path (/oem/90_custom.yaml).
	Path string
	// Pin is the value as written (possibly not a version: print it with
	// plan.ShownPin).
	Pin string

	data    []byte
	loc     location
	st      unix.Stat_t
	dir     *os.File
	name    string
	openDir string // the first directory from the root down that someone else can write, if any
}

// Close releases the directory handle.
func (f *File) Close() error {
	if f == nil || f.dir == nil {
		return nil
	}
	return f.dir.Close()
}

// candidate is a cloud-config below /oem that sets cluster: config.
type candidate struct {
	path string
	file *File
	err  error // why its pin cannot be read
}

// finder walks /oem beneath held directory handles.
type finder struct {
	entries, read int
	found         []candidate
	// admins are the node's groups whose members are root already
	// (fsutil.AdminGroups): Kairos makes /oem root:admin 0770.
	admins []uint32
}

// Find locates the pin below root's /oem. A refusal (ErrRefused) says why
// it cannot be told safely; other errors are failures to read.
func Find(root paths.Root) (*File, error) {
	r := string(root)
	if r == "" {
		r = "/"
	}
	top, err := fsutil.OpenDirNoFollow(r, "/")
	if err != nil {
		return nil, err
	}
	fd := &finder{admins: fsutil.AdminGroups(r)}
	open := ""
	if !fd.trusted(top) {
		open = "/"
	}
	dir, host := top, ""
	for _, c := range strings.Split(strings.Trim(paths.OEMDir, "/"), "/") {
		host += "/" + c
		next, err := openDir(dir, c, host)
		dir.Close()
		if err != nil {
			return nil, err
		}
		dir = next
		if open == "" && !fd.trusted(dir) {
			open = host
		}
	}
	err = fd.walk(dir, host, 0, open)
	dir.Close()
	if err != nil {
		fd.close()
		return nil, err
	}
	switch len(fd.found) {
	case 0:
		return nil, refuse("no cloud-config under %s sets the cluster: section's config (Kairos reads the *.yaml and *.yml files there that start with #cloud-config)", paths.OEMDir)
	case 1:
	default:
		var names []string
		for _, c := range fd.found {
			names = append(names, c.path)
		}
		fd.close()
		return nil, refuse("%d cloud-configs set the cluster: section's config (%s): Kairos merges them and pin would be guessing which one counts; keep the section in one file", len(names), strings.Join(names, ", "))
	}
	c := fd.found[0]
	if c.err != nil {
		fd.close()
		return nil, c.err
	}
	return c.file, nil
}

func (fd *finder) close() {
	for _, c := range fd.found {
		c.file.Close()
	}
}

// openDir opens the directory name in dir without following a link.
func openDir(dir *os.File, name, host string) (*os.File, error) {
	d, err := fsutil.OpenAtNoFollow(dir, name)
	if errors.Is(err, fsutil.ErrSymlink) {
		return nil, refuse("%s is a symlink: pin does not follow links", host)
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, refuse("%s does not exist: is this an installed Kairos node?", host)
	}
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		d.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		d.Close()
		return nil, refuse("%s is %s, not a directory", host, fsutil.Kind(st.Mode))
	}
	return d, nil
}

// trusted: a directory only this user can write (its owner, no world
// write, no group write but by a group of fd.admins): nobody but root can
// swap what is in it.
func (fd *finder) trusted(d *os.File) bool {
	var st unix.Stat_t
	return unix.Fstat(int(d.Fd()), &st) == nil && fsutil.TrustedStat(&st, fd.admins)
}

// walk visits dir (host path host) as Kairos's collector does (every
// file below it, in name order), never following a link.
func (fd *finder) walk(dir *os.File, host string, depth int, open string) error {
	ents, err := fsutil.ReadDirAtMost(dir, maxEntries-fd.entries)
	if errors.Is(err, fsutil.ErrTooLarge) {
		return refuse("%s holds more than %d entries: pin stops there rather than search without end", paths.OEMDir, maxEntries)
	}
	if err != nil {
		return err
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	for _, e := range ents {
		fd.entries++
		name, p := e.Name(), host+"/"+e.Name()
		var st unix.Stat_t
		if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "lstat", Path: p, Err: err}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if depth+1 >= maxDepth {
				return refuse("%s is nested more than %d directories below %s: pin stops there rather than search without end", p, maxDepth, paths.OEMDir)
			}
			sub, err := openDir(dir, name, p)
			if err != nil {
				return err
			}
			subOpen := open
			if subOpen == "" && !fd.trusted(sub) {
				subOpen = p
			}
			err = fd.walk(sub, p, depth+1, subOpen)
			sub.Close()
			if err != nil {
				return err
			}
			continue
		}
		if ext := path.Ext(name); ext != ".yaml" && ext != ".yml" {
			continue // Kairos skips it too
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
		case unix.S_IFLNK:
			return refuse("%s is a symlink: Kairos reads the file it points to, which may carry the pin, and pin does not follow links: put the file itself there", p)
		default:
			return refuse("%s is %s, not a regular file", p, fsutil.Kind(st.Mode))
		}
		if err := fd.visit(dir, name, p, open); err != nil {
			return err
		}
	}
	return nil
}

// visit reads one cloud-config candidate, bounded, and keeps it when it
// sets the cluster: section's config.
func (fd *finder) visit(dir *os.File, name, p, open string) error {
	fd.read++
	if fd.read > maxYAMLRead {
		return refuse("%s holds more than %d YAML files: pin stops there rather than read without end", paths.OEMDir, maxYAMLRead)
	}
	f, err := fsutil.OpenAtNoFollow(dir, name)
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return refuse("%s is %s, not a regular file", p, fsutil.Kind(st.Mode))
	}
	if st.Size > MaxFile {
		return refuse("%s is %d bytes: Kairos skips a cloud-config of 2 MiB or more and pin reads no more than that: keep the cluster: section in a smaller file", p, st.Size)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFile+1))
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if len(data) > MaxFile {
		return refuse("%s grew past %d bytes while being read", p, MaxFile)
	}
	if !clusterconfig.HasCloudConfigHeader(data) {
		return nil // not a cloud-config: Kairos skips it too
	}
	loc, has, err := locate(data)
	if err != nil && !has {
		return refuse("%s: %v", p, err)
	}
	if !has {
		return nil
	}
	c := candidate{path: p, err: err}
	if err != nil {
		c.err = refuse("%s: %v", p, err)
	} else {
		d, derr := unix.Dup(int(dir.Fd()))
		if derr != nil {
			return &os.PathError{Op: "dup", Path: p, Err: derr}
		}
		unix.CloseOnExec(d)
		c.file = &File{Path: p, Pin: loc.value, data: data, loc: loc, st: st, dir: os.NewFile(uintptr(d), dir.Name()), name: name, openDir: open}
	}
	fd.found = append(fd.found, c)
	return nil
}
