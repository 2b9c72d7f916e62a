#!/usr/bin/env bash
# Installs the system tools netwarden and its tests use (Debian), only those missing
# (chromium: the HTML pages are tested in a real headless browser).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
for tool in nft:nftables iptables:iptables ipset:ipset ip:iproute2 protoc:protobuf-compiler conntrack:conntrack nsenter:util-linux chromium:chromium; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${need[@]}"
fi
# A real containerd, runc and the CNI plugins for the CRI tests (crates/cri, the node agent's).
"$(dirname "$0")/install-cri.sh"
