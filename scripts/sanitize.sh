#!/usr/bin/env bash
# Builds the whole suite with AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/) and
# runs it, including the e2e tests (the daemon binary they run is sanitized too). Any report fails.
#
# UBSan's vptr check is left out: the first time it meets a type in a process it asks whether the
# object's memory is readable by writing it to a pipe (IsAccessibleMemoryRange, GCC 12's
# libsanitizer), and the tests that take every file descriptor (AllFdsTaken: no inotify instance,
# no eventfd) leave it none, so it reports an "invalid vptr" on whatever type it meets first there
# (std::shared_ptr's control blocks, std::thread's state). A suppression cannot name a type it
# could not read. A bad vptr comes from a freed or overrun object, which ASan reports anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# Line tables only (-g1): a report's stack still names each function, file and line, and the
# build spends far less time writing debug information.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g1" -DEDGEACCEL_BUILD_BENCH=OFF -DEDGEACCEL_STATIC=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  >/dev/null
cmake --build build-asan -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-asan --output-on-failure -j"$(nproc)"
