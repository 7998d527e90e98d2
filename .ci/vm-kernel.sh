#!/usr/bin/env bash
# Fetches the Debian kernel that linux-image-amd64 currently depends on and
# unpacks what the dm-crypt VM test needs (vmlinuz, the md/block/fs/crypto
# modules, modules.dep) into the test cache. Idempotent: a kernel already
# unpacked is kept. Needs apt (index updated), dpkg and kmod's depmod.
set -euo pipefail
cache="${PROVIDER_KUBERNETES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provider-kubernetes}/vm"
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1=="Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
if [ -z "$pkg" ]; then
  echo "vm-kernel: apt knows no linux-image-*-amd64 (is the apt index updated?)" >&2
  exit 1
fi
kver=${pkg#linux-image-}
if [ -f "$cache/$kver/vmlinuz" ] && [ -f "$cache/$kver/lib/modules/$kver/modules.dep" ]; then
  echo "vm-kernel: $kver already in $cache"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -qq "$pkg" 2>&1 | grep -v 'unsandboxed' || true)
deb=$(ls "$tmp"/*.deb)
dpkg -x "$deb" "$tmp/x"
out="$tmp/out"
mkdir -p "$out/lib/modules/$kver/kernel"
cp "$tmp/x/boot/vmlinuz-$kver" "$out/vmlinuz"
m="$tmp/x/lib/modules/$kver"
for d in kernel/crypto kernel/lib kernel/arch kernel/fs kernel/drivers/md kernel/drivers/block; do
  mkdir -p "$out/lib/modules/$kver/$(dirname $d)"
  cp -a "$m/$d" "$out/lib/modules/$kver/$d"
done
cp "$m"/modules.builtin* "$m"/modules.order "$out/lib/modules/$kver/" 2>/dev/null || true
depmod -b "$out" "$kver"
mkdir -p "$cache"
rm -rf "$cache/$kver"
mv "$out" "$cache/$kver"
echo "vm-kernel: unpacked $pkg into $cache/$kver"
