package testbin

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/kairos-io/provider-kubernetes/images"
)

// ContainerdModule is containerd's module (the v2 line).
const ContainerdModule = "github.com/containerd/containerd/v2"

// ContainerdCommands are the binaries a node's containerd is: the daemon,
// its client (import-images runs it) and the runc shim the CRI starts pods with.
var ContainerdCommands = []string{"containerd", "ctr", "containerd-shim-runc-v2"}

// Containerd returns the paths of ContainerdCommands at images.Containerd,
// by name, building them from the module (static, version stamped) in one
// go build into the cache when any is missing: about 1.5 min cold on 2 cores.
func Containerd(ctx context.Context, log io.Writer) (map[string]string, error) {
	key := strings.ReplaceAll(ContainerdModule, "/", "_") + "@" + images.Containerd
	dir := filepath.Join(CacheDir(), "bin", key)
	out := map[string]string{}
	for _, n := range ContainerdCommands {
		out[n] = filepath.Join(dir, n)
	}
	// The last binary moved into place stands for the set: goBuildSet moves
	// them in order only after all were built.
	last := out[ContainerdCommands[len(ContainerdCommands)-1]]
	err := cached(last, fmt.Sprintf("%s (%s@%s)", strings.Join(ContainerdCommands, ", "), ContainerdModule, images.Containerd), log, func() error {
		wrap, err := requireWrapper(key, ContainerdModule, images.Containerd)
		if err != nil {
			return err
		}
		var pkgs []string
		for _, n := range ContainerdCommands {
			pkgs = append(pkgs, ContainerdModule+"/cmd/"+n)
		}
		return goBuildSet(ctx, wrap, dir, pkgs, "-s -w -X "+ContainerdModule+"/version.Version="+images.Containerd, log)
	})
	if err != nil {
		return nil, err
	}
	for n, p := range out {
		if !ok(p) {
			return nil, fmt.Errorf("containerd %s: %s missing from the cache", images.Containerd, n)
		}
	}
	return out, nil
}

// CriToolsVersion is the crictl tests ask the CRI with (rmi --prune skips
// pinned images, as the kubelet's image garbage collection does).
const CriToolsVersion = "v1.37.0"

// Crictl returns the path of crictl at CriToolsVersion, built from its
// module into the cache when missing.
func Crictl(ctx context.Context, log io.Writer) (string, error) {
	return GoBinary(ctx, "sigs.k8s.io/cri-tools", CriToolsVersion, "sigs.k8s.io/cri-tools/cmd/crictl", "crictl", "", log)
}
