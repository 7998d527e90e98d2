package testbin

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// moduleDir (modDownload) finds a module's source in the module cache.
func TestModuleDir(t *testing.T) {
	if testing.Short() {
		t.Skip("asks the Go module proxy: not in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := moduleDir(ctx, "github.com/kairos-io/kairos-init", KairosInitVersion)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pkg", "bundled", "bundled.go")); err != nil {
		t.Errorf("%s is not kairos-init's source: %v", dir, err)
	}
	if _, err := moduleDir(ctx, "github.com/kairos-io/kairos-init", "v0.0.0-not-a-version"); err == nil {
		t.Error("a version that does not exist was found")
	}
}
