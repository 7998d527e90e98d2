#!/usr/bin/env bash
# The main job: first the plan preview over sample nodes (what the next boot
# of each would do; changes nothing, runs anywhere), then, as root, a real
# cluster of one nspawn node bootstrapped at 1.36.3 and upgraded to 1.37.2 by
# the provider's own units (tests/e2e TestSingleControlPlaneUpgrade).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./bin/provider-kubernetes}
here=$PWD

show() {
  local title=$1; shift
  printf '\n=== %s\n$ provider-kubernetes plan %s\n' "$title" "$*"
  local rc=0
  "$BIN" plan "$@" || rc=$?
  printf '(exit %d)\n' "$rc"
}

echo "provider-kubernetes plan preview: $("$BIN" version)"
show "a fresh node with role init (sample node root)" --root "$here/examples/nodes/init-1.37"
show "a worker whose pin is ahead of its image (sample node root)" --root "$here/examples/nodes/worker-pin-ahead"
show "first control plane after the 1.37 image swap and pin bump" \
  --pin v1.37.2 --bundled v1.37.2 --node-version v1.36.3 --cluster-version v1.36.3 --role controlplane --member
show "second control plane, the cluster already at 1.37" \
  --pin v1.37.2 --bundled v1.37.2 --node-version v1.36.3 --cluster-version v1.37.2 --role controlplane --member
show "a worker rebooted into 1.37 before the control planes" \
  --pin v1.37.2 --bundled v1.37.2 --node-version v1.36.3 --cluster-version v1.36.3 --role worker --member
show "control plane whose API is down after the swap" \
  --pin v1.37.2 --bundled v1.37.2 --node-version v1.36.3 --cluster-version unknown --role controlplane --member
show "a routine OS refresh: 1.37 image, pin left at 1.36" \
  --pin v1.36.3 --bundled v1.37.2 --node-version v1.36.3 --cluster-version v1.36.3 --role controlplane --member
show "skip-level: 1.35 straight to 1.37" \
  --pin v1.37.2 --bundled v1.37.2 --node-version v1.35.4 --cluster-version v1.35.4 --role controlplane --member
show "downgrade" \
  --pin v1.36.3 --bundled v1.37.2 --node-version v1.37.2 --cluster-version v1.37.2 --role controlplane --member
show "a pin that is not an exact release, as JSON" \
  -o json --pin v1.37 --bundled v1.37.2 --node-version v1.36.3 --cluster-version v1.36.3 --role worker --member

[ -n "${DEMO_PREVIEW_ONLY:-}" ] && exit 0
echo
echo "=== a real cluster: one control plane, init at v1.36.3, upgrade to v1.37.2, refusals"
if [ "$(id -u)" != 0 ]; then
  echo "(skipped: the nspawn nodes need root; run 'sudo make demo' on a machine like CI's)"
  exit 0
fi
.ci/host-packages.sh
# The one-time builds the demo needs, with progress lines ([n/m] what: built | cached).
go run ./cmd/prebuild -minors 1.36,1.37
echo "A first, uncached run builds Kubernetes 1.36.3 and 1.37.2, etcd and coredns from the Go"
echo "module proxy and debootstraps a Debian node base: about 35-40 minutes on 2 cores (measured: ~30 of builds)."
echo "Warm (cached in \${PROVIDER_KUBERNETES_CACHE:-~/.cache/provider-kubernetes}): about 5 minutes."
echo "Progress lines start with 'e2e'."
set +e
go test -count=1 -v -timeout 80m -run 'TestSingleControlPlaneUpgrade$' ./tests/e2e/ 2>&1 \
  | grep --line-buffered -E '^e2e |^(--- |ok|FAIL|PASS)|e2e_test.go'
rc=${PIPESTATUS[0]}
set -e
exit "$rc"
