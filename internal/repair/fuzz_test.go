package repair

import (
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// FuzzFlagFiles feeds arbitrary bytes as a kubelet flag file
// (kubeadm-flags.env, /etc/default/kubelet, a drop-in) and as mountinfo:
// no panic, and every flag reported is one the table says was removed.
func FuzzFlagFiles(f *testing.F) {
	f.Add([]byte("KUBELET_KUBEADM_ARGS=\"--pod-infra-container-image=x --containerd=/run/c.sock\"\n"), []byte("30 1 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"))
	f.Add([]byte("# --containerd\n--storage-driver-db=x"), []byte("- - -"))
	f.Fuzz(func(t *testing.T, text, mountinfo []byte) {
		for _, flag := range ScanText(text, version.Minor{Major: 1, Minor: 37}) {
			if !strings.HasPrefix(flag, "--") {
				t.Fatalf("reported %q", flag)
			}
			if _, ok := RemovedIn(flag, version.Minor{Major: 1, Minor: 37}); !ok {
				t.Fatalf("reported %q, not in the table", flag)
			}
		}
		_, _ = CgroupV1(mountinfo)
	})
}
