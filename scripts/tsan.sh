#!/usr/bin/env bash
# ThreadSanitizer over the tests whose threads meet only in our code and absl: inventory,
# inotify, health (the event loop, DeviceSet and its listeners), node_labeler, metrics and the
# per-family discovery tests. Any report fails (scripts/tsan.supp lists the one suppression and
# why).
#
# TSan must see every lock. Debian's libabsl is not built with TSan, so this script builds the
# same source package (Debian's abseil, the installed version, from deb.debian.org) with
# -fsanitize=thread into build-tsan/absl, and the tests load it in place of the system one
# (LD_LIBRARY_PATH; same sonames, same inline namespace).
#
# Left out, and why: plugin, registration, prometheus, e2e and the daemon-running node_labeler
# test go through gRPC, whose own code (Debian's libgrpc, uninstrumented) hands buffers between
# threads with atomics TSan cannot see; every report there is inside gRPC's plumbing. Covering
# them needs gRPC itself rebuilt with TSan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh curl dpkg-dev
root=$PWD
absl_dir=$root/build-tsan/absl
version=$(dpkg-query -W -f='${Version}' libabsl-dev)
upstream=${version%-*}
if [ ! -e "$absl_dir/install/.built-$version" ]; then
  echo "building Debian's abseil $version with ThreadSanitizer"
  rm -rf "$absl_dir"
  mkdir -p "$absl_dir/source"
  cd "$absl_dir/source"
  dsc="abseil_${version}.dsc"
  for pool in http://deb.debian.org/debian/pool/main/a/abseil \
              http://deb.debian.org/debian-security/pool/updates/main/a/abseil; do
    curl -sfO "$pool/$dsc" || continue
    for f in $(awk '/^Files:/{on=1; next} /^[^ ]/{on=0} on{print $3}' "$dsc"); do
      curl -sfO "$pool/$f"
    done
    break
  done
  [ -e "$dsc" ] || { echo "tsan.sh: cannot download $dsc from deb.debian.org" >&2; exit 1; }
  dpkg-source --no-check -x "$dsc" src > /dev/null  # checks the files' sizes and hashes
  cmake -S src -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_STANDARD=17 \
    -DBUILD_SHARED_LIBS=ON -DCMAKE_CXX_FLAGS="-fsanitize=thread" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
    -DCMAKE_INSTALL_PREFIX="$absl_dir/install" > /dev/null
  cmake --build build -j"$(nproc)" > /dev/null
  cmake --install build > /dev/null
  touch "$absl_dir/install/.built-$version"
  cd "$root"
fi

tests=(host coral tegra nvidia cdi labels metrics config inventory inotify health node_labeler)
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEDGEACCEL_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" > /dev/null
targets=()
for t in "${tests[@]}"; do targets+=(--target "${t}_test"); done
cmake --build build-tsan -j"$(nproc)" "${targets[@]}"

export LD_LIBRARY_PATH="$absl_dir/install/lib"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/scripts/tsan.supp"
# The instrumented absl must be the one loaded, or TSan sees no absl lock at all.
ldd build-tsan/inventory_test | grep -q "$absl_dir/install/lib/libabsl_synchronization" ||
  { echo "tsan.sh: the TSan-built absl is not the one loaded" >&2; exit 1; }
failed=0
for t in "${tests[@]}"; do
  filter="*"
  # Runs the daemon, and with it gRPC (see above).
  [ "$t" = node_labeler ] && filter="-NodeLabelerTest.TheDaemonLabelsItsNode"
  if build-tsan/"${t}_test" --gtest_filter="$filter" > "build-tsan/${t}_test.log" 2>&1; then
    echo "tsan: ${t}_test clean"
  else
    echo "tsan: ${t}_test FAILED"
    grep -A40 -m1 'WARNING: ThreadSanitizer' "build-tsan/${t}_test.log" ||
      tail -30 "build-tsan/${t}_test.log"
    failed=1
  fi
done
exit $failed
