// Package kairosimage builds the project's per-minor OS image as a real
// Kairos image, in an OCI image layout: a Kairos core base (Debian bookworm
// with images.NodePackages, made a Kairos image by kairos-init with the
// real kairos-agent and immucore), the tree the end-to-end nodes boot
// (internal/imagetree, the same builder), the node's files
// (system.NodeFiles) and the /etc/kairos-release kairos-init writes after
// asking the provider for its version (init.provider.info). The Earthfile
// lays the same tree and node files on Kairos's published base; where no
// registry is reachable, this is how the image is built. Needs root
// (chroot, mount namespaces, exact ownership).
package kairosimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/system"
)

// baseFormat changes whenever the way the base is built changes, so a
// cached base of an older builder is never reused.
const baseFormat = "pk-kairos-base/2"

// slimmed are the parts of the base no node boots with: documentation and
// translations, and kernel module trees for hardware a server node has no
// use for (sound, graphics, media, wireless, bluetooth, infiniband,
// staging drivers). They are removed before the initrd is built and depmod
// runs again, so nothing refers to them.
var slimmed = []string{
	"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
	"lib/modules/*/kernel/sound", "lib/modules/*/kernel/drivers/gpu", "lib/modules/*/kernel/drivers/media",
	"lib/modules/*/kernel/drivers/net/wireless", "lib/modules/*/kernel/drivers/bluetooth",
	"lib/modules/*/kernel/drivers/infiniband", "lib/modules/*/kernel/drivers/staging",
	"lib/modules/*/kernel/drivers/iio", "lib/modules/*/kernel/drivers/isdn",
	"lib/modules/*/kernel/net/wireless", "lib/modules/*/kernel/net/mac80211", "lib/modules/*/kernel/net/bluetooth",
}

// masked are units that stall or have no place on a node: mdadm's shutdown
// hook waits 90 s on every poweroff of a machine with no RAID.
var masked = []string{"mdadm-shutdown.service"}

// Options tune a build.
type Options struct {
	CacheDir string    // default testbin.CacheDir()/kairos
	Mirror   string    // default testbin.DebianMirror()
	Log      io.Writer // progress lines and the tools' output; nil discards
}

