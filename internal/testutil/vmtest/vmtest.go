// Package vmtest boots a Debian kernel under QEMU (TCG: this machine has no
// KVM) on an initramfs built by the test, for the proofs that need a real
// kernel with device-mapper: the encryption gate's verdicts
// (internal/cryptgate), a snapshot taken on dm-crypt (internal/etcdsnap)
// and a power cut during the atomic writes (tests/powercut, dm-flakey).
//
// .ci/run installs qemu-system-x86, busybox-static, cryptsetup-bin, dmsetup,
// xfsprogs, e2fsprogs and kmod, unpacks the kernel (.ci/vm-kernel.sh) into
// the test cache and sets PROVIDER_KUBERNETES_VM=required (and CI=true),
// either of which turns every skip below into a failure.
package vmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// Required says CI installed everything, so nothing may be missing.
func Required() bool { return os.Getenv("PROVIDER_KUBERNETES_VM") == "required" }

// Need fails the test when the VM is required or in CI (testutil.InCI),
// else skips it saying what is missing.
func Need(t testing.TB, format string, a ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, a...)
	if Required() {
		t.Fatalf("PROVIDER_KUBERNETES_VM=required but %s", msg)
	}
	testutil.SkipUnlessCI(t, "VM test: "+msg)
}

// Host is what booting needs from this machine.
type Host struct {
	QEMU   string            // qemu-system-x86_64
	Tools  map[string]string // guest tool name -> host path
	Kernel string            // the unpacked kernel's directory (vmlinuz, lib/modules/KVER)
	KVer   string
}

// Find checks for QEMU, the named guest tools and an unpacked kernel; it
// skips (fails when required) when one is missing, and in -short mode.
func Find(t testing.TB, tools ...string) Host {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM: not in -short mode")
	}
	if runtime.GOARCH != "amd64" {
		Need(t, "the guest kernel is amd64, this is %s", runtime.GOARCH)
	}
	var h Host
	var err error
	if h.QEMU, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		Need(t, "qemu-system-x86_64 is not installed")
	}
	h.Tools = map[string]string{}
	for _, name := range tools {
		for _, dir := range []string{"/bin", "/sbin", "/usr/bin", "/usr/sbin"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				h.Tools[name] = filepath.Join(dir, name)
				break
			}
		}
		if h.Tools[name] == "" {
			Need(t, "%s is not installed", name)
		}
	}
	h.Kernel, h.KVer = kernelDir(t)
	return h
}

// kernelDir finds a kernel unpacked by .ci/vm-kernel.sh: DIR/vmlinuz and DIR/lib/modules/KVER.
func kernelDir(t testing.TB) (dir, kver string) {
	t.Helper()
	base := filepath.Join(testbin.CacheDir(), "vm")
	ents, _ := os.ReadDir(base)
	var found []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(base, e.Name(), "vmlinuz")); err == nil {
			if _, err := os.Stat(filepath.Join(base, e.Name(), "lib/modules", e.Name(), "modules.dep")); err == nil {
				found = append(found, e.Name())
			}
		}
	}
	if len(found) == 0 {
		Need(t, "no Debian kernel unpacked under %s (run .ci/vm-kernel.sh)", base)
	}
	sort.Strings(found)
	k := found[len(found)-1]
	return filepath.Join(base, k), k
}

// Prelude starts every guest /init: the kernel's filesystems, report (the
// guest's exit code through isa-debug-exit, QEMU then exits 2*rc+1) and
// fail (a setup step failed: 100), and the modules of /modules.load.
const Prelude = `#!/bin/sh
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /run /tmp
report() {
  echo "GUEST-EXIT $1"
  printf "\\$(printf %03o "$1")" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
  sleep 5; poweroff -f
}
fail() { echo "GUEST-SETUP-FAILED: $*"; report 100; }
echo "GUEST: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime)s"
for m in $(cat /modules.load); do modprobe $m || echo "GUEST: modprobe $m failed"; done
`

