package cryptgate

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// fakeFS answers Stat for paths under a sandbox root from a table: the only
// facts a sandbox cannot have (the device number and the filesystem magic).
type fakeFS map[string]Stat

func (f fakeFS) Stat(p string) (Stat, error) {
	st, ok := f[p]
	if !ok {
		return Stat{}, &os.PathError{Op: "fstat", Path: p, Err: os.ErrNotExist}
	}
	return st, nil
}

const backup = "/usr/local/provider-kubernetes/etcd-backup"

var forbidden = []string{"/etc/kubernetes", "/var/lib/etcd"}

// A Kairos node with an encrypted COS_PERSISTENT: the overlay root, the
// persistent partition at /usr/local, and its bind mounts onto /etc/kubernetes
// and /var/lib/etcd.
const kairosMountinfo = `21 1 0:30 / / rw,relatime shared:1 - overlay overlay rw,lowerdir=/sysroot
22 21 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:2 - proc proc rw
23 21 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:3 - sysfs sysfs rw
40 21 254:0 / /usr/local rw,relatime shared:20 - ext4 /dev/mapper/luks-persistent rw
41 21 254:0 /.state/etc-kubernetes.bind /etc/kubernetes rw,relatime shared:20 - ext4 /dev/mapper/luks-persistent rw
42 21 254:0 /.state/var-lib-etcd.bind /var/lib/etcd rw,relatime shared:20 - ext4 /dev/mapper/luks-persistent rw
`

type gateCase struct {
	name      string
	dir       string
	mountinfo string
	stat      Stat              // what fstat/fstatfs report for dir
	dm        map[string]string // "MAJ:MIN" -> dm/uuid content
	setup     func(t *testing.T, root string)
	confirmed bool
	crypt     string
	reason    string // a substring of the reason
}

func mi(dev, fstype, src string) string {
	return "21 1 0:30 / / rw shared:1 - overlay overlay rw\n22 21 0:21 / /proc rw - proc proc rw\n" +
		"40 21 " + dev + " / /usr/local rw,relatime shared:20 - " + fstype + " " + src + " rw\n"
}

var luks2 = map[string]string{"254:0": "CRYPT-LUKS2-9f2c6e0d4a8b4c1e8f7a6b5c4d3e2f10-luks-persistent\n"}

