#!/usr/bin/env bash
# The test command of the README: every test of the workspace, including the privileged
# end-to-end tests in network namespaces (run as root; with CI=true a missing privilege fails).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
# Tests that build network namespaces share the kernel; keep them from fighting over CPU.
cargo test --workspace --all-targets -- --test-threads="${NETWARDEN_TEST_THREADS:-2}"
