// Package cryptgate decides whether a directory is on storage the provider
// may write a full etcd dump to: ext4 or xfs sitting directly on a dm-crypt
// device with an encrypting type. The decision (Decide) is a pure function of
// facts read under a host root (Gather): the path's components, the
// directory's device and filesystem magic (through the FS seam), the parsed
// /proc/self/mountinfo and /sys/dev/block/MAJ:MIN/dm/uuid. Anything unclear
// is unconfirmed.
package cryptgate

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// Filesystem magic numbers (statfs f_type).
const (
	MagicExt4 = 0xEF53 // ext2/3/4 share it: mountinfo's fstype tells them apart
	MagicXFS  = 0x58465342
)

// Host paths the gate reads.
const (
	Mountinfo = "/proc/self/mountinfo"
	SysDevBlk = "/sys/dev/block"
)

// encrypting are the dm-crypt types cryptsetup names in a dm uuid
// ("CRYPT-<TYPE>-...") that encrypt the data.
var encrypting = map[string]bool{"PLAIN": true, "LUKS1": true, "LUKS2": true, "LOOPAES": true, "TCRYPT": true, "BITLK": true}

// Dev is a block device number.
type Dev struct{ Major, Minor uint32 }

func (d Dev) String() string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// Verdict is the gate's answer. Reason always says why, in one line.
type Verdict struct {
	Confirmed bool
	Reason    string
	Dev       Dev    // the directory's device, when it was read
	FSType    string // the mount's filesystem type, when known
	CryptType string // LUKS2, PLAIN, ... when confirmed
}

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	ID, Parent int
	Dev        Dev
	Root       string // the path inside the filesystem that is mounted
	MountPoint string
	FSType     string
	Source     string
	// SuperOptions are the per-superblock options ("rw,memory"), as written.
	SuperOptions string
}

// ParseMountinfo parses /proc/PID/mountinfo (proc(5)).
func ParseMountinfo(b []byte) ([]Mount, error) {
	var out []Mount
	for n, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Fields(line)
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if len(f) < 7 || sep < 0 || sep+2 >= len(f) {
			return nil, fmt.Errorf("mountinfo line %d: malformed", n+1)
		}
		id, err1 := strconv.Atoi(f[0])
		parent, err2 := strconv.Atoi(f[1])
		maj, min, ok := strings.Cut(f[2], ":")
		ma, err3 := strconv.ParseUint(maj, 10, 32)
		mi, err4 := strconv.ParseUint(min, 10, 32)
		if err := errors.Join(err1, err2, err3, err4); err != nil || !ok {
			return nil, fmt.Errorf("mountinfo line %d: malformed numbers", n+1)
		}
		out = append(out, Mount{
			ID: id, Parent: parent, Dev: Dev{uint32(ma), uint32(mi)},
			Root: unescape(f[3]), MountPoint: unescape(f[4]),
			FSType: f[sep+1], Source: unescape(f[sep+2]),
		})
		if sep+3 < len(f) {
			out[len(out)-1].SuperOptions = f[sep+3]
		}
	}
	if len(out) == 0 {
		return nil, errors.New("mountinfo is empty")
	}
	return out, nil
}

// unescape undoes the kernel's octal escapes (\040 for a space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Facts are everything Decide looks at.
type Facts struct {
	Dir       string   // host path of the directory, absolute
	Forbidden []string // host paths the directory must not be under (nor be visible under)

	Symlink string // first path component that is a symlink
	NotDir  string // first component that is not a directory
	Missing string // first component that does not exist
	PathErr string // another error walking the path

	Stat    Stat
	StatErr string

	Mounts       []Mount
	MountinfoErr string

	DMUUID    string // content of /sys/dev/block/MAJ:MIN/dm/uuid
	HasDM     bool   // the device is a device-mapper device (the file exists)
	DMUUIDErr string // an error other than "does not exist" reading it
}

