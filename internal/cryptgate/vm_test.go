package cryptgate

// The gate on a real kernel: a Debian kernel under QEMU (TCG) boots an
// initramfs holding this package's compiled test binary, busybox,
// cryptsetup and mkfs; its /init formats LUKS2+ext4, LUKS1+ext4, plain+xfs,
// bare ext4, dm-verity and tmpfs on loop devices and runs TestGuestGate,
// which reports through isa-debug-exit.
//
// .ci/run installs qemu-system-x86, busybox-static, cryptsetup-bin, xfsprogs,
// e2fsprogs and kmod, fetches the kernel (.ci/vm-kernel.sh) into the test
// cache and sets PROVIDER_KUBERNETES_VM=required, which turns every skip
// below into a failure.

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
)

// guestCases is what the guest checks: directory | want | crypt type or a reason substring.
var guestCases = []string{
	"/mnt/luks2/etcd-backup|confirmed|LUKS2",
	"/mnt/luks1/etcd-backup|confirmed|LUKS1",
	"/mnt/plain/etcd-backup|confirmed|PLAIN",
	"/mnt/bare/etcd-backup|unconfirmed|not on device-mapper",
	"/mnt/verity/etcd-backup|unconfirmed|type VERITY",
	"/mnt/tmpfs/etcd-backup|unconfirmed|tmpfs",
	"/mnt/link/etcd-backup|unconfirmed|/mnt/link is a symlink",
	"/mnt/luks2/kube/backup|unconfirmed|also visible under /etc/kubernetes",
	"/etc/kubernetes/backup|unconfirmed|under /etc/kubernetes",
}

const guestInit = `#!/bin/sh
export PATH=/sbin:/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /run /tmp /etc/kubernetes /var/lib/etcd
report() {
  echo "GUEST-EXIT $1"
  printf "\\$(printf %03o "$1")" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
  sleep 5; poweroff -f
}
fail() { echo "GUEST-SETUP-FAILED: $*"; report 100; }
echo "GUEST: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime)s"
for m in $(cat /modules.load); do modprobe $m || echo "GUEST: modprobe $m failed"; done
head -c 32 /dev/urandom > /tmp/key
newloop() { truncate -s $2 /tmp/$1.img || fail truncate; L=$(losetup -f) || fail losetup; losetup $L /tmp/$1.img || fail losetup $L; echo $L; }
L=$(newloop luks2 48M)
cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file /tmp/key $L || fail luks2 format
cryptsetup open --key-file /tmp/key $L luks2 || fail luks2 open
mkfs.ext4 -q /dev/mapper/luks2 || fail mkfs luks2
mkdir -p /mnt/luks2 && mount /dev/mapper/luks2 /mnt/luks2 || fail mount luks2
mkdir -p /mnt/luks2/etcd-backup /mnt/luks2/kube/backup
mount -o bind /mnt/luks2/kube /etc/kubernetes || fail bind
ln -s /mnt/luks2 /mnt/link
L=$(newloop luks1 16M)
cryptsetup luksFormat -q --type luks1 --pbkdf-force-iterations 1000 --key-file /tmp/key $L || fail luks1 format
cryptsetup open --key-file /tmp/key $L luks1 || fail luks1 open
mkfs.ext4 -q /dev/mapper/luks1 || fail mkfs luks1
mkdir -p /mnt/luks1 && mount /dev/mapper/luks1 /mnt/luks1 && mkdir -p /mnt/luks1/etcd-backup || fail mount luks1
L=$(newloop plain 320M)
cryptsetup open -q --type plain --cipher aes-xts-plain64 --key-size 256 --key-file /tmp/key $L plain || fail plain open
mkfs.xfs -q /dev/mapper/plain || fail mkfs xfs
mkdir -p /mnt/plain && mount /dev/mapper/plain /mnt/plain && mkdir -p /mnt/plain/etcd-backup || fail mount plain
L=$(newloop bare 16M)
mkfs.ext4 -q $L || fail mkfs bare
mkdir -p /mnt/bare && mount $L /mnt/bare && mkdir -p /mnt/bare/etcd-backup || fail mount bare
D=$(newloop vdata 8M); H=$(newloop vhash 2M)
mkfs.ext4 -q -b 4096 $D || fail mkfs vdata
mkdir -p /mnt/verity && mount $D /mnt/verity && mkdir /mnt/verity/etcd-backup && umount /mnt/verity || fail vdata
veritysetup format $D $H > /tmp/verity.out || fail verity format
RH=$(sed -n 's/^Root hash:[[:space:]]*//p' /tmp/verity.out)
veritysetup open $D vroot $H $RH || fail verity open
mount -o ro /dev/mapper/vroot /mnt/verity || fail mount verity
mkdir -p /mnt/tmpfs && mount -t tmpfs tmpfs /mnt/tmpfs && mkdir /mnt/tmpfs/etcd-backup || fail tmpfs
for d in /dev/mapper/*; do [ -b "$d" ] || continue; MM=$(stat -L -c '%t:%T' $d); echo "GUEST: $d $((0x${MM%%:*})):$((0x${MM##*:})) $(cat /sys/dev/block/$((0x${MM%%:*})):$((0x${MM##*:}))/dm/uuid)"; done
echo "GUEST: setup done, up $(cut -d' ' -f1 /proc/uptime)s"
CRYPTGATE_GUEST_CASES="$(cat /cases)" /gate.test -test.run '^TestGuestGate$' -test.v -test.count=1
report $?
`

