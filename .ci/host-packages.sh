#!/usr/bin/env bash
# Installs, from Debian's packages, what the tests and the demo need and a
# fresh machine (Go, gcc, apt) lacks. Idempotent; used by .ci/run and
# examples/demo.sh.
set -euo pipefail
need=()
command -v make >/dev/null 2>&1 || need+=(make)
command -v git >/dev/null 2>&1 || need+=(git)
# The end-to-end nodes (tests/e2e): debootstrap builds their Debian base,
# systemd-nspawn runs them, ip(8) wires their private network.
[ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
[ -x /usr/bin/systemd-nspawn ] || need+=(systemd-container)
[ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need+=(iproute2)
# The tree builder puts Debian's nft iptables into the kube-proxy image; the
# units are checked with Debian's systemd-analyze. (containerd is the node's
# own, built from its module: internal/testbin.)
[ -x /usr/sbin/xtables-nft-multi ] || need+=(iptables)
[ -x /usr/bin/systemd-analyze ] || need+=(systemd)
command -v tar >/dev/null 2>&1 || need+=(tar)
# The HA scenario's control-plane endpoint: a load balancer in front of the
# three apiservers (tests/e2e/harness LoadBalancer).
[ -x /usr/sbin/haproxy ] || need+=(haproxy)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
