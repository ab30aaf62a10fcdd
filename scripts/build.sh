#!/usr/bin/env bash
# Configures and builds flowfeed in Release into ${FLOWFEED_BUILD_DIR:-build}. Extra args go to cmake.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FLOWFEED_BUILD_DIR:-$root/build}
"$root/scripts/deps.sh"
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif (($#)); then
  cmake "$build" "$@" >/dev/null
fi
cmake --build "$build" -j"$(nproc)"
