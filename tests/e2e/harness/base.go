package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
)

// Base is the node base: the layers under every node's OS tree.
type Base struct {
	Rootfs string // debootstrap'd Debian bookworm (systemd, containerd, runc, CNI plugins, ...)
	Kairos string // the Kairos layer: the real kairos-agent, kairos-init's notify stage, cos-setup-boot.service
	Config string // the harness's config layer (containerd config, fixup unit, masks)
}

// Lowers are the base layers, topmost first, as overlayfs lowerdirs.
func (b Base) Lowers() []string { return []string{b.Config, b.Kairos, b.Rootfs} }

// Suite is the Debian release of the base.
const Suite = testbin.DebianSuite

// BasePackages are installed on top of debootstrap's minbase: the node's
// packages (images.NodePackages, the same list the Kairos image installs),
// then ping and ps for diagnosis.
var BasePackages = append(append([]string(nil), images.NodePackages...), "iputils-ping", "procps")

// rootfsFormat changes whenever the way the rootfs is built changes, so a
// cached rootfs of an older builder is not reused.
const rootfsFormat = "pk-e2e-rootfs/1"

// BaseOptions tunes EnsureBase.
type BaseOptions struct {
	CacheDir string    // default testbin.CacheDir()/e2e
	Mirror   string    // default testbin.DebianMirror()
	Log      io.Writer // progress lines; nil discards
	Runner   runner.Runner
	Budget   time.Duration // debootstrap's budget, default 20m
}

// RootfsKey is the content key of the debootstrap layer: the builder format,
// suite, variant, architecture and package set (the mirror is where the same
// packages come from, not what they are).
func RootfsKey(suite string, packages []string) string {
	p := append([]string(nil), packages...)
	sort.Strings(p)
	h := sha256.Sum256([]byte(strings.Join([]string{rootfsFormat, suite, "minbase", "amd64", strings.Join(p, ",")}, "\n")))
	return hex.EncodeToString(h[:])[:16]
}