func (o Options) withDefaults() Options {
	if o.CacheDir == "" {
		o.CacheDir = filepath.Join(testbin.CacheDir(), "kairos")
	}
	if o.Mirror == "" {
		o.Mirror = testbin.DebianMirror()
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return o
}

// Base is a built Kairos base.
type Base struct {
	Key    string // content key
	Dir    string // the cache directory holding it
	Rootfs string // the unpacked tree (read it, never change it)
	Layer  string // the tree as a gzip'd tar layer
	Kernel string // the kernel and initrd the base boots (live media uses them too)
	Initrd string
}

// BaseKey is the content key of the base: what it is built from and how.
func BaseKey() string {
	p := append([]string(nil), images.NodePackages...)
	sort.Strings(p)
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\nkairos-init %s\nkairos-agent %s\nimmucore %s\nslimmed %s\nmasked %s\n",
		baseFormat, testbin.DebianSuite, strings.Join(p, ","), testbin.KairosInitVersion, testbin.KairosAgentVersion,
		testbin.ImmucoreVersion, strings.Join(slimmed, ","), strings.Join(masked, ","))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

type baseStamp struct {
	Key     string         `json:"key"`
	Built   string         `json:"built"`
	Seconds map[string]int `json:"seconds"`
	Kernel  string         `json:"kernel"`
	Initrd  string         `json:"initrd"`
}

// EnsureBase returns the Kairos base, building it when it is not cached
// (about 9 minutes cold on 2 cores): debootstrap, kairos-init's install
// stage (kernel, grub, kairos-agent, immucore, Kairos's cloud-configs),
// slimming, kairos-init's init stage (the initrd with immucore, services,
// /etc/kairos-release), `kairos-init validate`, then the layer.
func EnsureBase(ctx context.Context, o Options) (Base, error) {
	o = o.withDefaults()
	key := BaseKey()
	dir := filepath.Join(o.CacheDir, "base-"+key)
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return Base{}, err
	}
	unlock, err := testbin.Lock(filepath.Join(o.CacheDir, "base.lock"))
	if err != nil {
		return Base{}, err
	}
	defer unlock()
	if b, err := readBase(dir, key); err == nil {
		return b, nil
	}
	old, _ := filepath.Glob(filepath.Join(o.CacheDir, "base-*"))
	for _, d := range old {
		if d != dir {
			_ = os.RemoveAll(d) // an older builder's base: ~3 GB of dead weight
		}
	}
	part := dir + ".part"
	if err := os.RemoveAll(part); err != nil {
		return Base{}, err
	}
	rootfs := filepath.Join(part, "rootfs")
	if err := os.MkdirAll(part, 0o755); err != nil {
		return Base{}, err
	}
	fmt.Fprintf(o.Log, "kairosimage: building the Kairos base %s (debootstrap %s, kairos-init %s: about 9 min cold on 2 cores) in %s\n", key, testbin.DebianSuite, testbin.KairosInitVersion, dir)
	secs := map[string]int{}
	step := func(name string, f func() error) error {
		t0 := time.Now()
		fmt.Fprintf(o.Log, "kairosimage: base: %s\n", name)
		if err := f(); err != nil {
			return fmt.Errorf("Kairos base: %s: %w", name, err)
		}
		secs[name] = int(time.Since(t0).Seconds())
		fmt.Fprintf(o.Log, "kairosimage: base: %s done in %s\n", name, time.Since(t0).Round(time.Second))
		return nil
	}
	kinit, err := testbin.KairosInit(ctx, o.Log)
	if err != nil {
		return Base{}, err
	}
	initArgs := func(stage string) []string {
		return []string{"/kairos-init", "-l", "info", "-s", stage, "-m", "generic", "-t", "false", "--version", releaseVersion()}
	}
	steps := []struct {
		name string
		f    func() error
	}{
		{"debootstrap", func() error {
			return run(ctx, o.Log, 25*time.Minute, "debootstrap", "--variant=minbase", "--include="+strings.Join(images.NodePackages, ","), testbin.DebianSuite, rootfs, o.Mirror)
		}},
		{"kairos-init install stage", func() error {
			if err := copyExecutable(kinit, filepath.Join(rootfs, "kairos-init")); err != nil {
				return err
			}
			if err := writeSources(rootfs, o.Mirror); err != nil {
				return err
			}
			return Chroot(ctx, o.Log, 30*time.Minute, rootfs, nil, initArgs("install")...)
		}},
		{"slimming", func() error { return slim(ctx, o.Log, rootfs) }},
		{"kairos-init init stage", func() error {
			return Chroot(ctx, o.Log, 30*time.Minute, rootfs, nil, initArgs("init")...)
		}},
		{"kairos-init validate", func() error {
			return Chroot(ctx, o.Log, 10*time.Minute, rootfs, nil, "/kairos-init", "validate")
		}},
		{"cleanup", func() error { return cleanup(rootfs) }},
		{"CNI plugins", func() error { return CheckCNIPlugins(rootfs) }},
	}
	for _, s := range steps {
		if err := step(s.name, s.f); err != nil {
			return Base{}, err
		}
	}
	kernel, initrd, err := bootFiles(rootfs)
	if err != nil {
		return Base{}, err
	}
	if err := step("layer", func() error {
		n, err := WriteLayer(rootfs, filepath.Join(part, "layer.tar.gz"), nil)
		fmt.Fprintf(o.Log, "kairosimage: base layer: %d entries\n", n)
		return err
	}); err != nil {
		return Base{}, err
	}
	st := baseStamp{Key: key, Built: time.Now().UTC().Format(time.RFC3339), Seconds: secs, Kernel: kernel, Initrd: initrd}
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := os.WriteFile(filepath.Join(part, "stamp.json"), b, 0o644); err != nil {
		return Base{}, err
	}
	if err := os.Rename(part, dir); err != nil {
		return Base{}, err
	}
	if err := syncDir(o.CacheDir); err != nil {
		return Base{}, err
	}
	return readBase(dir, key)
}

