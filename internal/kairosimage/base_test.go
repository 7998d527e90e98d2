package kairosimage

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/system"
)

func cniRoot(t *testing.T, names []string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, system.DebianCNIDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestCheckCNIPlugins(t *testing.T) {
	if err := CheckCNIPlugins(cniRoot(t, system.DebianCNIPlugins)); err != nil {
		t.Errorf("Debian's set: %v", err)
	}
	if err := CheckCNIPlugins(cniRoot(t, system.DebianCNIPlugins[1:])); err == nil {
		t.Error("a listed plugin Debian does not ship passed (its link would dangle)")
	}
	if err := CheckCNIPlugins(cniRoot(t, append(append([]string(nil), system.DebianCNIPlugins...), "new"))); err == nil {
		t.Error("a plugin Debian ships and the list lacks passed")
	}
}

// The list matches the Debian base the end-to-end nodes boot, when it is
// built (the same package from the same suite as the Kairos base).
func TestDebianCNIPluginsMatchTheE2EBase(t *testing.T) {
	m, _ := filepath.Glob(filepath.Join(testbin.CacheDir(), "e2e", "rootfs-*", "rootfs"))
	if len(m) == 0 {
		t.Skip("no end-to-end base built yet (prebuild builds it, as root)")
	}
	if err := CheckCNIPlugins(m[0]); err != nil {
		t.Error(err)
	}
}
