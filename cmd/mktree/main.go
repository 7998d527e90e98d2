// Command mktree builds the filesystem tree of per-minor OS images (a build
// tool, not shipped in the image): `make tree MINOR=1.37`, `make trees`.
//
//	go run ./cmd/mktree -minor 1.37 -out build/tree-1.37 [-replace] [-no-images] [-version V] [-verify]
//	go run ./cmd/mktree -all -out build [-replace] ...      # build/tree-<minor> for every minor of versions.yaml
//	go run ./cmd/mktree -list                                # <minor> <kubernetes> <image tag> <pause tag> per line
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/imagetree"
	"github.com/kairos-io/provider-kubernetes/internal/kairosimage"
)

func main() {
	minor := flag.String("minor", "", "the minor to build (\"1.37\"); see images/versions.yaml")
	all := flag.Bool("all", false, "build every minor of images/versions.yaml into OUT/tree-<minor>")
	out := flag.String("out", "", "output directory (the tree with -minor, the parent of the trees with -all)")
	replace := flag.Bool("replace", false, "replace an existing tree")
	noImages := flag.Bool("no-images", false, "leave out the control-plane images and their lock file")
	ver := flag.String("version", "dev", "version stamped into the provider binary")
	verify := flag.Bool("verify", true, "run systemd-analyze verify on the units inside the tree")
	nodeFiles := flag.String("node-files", "", "with -minor: write the node files of that minor (system.NodeFiles: containerd config, modules, sysctls, CNI links) into this new directory, laid out as on the node, and exit")
	list := flag.Bool("list", false, "print <minor> <kubernetes> <image tag> <pause tag> per line of images/versions.yaml and exit")
	flag.Parse()
	if *list {
		for _, e := range images.Get().Minors {
			fmt.Printf("%s %s %s %s\n", e.Minor, e.Kubernetes, e.ImageTag, e.Pause)
		}
		return
	}
	if *nodeFiles != "" {
		e, err := imagetree.Entry(*minor)
		if err == nil {
			err = kairosimage.WriteNodeFiles(*nodeFiles, e.Pause)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "mktree: node files: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if *out == "" || (*minor == "") == !*all || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: mktree (-minor 1.37 | -all) -out DIR [-replace] [-no-images] [-version V] [-verify=false]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	type job struct{ minor, dir string }
	var jobs []job
	if *all {
		for _, e := range images.Get().Minors {
			jobs = append(jobs, job{e.Minor, filepath.Join(*out, "tree-"+e.Minor)})
		}
	} else {
		jobs = append(jobs, job{*minor, *out})
	}
	for _, j := range jobs {
		res, err := imagetree.Build(ctx, j.minor, j.dir, imagetree.Options{Log: os.Stderr, Replace: *replace,
			NoImages: *noImages, ProviderVersion: *ver})
		if err != nil {
			fmt.Fprintf(os.Stderr, "mktree %s: %v\n", j.minor, err)
			os.Exit(1)
		}
		if *verify {
			if err := imagetree.VerifyUnits(ctx, res.Dir, ""); err != nil {
				fmt.Fprintf(os.Stderr, "mktree %s: %v\n", j.minor, err)
				os.Exit(1)
			}
		}
		fmt.Printf("%s %s %s images=%d took=%s\n", j.minor, res.Bundle.Kubernetes, res.Dir, len(res.Lock.Images), res.Took.Round(1e9))
	}
}