func readBase(dir, key string) (Base, error) {
	b, err := os.ReadFile(filepath.Join(dir, "stamp.json"))
	if err != nil {
		return Base{}, err
	}
	var st baseStamp
	if err := json.Unmarshal(b, &st); err != nil || st.Key != key || st.Kernel == "" || st.Initrd == "" {
		return Base{}, errors.New("stale or invalid stamp")
	}
	base := Base{Key: key, Dir: dir, Rootfs: filepath.Join(dir, "rootfs"), Layer: filepath.Join(dir, "layer.tar.gz"),
		Kernel: filepath.Join(dir, "rootfs", st.Kernel), Initrd: filepath.Join(dir, "rootfs", st.Initrd)}
	for _, p := range []string{base.Layer, base.Kernel, base.Initrd} {
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			return Base{}, fmt.Errorf("cached base lacks %s", p)
		}
	}
	return base, nil
}

// writeSources gives apt inside the chroot the mirror debootstrap used
// (kairos-init installs the kernel, grub and dracut with apt).
func writeSources(rootfs, mirror string) error {
	return os.WriteFile(filepath.Join(rootfs, "etc/apt/sources.list"),
		[]byte(fmt.Sprintf("deb %s %s main\n", mirror, testbin.DebianSuite)), 0o644)
}

