#!/usr/bin/env bash
# Builds the Python module for the GPU machine, which has Python 3.12, pybind11 (pip), g++ and the
# CUDA 13 toolkit but no oneTBB/yaml-cpp/DLPack headers (../shared/docs/GPU.md):
#
#   here:  scripts/gpu_python_build.sh prepare [DIR]   (DIR defaults to .pybuild, an ignored folder)
#          builds flowfeed's static libraries for sm_90 (in $FLOWFEED_GPU_BUILD_DIR, default
#          build-gpu/; a Release build with CUDA, such as scripts/build.sh's build/, does) and copies
#          into DIR what the binding needs: every flowfeed static library, libcudart_static, the
#          DLPack and fmt headers and the shared libraries that machine lacks (what the libraries
#          link, and what those link in turn, without glibc's and the compiler's own). Carry DIR.
#   there: scripts/gpu_python_build.sh build [DIR]
#          compiles the module's sources (python/CMakeLists.txt's lists for flowfeed_python_nodes
#          and flowfeed_python) and the test extension (testing/module.cpp) against that
#          machine's Python and pybind11 and links DIR's libraries:
#          DIR/python/flowfeed.<abi>.so and DIR/python-testing/flowfeed_testing.<abi>.so. Then
#          export PYTHONPATH=$PWD/DIR/python:$PWD/DIR/python-testing
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
step=${1:?usage: gpu_python_build.sh prepare|build [DIR]}
dir=$(realpath -m "${2:-$root/.pybuild}")
# Shared libraries the GPU machine has as part of its C library and compiler: never carried.
system_libs='/(libc|libm|libresolv|libpthread|libdl|librt|libutil|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so'

# The .cpp files that python/CMakeLists.txt lists for the target whose definition starts with $1.
sources_of() {
  sed -n "/$1/,/)/p" "$root/python/CMakeLists.txt" | tr ' ()' '\n\n\n' | grep '\.cpp$' |
    sed "s|^|$root/python/|"
}

case $step in
  prepare)
    build=${FLOWFEED_GPU_BUILD_DIR:-$root/build-gpu}
    if [[ ! -f $build/CMakeCache.txt ]]; then
      cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLOWFEED_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DFLOWFEED_PYTHON=OFF >/dev/null
    fi
    cmake --build "$build" -j"$(nproc)" --target flowfeed_interop flowfeed_fault_nodes pipeline_runner
    rm -rf "$dir"
    mkdir -p "$dir/lib" "$dir/include" "$dir/_libs"
    find "$build" -name 'libflowfeed_*.a' ! -path '*/CMakeFiles/*' -exec cp {} "$dir/lib/" \;
    cp /usr/local/cuda/lib64/libcudart_static.a "$dir/lib/"
    cp -r /usr/include/dlpack /usr/include/fmt "$dir/include/"  # fmt: header-only in the binding
    # pipeline_runner links every library the static ones need; ldd gives them with their own needs.
    ldd "$build/apps/pipeline_runner/pipeline_runner" | awk '/=> \//{print $3}' |
      grep -Ev "$system_libs" | grep -v '^/usr/local/cuda' | while read -r so; do
      cp -L "$so" "$dir/_libs/"
    done
    du -sh "$dir"
    ;;
  build)
    python=${PYTHON:-python3}
    # pip's pybind11 (the GPU machine); else CPython's and the system's headers (Debian pybind11-dev)
    includes=$("$python" -m pybind11 --includes 2>/dev/null ||
      "$python" -c 'import sysconfig; print("-I" + sysconfig.get_paths()["include"])')
    suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    mkdir -p "$dir/python" "$dir/python-testing"
    mapfile -t sources < <(sources_of 'add_library(flowfeed_python_nodes ' &&
      sources_of 'pybind11_add_module(flowfeed_python ')
    mapfile -t testing < <(sources_of 'pybind11_add_module(flowfeed_python_testing ')
    ((${#sources[@]} && ${#testing[@]})) ||
      { echo "gpu_python_build.sh: no sources in python/CMakeLists.txt" >&2; exit 1; }
    flags=(-std=c++20 -O2 -DNDEBUG -DFMT_HEADER_ONLY -fPIC -fvisibility=hidden)
    # shellcheck disable=SC2206
    flags+=($includes -I"$dir/include" -I"$root/python" -I"$root/pipeline/include"
      -I"$root/nodes/include" -I"$root/interop/include" -I"$root/cuda_support/include"
      -I"$root/nodes/testing/include")
    objects="$dir/objects"
    mkdir -p "$objects"
    object_of() { local rel=${1#"$root"/python/}; echo "$objects/${rel//\//_}.o"; }
    # Every source compiles at once (one process each: the machine has the cores), then each
    # module links its objects with DIR's libraries.
    pids=()
    for source in "${sources[@]}" "${testing[@]}"; do
      g++ "${flags[@]}" -c "$source" -o "$(object_of "$source")" &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do
      wait "$pid" || { echo "gpu_python_build.sh: a source did not compile" >&2; exit 1; }
    done
    link() {  # OUT SOURCES...: one extension module from its sources' objects
      local out=$1
      shift
      local objs=()
      for source in "$@"; do
        objs+=("$(object_of "$source")")
      done
      g++ -shared "${objs[@]}" -o "$out" \
        -Wl,--start-group "$dir"/lib/libflowfeed_*.a -Wl,--end-group "$dir/lib/libcudart_static.a" \
        "$dir"/_libs/*.so* -L/usr/local/cuda/lib64 -lcublas -lcublasLt -ldl -lrt -lpthread \
        -Wl,-rpath,'$ORIGIN/../_libs' -Wl,-rpath,/usr/local/cuda/lib64
      echo "built $out"
    }
    link "$dir/python/flowfeed$suffix" "${sources[@]}"
    link "$dir/python-testing/flowfeed_testing$suffix" "${testing[@]}"
    PYTHONPATH="$dir/python:$dir/python-testing" "$python" -c \
      'import flowfeed, flowfeed_testing; print("import flowfeed, flowfeed_testing: ok")'
    ;;
  *)
    echo "gpu_python_build.sh: unknown step '$step' (prepare, build)" >&2
    exit 2
    ;;
esac
