# provider-kubernetes: the two commands a newcomer needs are `make demo` and `make test`.
GO ?= go
BIN := bin/provider-kubernetes
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: build demo preview test test-short e2e vet fmt-check bench fuzz tree trees image prebuild

MINOR ?= 1.37

build:
	$(GO) build -trimpath -tags grpcnotrace -ldflags "-s -w -X github.com/kairos-io/provider-kubernetes/internal/cli.Version=$(VERSION)" -o $(BIN) ./cmd/provider-kubernetes

# The main job on an embedded default: a real one-node cluster bootstrapped
# at 1.36.3 and upgraded to 1.37.2 by the provider alone (as root), after the
# plan preview over sample nodes. `make preview` is the preview alone.
demo: build
	./examples/demo.sh

preview: build
	DEMO_PREVIEW_ONLY=1 ./examples/demo.sh

# Every test, including the ones that build and run a real kubeadm (cached
# by version in $${PROVIDER_KUBERNETES_CACHE:-~/.cache/provider-kubernetes}).
# The end-to-end suite and the Kairos VM test take turns (testutil.Heavy),
# so one test binary may wait for the other: -timeout covers both.
test: fmt-check vet prebuild
	$(GO) test -count=1 -timeout 150m ./...
	@echo "--- the simulated crash matrix (in memory: a cancelled command, not a kill; the real kills are TestHAUpgrade's)"
	@$(GO) test -count=1 -v -run 'TestSimulatedCrashMatrix$$' ./internal/reconcile | sed -n '/simulated crash matrix/,/^--- PASS/p'

# Every one-time build the tests take from the cache, with "[n/m] what:
# built in ... | cached" lines (go test shows a package's output only when it
# ends). Cold (empty GOCACHE and module cache): 42m39s measured on 2 cores on 2026-12-03, 12-15 min per minor; warm: seconds.
prebuild:
	$(GO) run ./cmd/prebuild

test-short:
	$(GO) test -short ./...

# The end-to-end suite alone, with progress lines (root; real nspawn nodes;
# see docs/development.md "End-to-end suite"). `make test` runs it too, with the rest.
e2e:
	$(GO) test -count=1 -timeout 85m -v ./tests/e2e/...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); if [ -n "$$out" ]; then echo "not gofmt'd: $$out"; exit 1; fi

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# Arbitrary bytes for every file the provider parses (30 s each).
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 30s ./pkg/version/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 30s ./pkg/clusterconfig/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 30s ./internal/bundle/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 30s ./internal/imagelock/
	$(GO) test -run '^$$' -fuzz '^FuzzStaticPodManifest$$' -fuzztime 30s ./internal/observe/
	$(GO) test -run '^$$' -fuzz '^FuzzGate$$' -fuzztime 30s ./internal/cryptgate/
	$(GO) test -run '^$$' -fuzz '^FuzzFlagFiles$$' -fuzztime 30s ./internal/repair/
	$(GO) test -run '^$$' -fuzz '^FuzzEtcdFiles$$' -fuzztime 30s ./internal/etcdsnap/
	$(GO) test -run '^$$' -fuzz '^FuzzRead$$' -fuzztime 30s ./internal/status/
	$(GO) test -run '^$$' -fuzz '^FuzzPrintable$$' -fuzztime 30s ./internal/status/
	$(GO) test -run '^$$' -fuzz '^FuzzKubeconfig$$' -fuzztime 30s ./internal/kube/
	$(GO) test -run '^$$' -fuzz '^FuzzPrefilter$$' -fuzztime 30s ./internal/runner/
	$(GO) test -run '^$$' -fuzz '^FuzzReadEvent$$' -fuzztime 30s ./internal/plugin/
	$(GO) test -run '^$$' -fuzz '^FuzzPlanOverHostFiles$$' -fuzztime 30s ./internal/cli/
	$(GO) test -run '^$$' -fuzz '^FuzzParseCheck$$' -fuzztime 30s ./internal/imageimport/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 30s ./internal/restore/

# The filesystem tree of one per-minor OS image (build/tree-$(MINOR)), offline:
# binaries and control-plane images built from Go modules, cached by version.
# Cold: ~13 min per minor on 2 cores; warm: seconds. Needs root for exact
# ownership, Debian's iptables (kube-proxy image) and systemd-analyze (verify).
tree:
	$(GO) run ./cmd/mktree -minor $(MINOR) -out build/tree-$(MINOR) -replace -version $(VERSION)

# Every minor of images/versions.yaml: build/tree-1.35, build/tree-1.36, build/tree-1.37.
trees:
	$(GO) run ./cmd/mktree -all -out build -replace -version $(VERSION)

# The per-minor OS image as a real Kairos image: an OCI image layout in
# build/image-$(MINOR) (its image.json names the tag and digest): the Kairos
# base (Debian bookworm made a Kairos core image by kairos-init, cached by
# content), the tree above, the node files and /etc/kairos-release. Root,
# debootstrap, the Debian mirror and the Go module proxy. Cold: ~9 min for
# the base plus the tree's; warm: about a minute. See docs/install.md.
image:
	$(GO) run ./cmd/mkimage -minor $(MINOR) -out build/image-$(MINOR) -replace -version $(VERSION)
