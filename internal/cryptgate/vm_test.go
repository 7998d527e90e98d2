package cryptgate

// The gate on a real kernel: a Debian kernel under QEMU (TCG) boots an
// initramfs holding this package's compiled test binary, busybox,
// cryptsetup and mkfs; its /init formats LUKS2+ext4, LUKS1+ext4, plain+xfs,
// bare ext4, dm-verity and tmpfs on loop devices and runs TestGuestGate,
// which reports through isa-debug-exit.
//
// The VM plumbing (and what turns a skip into a failure under CI) is
// internal/testutil/vmtest.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/testutil/vmtest"
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

const guestInit = vmtest.Prelude + `mkdir -p /etc/kubernetes /var/lib/etcd
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

func TestGateOnRealKernel(t *testing.T) {
	h := vmtest.Find(t, "busybox", "cryptsetup", "veritysetup", "mke2fs", "mkfs.xfs")
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

	ird := vmtest.NewInitramfs()
	ird.File("/init", []byte(guestInit), 0o755)
	ird.File("/cases", []byte(strings.Join(guestCases, "\n")+"\n"), 0o644)
	ird.Copy(t, "/gate.test", testBin)
	ird.Busybox(t, ctx, h.Tools["busybox"])
	for _, name := range []string{"cryptsetup", "veritysetup", "mke2fs", "mkfs.xfs"} {
		ird.CopyWithLibs(t, ctx, "/sbin/"+name, h.Tools[name])
	}
	ird.Symlink("/sbin/mkfs.ext4", "mke2fs")
	if b, err := os.ReadFile("/etc/mke2fs.conf"); err == nil {
		ird.File("/etc/mke2fs.conf", b, 0o644)
	}
	ird.Modules(t, h, []string{
		// crc32c first: libcrc32c (xfs) and ext4 ask the crypto API for it at load (a soft dependency).
		"crc32c_generic", "crc32c-intel", "dm-crypt", "dm-verity", "loop", "ext4", "xfs", "aesni-intel", "xts", "sha256_generic"})

	res := vmtest.Boot{}.Run(t, ctx, h, ird, work)
	log := res.Console
	for _, l := range strings.Split(log, "\n") {
		if strings.HasPrefix(l, "GUEST") || strings.Contains(l, "--- ") || strings.Contains(l, "gate_test.go") || strings.Contains(l, "vm_test.go") {
			t.Log(strings.TrimRight(l, "\r"))
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("the VM did not finish within its budget:\n%s", vmtest.Tail(log, 60))
	}
	if g := res.Guest(); g != 0 {
		t.Fatalf("guest reported %d (qemu exit %d), want 0:\n%s", g, res.QEMUExit, vmtest.Tail(log, 80))
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