// SetupFailed is the exit code of the prelude's fail.
const SetupFailed = 100

// Initramfs is an in-memory newc cpio archive; every entry is root:root.
type Initramfs struct {
	files map[string]entry
}

type entry struct {
	mode uint32 // full st_mode
	data []byte
}

// NewInitramfs has the directories the prelude mounts on.
func NewInitramfs() *Initramfs {
	r := &Initramfs{files: map[string]entry{}}
	for _, d := range []string{"/proc", "/sys", "/dev", "/run", "/tmp", "/mnt", "/etc", "/var"} {
		r.Dir(d, 0o755)
	}
	return r
}

func (r *Initramfs) dirs(p string) {
	for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
		if _, ok := r.files[d]; !ok {
			r.files[d] = entry{mode: 0o40755}
		}
	}
}

// Dir adds a directory.
func (r *Initramfs) Dir(p string, perm uint32) {
	r.dirs(p)
	r.files[p] = entry{mode: 0o40000 | perm}
}

// File adds a regular file.
func (r *Initramfs) File(p string, b []byte, perm uint32) {
	r.dirs(p)
	r.files[p] = entry{mode: 0o100000 | perm, data: b}
}

// Symlink adds a symbolic link.
func (r *Initramfs) Symlink(p, target string) {
	r.dirs(p)
	r.files[p] = entry{mode: 0o120777, data: []byte(target)}
}

// Copy adds the host file src (followed) as dst with its permission bits.
func (r *Initramfs) Copy(t testing.TB, dst, src string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	r.File(dst, b, uint32(st.Mode().Perm()))
}

// CopyTree adds the host directory tree src under dst: directories and
// regular files with their permission bits (no symlinks are expected).
func (r *Initramfs) CopyTree(t testing.TB, dst, src string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case fi.IsDir():
			r.Dir(to, uint32(fi.Mode().Perm()))
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			r.File(to, b, uint32(fi.Mode().Perm()))
		default:
			return fmt.Errorf("%s: not a directory or a regular file", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// CopyWithLibs copies a dynamic binary and the shared libraries ldd names.
func (r *Initramfs) CopyWithLibs(t testing.TB, ctx context.Context, dst, src string) {
	t.Helper()
	r.Copy(t, dst, src)
	out, err := exec.CommandContext(ctx, "ldd", src).CombinedOutput()
	if strings.Contains(string(out), "not a dynamic executable") {
		return // static
	}
	if err != nil {
		t.Fatalf("ldd %s: %v: %s", src, err, out)
	}
	for _, lib := range regexp.MustCompile(`(/[^ \t]+)`).FindAllString(string(out), -1) {
		real, err := filepath.EvalSymlinks(lib)
		if err != nil {
			t.Fatalf("%s: %v", lib, err)
		}
		r.Copy(t, lib, real)
	}
}

// Busybox adds busybox as /bin/busybox with a link per applet, and /sbin/modprobe.
func (r *Initramfs) Busybox(t testing.TB, ctx context.Context, busybox string) {
	t.Helper()
	r.CopyWithLibs(t, ctx, "/bin/busybox", busybox)
	out, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" {
			r.Symlink("/bin/"+a, "busybox")
		}
	}
	r.Symlink("/sbin/modprobe", "/bin/busybox")
}

