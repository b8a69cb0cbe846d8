#!/usr/bin/env bash
# kiln CI: the whole test story in one script, run from a fresh clone by the README's test command.
#
#   1. build/        Release, gcc: every suite but unit (ctest: nvrtc, stress, remote, package; gpu
#                    -> skipped without a GPU, remote -> skipped without redis-server). The remote
#                    tests start and stop their own redis-servers on 127.0.0.1 (free ports).
#   2. build-asan/   clang with ASan + UBSan (+ fuzzer-no-link coverage, so the same tree also
#                    builds the fuzzers): every unit and nvrtc test (ctest -L 'unit|nvrtc') but the
#                    NVRTC-bound ones below. The unit suite runs here only: built and run in the
#                    Release tree as well, it took ~100 s of the budget.
#   3. build-tsan/   gcc with TSan: the threaded and multi-process service/store tests (Catch tag
#                    [concurrency], built into one binary there) and the remote suite (ctest -L
#                    concurrency).
#   4. fuzzers       from build-asan: fuzz_entry, fuzz_manifest, fuzz_semantic_key, the three at
#                    once, each for KILN_FUZZ_SECONDS (default 60) from a scratch copy of
#                    tests/fuzz/corpus/<target>.
#   5. python        the pip package (pyproject.toml) in a venv, linked against stage 1's tree
#                    installed into build/install (-DKILN_PREBUILT: kiln is not compiled again, only
#                    the binding), then pytest over tools/python/tests. No torch here (a multi-GB
#                    download): its tests skip with the reason; they run on the GPU machine.
#
# The NVRTC-bound tests (every default-manifest key, the MLA, sparse and DeepSeek-V4.1 writer
# template sets) spend nearly all their time inside NVRTC, which is the same uninstrumented library
# in every tree and gives byte-identical cubins whoever calls it, so they run once, in the Release
# tree. Under ASan every allocation NVRTC makes goes through ASan's allocator: there they took ~3x
# as long (the default-manifest test 229 s against ~110 s, a fifth of the 20-minute budget), and the
# kiln code around them (the CLI's prebuild, the store, the manifest parser) is checked by the
# smaller nvrtc tests that stay in the ASan tree.
#
# Every stage runs even if an earlier one failed (one CI run shows every problem); the script exits
# non-zero if any stage failed. Needs, besides the README's build packages: clang and
# libclang-rt-14-dev (libFuzzer and clang's sanitizer runtimes), redis-server (the remote tests);
# gcc's ASan/TSan runtimes come with g++.
#
# Knobs: KILN_CI_JOBS (default 2), KILN_FUZZ_SECONDS (default 60), KILN_CI_STAGES (default
# "normal asan tsan fuzz python": run a subset locally).
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=${KILN_CI_JOBS:-2}
fuzz_seconds=${KILN_FUZZ_SECONDS:-60}
stages=${KILN_CI_STAGES:-normal asan tsan fuzz python}
failed=()
summary=()

# Sanitizer settings. NVRTC and libcuda are not instrumented (their own memory accesses are not
# checked; calls into them are). LeakSanitizer stays on with one suppression (tests/lsan.supp):
# glibc's per-thread key block of an NVRTC worker thread that is still ending when the process
# exits. halt_on_error and -fno-sanitize-recover make the first report fail the test.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

nvrtc_bound='default manifest: kiln prebuild compiles every key|mla_decode compiles|sparse_nvfp4 compiles|every sm_120a sparse decode render|dsv41_writer compiles'

run_stage() {
  local name=$1
  shift
  case " $stages " in *" $name "*) ;; *) return 0 ;; esac
  echo
  echo "=================== stage $name"
  local start=$SECONDS
  if "$@"; then
    summary+=("$name: ok, $((SECONDS - start)) s")
  else
    summary+=("$name: FAILED, $((SECONDS - start)) s")
    failed+=("$name")
  fi
}