// TestGuestGate runs only inside the guest.
func TestGuestGate(t *testing.T) {
	spec := os.Getenv("CRYPTGATE_GUEST_CASES")
	if spec == "" {
		t.Skip("the guest half of TestGateOnRealKernel: runs inside the QEMU guest only")
	}
	for _, c := range strings.Split(strings.TrimSpace(spec), "\n") {
		dir, rest, _ := strings.Cut(c, "|")
		want, detail, _ := strings.Cut(rest, "|")
		t.Run(dir, func(t *testing.T) {
			f := Gather("/", dir, forbidden, RealFS{})
			v := Decide(f)
			t.Logf("dev %s magic %#x dm uuid %q: confirmed=%v %s", f.Stat.Dev, f.Stat.Magic, strings.TrimSpace(f.DMUUID), v.Confirmed, v.Reason)
			if v.Confirmed != (want == "confirmed") {
				t.Fatalf("confirmed=%v, want %s: %s", v.Confirmed, want, v.Reason)
			}
			if v.Confirmed && v.CryptType != detail {
				t.Fatalf("crypt type %q, want %q", v.CryptType, detail)
			}
			if !v.Confirmed && !strings.Contains(v.Reason, detail) {
				t.Fatalf("reason %q lacks %q", v.Reason, detail)
			}
		})
	}
}

// vmRequired: CI installed everything, so nothing may be missing.
func vmRequired() bool { return os.Getenv("PROVIDER_KUBERNETES_VM") == "required" }

func needVM(t *testing.T, format string, a ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, a...)
	if vmRequired() {
		t.Fatalf("PROVIDER_KUBERNETES_VM=required but %s", msg)
	}
	t.Skipf("dm-crypt VM test skipped: %s (.ci/run installs it)", msg)
}

// KernelDir finds a kernel unpacked by .ci/vm-kernel.sh: DIR/vmlinuz and DIR/lib/modules/KVER.
func kernelDir(t *testing.T) (dir, kver string) {
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
		needVM(t, "no Debian kernel unpacked under %s (run .ci/vm-kernel.sh)", base)
	}
	sort.Strings(found)
	k := found[len(found)-1]
	return filepath.Join(base, k), k
}

