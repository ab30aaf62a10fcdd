#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest.
# GPU tests (label gpu) skip, visibly, on a machine without a CUDA device.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FLOWFEED_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure -j"$(nproc)" --timeout 600