// Decide is the gate.
func Decide(f Facts) Verdict {
	no := func(format string, a ...any) Verdict {
		return Verdict{Reason: fmt.Sprintf(format, a...), Dev: f.Stat.Dev}
	}
	dir := f.Dir
	if !path.IsAbs(dir) || path.Clean(dir) != dir {
		return no("%q is not a clean absolute path", dir)
	}
	for _, fb := range f.Forbidden {
		if under(dir, fb) {
			return no("%s is under %s", dir, fb)
		}
	}
	switch {
	case f.Symlink != "":
		return no("%s is a symlink", f.Symlink)
	case f.NotDir != "":
		return no("%s is not a directory", f.NotDir)
	case f.Missing != "":
		return no("%s does not exist", f.Missing)
	case f.PathErr != "":
		return no("%s", f.PathErr)
	case f.StatErr != "":
		return no("stat %s: %s", dir, f.StatErr)
	case f.MountinfoErr != "":
		return no("%s: %s", Mountinfo, f.MountinfoErr)
	}
	var m *Mount
	for i := range f.Mounts {
		c := &f.Mounts[i]
		// The longest mount point wins; on a tie the later (stacked on top) one.
		if under(dir, c.MountPoint) && (m == nil || len(c.MountPoint) >= len(m.MountPoint)) {
			m = c
		}
	}
	if m == nil {
		return no("no mount in %s holds %s", Mountinfo, dir)
	}
	v := no("")
	v.FSType = m.FSType
	if m.Dev != f.Stat.Dev {
		v.Reason = fmt.Sprintf("%s is on device %s but its mount %s is %s (a subvolume, or a mount that changed)", dir, f.Stat.Dev, m.MountPoint, m.Dev)
		return v
	}
	// The same directory may also be visible under a forbidden path through a
	// bind mount of the same filesystem.
	rel := strings.TrimPrefix(strings.TrimPrefix(dir, m.MountPoint), "/")
	fsPath := path.Join(m.Root, rel)
	for _, o := range f.Mounts {
		if o.Dev != m.Dev {
			continue
		}
		for _, fb := range f.Forbidden {
			var fbFS string
			switch {
			case under(o.MountPoint, fb):
				fbFS = o.Root
			case under(fb, o.MountPoint):
				fbFS = path.Join(o.Root, strings.TrimPrefix(strings.TrimPrefix(fb, o.MountPoint), "/"))
			default:
				continue
			}
			if under(fsPath, fbFS) {
				v.Reason = fmt.Sprintf("%s is also visible under %s (mount %s of the same filesystem)", dir, fb, o.MountPoint)
				return v
			}
		}
	}
	var want int64
	switch m.FSType {
	case "ext4":
		want = MagicExt4
	case "xfs":
		want = MagicXFS
	default:
		v.Reason = fmt.Sprintf("%s is on %s (%s), not ext4 or xfs", dir, m.FSType, m.MountPoint)
		return v
	}
	if f.Stat.Magic != want {
		v.Reason = fmt.Sprintf("%s: mountinfo says %s but statfs reports magic %#x", dir, m.FSType, f.Stat.Magic)
		return v
	}
	if f.Stat.Dev.Major == 0 {
		v.Reason = fmt.Sprintf("%s is on an anonymous device %s, not a block device", dir, f.Stat.Dev)
		return v
	}
	switch {
	case f.DMUUIDErr != "":
		v.Reason = fmt.Sprintf("device %s: %s", f.Stat.Dev, f.DMUUIDErr)
		return v
	case !f.HasDM:
		v.Reason = fmt.Sprintf("%s on device %s is not on device-mapper (no dm-crypt)", m.FSType, f.Stat.Dev)
		return v
	}
	uuid := strings.TrimSpace(f.DMUUID)
	typ, ok := cryptType(uuid)
	switch {
	case ok:
		v.Confirmed = true
		v.CryptType = typ
		v.Reason = fmt.Sprintf("%s on dm-crypt %s (device %s)", m.FSType, typ, f.Stat.Dev)
	case typ != "":
		v.Reason = fmt.Sprintf("device %s is dm-crypt type %s, which does not encrypt or is not directly under the filesystem", f.Stat.Dev, typ)
	case strings.HasPrefix(uuid, "LVM-"):
		v.Reason = fmt.Sprintf("device %s is an LVM volume: dm-crypt, if any, is not directly under the filesystem", f.Stat.Dev)
	case uuid == "":
		v.Reason = fmt.Sprintf("device %s is a device-mapper device without a uuid", f.Stat.Dev)
	default:
		kind, _, _ := strings.Cut(uuid, "-")
		v.Reason = fmt.Sprintf("device %s is a %s device-mapper device, not dm-crypt", f.Stat.Dev, sanitizeWord(kind))
	}
	return v
}

