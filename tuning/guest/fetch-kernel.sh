#!/usr/bin/env bash
# Unpack Debian 12's generic 6.1 kernel package (the Amazon Linux 2023 kernel line) into DEST/kernel and index
# its modules (depmod), for the guest (tuning/guest). The pinned ABI first; Debian keeps only the newest 6.1 ABI
# in its archive, so when the pin is gone the newest 6.1.0-*-amd64 is taken and named. Idempotent.
set -euo pipefail
dest=$1 abi=$2
mkdir -p "$dest"
cd "$dest"
if compgen -G "kernel/boot/vmlinuz-*" >/dev/null && compgen -G "kernel/lib/modules/*/modules.dep" >/dev/null; then
  exit 0
fi
pkg="linux-image-$abi-amd64-unsigned"
if ! apt-cache show "$pkg" >/dev/null 2>&1; then
  apt-get update -qq || true
fi
if ! apt-cache show "$pkg" >/dev/null 2>&1; then
  newest=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$' | cut -d' ' -f1 | sort -V | tail -1)
  [ -n "$newest" ] || { echo "no Debian 6.1 kernel package is available (apt-cache search linux-image-6.1.0)" >&2; exit 1; }
  echo "note: $pkg is no longer in the archive; using $newest"
  pkg=$newest
fi
rm -rf kernel.tmp deb && mkdir -p deb
(cd deb && apt-get download -qq "$pkg" 2>/dev/null)
dpkg-deb -x deb/*.deb kernel.tmp
release=$(basename "$(ls -d kernel.tmp/lib/modules/*)")
/sbin/depmod -b "$PWD/kernel.tmp" "$release"
rm -rf kernel deb && mv kernel.tmp kernel
echo "guest kernel: $release ($pkg)"
