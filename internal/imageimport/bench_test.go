package imageimport

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/imagelock"
	"github.com/kairos-io/provider-kubernetes/internal/oci"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// benchImages are the seven images of a 1.37 tree, with the sizes of their
// binaries there (~490 MB of tarballs in all).
var benchImages = []struct {
	ref  string
	size int
}{
	{"registry.k8s.io/kube-apiserver:v1.37.2", 119 << 20},
	{"registry.k8s.io/kube-controller-manager:v1.37.2", 105 << 20},
	{"registry.k8s.io/kube-proxy:v1.37.2", 85 << 20},
	{"registry.k8s.io/kube-scheduler:v1.37.2", 81 << 20},
	{"registry.k8s.io/coredns/coredns:v1.14.6", 75 << 20},
	{"registry.k8s.io/etcd:3.7.0-0", 24 << 20},
	{"registry.k8s.io/pause:3.10.2", 1600 << 10},
}

// BenchmarkImport runs import-images of a 1.37-sized bundle into a real
// containerd: cold (containerd holds none of the images, a first boot) and
// warm (containerd holds every reference already, a converged reboot).
//
//	go test -run '^$' -bench Import -benchtime 1x -count 5 ./internal/imageimport/
func BenchmarkImport(b *testing.B) {
	address := testutil.Containerd(b)
	bd := newBundle(b)
	src := b.TempDir()
	for i, im := range benchImages {
		p := filepath.Join(src, "bin")
		if err := os.WriteFile(p, noise(uint64(i), im.size), 0o755); err != nil {
			b.Fatal(err)
		}
		bd.addEntry(im.ref, imagelock.FileName(im.ref), oci.Entry{Path: "bin/x", Source: p, Mode: 0o755})
	}
	bd.writeLock()
	var refs []string
	for _, im := range bd.lock.Images {
		refs = append(refs, im.Ref)
	}
	importAll := func(b *testing.B) {
		res, log := bd.run(address, runner.Exec{}, nil)
		if res.ExitCode != 0 {
			b.Fatalf("%+v\n%s", res, log)
		}
	}
	b.Run("cold", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			// --sync: the content and snapshots are gone too, as on a first boot.
			args := append([]string{"--address", address, "-n", Namespace, "images", "rm", "--sync"}, refs...)
			if out, err := testutil.Command(b, 2*time.Minute, testutil.Ctr(b), args...).CombinedOutput(); err != nil {
				b.Fatalf("%v: %s", err, out)
			}
			b.StartTimer()
			importAll(b)
		}
	})
	b.Run("warm", func(b *testing.B) {
		b.StopTimer()
		importAll(b)
		b.StartTimer()
		for i := 0; i < b.N; i++ {
			importAll(b)
		}
	})
}

// noise is n reproducible incompressible bytes.
func noise(seed uint64, n int) []byte {
	var key [32]byte
	key[0] = byte(seed)
	out := make([]byte, n)
	r := rand.NewChaCha8(key)
	r.Read(out)
	return out
}
