package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/imageimport"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/unitmigrate"
	"github.com/kairos-io/provider-kubernetes/system"
)

// Seams the tests replace: the journal and the systemd reload.
var (
	newJournal  = func(stderr io.Writer) unitmigrate.Journal { return unitmigrate.SystemJournal{W: stderr} }
	newReloader = func() unitmigrate.Reloader { return unitmigrate.SystemdReloader{} }
)

func cmdMigrateUnits(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("migrate-units", stdout, stderr)
	root := fs.String("root", "/", "host root; systemd is reloaded only when it is /")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	var rl unitmigrate.Reloader
	if paths.Root(*root).Path("/") == "/" {
		rl = newReloader()
	}
	res := unitmigrate.Run(ctx, unitmigrate.Options{
		Root: paths.Root(*root), Manifest: system.Shipped(), Journal: newJournal(stderr), Reloader: rl,
		Log: slog.New(slog.NewTextHandler(stderr, nil)),
	})
	return res.ExitCode
}

// imagesStep wires the bundled images' check into the pass, before each
// kubeadm action: import-images again, with the pass's logger (what
// containerd holds at the locked digest is only listed, what is missing is
// verified and imported), and an error naming any image still not there.
// An image that bundles no images (no lock file) has nothing to check.
// pin false (images.pin: "false") pins nothing and takes off earlier pins.
func imagesStep(root paths.Root, run runner.Runner, address string, log *slog.Logger) func(context.Context, bool) error {
	return func(ctx context.Context, pin bool) error {
		ok, err := imageimport.Bundles(root)
		if err != nil {
			return fmt.Errorf("the bundled images: %w", err)
		}
		if !ok {
			log.Info("import-images", "outcome", "none", "detail", "the booted image bundles no images (no "+paths.ImageLock+")")
			return nil
		}
		return imageimport.Run(ctx, imageimport.Options{Root: root, Runner: run, Address: address, Log: log, NoPin: !pin}).NotInContainerd()
	}
}

// releasePinsStep wires into the pass the release of the pins the boot's
// import-images set, for a node whose providerConfig turns them off.
func releasePinsStep(run runner.Runner, address string, log *slog.Logger) func(context.Context) {
	return func(ctx context.Context) {
		// Release waits for nothing and imports nothing: only its total counts.
		imageimport.Release(ctx, imageimport.Options{Runner: run, Address: address, Log: log, Budgets: imageimport.Budgets{Total: 2 * time.Minute}})
	}
}

func cmdImportImages(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("import-images", stdout, stderr)
	root := fs.String("root", "/", "host root the images directory is read under")
	address := fs.String("address", paths.ContainerdSocket, "containerd's socket")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	res := imageimport.Run(ctx, imageimport.Options{
		Root: paths.Root(*root), Runner: runner.Exec{Root: *root}, Address: *address,
		Log: slog.New(slog.NewTextHandler(stderr, nil)),
	})
	return res.ExitCode
}
