package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/imagelock"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// The real binary's pass, on a sandbox worker due for kubeadm upgrade
// node, checks the bundled images first: containerd (a stand-in ctr that
// answers and holds nothing) lacks the image the lock file names, and its
// tarball is gone from the image, so the pass fails BundledImagesMissing
// naming it, and kubeadm never runs.
func TestThePassChecksTheBundledImagesBeforeKubeadm(t *testing.T) {
	bin := buildProvider(t)
	n := workerDueForUpgradeNode(t)
	lock, err := imagelock.Lock{Images: []imagelock.Image{{Ref: "registry.k8s.io/pause:3.10.2", File: "pause_3.10.2.tar",
		SHA256: strings.Repeat("a", 64), Size: 1024, Manifest: "sha256:" + strings.Repeat("b", 64)}}}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	n.Write(paths.ImageLock, string(lock), 0o644)
	n.Write(paths.Ctr, "#!/bin/sh\n# stand-in ctr: containerd answers and holds no image\ncase \"$*\" in *' version') exit 0;; *' images check '*) exit 0;; esac\necho \"unexpected: $*\" >&2; exit 1\n", 0o755)
	ran := n.Path("/kubeadm-ran")
	n.Write(paths.Kubeadm, "#!/bin/sh\ntouch "+ran+"\n", 0o755)

	out, err := exec.Command(bin, "reconcile", "--root", n.Root).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != reconcile.ExitFailed {
		t.Fatalf("exit %v, want %d:\n%s", err, reconcile.ExitFailed, out)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Fatalf("kubeadm ran:\n%s", out)
	}
	st, err := status.Read(n.R(), paths.StatusFile)
	if err != nil {
		t.Fatal(err)
	}
	if st.Reason != reconcile.ReasonImagesMissing || st.LastAction != "upgrade-node" || !strings.Contains(st.Message, "bundled images not in containerd: registry.k8s.io/pause:3.10.2") {
		t.Fatalf("status %+v\n%s", st, out)
	}
	for _, want := range []string{"msg=image-refused ref=registry.k8s.io/pause:3.10.2", "msg=import-images outcome=refused", "msg=upgrade-node outcome=failed"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %q in the pass's log:\n%s", want, out)
		}
	}
}