func gateCases() []gateCase {
	ext4On := func(d uint32) Stat { return Stat{Dev: Dev{254, d}, Magic: MagicExt4} }
	return []gateCase{
		{name: "kairos LUKS2 ext4", dir: backup, mountinfo: kairosMountinfo, stat: ext4On(0), dm: luks2, confirmed: true, crypt: "LUKS2", reason: "ext4 on dm-crypt LUKS2"},
		{name: "LUKS1 ext4", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/p"), stat: ext4On(0),
			dm: map[string]string{"254:0": "CRYPT-LUKS1-00112233445566778899aabbccddeeff-p"}, confirmed: true, crypt: "LUKS1"},
		{name: "plain xfs", dir: backup, mountinfo: mi("254:3", "xfs", "/dev/mapper/p"), stat: Stat{Dev: Dev{254, 3}, Magic: MagicXFS},
			dm: map[string]string{"254:3": "CRYPT-PLAIN-p"}, confirmed: true, crypt: "PLAIN", reason: "xfs on dm-crypt PLAIN"},
		{name: "BITLK ext4", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/b"), stat: ext4On(0),
			dm: map[string]string{"254:0": "CRYPT-BITLK-b"}, confirmed: true, crypt: "BITLK"},
		{name: "TCRYPT ext4", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/b"), stat: ext4On(0),
			dm: map[string]string{"254:0": "CRYPT-TCRYPT-b"}, confirmed: true, crypt: "TCRYPT"},
		{name: "LOOPAES ext4", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/b"), stat: ext4On(0),
			dm: map[string]string{"254:0": "CRYPT-LOOPAES-b"}, confirmed: true, crypt: "LOOPAES"},

		{name: "default install: bare ext4 partition", dir: backup, mountinfo: mi("8:3", "ext4", "/dev/sda3"), stat: Stat{Dev: Dev{8, 3}, Magic: MagicExt4},
			reason: "not on device-mapper"},
		{name: "bare ext4 on a loop device", dir: backup, mountinfo: mi("7:0", "ext4", "/dev/loop0"), stat: Stat{Dev: Dev{7, 0}, Magic: MagicExt4},
			reason: "not on device-mapper"},
		{name: "overlay", dir: backup, mountinfo: "21 1 0:30 / / rw - overlay overlay rw\n", stat: Stat{Dev: Dev{0, 30}, Magic: 0x794c7630},
			reason: "overlay"},
		{name: "btrfs on LUKS (anonymous subvolume device)", dir: backup, mountinfo: mi("0:45", "btrfs", "/dev/mapper/luks"), stat: Stat{Dev: Dev{0, 45}, Magic: 0x9123683E},
			dm: luks2, reason: "btrfs"},
		{name: "btrfs subvolume device differs from mountinfo", dir: backup, mountinfo: mi("0:45", "btrfs", "/dev/mapper/luks"), stat: Stat{Dev: Dev{0, 46}, Magic: 0x9123683E},
			reason: "is on device 0:46 but its mount"},
		{name: "tmpfs", dir: backup, mountinfo: mi("0:50", "tmpfs", "tmpfs"), stat: Stat{Dev: Dev{0, 50}, Magic: 0x01021994}, reason: "tmpfs"},
		{name: "LVM on LUKS", dir: backup, mountinfo: mi("254:1", "ext4", "/dev/mapper/vg-lv"), stat: ext4On(1),
			dm: map[string]string{"254:0": "CRYPT-LUKS2-aa-pv", "254:1": "LVM-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKlMnOpQrStUv\n"}, reason: "LVM volume"},
		{name: "CRYPT-VERITY", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/v"), stat: ext4On(0),
			dm: map[string]string{"254:0": "CRYPT-VERITY-5a1b2c3d4e5f60718293a4b5c6d7e8f9-v"}, reason: "type VERITY"},
		{name: "CRYPT-INTEGRITY", dir: backup, mountinfo: mi("254:0", "xfs", "/dev/mapper/i"), stat: Stat{Dev: Dev{254, 0}, Magic: MagicXFS},
			dm: map[string]string{"254:0": "CRYPT-INTEGRITY-i"}, reason: "type INTEGRITY"},
		{name: "CRYPT-SUBDEV", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/s"), stat: ext4On(0),
			dm: map[string]string{"254:0": "CRYPT-SUBDEV-0123-s_dif"}, reason: "type SUBDEV"},
		{name: "CRYPT-TEMP", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/t"), stat: ext4On(0),
			dm: map[string]string{"254:0": "CRYPT-TEMP-t"}, reason: "type TEMP"},
		{name: "unknown CRYPT type", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/t"), stat: ext4On(0),
			dm: map[string]string{"254:0": "CRYPT-FUTURE9-t"}, reason: "type FUTURE9"},
		{name: "other device-mapper target", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/t"), stat: ext4On(0),
			dm: map[string]string{"254:0": "mpath-3600508b400105e210000900000490000"}, reason: "mpath device-mapper device"},
		{name: "device-mapper without uuid", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/t"), stat: ext4On(0),
			dm: map[string]string{"254:0": "\n"}, reason: "without a uuid"},
		{name: "ext3 on LUKS (same magic as ext4)", dir: backup, mountinfo: mi("254:0", "ext3", "/dev/mapper/l"), stat: ext4On(0), dm: luks2, reason: "ext3"},
		{name: "mountinfo ext4 but statfs xfs", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/l"), stat: Stat{Dev: Dev{254, 0}, Magic: MagicXFS}, dm: luks2,
			reason: "statfs reports magic"},
		{name: "device differs from its mount", dir: backup, mountinfo: mi("254:0", "ext4", "/dev/mapper/l"), stat: ext4On(7), dm: luks2,
			reason: "but its mount /usr/local is 254:0"},
		{name: "no mountinfo", dir: backup, stat: ext4On(0), dm: luks2, reason: "mountinfo"},
		{name: "no mount holds it", dir: backup, mountinfo: "40 21 254:0 / /usr/local/other rw - ext4 /dev/mapper/l rw\n", stat: ext4On(0), dm: luks2, reason: "no mount"},

		{name: "symlink in the middle of the path", dir: backup, mountinfo: kairosMountinfo, stat: ext4On(0), dm: luks2,
			setup: func(t *testing.T, root string) {
				mustMkdir(t, filepath.Join(root, "persist/provider-kubernetes/etcd-backup"))
				mustRemoveAll(t, filepath.Join(root, "usr/local/provider-kubernetes"))
				mustSymlink(t, "../../persist/provider-kubernetes", filepath.Join(root, "usr/local/provider-kubernetes"))
			}, reason: "/usr/local/provider-kubernetes is a symlink"},
		{name: "symlink as the directory", dir: backup, mountinfo: kairosMountinfo, stat: ext4On(0), dm: luks2,
			setup: func(t *testing.T, root string) {
				mustMkdir(t, filepath.Join(root, "usr/local/elsewhere"))
				mustRemoveAll(t, filepath.Join(root, backup))
				mustSymlink(t, "../elsewhere", filepath.Join(root, backup))
			}, reason: "etcd-backup is a symlink"},
		{name: "symlink at the top", dir: backup, mountinfo: kairosMountinfo, stat: ext4On(0), dm: luks2,
			setup: func(t *testing.T, root string) {
				mustMkdir(t, filepath.Join(root, "realusr/local/provider-kubernetes/etcd-backup"))
				mustRemoveAll(t, filepath.Join(root, "usr"))
				mustSymlink(t, "realusr", filepath.Join(root, "usr"))
			}, reason: "/usr is a symlink"},
		{name: "a file, not a directory", dir: backup, mountinfo: kairosMountinfo, stat: ext4On(0), dm: luks2,
			setup: func(t *testing.T, root string) {
				mustRemoveAll(t, filepath.Join(root, backup))
				if err := os.WriteFile(filepath.Join(root, backup), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}, reason: "is not a directory"},
		{name: "missing directory", dir: backup, mountinfo: kairosMountinfo, stat: ext4On(0), dm: luks2,
			setup:  func(t *testing.T, root string) { mustRemoveAll(t, filepath.Join(root, backup)) },
			reason: "etcd-backup does not exist"},
		{name: "under /etc/kubernetes even on LUKS", dir: "/etc/kubernetes/etcd-backup", mountinfo: kairosMountinfo, stat: ext4On(0), dm: luks2,
			reason: "under /etc/kubernetes"},
		{name: "under /var/lib/etcd even on LUKS", dir: "/var/lib/etcd/backup", mountinfo: kairosMountinfo, stat: ext4On(0), dm: luks2,
			reason: "under /var/lib/etcd"},
		{name: "bind mount of /etc/kubernetes content", dir: backup,
			mountinfo: "1 0 254:0 / / rw - ext4 /dev/mapper/root rw\n2 1 254:0 /etc/kubernetes/bk " + backup + " rw - ext4 /dev/mapper/root rw\n",
			stat:      ext4On(0), dm: luks2, reason: "also visible under /etc/kubernetes"},
		{name: "bind mount of the backup dir onto /var/lib/etcd", dir: backup,
			mountinfo: kairosMountinfo + "43 42 254:0 /provider-kubernetes /var/lib/etcd/pk rw - ext4 /dev/mapper/luks-persistent rw\n",
			stat:      ext4On(0), dm: luks2, reason: "also visible under /var/lib/etcd"},
		{name: "relative path", dir: "usr/local/x", mountinfo: kairosMountinfo, stat: ext4On(0), dm: luks2, reason: "not a clean absolute path"},
		{name: "unclean path", dir: "/usr/local/provider-kubernetes/../provider-kubernetes/etcd-backup", mountinfo: kairosMountinfo, stat: ext4On(0), dm: luks2, reason: "not a clean absolute path"},
	}
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o700); err != nil {
		t.Fatal(err)
	}
}

