#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (+ASan/UBSan) and runs each for FUZZ_SECONDS (default
# 20), starting from the seed corpus in fuzz/corpus/<target>/. A crash fails the run and leaves
# the input in build-fuzz/crashes/; turn it into a regression test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh clang-14 libclang-rt-14-dev nlohmann-json3-dev
cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DEDGEACCEL_BUILD_TESTS=OFF -DEDGEACCEL_BUILD_BENCH=OFF -DEDGEACCEL_BUILD_FUZZ=ON -DEDGEACCEL_STATIC=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
  >/dev/null
targets=(tegra_release nvidia_proc flags cdi host_files labels host_resolution uevent http_response
         event_body kubelet_checkpoint nvml_record ld_so_cache dra_claim tegra_host_files)
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"
mkdir -p build-fuzz/crashes
fuzz_one() {
  local t=$1 work status=0
  work=$(mktemp -d)
  if build-fuzz/fuzz_$t -max_total_time="${FUZZ_SECONDS:-20}" -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix=build-fuzz/crashes/$t- "$work" "fuzz/corpus/$t" >"build-fuzz/$t.log" 2>&1; then
    echo "fuzz_$t: ok, $(grep -Eo '#[0-9]+' "build-fuzz/$t.log" | tail -1 | tr -d '#') runs, corpus $(ls "$work" | wc -l)"
  else
    echo "fuzz_$t: FAILED"; tail -30 "build-fuzz/$t.log"; status=1
  fi
  rm -rf "$work"
  return $status
}
# One target per core at a time: each still fuzzes FUZZ_SECONDS on a core of its own.
source scripts/each-in-parallel.sh
each_in_parallel "$(nproc)" build-fuzz/results fuzz_one "${targets[@]}"