// Modules copies the named modules of the unpacked kernel and their
// dependencies (its modules.dep), and lists them in load order in
// /modules.load for the prelude.
func (r *Initramfs) Modules(t testing.TB, h Host, want []string) {
	t.Helper()
	mdir := filepath.Join(h.Kernel, "lib/modules", h.KVer)
	dep, err := os.ReadFile(filepath.Join(mdir, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	builtin, _ := os.ReadFile(filepath.Join(mdir, "modules.builtin"))
	norm := func(s string) string {
		return strings.ReplaceAll(strings.TrimSuffix(filepath.Base(s), ".ko"), "-", "_")
	}
	deps := map[string][]string{}
	file := map[string]string{}
	for _, l := range strings.Split(string(dep), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n := norm(k)
		file[n] = k
		deps[n] = strings.Fields(v)
	}
	isBuiltin := map[string]bool{}
	for _, l := range strings.Fields(string(builtin)) {
		isBuiltin[norm(l)] = true
	}
	var order []string
	seen := map[string]bool{}
	var lines []string
	var visit func(n string)
	visit = func(n string) {
		if seen[n] {
			return
		}
		seen[n] = true
		f, ok := file[n]
		if !ok {
			if !isBuiltin[n] {
				t.Fatalf("module %s is neither in modules.dep nor built in", n)
			}
			return
		}
		// modules.dep lists every dependency, deepest last.
		for i := len(deps[n]) - 1; i >= 0; i-- {
			visit(norm(deps[n][i]))
		}
		r.Copy(t, "/lib/modules/"+h.KVer+"/"+f, filepath.Join(mdir, f))
		lines = append(lines, f+": "+strings.Join(deps[n], " "))
		order = append(order, n)
	}
	for _, w := range want {
		visit(strings.ReplaceAll(w, "-", "_"))
	}
	r.File("/lib/modules/"+h.KVer+"/modules.dep", []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	r.File("/modules.load", []byte(strings.Join(order, "\n")+"\n"), 0o644)
}

// Bytes is the archive.
func (r *Initramfs) Bytes() []byte {
	names := make([]string, 0, len(r.files))
	for n := range r.files {
		names = append(names, n)
	}
	sort.Strings(names) // parents sort before their children
	var b bytes.Buffer
	ino := uint32(1)
	hdr := func(name string, mode uint32, data []byte) {
		fmt.Fprintf(&b, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
		ino++
		b.WriteString(name)
		b.WriteByte(0)
		pad(&b)
		b.Write(data)
		pad(&b)
	}
	for _, n := range names {
		e := r.files[n]
		hdr(strings.TrimPrefix(n, "/"), e.mode, e.data)
	}
	hdr("TRAILER!!!", 0, nil)
	return b.Bytes()
}

func pad(b *bytes.Buffer) {
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
}

// Boot is one guest run.
type Boot struct {
	MemoryMB int      // default 1024
	Extra    []string // more QEMU arguments (a second serial port)
}

// Result is what a guest run left.
type Result struct {
	Console  string        // the serial console (kernel and /init output)
	QEMUExit int           // QEMU's exit code, -1 when it did not exit by itself
	Took     time.Duration // from QEMU's start to its exit
}

// Guest is the code the guest reported through isa-debug-exit, -1 when it reported none.
func (r Result) Guest() int {
	if r.QEMUExit < 1 || r.QEMUExit%2 == 0 {
		return -1
	}
	return (r.QEMUExit - 1) / 2
}

// Run writes the initramfs to dir and boots the kernel on it, bounded by
// ctx (QEMU is killed at its deadline).
func (b Boot) Run(t testing.TB, ctx context.Context, h Host, ird *Initramfs, dir string) Result {
	t.Helper()
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := os.WriteFile(initrd, ird.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	mem := b.MemoryMB
	if mem == 0 {
		mem = 1024
	}
	var console bytes.Buffer
	start := time.Now()
	args := append([]string{"-accel", "tcg", "-cpu", "max", "-m", fmt.Sprint(mem), "-smp", "1",
		"-kernel", filepath.Join(h.Kernel, "vmlinuz"), "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 loglevel=4",
		"-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"}, b.Extra...)
	cmd := exec.CommandContext(ctx, h.QEMU, args...)
	cmd.Stdout, cmd.Stderr = &console, &console
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	res := Result{Console: console.String(), QEMUExit: -1, Took: time.Since(start)}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ctx.Err() == nil {
		res.QEMUExit = ee.ExitCode()
	} else if err == nil {
		res.QEMUExit = 0
	}
	t.Logf("QEMU (TCG, kernel %s) exited %d after %s", h.KVer, res.QEMUExit, res.Took.Round(100*time.Millisecond))
	return res
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
