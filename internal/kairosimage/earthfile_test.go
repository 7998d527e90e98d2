package kairosimage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/imagetree"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
)

// The published images (the Earthfile) write /etc/kairos-release the way
// `make image` does: the same kairos-init version, the same arguments, and
// the same check that it carries the bundled Kubernetes version.
func TestEarthfileWritesKairosReleaseLikeTheImageBuild(t *testing.T) {
	src, err := imagetree.FindSourceDir()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(src, "Earthfile"))
	if err != nil {
		t.Fatal(err)
	}
	// One logical line per instruction, whitespace collapsed.
	var lines []string
	for _, l := range strings.Split(strings.ReplaceAll(string(b), "\\\n", " "), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	has := func(want string) bool {
		for _, l := range lines {
			if strings.Contains(l, want) {
				return true
			}
		}
		return false
	}
	for _, want := range []string{
		"ARG --global KAIROS_INIT_VERSION=" + testbin.KairosInitVersion,
		"FROM quay.io/kairos/kairos-init:$KAIROS_INIT_VERSION",
		"COPY +kairos-init/kairos-init /tmp/kairos-init",
		"RUN /tmp/kairos-init " + strings.Join(ReleaseStepArgs(`"$RELEASE"`), " "),
		`test "$KAIROS_SOFTWARE_VERSION_PREFIX" = k8s && test "$KAIROS_SOFTWARE_VERSION" = "$KUBERNETES"`,
	} {
		if !has(want) {
			t.Errorf("the Earthfile lacks %q", want)
		}
	}
	// The release step runs after the tree (the provider answering
	// init.provider.info) is in the image.
	tree, rel := -1, -1
	for i, l := range lines {
		if strings.HasPrefix(l, "COPY (+tree/tree") {
			tree = i
		}
		if strings.HasPrefix(l, "RUN /tmp/kairos-init") {
			rel = i
		}
	}
	if tree < 0 || rel < tree {
		t.Errorf("the Earthfile runs kairos-init's release step (line %d) before laying the tree (line %d)", rel, tree)
	}
}
