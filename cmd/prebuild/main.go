// Command prebuild builds, once, everything the tests and the demo take from
// the cache ($PROVIDER_KUBERNETES_CACHE, default ~/.cache/provider-kubernetes),
// saying what it builds and how far along it is: the Kubernetes, etcd and
// CoreDNS binaries of every minor's OS image tree (from Go modules), the
// real kairos-agent, and, as root, the end-to-end nodes' Debian base.
// `make test` and `make demo` run it first; warm, it takes seconds.
//
//	go run ./cmd/prebuild [-minors 1.36,1.37] [-e2e-base=true]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/imagetree"
	"github.com/kairos-io/provider-kubernetes/internal/kairosimage"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/tests/e2e/harness"
)

type step struct {
	what  string
	build func(ctx context.Context, log io.Writer) error
}

// built notices whether a step wrote anything: the builders say only what
// they build, so silence means cached.
type built struct {
	w   io.Writer
	any bool
}

func (b *built) Write(p []byte) (int, error) {
	b.any = true
	return b.w.Write(p)
}

func main() {
	minors := flag.String("minors", "", "comma-separated minors (default: every minor of images/versions.yaml)")
	e2eBase := flag.Bool("e2e-base", true, "also the end-to-end nodes' Debian base (needs root; skipped otherwise)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *minors, *e2eBase, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "prebuild: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, minors string, e2eBase bool, out io.Writer) error {
	want := map[string]bool{}
	for _, m := range strings.Split(minors, ",") {
		if m = strings.TrimSpace(m); m != "" {
			want[m] = true
		}
	}
	var steps []step
	seen := map[string]bool{} // containerd is the same in every minor's image
	for _, e := range images.Get().Minors {
		if len(want) > 0 && !want[e.Minor] {
			continue
		}
		bs, err := imagetree.Binaries(e)
		if err != nil {
			return err
		}
		for _, b := range bs {
			if seen[b.What] {
				continue
			}
			seen[b.What] = true
			which := " (the " + e.Minor + " image)"
			if slices.Contains(b.Names, "containerd") {
				which = " (every image)"
			}
			steps = append(steps, step{what: b.What + which, build: func(ctx context.Context, log io.Writer) error {
				_, err := b.Build(ctx, log)
				return err
			}})
		}
	}
	steps = append(steps, step{what: "crictl " + testbin.CriToolsVersion + " (the pin test's forced image garbage collection)", build: func(ctx context.Context, log io.Writer) error {
		_, err := testbin.Crictl(ctx, log)
		return err
	}})
	steps = append(steps, step{what: "kairos-agent " + testbin.KairosAgentVersion + " (every end-to-end node's Kairos layer)", build: func(ctx context.Context, log io.Writer) error {
		_, err := testbin.KairosAgent(ctx, log)
		return err
	}})
	if os.Geteuid() == 0 && os.Getenv("PROVIDER_KUBERNETES_KAIROS_VM") == "1" {
		steps = append(steps, step{what: "the Kairos base (debootstrap " + testbin.DebianSuite + ", kairos-init " + testbin.KairosInitVersion + "; the Kairos VM test's images)", build: func(ctx context.Context, log io.Writer) error {
			_, err := kairosimage.EnsureBase(ctx, kairosimage.Options{Log: log})
			return err
		}})
	} else {
		fmt.Fprintf(out, "prebuild: the Kairos base is not built: it needs root and PROVIDER_KUBERNETES_KAIROS_VM=1 (the Kairos VM test is opt-in: it does not fit CI's time)\n")
	}
	if e2eBase {
		if _, err := harness.Check(); err != nil {
			fmt.Fprintf(out, "prebuild: the end-to-end nodes' Debian base is not built: %v\n", err)
		} else {
			steps = append(steps, step{what: "the end-to-end nodes' Debian base (debootstrap " + harness.Suite + ")", build: func(ctx context.Context, log io.Writer) error {
				_, err := harness.EnsureBase(ctx, harness.BaseOptions{Log: log})
				return err
			}})
		}
	}
	fmt.Fprintf(out, "prebuild: %d one-time builds, cached in %s (cold: about 43 min on 2 cores; warm: seconds)\n", len(steps), testbin.CacheDir())
	start := time.Now()
	cold := 0
	for i, s := range steps {
		t0 := time.Now()
		b := &built{w: prefixed{out, fmt.Sprintf("[%d/%d] ", i+1, len(steps))}}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
		err := s.build(sctx, b)
		cancel()
		if err != nil {
			return fmt.Errorf("[%d/%d] %s: %w", i+1, len(steps), s.what, err)
		}
		if b.any {
			cold++
			fmt.Fprintf(out, "[%d/%d] %s: built in %s\n", i+1, len(steps), s.what, time.Since(t0).Round(time.Second))
		} else {
			fmt.Fprintf(out, "[%d/%d] %s: cached\n", i+1, len(steps), s.what)
		}
	}
	fmt.Fprintf(out, "prebuild: done in %s (%d built, %d cached)\n", time.Since(start).Round(time.Second), cold, len(steps)-cold)
	return nil
}

// prefixed puts the step number before every line a builder prints.
type prefixed struct {
	w      io.Writer
	prefix string
}

func (p prefixed) Write(b []byte) (int, error) {
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if l == "" {
			continue
		}
		if _, err := io.WriteString(p.w, p.prefix+l); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}