configure_build() {  # dir, cmake args..., -- targets...
  local dir=$1
  shift
  local args=() targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  targets=("$@")
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "${args[@]}" || return 1
  if [ ${#targets[@]} -gt 0 ]; then
    cmake --build "$dir" -j"$jobs" --target "${targets[@]}"
  else
    cmake --build "$dir" -j"$jobs"
  fi
}

# --as-needed (clang tree and TSan tree): CMake's CUDA::nvrtc target drags in the libcuda *stub* as
# a link dependency; a plain gcc link drops it (Debian's default --as-needed), but clang and gcc's
# -fsanitize=thread link keep it, and a binary with DT_NEEDED libcuda.so.1 cannot even start on a
# machine without a driver (kiln dlopens libcuda).
# -O0 and no bench command (-DKILN_BENCH=OFF) in the sanitizer trees: they are built for their
# checks, not their speed, and their compile time is the largest part of the CI budget. Against -O1
# and the bench sources, the ASan tree's build takes half the CPU time; its tests take ~20 s longer
# and the fuzzers run 3-7x fewer inputs in their 60 s.
asan_args=(-DKILN_SANITIZE=address,undefined,fuzzer-no-link -DKILN_BUILD_FUZZERS=ON -DKILN_BENCH=OFF
  "-DCMAKE_CXX_FLAGS=-g1 -fno-sanitize-recover=all" "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG"
  "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed")

stage_normal() {
  # The stress test runs alone (RUN_SERIAL); 20 s of kills (~60 SIGKILLs) instead of the default 50.
  configure_build build -DKILN_STRESS_SECONDS=20 "-DKILN_TEST_SUITES=nvrtc;gpu" || return 1
  (cd build && ctest --output-on-failure -j"$jobs")
}

stage_asan() {
  CXX=clang++ configure_build build-asan "${asan_args[@]}" \
    -- kiln store_worker kiln_unit_tests kiln_nvrtc_tests || return 1
  (cd build-asan && ctest --output-on-failure -j"$jobs" -L 'unit|nvrtc' -E "$nvrtc_bound")
}

stage_tsan() {
  configure_build build-tsan -DKILN_SANITIZE=thread -DKILN_BENCH=OFF "-DCMAKE_CXX_FLAGS=-g1" "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG" \
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed" \
    -- kiln store_worker kiln_concurrency_tests kiln_remote_tests || return 1
  (cd build-tsan && ctest --output-on-failure -j"$jobs" -L concurrency)
}

stage_fuzz() {
  CXX=clang++ configure_build build-asan "${asan_args[@]}" \
    -- fuzz_entry fuzz_manifest fuzz_semantic_key || return 1
  local targets=(entry manifest semantic_key) pids=() rc=0 i
  rm -rf build-asan/fuzz-work build-asan/fuzz-artifacts && mkdir -p build-asan/fuzz-artifacts
  for target in "${targets[@]}"; do
    # New inputs go to a scratch directory; the committed seeds stay small and unchanged.
    local scratch=build-asan/fuzz-work/$target
    mkdir -p "$scratch"
    echo "--- fuzz_$target for ${fuzz_seconds} s"
    # -rss_limit_mb / -timeout turn a blow-up on one input into a reported failure, not a stuck job.
    build-asan/tests/fuzz/fuzz_$target \
      -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
      -artifact_prefix=build-asan/fuzz-artifacts/"$target"- \
      "$scratch" tests/fuzz/corpus/$target $(ls -d tests/fuzz/regressions/$target 2>/dev/null) \
      > build-asan/fuzz-$target.log 2>&1 &
    pids+=($!)
  done
  for i in "${!targets[@]}"; do
    local target=${targets[$i]}
    if wait "${pids[$i]}"; then
      echo "fuzz_$target: $(grep -E '^(Done|#[0-9]+ +DONE)' build-asan/fuzz-$target.log | tail -1)"
    else
      rc=1
      echo "fuzz_$target FAILED; the crashing input is in build-asan/fuzz-artifacts/ -- log tail:"
      tail -40 build-asan/fuzz-$target.log
    fi
  done
  return $rc
}

stage_python() {
  cmake --install build --prefix build/install > /dev/null || return 1
  python3 -m venv build/venv && build/venv/bin/pip install -q nanobind scikit-build-core pytest || return 1
  build/venv/bin/pip install -q --no-build-isolation -C build-dir=build/python -C build.tool-args=-j"$jobs" \
    -C cmake.define.KILN_PREBUILT=ON -C cmake.define.kiln_DIR="$PWD/build/install/lib/cmake/kiln" . || return 1
  build/venv/bin/python -m pytest -q -rs tools/python/tests
}

run_stage normal stage_normal
run_stage asan stage_asan
run_stage tsan stage_tsan
run_stage fuzz stage_fuzz
run_stage python stage_python

echo
echo "=================== summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED stages: ${failed[*]}"
  exit 1
fi
echo "all stages passed"
