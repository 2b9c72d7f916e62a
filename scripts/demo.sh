#!/usr/bin/env bash
# The README's first command: builds netwarden and runs the demo on examples/.
# `--kube`: the node agent's path instead (fake API server, `run --kube`, a change through the API).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cargo build --release -q -p netwarden
if [[ "${1:-}" == "--kube" ]]; then
    shift
    exec ./target/release/netwarden demo --kube -f examples/multinet "$@"
fi
exec ./target/release/netwarden demo -f examples/multinet "$@"
