package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/images"
	"github.com/kairos-io/provider-kubernetes/internal/imagetree"
)

// Every binary a tree takes from the cache is a numbered step (containerd,
// the same in every image, says so), then crictl and the kairos-agent;
// each says built or cached.
func TestPrebuildSaysWhatAndHowFar(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Kubernetes from modules when the cache is cold: not in -short mode")
	}
	e := images.Get().Minors[len(images.Get().Minors)-1]
	bs, err := imagetree.Binaries(e)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), e.Minor, false, &out); err != nil {
		t.Fatal(err)
	}
	n := len(bs) + 2
	for i, b := range bs {
		which := " (the " + e.Minor + " image): "
		if i == 0 {
			which = " (every image): "
		}
		line := "[" + itoa(i+1) + "/" + itoa(n) + "] " + b.What + which
		if !strings.Contains(out.String(), line+"cached\n") && !strings.Contains(out.String(), line+"built in ") {
			t.Fatalf("no %q line:\n%s", line, out.String())
		}
	}
	if !strings.Contains(out.String(), "["+itoa(n-1)+"/"+itoa(n)+"] crictl ") || !strings.Contains(out.String(), "["+itoa(n)+"/"+itoa(n)+"] kairos-agent ") || !strings.Contains(out.String(), "prebuild: done in ") {
		t.Fatalf("output:\n%s", out.String())
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
