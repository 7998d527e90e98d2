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

// The real binary's pass on a converged worker whose providerConfig turns
// the pins off (images.pin: "false") takes off the pin the boot's
// import-images set: a stand-in ctr lists one image the provider pinned
// and records the label command the pass runs on it.
func TestThePassTakesThePinsOffWhenTurnedOff(t *testing.T) {
	bin := buildProvider(t)
	n := sandboxWorker(t, "v1.37.2")
	n.Write(paths.ClusterFile, n.Read(paths.ClusterFile)+"providerConfig:\n  images.pin: \"false\"\n", 0o600)
	labelled := n.Path("/ctr-labelled")
	n.Write(paths.Ctr, "#!/bin/sh\n# stand-in ctr: one image pinned by the provider\ncase \"$*\" in\n"+
		"*' images ls -q labels.\"provider-kubernetes.kairos.io/bundled\"==true') echo registry.k8s.io/pause:3.10.1;;\n"+
		"*' images label '*) echo \"$*\" >> "+labelled+";;\n*) echo \"unexpected: $*\" >&2; exit 1;;\nesac\n", 0o755)

	out, err := exec.Command(bin, "reconcile", "--root", n.Root).CombinedOutput()
	if err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	got, err := os.ReadFile(labelled)
	if want := "--address /run/containerd/containerd.sock --namespace k8s.io images label registry.k8s.io/pause:3.10.1 io.cri-containerd.pinned= provider-kubernetes.kairos.io/bundled=\n"; err != nil || string(got) != want {
		t.Fatalf("ctr labelled %q (%v), want %q:\n%s", got, err, want, out)
	}
	if !strings.Contains(string(out), "msg=release-image-pins outcome=ok released=1 pin_failed=0") {
		t.Fatalf("no release line:\n%s", out)
	}
}
