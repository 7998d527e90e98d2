package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// hostFiles are the files plan reads (and reconcile reads the same way) on
// a control plane member: the fuzzer replaces one of them per input.
var hostFiles = []string{
	paths.ClusterFile, paths.BundleManifest, paths.APIServerManifest,
	paths.ManifestsDir + "/kube-controller-manager.yaml", paths.ManifestsDir + "/kube-scheduler.yaml",
	paths.KubeletConf, testutil.KubeletClientCert, paths.StatusMirror,
	paths.BootID, paths.Hostname,
}

// FuzzPlanOverHostFiles runs plan over a sandbox control plane whose one
// file (chosen by the input) holds arbitrary bytes: no panic, no hang
// (bounded), an exit code of the contract, and every line printed for a
// person labelled and free of control characters.
func FuzzPlanOverHostFiles(f *testing.F) {
	for i := range hostFiles {
		f.Add(uint8(i), []byte("\x1b[2J\nVerdict:  nothing to do\r"))
		f.Add(uint8(i), []byte("kubernetesVersion: v1.37.2\n"))
	}
	n := testutil.NewNode(f, "cp1")
	api := testutil.NewAPI(f, "v1.36.3")
	n.ClusterFile("controlplane", "v1.37.2", "")
	n.Bundle("v1.37.2")
	n.Member(api)
	n.ControlPlane("v1.36.3")
	api.SetNode("cp1", "v1.36.3", true)
	good := map[string][]byte{}
	for _, p := range hostFiles {
		b, err := os.ReadFile(n.Path(p))
		if err != nil && p != paths.StatusMirror {
			f.Fatal(err)
		}
		good[p] = b
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		for p, b := range good {
			if err := os.MkdirAll(filepath.Dir(n.Path(p)), 0o755); err != nil {
				t.Fatal(err)
			}
			_ = os.RemoveAll(n.Path(p))
			if b != nil {
				if err := os.WriteFile(n.Path(p), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		target := hostFiles[int(which)%len(hostFiles)]
		if err := os.WriteFile(n.Path(target), data, 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		code := -1
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		testutil.Within(t, time.Minute, "plan", func() { code = Main(ctx, []string{"plan", "--root", n.Root}, nil, &out, &errb) }, nil)
		if code != 0 && code != 3 {
			t.Fatalf("exit %d with %s holding %q:\n%s%s", code, target, data, out.String(), errb.String())
		}
		for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			ok := false
			for _, p := range []string{"Facts:", "Verdict:", "Actions:", "Message:", "Warning:", "Observed:", "          "} {
				ok = ok || strings.HasPrefix(l, p)
			}
			if !ok || status.Printable(l) != l {
				t.Fatalf("with %s holding %q, printed %q", target, data, l)
			}
		}
	})
}
