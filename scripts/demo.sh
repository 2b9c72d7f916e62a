#!/usr/bin/env bash
# The README's first command: builds netwarden and runs the demo on examples/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cargo build --release -q -p netwarden
exec ./target/release/netwarden demo -f examples/multinet "$@"