func slim(ctx context.Context, log io.Writer, rootfs string) error {
	for _, g := range slimmed {
		m, err := filepath.Glob(filepath.Join(rootfs, g))
		if err != nil {
			return err
		}
		for _, p := range m {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	for _, u := range masked {
		p := filepath.Join(rootfs, "etc/systemd/system", u)
		_ = os.Remove(p)
		if err := os.Symlink("/dev/null", p); err != nil {
			return err
		}
	}
	kvers, err := filepath.Glob(filepath.Join(rootfs, "lib/modules/*"))
	if err != nil {
		return err
	}
	if len(kvers) != 1 {
		return fmt.Errorf("want exactly one kernel in lib/modules, found %d", len(kvers))
	}
	return Chroot(ctx, log, 5*time.Minute, rootfs, nil, "depmod", "-a", filepath.Base(kvers[0]))
}

// cleanup drops what is wrong to ship: kairos-init itself, apt's downloads
// and lists, the build host's identity.
func cleanup(rootfs string) error {
	for _, g := range []string{"kairos-init", "var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*", "var/log/apt/*", "var/log/dpkg.log"} {
		m, _ := filepath.Glob(filepath.Join(rootfs, g))
		for _, p := range m {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(filepath.Join(rootfs, "etc/machine-id"), nil, 0o444)
}

// bootFiles finds the kernel and initrd the base boots, relative to rootfs.
func bootFiles(rootfs string) (string, string, error) {
	k, _ := filepath.Glob(filepath.Join(rootfs, "boot/vmlinuz-*"))
	if len(k) != 1 {
		return "", "", fmt.Errorf("want one kernel in /boot, found %d", len(k))
	}
	kernel, _ := filepath.Rel(rootfs, k[0])
	for _, c := range []string{"boot/initrd", "boot/initrd.img-" + strings.TrimPrefix(filepath.Base(k[0]), "vmlinuz-")} {
		if fi, err := os.Stat(filepath.Join(rootfs, c)); err == nil && fi.Mode().IsRegular() {
			// Resolve a link inside the tree, never to the host.
			if l, err := os.Readlink(filepath.Join(rootfs, c)); err == nil && !filepath.IsAbs(l) {
				return kernel, filepath.Join(filepath.Dir(c), l), nil
			}
			return kernel, c, nil
		}
	}
	return "", "", errors.New("no initrd in /boot")
}

func copyExecutable(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// run runs a host command, its output to log, bounded.
func run(ctx context.Context, log io.Writer, budget time.Duration, name string, args ...string) error {
	return runLogged(ctx, log, budget, name, nil, name, args...)
}

// runLogged runs name with args (env added to the environment), its
// output to log, bounded by budget; its error names what with the last
// lines of the output.
func runLogged(ctx context.Context, log io.Writer, budget time.Duration, what string, env []string, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var tail tailWriter
	cmd.Stdout = io.MultiWriter(log, &tail)
	cmd.Stderr = cmd.Stdout
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w after %s (budget): %s", what, ctx.Err(), budget, tail.String())
		}
		return fmt.Errorf("%s: %w: %s", what, err, tail.String())
	}
	return nil
}

// chrootScript prepares a private mount namespace for a chroot: the tree
// bound onto itself, /proc, /sys and /dev from the host, a tmpfs /run and
// /tmp, and the host's resolver where systemd-resolved's link points (apt
// inside must resolve the mirror). Nothing is mounted in the host's
// namespace. With LOWER set, the root is an overlay of $LOWER (colon
// separated, topmost first) under the upper directory $0/upper.
const chrootScript = `set -e
R="$0"
if [ -n "$LOWER" ]; then
  mkdir -p "$R/upper" "$R/work" "$R/merged"
  mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$R/upper,workdir=$R/work" "$R/merged"
  R="$R/merged"
else
  mount --bind "$R" "$R"
fi
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/run"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
mkdir -p "$R/run/systemd/resolve"
cp /etc/resolv.conf "$R/run/systemd/resolve/stub-resolv.conf"
cp /etc/resolv.conf "$R/run/systemd/resolve/resolv.conf"
[ -L "$R/etc/resolv.conf" ] || cp /etc/resolv.conf "$R/etc/resolv.conf"
exec chroot "$R" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb DEBIAN_FRONTEND=noninteractive "$@"
`

// Chroot runs argv inside root in a private mount namespace, bounded by
// budget. With lower set, root is a scratch directory and the command
// runs in an overlay of lower (topmost first) whose changes land in
// root/upper.
func Chroot(ctx context.Context, log io.Writer, budget time.Duration, root string, lower []string, argv ...string) error {
	args := append([]string{"-m", "--propagation", "private", "sh", "-c", chrootScript, root}, argv...)
	return runLogged(ctx, log, budget, "chroot "+argv[0], []string{"LOWER=" + strings.Join(lower, ":")}, "unshare", args...)
}

// tailWriter keeps the last lines of a command's output for its error.
type tailWriter struct{ b []byte }

func (t *tailWriter) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 8192 {
		t.b = append([]byte(nil), t.b[len(t.b)-4096:]...)
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	l := strings.Split(strings.TrimSpace(string(t.b)), "\n")
	if len(l) > 8 {
		l = l[len(l)-8:]
	}
	return strings.Join(l, " | ")
}

// releaseVersion is KAIROS_VERSION of every image: the project's release
// (versions.yaml). The operator compares KAIROS_VERSION with the Kubernetes
// version after it (KAIROS_SOFTWARE_VERSION), so per-minor images of one
// release differ there.
func releaseVersion() string { return images.Get().Release }

// CheckCNIPlugins refuses a base whose Debian CNI directory does not hold
// exactly system.DebianCNIPlugins: the node files link each of them into
// system.CNIPluginDir, and a link to a plugin Debian does not ship would
// dangle (one Debian adds would never be linked).
func CheckCNIPlugins(rootfs string) error {
	dir, err := fsutil.OpenDirNoFollow(rootfs, system.DebianCNIDir)
	if err != nil {
		return err
	}
	defer dir.Close()
	ents, err := fsutil.ReadDirAt(dir)
	if err != nil {
		return err
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	want := append([]string(nil), system.DebianCNIPlugins...)
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		return fmt.Errorf("%s holds %v, system.DebianCNIPlugins lists %v: make them agree", system.DebianCNIDir, got, want)
	}
	return nil
}