func TestGateOnRealKernel(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM: not in -short mode")
	}
	if runtime.GOARCH != "amd64" {
		needVM(t, "the guest kernel is amd64, this is %s", runtime.GOARCH)
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		needVM(t, "qemu-system-x86_64 is not installed")
	}
	var tools = map[string]string{}
	for _, name := range []string{"busybox", "cryptsetup", "veritysetup", "mke2fs", "mkfs.xfs"} {
		for _, dir := range []string{"/bin", "/sbin", "/usr/bin", "/usr/sbin"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				tools[name] = filepath.Join(dir, name)
				break
			}
		}
		if tools[name] == "" {
			needVM(t, "%s is not installed", name)
		}
	}
	kdir, kver := kernelDir(t)
	work := t.TempDir()

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// This package's tests, static, as the guest's test binary.
	testBin := filepath.Join(work, "gate.test")
	build := exec.CommandContext(ctx, filepath.Join(runtime.GOROOT(), "bin", "go"), "test", "-c", "-trimpath", "-o", testBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c: %v\n%s", err, out)
	}

	ird := newInitramfs()
	for _, d := range []string{"/proc", "/sys", "/dev", "/run", "/tmp", "/mnt", "/etc", "/var"} {
		ird.files[d] = entry{mode: 0o40755}
	}
	ird.file("/init", []byte(guestInit), 0o755)
	ird.file("/cases", []byte(strings.Join(guestCases, "\n")+"\n"), 0o644)
	ird.copy(t, "/gate.test", testBin)
	ird.copyWithLibs(t, ctx, "/bin/busybox", tools["busybox"])
	out, err := exec.CommandContext(ctx, tools["busybox"], "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" {
			ird.symlink("/bin/"+a, "busybox")
		}
	}
	ird.symlink("/sbin/modprobe", "/bin/busybox")
	for _, name := range []string{"cryptsetup", "veritysetup", "mke2fs", "mkfs.xfs"} {
		ird.copyWithLibs(t, ctx, "/sbin/"+name, tools[name])
	}
	ird.symlink("/sbin/mkfs.ext4", "mke2fs")
	if b, err := os.ReadFile("/etc/mke2fs.conf"); err == nil {
		ird.file("/etc/mke2fs.conf", b, 0o644)
	}
	load := ird.modules(t, kdir, kver, []string{
		// crc32c first: libcrc32c (xfs) and ext4 ask the crypto API for it at load (a soft dependency).
		"crc32c_generic", "crc32c-intel", "dm-crypt", "dm-verity", "loop", "ext4", "xfs", "aesni-intel", "xts", "sha256_generic"})
	ird.file("/modules.load", []byte(strings.Join(load, "\n")+"\n"), 0o644)
	initrd := filepath.Join(work, "initrd.cpio")
	if err := os.WriteFile(initrd, ird.bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	var console bytes.Buffer
	start := time.Now()
	cmd := exec.CommandContext(ctx, qemu, "-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "1",
		"-kernel", filepath.Join(kdir, "vmlinuz"), "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 loglevel=4",
		"-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04")
	cmd.Stdout, cmd.Stderr = &console, &console
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	took := time.Since(start)
	code := -1
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err == nil {
		code = 0
	}
	log := console.String()
	t.Logf("QEMU (TCG, kernel %s) exited %d after %s", kver, code, took.Round(100*time.Millisecond))
	for _, l := range strings.Split(log, "\n") {
		if strings.HasPrefix(l, "GUEST") || strings.Contains(l, "--- ") || strings.Contains(l, "gate_test.go") || strings.Contains(l, "vm_test.go") {
			t.Log(strings.TrimRight(l, "\r"))
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("the VM did not finish within its budget:\n%s", tail(log, 60))
	}
	// isa-debug-exit: QEMU exits with (value << 1) | 1.
	if code != 1 {
		t.Fatalf("guest reported %d (qemu exit %d), want 0:\n%s", (code-1)/2, code, tail(log, 80))
	}
	for _, c := range guestCases {
		dir, _, _ := strings.Cut(c, "|")
		if !strings.Contains(log, "--- PASS: TestGuestGate/"+dir+" ") {
			t.Errorf("no PASS line for %s in the guest's output", dir)
		}
	}
	for _, want := range []string{"CRYPT-LUKS2-", "CRYPT-LUKS1-", "CRYPT-PLAIN-", "CRYPT-VERITY-"} {
		if !strings.Contains(log, want) {
			t.Errorf("the guest never showed a %s dm uuid", want)
		}
	}
}

func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// initramfs is an in-memory newc cpio archive.
type initramfs struct {
	files map[string]entry
}

type entry struct {
	mode uint32 // full st_mode
	data []byte
}

func newInitramfs() *initramfs { return &initramfs{files: map[string]entry{}} }

func (r *initramfs) dirs(p string) {
	for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
		if _, ok := r.files[d]; !ok {
			r.files[d] = entry{mode: 0o40755}
		}
	}
}

func (r *initramfs) file(p string, b []byte, perm uint32) {
	r.dirs(p)
	r.files[p] = entry{mode: 0o100000 | perm, data: b}
}

func (r *initramfs) symlink(p, target string) {
	r.dirs(p)
	r.files[p] = entry{mode: 0o120777, data: []byte(target)}
}

func (r *initramfs) copy(t *testing.T, dst, src string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	r.file(dst, b, uint32(st.Mode().Perm()))
}

// copyWithLibs copies a dynamic binary and the shared libraries ldd names.
func (r *initramfs) copyWithLibs(t *testing.T, ctx context.Context, dst, src string) {
	t.Helper()
	r.copy(t, dst, src)
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
		r.copy(t, lib, real)
	}
}

// modules copies the named modules and their dependencies (modules.dep of
// the unpacked kernel) and returns them in load order.
func (r *initramfs) modules(t *testing.T, kdir, kver string, want []string) []string {
	t.Helper()
	mdir := filepath.Join(kdir, "lib/modules", kver)
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
		r.copy(t, "/lib/modules/"+kver+"/"+f, filepath.Join(mdir, f))
		lines = append(lines, f+": "+strings.Join(deps[n], " "))
		order = append(order, n)
	}
	for _, w := range want {
		visit(strings.ReplaceAll(w, "-", "_"))
	}
	r.file("/lib/modules/"+kver+"/modules.dep", []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	return order
}

func (r *initramfs) bytes() []byte {
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