func mustRemoveAll(t *testing.T, p string) {
	t.Helper()
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// sandbox builds a host root with /proc/self/mountinfo, /sys/dev/block/*/dm/uuid
// and the directory, and a fake FS answering for the directory.
func sandbox(t *testing.T, c gateCase) (paths.Root, FS) {
	root := t.TempDir()
	r := paths.Root(root)
	if filepath.IsAbs(c.dir) {
		mustMkdir(t, r.Path(c.dir))
	}
	if c.mountinfo != "" {
		mustMkdir(t, r.Path("/proc/self"))
		if err := os.WriteFile(r.Path(Mountinfo), []byte(c.mountinfo), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	for dev, uuid := range c.dm {
		// As in sysfs: /sys/dev/block/MAJ:MIN is a symlink to the device's directory.
		name := "dm-" + strings.Split(dev, ":")[1]
		mustMkdir(t, r.Path("/sys/devices/virtual/block/"+name+"/dm"))
		if err := os.WriteFile(r.Path("/sys/devices/virtual/block/"+name+"/dm/uuid"), []byte(uuid), 0o444); err != nil {
			t.Fatal(err)
		}
		mustMkdir(t, r.Path(SysDevBlk))
		mustSymlink(t, "../../devices/virtual/block/"+name, r.Path(SysDevBlk+"/"+dev))
	}
	if c.setup != nil {
		c.setup(t, root)
	}
	return r, fakeFS{r.Path(c.dir): c.stat}
}

func TestGateTable(t *testing.T) {
	for _, c := range gateCases() {
		t.Run(c.name, func(t *testing.T) {
			r, fs := sandbox(t, c)
			v := Check(r, c.dir, forbidden, fs)
			if v.Confirmed != c.confirmed {
				t.Fatalf("confirmed=%v, want %v (reason %q)", v.Confirmed, c.confirmed, v.Reason)
			}
			if v.Confirmed && v.CryptType != c.crypt {
				t.Fatalf("crypt type %q, want %q", v.CryptType, c.crypt)
			}
			if !strings.Contains(v.Reason, c.reason) || v.Reason == "" {
				t.Fatalf("reason %q, want it to contain %q", v.Reason, c.reason)
			}
			if strings.Contains(v.Reason, string(r)) {
				t.Fatalf("reason %q names the sandbox root", v.Reason)
			}
		})
	}
}

func TestParseMountinfo(t *testing.T) {
	in := "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 shared:7 - ext3 /dev/root rw,errors=continue\n" +
		"40 21 254:0 / /usr/local rw,relatime - ext4 /dev/mapper/luks-persistent rw\n"
	got, err := ParseMountinfo([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{ID: 36, Parent: 35, Dev: Dev{98, 0}, Root: "/mnt1", MountPoint: "/mnt/with space", FSType: "ext3", Source: "/dev/root", SuperOptions: "rw,errors=continue"},
		{ID: 40, Parent: 21, Dev: Dev{254, 0}, Root: "/", MountPoint: "/usr/local", FSType: "ext4", Source: "/dev/mapper/luks-persistent", SuperOptions: "rw"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	for _, bad := range []string{"", "1 2 3\n", "a b 254:0 / / rw - ext4 x rw\n", "1 2 254:0 / / rw ext4 x rw\n", "1 2 25x:0 / / rw - ext4 x rw\n"} {
		if _, err := ParseMountinfo([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// On this machine (no device-mapper) the real seam must read real facts and
// never confirm a temporary directory.
func TestRealFSOnThisHost(t *testing.T) {
	dir := t.TempDir()
	st, err := RealFS{}.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Magic == 0 {
		t.Fatalf("statfs magic 0 for %s", dir)
	}
	v := Check("/", dir, forbidden, RealFS{})
	if v.Confirmed {
		t.Fatalf("a temp dir on this host was confirmed: %+v", v)
	}
	if v.Dev != st.Dev || v.Reason == "" {
		t.Fatalf("verdict %+v, stat %+v", v, st)
	}
	t.Logf("host temp dir: %s", v.Reason)
	link := filepath.Join(t.TempDir(), "link")
	mustSymlink(t, dir, link)
	if v := Check("/", link, forbidden, RealFS{}); v.Confirmed || !strings.Contains(v.Reason, "is a symlink") {
		t.Fatalf("symlink: %+v", v)
	}
	if _, err := (RealFS{}).Stat(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing path: %v", err)
	}
}
