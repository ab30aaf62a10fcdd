#!/usr/bin/env bash
# Configures and builds flowfeed in Release into ${FLOWFEED_BUILD_DIR:-build}. Extra args go to cmake.
# FLOWFEED_UNITY_BUILD=ON (when the build dir is configured): the libraries and programs compile
# in unity batches (CMAKE_UNITY_BUILD) and flowfeed_tests in fixed groups of eight files
# (tests/CMakeLists.txt), about 60% of the CPU time of a build from nothing; the other test
# programs' files compile alone. .ci/run sets it: a fresh machine compiles everything.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FLOWFEED_BUILD_DIR:-$root/build}
"$root/scripts/deps.sh"
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_UNITY_BUILD=${FLOWFEED_UNITY_BUILD:-OFF}" "$@" >/dev/null
elif (($#)); then
  cmake "$build" "$@" >/dev/null
fi
cmake --build "$build" -j"$(nproc)"
