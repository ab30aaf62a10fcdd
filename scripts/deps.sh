#!/usr/bin/env bash
# Installs the Debian packages flowfeed needs, if any is missing. Idempotent; quick when all are there.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libtbb-dev libyaml-cpp-dev libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev zlib1g-dev libexpat1-dev dataset-fashion-mnist
  liburing-dev  # io: io_uring in the file loaders
  libcurl4-openssl-dev libssl-dev libpugixml-dev nginx  # remote shards (libcurl, SHA-256, S3 listings); nginx serves the tests
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev python3-pil python3-numpy  # images; PIL writes test shards
  python3-skimage  # scripts/make_image_shards.py (benchmark JPEGs from its photos)
  libdlpack-dev pybind11-dev python3-dev python3-pytest python3-torch  # interop: the Python module
  python3-torchvision  # examples/python/jpeg_folder.py's transforms (and its test)
  python3-pip python3-venv  # pip install . in a fresh venv (tests/python/pip_install_test.sh)
  openmpi-bin libopenmpi-dev  # mpirun for the multi-process tests; headers for FLOWFEED_MPI
  clang-16 libclang-rt-16-dev xz-utils)  # the last three: scripts/sanitize.sh (libFuzzer, TBB source)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "flowfeed: installing ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  # No translations in the index; dpkg without an fsync per file (a fresh CI machine installs
  # hundreds of packages; a half-installed one is installed again by the next run).
  "${sudo_cmd[@]}" apt-get update -qq -o Acquire::Languages=none
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-unsafe-io "${missing[@]}" >/dev/null
fi
