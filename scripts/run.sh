#!/usr/bin/env bash
# Installs what is missing, builds, and runs pipeline_runner on configs/mnist_like.yaml.
# Extra arguments pass through to the runner, e.g. ./scripts/run.sh --epochs 1 --report r.json
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh" >&2
exec "${FLOWFEED_BUILD_DIR:-$root/build}/apps/pipeline_runner/pipeline_runner" \
  "$root/configs/mnist_like.yaml" "$@"
