#!/usr/bin/env bash
# Builds the Python module for the GPU machine, which has Python 3.12, pybind11 (pip), g++ and the
# CUDA 13 toolkit but no oneTBB/yaml-cpp/DLPack headers (../shared/docs/GPU.md):
#
#   here:  scripts/gpu_python_build.sh prepare [DIR]   (DIR defaults to .pybuild, an ignored folder)
#          builds flowfeed's static libraries for sm_90 (in $FLOWFEED_GPU_BUILD_DIR, default
#          build-gpu/; a Release build with CUDA, such as scripts/build.sh's build/, does) and copies
#          into DIR what the binding needs: the libraries, libcudart_static, the DLPack and fmt headers and
#          the shared libraries that machine lacks (libtbb, libyaml-cpp, zlib). About 8 MiB; carry
#          DIR.
#   there: scripts/gpu_python_build.sh build [DIR]
#          compiles the module's sources (python/CMakeLists.txt's list) against that machine's
#          Python and pybind11 and links DIR's
#          libraries: DIR/python/flowfeed.cpython-312-x86_64-linux-gnu.so. Then
#          export PYTHONPATH=$PWD/DIR/python LD_LIBRARY_PATH=$PWD/DIR/_libs:$LD_LIBRARY_PATH
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
step=${1:?usage: gpu_python_build.sh prepare|build [DIR]}
dir=$(realpath -m "${2:-$root/.pybuild}")
libs=(interop/libflowfeed_interop.a nodes/libflowfeed_fault_nodes.a nodes/libflowfeed_nodes.a
  pipeline/libflowfeed_pipeline.a)

case $step in
  prepare)
    build=${FLOWFEED_GPU_BUILD_DIR:-$root/build-gpu}
    if [[ ! -f $build/CMakeCache.txt ]]; then
      cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLOWFEED_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DFLOWFEED_PYTHON=OFF >/dev/null
    fi
    cmake --build "$build" -j"$(nproc)" --target flowfeed_interop flowfeed_fault_nodes
    rm -rf "$dir"
    mkdir -p "$dir/lib" "$dir/include" "$dir/_libs"
    for l in "${libs[@]}"; do cp "$build/$l" "$dir/lib/"; done
    cp /usr/local/cuda/lib64/libcudart_static.a "$dir/lib/"
    cp -r /usr/include/dlpack /usr/include/fmt "$dir/include/"  # fmt: header-only in the binding
    for so in libtbb.so.12 libyaml-cpp.so.0.7 libz.so.1 libturbojpeg.so.0 libjpeg.so.62 libpng16.so.16 liburing.so.2; do
      cp -L "/usr/lib/x86_64-linux-gnu/$so" "$dir/_libs/"
    done
    du -sh "$dir"
    ;;
  build)
    python=${PYTHON:-python3}
    # pip's pybind11 (the GPU machine); else CPython's and the system's headers (Debian pybind11-dev)
    includes=$("$python" -m pybind11 --includes 2>/dev/null ||
      "$python" -c 'import sysconfig; print("-I" + sysconfig.get_paths()["include"])')
    mkdir -p "$dir/python"
    # The module's sources, as python/CMakeLists.txt lists them for pybind11_add_module.
    mapfile -t sources < <(sed -n '/pybind11_add_module(flowfeed_python/,/)/p' "$root/python/CMakeLists.txt" |
      tr ' ()' '\n\n\n' | grep '\.cpp$' | sed "s|^|$root/python/|")
    ((${#sources[@]})) || { echo "gpu_python_build.sh: no sources in python/CMakeLists.txt" >&2; exit 1; }
    out="$dir/python/flowfeed$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
    # shellcheck disable=SC2046
    g++ -std=c++20 -O2 -DNDEBUG -DFMT_HEADER_ONLY -fPIC -shared -fvisibility=hidden \
      $includes -I"$dir/include" -I"$root/pipeline/include" \
      -I"$root/nodes/include" -I"$root/interop/include" -I"$root/nodes" \
      "${sources[@]}" -o "$out" \
      -Wl,--start-group "$dir"/lib/libflowfeed_*.a -Wl,--end-group "$dir/lib/libcudart_static.a" \
      "$dir/_libs/libtbb.so.12" "$dir/_libs/libyaml-cpp.so.0.7" "$dir/_libs/libz.so.1" \
      "$dir/_libs/libturbojpeg.so.0" "$dir/_libs/libjpeg.so.62" "$dir/_libs/libpng16.so.16" \
      "$dir/_libs/liburing.so.2" \
      -L/usr/local/cuda/lib64 -lcublas -lcublasLt -ldl -lrt -lpthread \
      -Wl,-rpath,'$ORIGIN/../_libs' -Wl,-rpath,/usr/local/cuda/lib64
    echo "built $out"
    PYTHONPATH="$dir/python" "$python" -c 'import flowfeed; print("import flowfeed: ok")'
    ;;
  *)
    echo "gpu_python_build.sh: unknown step '$step' (prepare, build)" >&2
    exit 2
    ;;
esac
