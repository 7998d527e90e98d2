package etcdtest

import (
	"os"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/cryptgate"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// EtcdctlVersion is the etcdctl and etcdutl the 1.37 image bundles
// (kubeadm 1.37 deploys etcd 3.7.0).
const EtcdctlVersion = "v3.7.0"

// BundleEtcdTools puts the real etcdctl and etcdutl (built from modules,
// cached) at the node's /usr/bin, as the image bundles them.
func BundleEtcdTools(t testing.TB, n *testutil.Node) {
	t.Helper()
	if err := os.MkdirAll(n.Path("/usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for p, bin := range map[string]string{
		paths.Etcdctl: testbin.Etcdctl(t, EtcdctlVersion),
		paths.Etcdutl: testbin.Etcdutl(t, EtcdctlVersion),
	} {
		if err := os.Symlink(bin, n.Path(p)); err != nil {
			t.Fatal(err)
		}
	}
}

// PersistFS fakes only what a sandbox cannot have: paths under the node's
// /usr/local report ext4 on Dev. Whether Dev is dm-crypt is in the sandbox
// /sys the gate reads. Everything else (files, modes, symlinks, free space)
// is real.
type PersistFS struct {
	Prefix string
	Dev    cryptgate.Dev
}

// Stat implements cryptgate.FS.
func (f PersistFS) Stat(p string) (cryptgate.Stat, error) {
	if p == f.Prefix || strings.HasPrefix(p, f.Prefix+"/") {
		if _, err := os.Lstat(p); err != nil {
			return cryptgate.Stat{}, err
		}
		return cryptgate.Stat{Dev: f.Dev, Magic: cryptgate.MagicExt4}, nil
	}
	return cryptgate.RealFS{}.Stat(p)
}

// EncryptedPersistent lays out a Kairos node whose COS_PERSISTENT
// (/usr/local, bind-mounted onto /etc/kubernetes and /var/lib/etcd) is
// LUKS2-encrypted ext4 on 254:0, and returns the seam for it.
func EncryptedPersistent(t testing.TB, n *testutil.Node) cryptgate.FS {
	t.Helper()
	n.Write(cryptgate.Mountinfo, `21 1 0:30 / / rw,relatime shared:1 - overlay overlay rw
40 21 254:0 / /usr/local rw,relatime shared:20 - ext4 /dev/mapper/luks-persistent rw
41 21 254:0 /.state/etc-kubernetes.bind /etc/kubernetes rw,relatime shared:20 - ext4 /dev/mapper/luks-persistent rw
42 21 254:0 /.state/var-lib-etcd.bind /var/lib/etcd rw,relatime shared:20 - ext4 /dev/mapper/luks-persistent rw
`, 0o444)
	n.Write("/sys/devices/virtual/block/dm-0/dm/uuid", "CRYPT-LUKS2-6b1f0e7a2c3d4e5f8091a2b3c4d5e6f7-luks-persistent\n", 0o444)
	if err := os.MkdirAll(n.Path(cryptgate.SysDevBlk), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../devices/virtual/block/dm-0", n.Path(cryptgate.SysDevBlk+"/254:0")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(n.Path(paths.PersistDir), 0o755); err != nil {
		t.Fatal(err)
	}
	return PersistFS{Prefix: n.Path("/usr/local"), Dev: cryptgate.Dev{Major: 254, Minor: 0}}
}

// PlainPersistent is the default install: COS_PERSISTENT is a bare ext4 partition.
func PlainPersistent(t testing.TB, n *testutil.Node) cryptgate.FS {
	t.Helper()
	n.Write(cryptgate.Mountinfo, `21 1 0:30 / / rw,relatime shared:1 - overlay overlay rw
40 21 8:3 / /usr/local rw,relatime shared:20 - ext4 /dev/sda3 rw
41 21 8:3 /.state/etc-kubernetes.bind /etc/kubernetes rw,relatime shared:20 - ext4 /dev/sda3 rw
`, 0o444)
	if err := os.MkdirAll(n.Path("/sys/devices/pci0000:00/block/sda/sda3"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(n.Path(paths.PersistDir), 0o755); err != nil {
		t.Fatal(err)
	}
	return PersistFS{Prefix: n.Path("/usr/local"), Dev: cryptgate.Dev{Major: 8, Minor: 3}}
}