// cryptType returns the type of a "CRYPT-<TYPE>-..." dm uuid and whether
// it is an encrypting type. CRYPT-VERITY, CRYPT-INTEGRITY and cryptsetup's
// internal CRYPT-SUBDEV/CRYPT-TEMP devices are not.
func cryptType(uuid string) (string, bool) {
	rest, ok := strings.CutPrefix(uuid, "CRYPT-")
	if !ok {
		return "", false
	}
	typ, _, _ := strings.Cut(rest, "-")
	typ = sanitizeWord(typ)
	if typ == "" {
		typ = "(none)"
	}
	return typ, encrypting[typ]
}

func sanitizeWord(s string) string {
	if len(s) > 16 {
		s = s[:16]
	}
	return strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
}

// under reports whether p is base or inside it.
func under(p, base string) bool {
	if base == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == base || strings.HasPrefix(p, base+"/")
}

// Stat is what the FS seam reports for a path.
type Stat struct {
	Dev   Dev
	Magic int64
}

// FS is the narrow seam over stat and statfs: a sandbox cannot have a
// dm-crypt device, so tests fake only these two facts.
type FS interface {
	// Stat reports the device and filesystem magic of path, without
	// following a symlink in its last component.
	Stat(path string) (Stat, error)
}

// RealFS reads the kernel's answer.
type RealFS struct{}

// Stat implements FS with fstat and fstatfs on an O_PATH|O_NOFOLLOW descriptor.
func (RealFS) Stat(p string) (Stat, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stat{}, &os.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Stat{}, &os.PathError{Op: "fstat", Path: p, Err: err}
	}
	var sf unix.Statfs_t
	if err := unix.Fstatfs(fd, &sf); err != nil {
		return Stat{}, &os.PathError{Op: "fstatfs", Path: p, Err: err}
	}
	return Stat{Dev: Dev{unix.Major(st.Dev), unix.Minor(st.Dev)}, Magic: int64(sf.Type)}, nil
}

// Gather reads the facts for host directory dir under root.
func Gather(root paths.Root, dir string, forbidden []string, fs FS) Facts {
	if fs == nil {
		fs = RealFS{}
	}
	f := Facts{Dir: dir, Forbidden: forbidden}
	if !path.IsAbs(dir) || path.Clean(dir) != dir {
		return f
	}
	cur := "/"
	for _, c := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		if c == "" {
			continue
		}
		cur = path.Join(cur, c)
		st, err := os.Lstat(root.Path(cur))
		switch {
		case errors.Is(err, os.ErrNotExist):
			f.Missing = cur
			return f
		case err != nil:
			f.PathErr = fmt.Sprintf("lstat %s: %s", cur, bare(err))
			return f
		case st.Mode()&os.ModeSymlink != 0:
			f.Symlink = cur
			return f
		case !st.IsDir():
			f.NotDir = cur
			return f
		}
	}
	st, err := fs.Stat(root.Path(dir))
	if err != nil {
		f.StatErr = bare(err)
		return f
	}
	f.Stat = st
	b, err := fsutil.ReadFileNoFollow(root.Path(Mountinfo), 16<<20)
	if err == nil {
		f.Mounts, err = ParseMountinfo(b)
	}
	if err != nil {
		f.MountinfoErr = bare(err)
		return f
	}
	if st.Dev.Major == 0 {
		return f
	}
	ub, err := fsutil.ReadFileNoFollow(root.Path(fmt.Sprintf("%s/%s/dm/uuid", SysDevBlk, st.Dev)), 64<<10)
	switch {
	case err == nil:
		f.HasDM, f.DMUUID = true, string(ub)
	case errors.Is(err, os.ErrNotExist):
	default:
		f.DMUUIDErr = "read dm uuid: " + bare(err)
	}
	return f
}

// bare drops the (root-based) path of a path error: reasons name host paths.
func bare(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}

// Check is Decide(Gather(...)).
func Check(root paths.Root, dir string, forbidden []string, fs FS) Verdict {
	return Decide(Gather(root, dir, forbidden, fs))
}
