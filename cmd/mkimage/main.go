// Command mkimage builds the per-minor OS image as a real Kairos image, in
// an OCI image layout (internal/kairosimage): the Kairos base built from
// Debian with kairos-init, the tree `make tree` builds, the node files and
// /etc/kairos-release. Root, Debian's debootstrap, the Debian mirror and
// the Go module proxy; the base and the Kubernetes binaries are cached by
// content.
//
//	go run ./cmd/mkimage -minor 1.37 -out build/image-1.37 [-replace] [-version v0.4.0]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/kairos-io/provider-kubernetes/internal/kairosimage"
)

func main() {
	minor := flag.String("minor", "", "the minor to build (\"1.37\"); see images/versions.yaml")
	out := flag.String("out", "", "the OCI image layout to write (a new directory)")
	replace := flag.Bool("replace", false, "replace an existing layout at -out")
	ver := flag.String("version", "dev", "version stamped into the provider binary")
	flag.Parse()
	if *minor == "" || *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: mkimage -minor 1.37 -out DIR [-replace] [-version V]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *minor, *out, *replace, *ver); err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, minor, out string, replace bool, ver string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (chroot, mount namespaces, exact ownership in the image)")
	}
	if replace {
		if err := os.RemoveAll(out); err != nil {
			return err
		}
	}
	res, err := kairosimage.Build(ctx, minor, out, kairosimage.BuildOptions{Options: kairosimage.Options{Log: os.Stderr}, ProviderVersion: ver})
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(kairosimage.ImageFile{Minor: res.Minor, Tag: res.Tag, Digest: res.Digest, Layout: res.Layout}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, kairosimage.ImageFileName), append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("%s %s %s (%s)\n", res.Tag, res.Digest, res.Layout, res.Took.Round(1e9))
	return nil
}