// EnsureBase returns the cached base, building what is missing: the
// debootstrap layer (about a minute cold with a reachable mirror, cached by
// RootfsKey), the Kairos layer (the real kairos-agent built from its module,
// about 3 minutes cold, cached by version; the layer by content) and the
// config layer (cached by its content).
func EnsureBase(ctx context.Context, o BaseOptions) (Base, error) {
	tl, err := Check()
	if err != nil {
		return Base{}, err
	}
	if o.CacheDir == "" {
		o.CacheDir = filepath.Join(testbin.CacheDir(), "e2e")
	}
	if o.Mirror == "" {
		o.Mirror = testbin.DebianMirror()
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Runner == nil {
		o.Runner = runner.Exec{}
	}
	if o.Budget <= 0 {
		o.Budget = 20 * time.Minute
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return Base{}, err
	}
	unlock, err := flock(filepath.Join(o.CacheDir, "base.lock"))
	if err != nil {
		return Base{}, err
	}
	defer unlock()
	rootfs, err := ensureRootfs(ctx, o, tl)
	if err != nil {
		return Base{}, err
	}
	agent, err := testbin.KairosAgent(ctx, o.Log)
	if err != nil {
		return Base{}, fmt.Errorf("kairos-agent: %w", err)
	}
	kl, err := ensureLayer(o.CacheDir, "kairos", kairosLayer(agent))
	if err != nil {
		return Base{}, err
	}
	cfg, err := ensureLayer(o.CacheDir, "config", configLayer())
	if err != nil {
		return Base{}, err
	}
	return Base{Rootfs: rootfs, Kairos: kl, Config: cfg}, nil
}

type rootfsStamp struct {
	Key      string   `json:"key"`
	Suite    string   `json:"suite"`
	Packages []string `json:"packages"`
	Built    string   `json:"built"`
	Seconds  float64  `json:"seconds"`
}

func ensureRootfs(ctx context.Context, o BaseOptions, tl tools) (string, error) {
	key := RootfsKey(Suite, BasePackages)
	dir := filepath.Join(o.CacheDir, "rootfs-"+key)
	stampPath := filepath.Join(dir, "stamp.json")
	if b, err := os.ReadFile(stampPath); err == nil {
		var s rootfsStamp
		if json.Unmarshal(b, &s) == nil && s.Key == key {
			return filepath.Join(dir, "rootfs"), nil
		}
	}
	// Older keys are dead weight (~450 MB each); a half-built .part is ours
	// to remove (we hold the lock).
	if old, _ := filepath.Glob(filepath.Join(o.CacheDir, "rootfs-*")); len(old) > 0 {
		for _, d := range old {
			if d != dir {
				_ = os.RemoveAll(d)
			}
		}
	}
	_ = os.RemoveAll(dir)
	part := dir + ".part"
	if err := os.MkdirAll(part, 0o755); err != nil {
		return "", err
	}
	fmt.Fprintf(o.Log, "e2e: building the node base rootfs (debootstrap %s from %s: about a minute cold, cached by content in %s)\n", Suite, o.Mirror, dir)
	start := time.Now()
	target := filepath.Join(part, "rootfs")
	// Two attempts: a mirror hiccup in the middle of a minute of downloads
	// should not fail a CI run.
	var err error
	for attempt := 1; attempt <= 2; attempt++ {
		if err = os.RemoveAll(target); err != nil {
			return "", err
		}
		var res runner.Result
		res, err = o.Runner.Run(ctx, runner.Cmd{
			Path:    tl.path("debootstrap"),
			Args:    []string{"--variant=minbase", "--include=" + strings.Join(BasePackages, ","), Suite, target, o.Mirror},
			Timeout: o.Budget,
		})
		if err == nil {
			break
		}
		detail := tailLines(string(res.Stdout)+string(res.Stderr), 15)
		if b, rerr := os.ReadFile(filepath.Join(target, "debootstrap", "debootstrap.log")); rerr == nil {
			detail += "\n--- debootstrap.log tail ---\n" + tailLines(string(b), 15)
		}
		err = fmt.Errorf("debootstrap %s (attempt %d): %w\n%s", Suite, attempt, err, detail)
		fmt.Fprintf(o.Log, "e2e: %v\n", err)
		if ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return "", err
	}
	if err := trimRootfs(target); err != nil {
		return "", err
	}
	s := rootfsStamp{Key: key, Suite: Suite, Packages: BasePackages, Built: time.Now().UTC().Format(time.RFC3339), Seconds: time.Since(start).Seconds()}
	b, _ := json.MarshalIndent(s, "", "  ")
	if err := os.WriteFile(filepath.Join(part, "stamp.json"), b, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(part, dir); err != nil {
		return "", err
	}
	fmt.Fprintf(o.Log, "e2e: base rootfs built in %s\n", time.Since(start).Round(time.Second))
	return filepath.Join(dir, "rootfs"), nil
}

// trimRootfs drops what a node never needs and what would be wrong to share:
// downloaded packages and lists, the build host's identity.
func trimRootfs(root string) error {
	for _, glob := range []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*"} {
		m, _ := filepath.Glob(filepath.Join(root, glob))
		for _, p := range m {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	// Each node gets its own machine id and hostname in its upper layer.
	if err := os.WriteFile(filepath.Join(root, "etc/machine-id"), nil, 0o444); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("localhost\n"), 0o644)
}

// layerEntry is one file, directory or symlink of a generated layer.
type layerEntry struct {
	Path string      // relative, slash-separated
	Mode os.FileMode // 0 for a symlink
	Data string      // file content, or the symlink target
	Src  string      // a host file to copy instead of Data
	Dir  bool
	Link bool
}

// layerKey is the content key of a generated layer (a Src file counts by
// its content).
func layerKey(entries []layerEntry) (string, error) {
	h := sha256.New()
	for _, e := range entries {
		fmt.Fprintf(h, "%s\x00%o\x00%t\x00%t\x00%d\x00%s\x00", e.Path, e.Mode, e.Dir, e.Link, len(e.Data), e.Data)
		if e.Src != "" {
			f, err := os.Open(e.Src)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", fmt.Errorf("%s: %w", e.Src, err)
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// writeLayer materialises entries under dir (which must not exist).
func writeLayer(dir string, entries []layerEntry) error {
	for _, e := range entries {
		p := filepath.Join(dir, filepath.FromSlash(e.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch {
		case e.Dir:
			if err := os.MkdirAll(p, e.Mode); err != nil {
				return err
			}
			if err := os.Chmod(p, e.Mode); err != nil {
				return err
			}
		case e.Link:
			if err := os.Symlink(e.Data, p); err != nil {
				return err
			}
		case e.Src != "":
			if err := copyFile(e.Src, p, e.Mode); err != nil {
				return err
			}
		default:
			if err := os.WriteFile(p, []byte(e.Data), e.Mode); err != nil {
				return err
			}
			if err := os.Chmod(p, e.Mode); err != nil {
				return err
			}
		}
	}
	return nil
}

// ensureLayer materialises a generated layer in the cache, named by its
// content key.
func ensureLayer(cacheDir, name string, entries []layerEntry) (string, error) {
	key, err := layerKey(entries)
	if err != nil {
		return "", fmt.Errorf("%s layer: %w", name, err)
	}
	dir := filepath.Join(cacheDir, name+"-"+key)
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		return dir, nil
	}
	part := dir + ".part"
	_ = os.RemoveAll(part)
	if err := writeLayer(part, entries); err != nil {
		return "", fmt.Errorf("%s layer: %w", name, err)
	}
	if err := os.Rename(part, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// flock takes an exclusive lock on path (blocking) and returns its release.
func flock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// ErrBadTree is returned for an OS tree that would break the merged root.
var ErrBadTree = errors.New("unusable OS tree")

// ValidateTree refuses a tree that would shadow the base's merged-/usr
// symlinks (/bin, /sbin, /lib, /lib64 are symlinks into /usr in bookworm: a
// real directory of that name in an upper layer hides the symlink and with it
// every library), or that is not a directory at all.
func ValidateTree(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadTree, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", ErrBadTree, dir)
	}
	for _, name := range []string{"bin", "sbin", "lib", "lib64"} {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return fmt.Errorf("%w: %s/%s is not a symlink; put its files under usr/%s (the base's /%s is a symlink to usr/%s)", ErrBadTree, dir, name, name, name, name)
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(mode); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
