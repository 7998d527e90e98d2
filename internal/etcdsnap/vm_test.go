package etcdsnap

// The whole step for real on dm-crypt: a Debian kernel under QEMU (TCG)
// boots an initramfs holding the real provider-kubernetes binary, the
// bundled etcdctl and etcdutl at /usr/bin, a real etcd server and a
// kubeadm-like /etc/kubernetes (PKI, etcd.yaml, the 1.36 control plane's
// manifests). Its /init mounts LUKS2 + ext4 on /usr/local as Kairos mounts
// an encrypted COS_PERSISTENT, starts etcd, writes keys with etcdctl and
// runs `provider-kubernetes etcd-snapshot --target v1.37.2` (taken, then
// skipped-already-taken); then it mounts a plain ext4 disk on /usr/local
// instead and runs it again (skipped, twice: without and with an
// etcd-backup directory there). The guest prints what it saw; the
// snapshot's bytes come out on a second serial port and are restored here
// with the same etcdutl. No fake: the gate reads the guest kernel's
// mountinfo, statfs and /sys.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/vmtest"
)

// The guest's etcd is the 1.36 cluster's (EtcdOnKubeadm136).
const (
	vmEtcdImage = "registry.k8s.io/etcd:3.6.8-0"
	vmNode      = "cp1"
	vmKeyPrefix = "/registry/secrets/vm/"
	vmKeys      = 100 // one etcdctl txn (etcd's --max-txn-ops is 128)
	vmKeySize   = 200
)

// vmGuestInit is the guest's /init after the prelude; %[1]s is the etcd
// server's command line.
const vmGuestInit = `mkdir -p /usr/local /var/lib/etcd && chmod 0700 /var/lib/etcd
ifconfig lo 127.0.0.1 up || fail loopback
head -c 32 /dev/urandom > /tmp/key
newloop() { truncate -s $2 /tmp/$1.img || fail truncate; L=$(losetup -f) || fail losetup; losetup $L /tmp/$1.img || fail losetup $L; echo $L; }
# COS_PERSISTENT, encrypted: LUKS2, ext4 directly on it, mounted on /usr/local.
# Big enough for the step's free-space rule (2 x database + 1 GiB); sparse.
L=$(newloop persistent 1600M)
cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file /tmp/key $L || fail luksFormat
cryptsetup open --key-file /tmp/key $L luks-persistent || fail luks open
mkfs.ext4 -q -m 0 -E lazy_itable_init=1,lazy_journal_init=1 /dev/mapper/luks-persistent || fail mkfs luks
mount -o noinit_itable /dev/mapper/luks-persistent /usr/local || fail mount luks
mkdir -m 0755 /usr/local/provider-kubernetes || fail mkdir
# The default install's disk: plain ext4, no dm-crypt, with the same room:
# only the gate stands between the step and a plaintext snapshot there.
P=$(newloop plaindisk 1600M)
mkfs.ext4 -q -m 0 -E lazy_itable_init=1,lazy_journal_init=1 $P || fail mkfs plain
set -- $(stat -L -c '%%t %%T' /dev/mapper/luks-persistent)
CRYPTDEV=$((0x$1)):$((0x$2))
echo "SNAP-CRYPT: dev=$CRYPTDEV uuid=$(cat /sys/dev/block/$CRYPTDEV/dm/uuid)"
grep ' /usr/local ' /proc/self/mountinfo | sed 's/^/GUEST: mountinfo: /'

%[1]s > /tmp/etcd.log 2>&1 &
ectl() { /usr/bin/etcdctl --endpoints=https://127.0.0.1:2379 --cacert=/etc/kubernetes/pki/etcd/ca.crt --cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt --key=/etc/kubernetes/pki/etcd/healthcheck-client.key --command-timeout=5s "$@"; }
i=0
until ectl endpoint health >/dev/null 2>&1; do
  i=$((i+1)); [ $i -lt 90 ] || { tail -20 /tmp/etcd.log; fail etcd not healthy in 90 tries; }
  sleep 1
done
echo "GUEST: etcd healthy, up $(cut -d' ' -f1 /proc/uptime)s"
ectl txn < /keys.txn > /tmp/txn.out 2>&1 || { cat /tmp/txn.out; fail txn; }
echo "GUEST: $(ectl get --prefix --count-only --write-out=fields %[2]s | grep Count) keys under %[2]s"

snap() {
  S=$(cut -d' ' -f1 /proc/uptime)
  /usr/bin/provider-kubernetes etcd-snapshot --target v1.37.2 --root / > /tmp/snap.out 2>&1
  rc=$?
  sed "s/^/SNAP-$1: /" /tmp/snap.out
  echo "SNAP-$1-RC: $rc (from ${S}s to $(cut -d' ' -f1 /proc/uptime)s)"
}
B=/usr/local/provider-kubernetes/etcd-backup

snap encrypted
for f in $B/*; do
  stat -c "SNAP-FILE: %%n|mode=%%a|uid=%%u|gid=%%g|links=%%h|dev=%%d|size=%%s|type=%%F" "$f"
done
stat -c "SNAP-DIR: mode=%%a|uid=%%u|gid=%%g|dev=%%d|type=%%F" $B
stat -f -c "SNAP-FS: magic=%%t" $B
for f in $B/*.db; do
  echo "SNAP-SHA256: $(sha256sum "$f" | cut -d' ' -f1)"
  stty -F /dev/ttyS1 raw -echo || fail stty
  cat "$f" > /dev/ttyS1 || fail copy out
done

snap again

# The same node on the unencrypted disk.
umount /usr/local || fail umount
mount -o noinit_itable $P /usr/local || fail mount plain
mkdir -m 0755 /usr/local/provider-kubernetes || fail mkdir
snap plain
find /usr/local | sed 's/^/SNAP-PLAIN-NODIR: /'
[ -d $B ] || mkdir -m 0700 $B || fail mkdir backup # (there already if the first run wrote)
snap plaindir
find /usr/local | sed 's/^/SNAP-PLAIN-DIR: /'
stat -c "SNAP-PLAIN-DIR-MODE: %%a" $B
report 0
`

