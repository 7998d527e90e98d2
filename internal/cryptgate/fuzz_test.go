package cryptgate

import (
	"strings"
	"testing"
)

// FuzzGate feeds arbitrary bytes as /proc/self/mountinfo and as the dm
// uuid of /sys/dev/block/MAJ:MIN/dm/uuid: parsing never panics, the reason
// is one line, and nothing is confirmed but ext4/xfs directly on an
// encrypting dm-crypt type.
func FuzzGate(f *testing.F) {
	f.Add([]byte("36 35 253:0 / /usr/local rw,relatime shared:1 - ext4 /dev/mapper/persistent rw\n"), "CRYPT-LUKS2-0123-persistent")
	f.Add([]byte("36 35 253:0 / /usr/local rw - xfs /dev/dm-0 rw\n"), "CRYPT-VERITY-x")
	f.Add([]byte("1 2 3\n"), "LVM-abc")
	f.Fuzz(func(t *testing.T, mountinfo []byte, uuid string) {
		mounts, err := ParseMountinfo(mountinfo)
		facts := Facts{Dir: "/usr/local/provider-kubernetes/etcd-backup", Forbidden: []string{"/etc/kubernetes", "/var/lib/etcd"},
			Mounts: mounts, HasDM: true, DMUUID: uuid}
		if err != nil {
			facts.MountinfoErr = err.Error()
		}
		if len(mounts) > 0 {
			facts.Stat = Stat{Dev: mounts[0].Dev, Magic: MagicExt4}
		}
		v := Decide(facts)
		if strings.ContainsAny(v.Reason, "\n\r") && err == nil {
			t.Fatalf("reason spans lines: %q", v.Reason)
		}
		if v.Confirmed {
			typ, ok := cryptType(strings.TrimSpace(uuid))
			if !ok || !encrypting[typ] || (v.FSType != "ext4" && v.FSType != "xfs") {
				t.Fatalf("confirmed %+v for uuid %q", v, uuid)
			}
		}
	})
}
