#!/usr/bin/env bash
# The sanitizer and fuzzing pass (.ci/run runs it after scripts/test.sh), host backend only:
#   asan  the whole host test suite under AddressSanitizer + UndefinedBehaviorSanitizer (gcc)
#   tsan  the graph and pool tests under ThreadSanitizer, in a build without the image family
#         (FLOWFEED_IMAGES=OFF: so CI also builds the tests, runner and bench without images, and
#         runs NodeFamilies.* there); only the files of those suites are instrumented, the other
#         test files are compiled and linked at -O0 without TSan (FLOWFEED_TEST_GRAPH_ONLY). libtbb from Debian is not instrumented,
#         so TSan would not see TBB's own synchronization and would report every hand-off between
#         two nodes; this step builds libtbb with -fsanitize=thread from the Debian source package
#         of the very version installed (apt-get source, with a private source list), once per
#         build dir
#   fuzz  libFuzzer (clang 16) for FLOWFEED_FUZZ_SECONDS in all (default 60), a third each: the
#         config loader, seeded with tests/fuzz/corpus and configs/, the checkpoint reader, seeded
#         with tests/fuzz/checkpoint_corpus, and the tar shard index, seeded with tests/fuzz/tar_corpus
# Usage: scripts/sanitize.sh [asan] [tsan] [fuzz]   (no argument: all three)
# Build dirs live under ${FLOWFEED_SANITIZE_DIR:-build-sanitize}/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${FLOWFEED_SANITIZE_DIR:-$root/build-sanitize}
steps=("$@")
((${#steps[@]})) || steps=(asan tsan fuzz)
jobs=$(nproc)
# Optimized enough to run the suite quickly, with line tables for the reports: gcc's -Og compiles
# about 40% faster than -O1 under the sanitizers (clang, the fuzz build's, reads -Og as -O1).
# FLOWFEED_UNITY_BUILD as in scripts/build.sh.
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-Og -g1"
  -DFLOWFEED_CUDA=OFF "-DCMAKE_UNITY_BUILD=${FLOWFEED_UNITY_BUILD:-OFF}")
ubsan_options="halt_on_error=1:print_stacktrace=1:suppressions=$root/tests/sanitizers/ubsan.supp"

"$root/scripts/deps.sh"
mkdir -p "$out"

configure() {  # dir, extra cmake args... (again when the args changed since the last time)
  local dir=$1
  shift
  local args="${common[*]} $*"
  [[ -f $dir/CMakeCache.txt && $(cat "$dir/.sanitize-args" 2>/dev/null) == "$args" ]] && return
  cmake -S "$root" -B "$dir" "${common[@]}" "$@" >/dev/null
  printf '%s' "$args" >"$dir/.sanitize-args"
}

run_asan() {
  echo "== sanitize: ASan + UBSan, host test suite" >&2
  configure "$out/asan" -DFLOWFEED_SANITIZE=address,undefined
  cmake --build "$out/asan" -j"$jobs" --target flowfeed_test_programs
  (cd "$out/asan" &&
    ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1 \
      UBSAN_OPTIONS=$ubsan_options ctest --output-on-failure -j"$jobs" --timeout 600 -LE gpu \
      -E '^package_downstream$|^DataParallel\.')
  # (package_downstream builds a plain consumer of the installed static libraries, which here
  # carry sanitizer calls that only an instrumented link resolves; scripts/test.sh runs it.
  # DataParallel.* run mpirun jobs that dlopen Open MPI, whose own allocations LeakSanitizer
  # would report; scripts/test.sh runs them uninstrumented.)
}

# libtbb built with -fsanitize=thread, installed into $out/tbb-tsan.
tsan_tbb() {
  local prefix=$out/tbb-tsan
  [[ -f $prefix/lib/cmake/TBB/TBBConfig.cmake ]] && return
  local apt=$out/tbb-apt src=$out/tbb-src
  rm -rf "$apt" "$src"
  mkdir -p "$apt/lists/partial" "$apt/cache" "$apt/sources" "$src"
  # The machine's own Debian sources, as source-package entries (no mirror is named here).
  sed -e 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/*.sources \
    >"$apt/sources/debian-src.sources"
  local apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt/sources"
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -qq)
  apt-get "${apt_opts[@]}" update
  local version
  version=$(dpkg-query -W -f='${source:Version}' libtbb-dev)
  (cd "$src" && apt-get "${apt_opts[@]}" source --download-only "onetbb=$version")
  tar -xf "$src"/onetbb_*.orig.tar.* -C "$src"
  local tree
  tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d | head -1)
  # -Wno-tsan: gcc notes that TSan does not model atomic_thread_fence (libtbb uses a few).
  # -O1: every graph test runs through it, and its 33 steps compile in seconds.
  # (Not in unity batches: libtbb's sources do not build that way.)
  cmake -S "$tree" -B "$src/build" "${common[@]}" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" \
    -DCMAKE_UNITY_BUILD=OFF \
    -DCMAKE_CXX_FLAGS=-Wno-tsan \
    -DTBB_SANITIZE=thread -DTBB_TEST=OFF \
    -DTBB_EXAMPLES=OFF -DTBB_STRICT=OFF -DTBBMALLOC_BUILD=OFF -DTBB_ENABLE_IPO=OFF \
    -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
  cmake --build "$src/build" -j"$jobs"
  cmake --install "$src/build" >/dev/null
}

run_tsan() {
  echo "== sanitize: ThreadSanitizer, graph and pool tests" >&2
  tsan_tbb
  # FLOWFEED_TEST_GRAPH_ONLY: flowfeed_tests holds the files of the suites below, instrumented;
  # flowfeed_tests_rest the other test files, compiled and linked without images (never run).
  configure "$out/tsan" -DFLOWFEED_SANITIZE=thread "-DTBB_DIR=$out/tbb-tsan/lib/cmake/TBB" \
    -DFLOWFEED_IMAGES=OFF -DFLOWFEED_TEST_GRAPH_ONLY=ON
  cmake --build "$out/tsan" -j"$jobs" --target flowfeed_tests flowfeed_tests_rest
  # The suites of tests/pipeline/{pipeline,pool,reliability,session}_test.cpp: every graph shape,
  # failure, skip, stall, stop and abort path, pull mode, and the pools under concurrent use.
  local filter='BufferPool.*:Pipeline.*:*ThroughTheGraph*:*FailureIn*:*NodeThrows*:*DataErrorFails*'
  filter+=':*CorruptData*:*SkipDataError*:*Stall*:Rerun.*:Interrupt.*:Session.*'
  filter+=':*AsyncTrain*:*Branches*'  # asynchronous train nodes, device branches
  filter+=':PullCheckpoint.*:RunCheckpoint.*'  # the resume cursor, checkpoints from train threads
  filter+=':Autotune.*'  # the tuner's gates, moved from the supervisor while bodies run
  filter+=':NodeFamilies.*'  # the registry of a build without images
  # A test of these suites in a file outside flowfeed_graph_test_sources would not run here.
  local stray
  stray=$("$out/tsan/tests/flowfeed_tests_rest" --gtest_list_tests --gtest_filter="$filter")
  if grep -q '^ ' <<<"$stray"; then
    echo "sanitize.sh: tests of the TSan suites outside flowfeed_graph_test_sources" \
      "(tests/CMakeLists.txt), which would not run under TSan; add their files there:" >&2
    echo "$stray" >&2
    return 1
  fi
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    "$out/tsan/tests/flowfeed_tests" --gtest_filter="$filter" --gtest_brief=1
}

run_fuzz() {
  # FLOWFEED_FUZZ_SECONDS is the whole step's fuzzing time, shared by the three targets.
  local seconds=${FLOWFEED_FUZZ_SECONDS:-60}
  local config_seconds=$(((seconds + 2) / 3)) checkpoint_seconds=$(((seconds + 1) / 3))
  local tar_seconds=$((seconds / 3))
  echo "== sanitize: libFuzzer on the config loader (${config_seconds} s), the checkpoint" \
    "reader (${checkpoint_seconds} s) and the tar shard index (${tar_seconds} s)" >&2
  # clang 16: clang 14 lacks the builtin that libstdc++ 12's std::source_location needs.
  CC=clang-16 CXX=clang++-16 configure "$out/fuzz" -DFLOWFEED_BUILD_TESTS=OFF -DFLOWFEED_BUILD_APPS=OFF \
    -DFLOWFEED_BUILD_FUZZERS=ON -DFLOWFEED_SANITIZE=address,undefined,fuzzer-no-link
  cmake --build "$out/fuzz" -j"$jobs" --target config_fuzz checkpoint_fuzz tar_fuzz
  # New inputs go to scratch dirs; the seeds in the repository are only read.
  mkdir -p "$out/fuzz/corpus" "$out/fuzz/checkpoint_corpus" "$out/fuzz/tar_corpus" \
    "$out/fuzz/artifacts"
  # A unit slower than 10 s or above 2 GiB fails the run like a crash; `timeout` ends the run
  # even if libFuzzer's own handler cannot (it reports a runaway unit from a watchdog thread).
  # With two cores or more, the config target runs on one while the other two run in turn on
  # another: each target still has its seconds of a core to itself.
  local config_pid=
  if ((jobs > 1)); then
    fuzz_config "$config_seconds" >"$out/fuzz/config_fuzz.log" 2>&1 &
    config_pid=$!
  else
    fuzz_config "$config_seconds"
  fi
  local status=0
  fuzz_checkpoint "$checkpoint_seconds" || status=$?
  ((status)) || fuzz_tar "$tar_seconds" || status=$?
  if [[ -n $config_pid ]]; then
    local config_status=0
    wait "$config_pid" || config_status=$?
    echo "== sanitize: config_fuzz's output" >&2
    cat "$out/fuzz/config_fuzz.log" >&2
    ((status)) || status=$config_status
  fi
  return "$status"
}

fuzz_config() {  # seconds
  UBSAN_OPTIONS=$ubsan_options timeout -k 10 $(($1 + 120)) \
    "$out/fuzz/tests/fuzz/config_fuzz" -max_total_time="$1" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict="$root/tests/fuzz/config.dict" \
    -artifact_prefix="$out/fuzz/artifacts/" "$out/fuzz/corpus" "$root/tests/fuzz/corpus" \
    "$root/configs"
}

fuzz_checkpoint() {  # seconds
  (($1 > 0)) || return 0
  UBSAN_OPTIONS=$ubsan_options timeout -k 10 $(($1 + 120)) \
    "$out/fuzz/tests/fuzz/checkpoint_fuzz" -max_total_time="$1" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict="$root/tests/fuzz/checkpoint.dict" \
    -artifact_prefix="$out/fuzz/artifacts/checkpoint-" "$out/fuzz/checkpoint_corpus" \
    "$root/tests/fuzz/checkpoint_corpus"
}

fuzz_tar() {  # seconds
  (($1 > 0)) || return 0
  UBSAN_OPTIONS=$ubsan_options timeout -k 10 $(($1 + 120)) \
    "$out/fuzz/tests/fuzz/tar_fuzz" -max_total_time="$1" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/fuzz/artifacts/tar-" "$out/fuzz/tar_corpus" "$root/tests/fuzz/tar_corpus"
}

for step in "${steps[@]}"; do
  start=$SECONDS
  case $step in
    asan) run_asan ;;
    tsan) run_tsan ;;
    fuzz) run_fuzz ;;
    *)
      echo "sanitize.sh: unknown step '$step' (asan, tsan, fuzz)" >&2
      exit 2
      ;;
  esac
  echo "== sanitize: $step passed in $((SECONDS - start)) s" >&2
done
