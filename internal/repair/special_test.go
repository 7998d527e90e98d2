package repair

import (
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// A FIFO planted where a kubelet flag file or drop-in directory belongs
// does not hold the repair's scan: it is skipped at once (the scan is
// advice), and the other files are still read.
func TestScanSkipsSpecialFilesWithoutBlocking(t *testing.T) {
	n := testutil.NewNode(t, "w1")
	n.Write(KubeletFlagFiles[0], "KUBELET_EXTRA_ARGS=--containerd=/run/containerd/containerd.sock\n", 0o644)
	testutil.Plant(t, n.Path(KubeadmFlagsEnv), testutil.FIFO)
	testutil.Plant(t, n.Path(KubeletDropInDirs[0]), testutil.FIFO)
	var got []Finding
	testutil.Within(t, 10*time.Second, "scan", func() { got = Scan(n.R(), version.Minor{Major: 1, Minor: 37}) }, func() {
		testutil.Unblock(n.Path(KubeadmFlagsEnv))
		testutil.Unblock(n.Path(KubeletDropInDirs[0]))
	})
	if len(got) != 1 || got[0].Flag != "--containerd" || got[0].File != KubeletFlagFiles[0] {
		t.Fatalf("%+v", got)
	}
}