func TestTakenOnRealDmCrypt(t *testing.T) {
	h := vmtest.Find(t, "busybox", "cryptsetup", "mke2fs")
	work := t.TempDir()
	etcdBin := testbin.Etcd(t, EtcdOnKubeadm136)
	etcdctl := testbin.Etcdctl(t, etcdtest.EtcdctlVersion)
	etcdutl := testbin.Etcdutl(t, etcdtest.EtcdctlVersion)

	bctx, bcancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer bcancel()
	// The binary users run, static, as the image ships it.
	provider := filepath.Join(work, "provider-kubernetes")
	if err := testbin.BuildProvider(bctx, provider); err != nil {
		t.Fatal(err)
	}

	// /etc/kubernetes as kubeadm leaves a 1.36 control plane with stacked
	// etcd: the PKI, etcd.yaml naming the guest's member, the manifests.
	node := testutil.NewNode(t, vmNode)
	etcdtest.NewPKI(t, node)
	node.Write(paths.EtcdManifest, etcdtest.Manifest(vmNode, vmEtcdImage, 2379, 2380), 0o600)
	for _, c := range testutil.ControlPlaneComponents {
		node.Write(paths.ManifestsDir+"/"+c+".yaml", testutil.StaticPodManifest(c, "v1.36.3"), 0o600)
	}
	pki := "/etc/kubernetes/pki/etcd/"
	peer := "https://127.0.0.1:2380"
	etcdCmd := strings.Join([]string{"/opt/etcd/etcd", "--name=" + vmNode, "--data-dir=/var/lib/etcd",
		"--listen-client-urls=https://127.0.0.1:2379", "--advertise-client-urls=https://127.0.0.1:2379",
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer, "--initial-cluster=" + vmNode + "=" + peer,
		"--cert-file=" + pki + "server.crt", "--key-file=" + pki + "server.key", "--trusted-ca-file=" + pki + "ca.crt", "--client-cert-auth=true",
		"--peer-cert-file=" + pki + "peer.crt", "--peer-key-file=" + pki + "peer.key", "--peer-trusted-ca-file=" + pki + "ca.crt", "--peer-client-cert-auth=true",
		"--listen-metrics-urls=http://127.0.0.1:2381", "--log-level=warn"}, " ")
	var txn strings.Builder
	txn.WriteString("\n") // no compares
	for i := 0; i < vmKeys; i++ {
		fmt.Fprintf(&txn, "put %s%08d %s\n", vmKeyPrefix, i, strings.Repeat("v", vmKeySize))
	}
	txn.WriteString("\n\n") // no failure branch

	ird := vmtest.NewInitramfs()
	ird.File("/init", []byte(vmtest.Prelude+fmt.Sprintf(vmGuestInit, etcdCmd, vmKeyPrefix)), 0o755)
	ird.File("/keys.txn", []byte(txn.String()), 0o644)
	ird.CopyTree(t, paths.KubernetesDir, node.Path(paths.KubernetesDir))
	ird.Copy(t, "/usr/bin/provider-kubernetes", provider)
	ird.Copy(t, paths.Etcdctl, etcdctl)
	ird.Copy(t, paths.Etcdutl, etcdutl)
	ird.Copy(t, "/opt/etcd/etcd", etcdBin)
	ird.Busybox(t, bctx, h.Tools["busybox"])
	ird.CopyWithLibs(t, bctx, "/sbin/cryptsetup", h.Tools["cryptsetup"])
	ird.CopyWithLibs(t, bctx, "/sbin/mke2fs", h.Tools["mke2fs"])
	ird.Symlink("/sbin/mkfs.ext4", "mke2fs")
	if b, err := os.ReadFile("/etc/mke2fs.conf"); err == nil {
		ird.File("/etc/mke2fs.conf", b, 0o644)
	}
	ird.Modules(t, h, []string{"crc32c_generic", "crc32c-intel", "dm-crypt", "loop", "ext4", "aesni-intel", "xts", "sha256_generic"})

	out := filepath.Join(work, "snapshot.out")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res := vmtest.Boot{MemoryMB: 1536, Extra: []string{"-serial", "file:" + out}}.Run(t, ctx, h, ird, work)
	lines := map[string][]string{} // by prefix
	for _, l := range strings.Split(res.Console, "\n") {
		l = strings.TrimRight(l, "\r")
		if strings.HasPrefix(l, "GUEST") || strings.HasPrefix(l, "SNAP") {
			t.Log(l)
		}
		if k, v, ok := strings.Cut(l, ": "); ok && strings.HasPrefix(k, "SNAP") {
			lines[k] = append(lines[k], v)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("the VM did not finish within its budget:\n%s", vmtest.Tail(res.Console, 60))
	}
	if g := res.Guest(); g != 0 {
		t.Fatalf("guest reported %d (qemu exit %d), want 0:\n%s", g, res.QEMUExit, vmtest.Tail(res.Console, 80))
	}

	// The encrypted disk: taken.
	taken := outcomeLine(t, lines, "encrypted", Taken)
	path := taken["path"]
	if !regexp.MustCompile(`^`+regexp.QuoteMeta(paths.EtcdBackupDir)+`/etcd-[0-9a-f]{16}-v1\.37-[0-9]{8}T[0-9]{6}Z\.db$`).MatchString(path) ||
		!strings.Contains(path, taken["cluster_id"]) {
		t.Fatalf("taken path %q (cluster_id %q)", path, taken["cluster_id"])
	}
	crypt := fields(one(t, lines, "SNAP-CRYPT"), " ")
	if !strings.HasPrefix(crypt["uuid"], "CRYPT-LUKS2-") {
		t.Fatalf("the guest's persistent device is not LUKS2 dm-crypt: %v", crypt)
	}
	files := lines["SNAP-FILE"]
	if len(files) != 1 {
		t.Fatalf("the backup directory holds %d entries, want the snapshot alone: %q", len(files), files)
	}
	name, rest, _ := strings.Cut(files[0], "|")
	f := fields(rest, "|")
	if name != path || f["type"] != "regular file" || f["mode"] != "600" || f["uid"] != "0" || f["gid"] != "0" || f["links"] != "1" {
		t.Fatalf("snapshot %s: %v, want %s, a regular file 0600 root:root with one link", name, f, path)
	}
	if d := devOf(t, f["dev"]); d != crypt["dev"] {
		t.Fatalf("the snapshot is on device %s, not on the LUKS2 device %s", d, crypt["dev"])
	}
	dir := fields(one(t, lines, "SNAP-DIR"), "|")
	if dir["mode"] != "700" || dir["uid"] != "0" || dir["gid"] != "0" || dir["type"] != "directory" || devOf(t, dir["dev"]) != crypt["dev"] {
		t.Fatalf("backup directory %v, want 0700 root:root on %s", dir, crypt["dev"])
	}
	if m := fields(one(t, lines, "SNAP-FS"), " ")["magic"]; m != "ef53" {
		t.Fatalf("backup directory's filesystem magic %s, want ext4's ef53", m)
	}
	// Its bytes, out of the guest, restore with the bundled etcdutl and hold the keys.
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	size, _ := strconv.Atoi(f["size"])
	sum := sha256.Sum256(b)
	if len(b) != size || hex.EncodeToString(sum[:]) != one(t, lines, "SNAP-SHA256") {
		t.Fatalf("copied out %d bytes (sha256 %x), the guest's file has %d (sha256 %s)", len(b), sum, size, one(t, lines, "SNAP-SHA256"))
	}
	if taken["db_size"] == "" || taken["keys"] == "" || taken["hash"] == "" {
		t.Fatalf("taken line lacks db_size, keys or hash: %v", taken)
	}
	snap := filepath.Join(work, filepath.Base(path))
	if err := os.WriteFile(snap, b, 0o600); err != nil {
		t.Fatal(err)
	}
	restoreAndRead(t, snap, vmKeyPrefix, vmKeys, vmKeySize)

	// Again on the same disk: the first one counts.
	if again := outcomeLine(t, lines, "again", SkippedAlreadyTaken); again["path"] != path {
		t.Fatalf("second attempt names %q, want the first snapshot %s", again["path"], path)
	}

	// The unencrypted disk: skipped, nothing written, not even the directory.
	plain := outcomeLine(t, lines, "plain", SkippedEncryptionUnconfirmed)
	if !strings.Contains(plain["detail"], "not on device-mapper") {
		t.Fatalf("plain disk skipped for %q, want the gate's not-on-device-mapper verdict", plain["detail"])
	}
	wantTree := func(key string, want ...string) {
		t.Helper()
		got := slices.Sorted(slices.Values(lines[key])) // find lists in directory order
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("the unencrypted disk after the step (%s):\n%s\nwant:\n%s", key, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	wantTree("SNAP-PLAIN-NODIR", "/usr/local", "/usr/local/lost+found", paths.PersistDir)
	plainDir := outcomeLine(t, lines, "plaindir", SkippedEncryptionUnconfirmed)
	if !strings.Contains(plainDir["detail"], "not on device-mapper") {
		t.Fatalf("plain disk with a backup directory skipped for %q", plainDir["detail"])
	}
	wantTree("SNAP-PLAIN-DIR", "/usr/local", "/usr/local/lost+found", paths.PersistDir, paths.EtcdBackupDir)
	if m := one(t, lines, "SNAP-PLAIN-DIR-MODE"); m != "700" {
		t.Fatalf("the plain disk's backup directory is now %s, want it untouched (700)", m)
	}
}

// outcomeLine is the one etcd-snapshot line of a guest run, its exit code 0,
// with the outcome want; it returns the line's fields.
func outcomeLine(t *testing.T, lines map[string][]string, run string, want Outcome) map[string]string {
	t.Helper()
	var found []map[string]string
	for _, l := range lines["SNAP-"+run] {
		if f := fields(l, " "); f["msg"] == Event {
			found = append(found, f)
		}
	}
	if len(found) != 1 {
		t.Fatalf("run %s: %d etcd-snapshot lines, want 1: %q", run, len(found), lines["SNAP-"+run])
	}
	if found[0]["outcome"] != string(want) {
		t.Fatalf("run %s: outcome %s, want %s: %v", run, found[0]["outcome"], want, found[0])
	}
	if rc := one(t, lines, "SNAP-"+run+"-RC"); !strings.HasPrefix(rc, "0 ") {
		t.Fatalf("run %s: exit %s, want 0", run, rc)
	}
	return found[0]
}

// one is the single value printed under key.
func one(t *testing.T, lines map[string][]string, key string) string {
	t.Helper()
	if len(lines[key]) != 1 {
		t.Fatalf("%s: %d lines from the guest, want 1: %q", key, len(lines[key]), lines[key])
	}
	return lines[key][0]
}

var kv = regexp.MustCompile(`([a-z_]+)=("(?:[^"\\]|\\.)*"|[^ ]*)`)

// fields parses key=value pairs separated by sep (values may be quoted, as slog writes them).
func fields(s, sep string) map[string]string {
	m := map[string]string{}
	if sep == " " {
		for _, g := range kv.FindAllStringSubmatch(s, -1) {
			v := g[2]
			if u, err := strconv.Unquote(v); err == nil && strings.HasPrefix(v, `"`) {
				v = u
			}
			m[g[1]] = v
		}
		return m
	}
	for _, p := range strings.Split(s, sep) {
		if k, v, ok := strings.Cut(p, "="); ok {
			m[k] = v
		}
	}
	return m
}

// devOf is stat's decimal st_dev as MAJOR:MINOR.
func devOf(t *testing.T, s string) string {
	t.Helper()
	d, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("device number %q: %v", s, err)
	}
	return fmt.Sprintf("%d:%d", unix.Major(d), unix.Minor(d))
}
