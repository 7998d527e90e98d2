#!/usr/bin/env bash
# The plan preview over sample nodes: what the next boot of each would do.
# Changes nothing anywhere; runs on any machine with Go.
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
