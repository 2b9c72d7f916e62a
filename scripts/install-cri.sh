#!/usr/bin/env bash
# Installs what the CRI tests need to start a real containerd (Debian): containerd (with ctr),
# runc, the CNI plugins (/usr/lib/cni) and a static C toolchain for the pause image.
# scripts/deps.sh (hence .ci/run and scripts/test.sh) calls this.
# Only what is missing is installed; run as root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have containerd || need+=(containerd)
have ctr || need+=(containerd)
have runc || need+=(runc)
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || need+=(containernetworking-plugins)
have gcc || need+=(gcc)
# gcc -static needs libc's static archive.
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -n "$(ls /usr/lib/*/libc.a 2>/dev/null)" ] || need+=(libc6-dev)
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
