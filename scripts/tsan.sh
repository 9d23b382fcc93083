#!/usr/bin/env bash
# ThreadSanitizer over every test binary: the per-family discovery tests, inventory, inotify,
# health (the event loop, DeviceSet and its listeners), the plugin service, registration against
# the test kubelet, metrics and Prometheus, the node labeller, and the end-to-end tests, whose
# daemon is the TSan build too. Any report, in a test or in a daemon it runs, fails
# (scripts/tsan.supp lists the suppressions and why each is not our race).
#
# TSan must see every lock and every hand-over between threads. Debian's libabsl and libgrpc are
# not built with TSan: it would see no absl::Mutex at all, and gRPC hands buffers between its
# threads with atomics in uninstrumented code (hundreds of false reports). So this script builds
# the same source packages Debian built them from (the installed versions, from deb.debian.org,
# with Debian's patches) with -fsanitize=thread into build-tsan/absl and build-tsan/grpc, and the
# tests load those in place of the system ones (LD_LIBRARY_PATH; same sonames, same ABI). The
# builds are kept and reused while the installed versions stay the same. They are optimised at
# -O1 with line tables only (-g1), as TSan's documentation suggests: a report's stack still names
# each function, file and line. On 2 cores absl takes about a minute, gRPC about 5.
# NDEBUG as in the RelWithDebInfo build of our code, whose headers must agree with the libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh curl dpkg-dev libre2-dev libc-ares-dev zlib1g-dev libssl-dev libprotoc-dev
root=$PWD
jobs=$(nproc)

# Downloads and unpacks (with Debian's patches applied) the source package that built the
# installed binary package $1, into $2/src. Prints the source version.
fetch_debian_source() {
  local binary=$1 dest=$2 name version
  name=$(dpkg-query -W -f='${source:Package}' "$binary")
  version=$(dpkg-query -W -f='${source:Version}' "$binary")
  local dsc="${name}_${version#*:}.dsc" letter=${name:0:1}
  [[ $name == lib* ]] && letter=${name:0:4}
  mkdir -p "$dest/download"
  (
    cd "$dest/download"
    for pool in "http://deb.debian.org/debian/pool/main/$letter/$name" \
                "http://deb.debian.org/debian-security/pool/updates/main/$letter/$name"; do
      curl -sfO "$pool/$dsc" || continue
      for f in $(awk '/^Files:/{on=1; next} /^[^ ]/{on=0} on{print $3}' "$dsc"); do
        curl -sfO "$pool/$f"
      done
      break
    done
    [ -e "$dsc" ] || { echo "tsan.sh: cannot download $dsc from deb.debian.org" >&2; exit 1; }
    dpkg-source --no-check -x "$dsc" ../src > /dev/null  # checks the files' sizes and hashes
  )
}

absl_dir=$root/build-tsan/absl
absl_version=$(dpkg-query -W -f='${source:Version}' libabsl-dev)
lib_flags="-fsanitize=thread -O1 -g1 -DNDEBUG"
built_mark=.built-O1-  # a build with other flags is made again
if [ ! -e "$absl_dir/lib/$built_mark$absl_version" ]; then
  echo "building Debian's abseil $absl_version with ThreadSanitizer"
  rm -rf "$absl_dir"
  fetch_debian_source libabsl-dev "$absl_dir"
  cmake -S "$absl_dir/src" -B "$absl_dir/build" -DCMAKE_BUILD_TYPE=None \
    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DCMAKE_CXX_FLAGS="$lib_flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_INSTALL_PREFIX="$absl_dir/install" \
    > /dev/null
  cmake --build "$absl_dir/build" -j"$jobs" > /dev/null
  cmake --install "$absl_dir/build" > /dev/null
  mkdir -p "$absl_dir/lib"
  cp -a "$absl_dir"/install/lib/*.so* "$absl_dir/lib/"
  rm -rf "$absl_dir/build" "$absl_dir/install" "$absl_dir/download"
  touch "$absl_dir/lib/$built_mark$absl_version"
fi

grpc_dir=$root/build-tsan/grpc
grpc_version=$(dpkg-query -W -f='${source:Version}' libgrpc++-dev)
if [ ! -e "$grpc_dir/lib/${built_mark}unsecure-$grpc_version" ]; then
  echo "building Debian's gRPC $grpc_version with ThreadSanitizer (about 5 minutes on 2 cores)"
  rm -rf "$grpc_dir"
  fetch_debian_source libgrpc++-dev "$grpc_dir"
  # Debian's own configuration (debian/rules), less the code generators and language plugins,
  # which the tests do not load. The headers compiled against are Debian's absl, the same
  # version as the TSan build above.
  cmake -S "$grpc_dir/src" -B "$grpc_dir/build" -DCMAKE_BUILD_TYPE=None \
    -DBUILD_SHARED_LIBS=ON -DgRPC_BUILD_TESTS=OFF -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF \
    -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package \
    -DgRPC_PROTOBUF_PROVIDER=package -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package \
    -DgRPC_ZLIB_PROVIDER=package -DgRPC_BUILD_CODEGEN=OFF \
    -DCMAKE_C_FLAGS="$lib_flags" -DCMAKE_CXX_FLAGS="$lib_flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" > /dev/null
  cmake --build "$grpc_dir/build" -j"$jobs" --target grpc++_unsecure > /dev/null
  mkdir -p "$grpc_dir/lib"
  cp -a "$grpc_dir"/build/*.so* "$grpc_dir/lib/"
  rm -rf "$grpc_dir/build" "$grpc_dir/download"
  touch "$grpc_dir/lib/${built_mark}unsecure-$grpc_version"
fi

# Inherited by the daemons the e2e tests start, so a report in a daemon fails its test too; and
# by the configure-time probe of gRPC's internals (cmake/grpc_internals.cmake), which then runs on
# the instrumented gRPC as the tests will.
export LD_LIBRARY_PATH="$grpc_dir/lib:$absl_dir/lib"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/scripts/tsan.supp"
# With TZ set, glibc's tzset keeps its cached zone and writes nothing after the first log line, so
# glog's time stamps cannot raise the tzset_internal false positive (scripts/tsan.supp) at all. The
# suppression needs a symbolized stack, and a test that holds every descriptor (an accept() at
# the limit: dra_plugin_server_test) leaves TSan none to start its symbolizer with.
export TZ=${TZ:-UTC}
# Our code at -O1 -g1 too (7.4 minutes on 2 cores, 11.5 at -O2 -g), NDEBUG as RelWithDebInfo has it.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DEDGEACCEL_BUILD_BENCH=ON -DEDGEACCEL_STATIC=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" | { grep "gRPC .* internals" || true; }
# Every test binary CTest knows ("<layer>/<module>/<Suite>.<Test>" runs in <module>_test). The
# cases are listed by running the binaries, so they are built first (all of them: the build
# tree's test targets are what CTest would list).
cmake --build build-tsan -j"$jobs" > /dev/null
mapfile -t tests < <(ctest --test-dir build-tsan -N |
  sed -n 's#^ *Test *\#[0-9]*: [a-z0-9_]*/\([a-z0-9_]*\)/.*$#\1#p' | sort -u)
((${#tests[@]})) || { echo "tsan: no tests found in build-tsan"; exit 1; }
targets=(--target edgeaccel-device-plugin --target edgeaccel-soak)
for t in "${tests[@]}"; do targets+=(--target "${t}_test"); done
cmake --build build-tsan -j"$jobs" "${targets[@]}"

# The instrumented libraries must be the ones loaded, or TSan sees none of their locks.
for lib in "$absl_dir/lib/libabsl_synchronization" "$grpc_dir/lib/libgrpc_unsecure.so" "$grpc_dir/lib/libgrpc++_unsecure.so" \
           "$grpc_dir/lib/libgpr.so"; do
  # (grep reads all of ldd's output: with -q it could exit first, and pipefail would count
  # ldd's SIGPIPE as a failure.)
  ldd build-tsan/edgeaccel-device-plugin | grep "$lib" > /dev/null ||
    { echo "tsan.sh: $lib is not the one the daemon loads" >&2; exit 1; }
done
tsan_one() {
  local t=$1
  if build-tsan/"${t}_test" > "build-tsan/${t}_test.log" 2>&1; then
    echo "tsan: ${t}_test clean"
  else
    echo "tsan: ${t}_test FAILED"
    grep -A40 -m1 'WARNING: ThreadSanitizer' "build-tsan/${t}_test.log" ||
      tail -30 "build-tsan/${t}_test.log"
    return 1
  fi
}
# One test binary per core at a time, as ctest -j runs the other builds' cases.
source scripts/each-in-parallel.sh
failed=0
each_in_parallel "$jobs" build-tsan/results tsan_one "${tests[@]}" || failed=1
# The churn soak against the TSan-built daemon: 16 allocating clients, device churn and kubelet
# restarts at once. A report makes the daemon exit (halt_on_error), which the soak fails on. RSS
# is allowed to grow here: TSan's shadow memory and history grow with the run, not the daemon.
soak_seconds=${TSAN_SOAK_SECONDS:-20}
if build-tsan/edgeaccel-soak --seconds="$soak_seconds" --max-rss-growth-mib=64 \
     > build-tsan/soak.log 2>&1; then
  echo "tsan: churn soak clean: $(grep -m1 '^soak' build-tsan/soak.log)"
else
  echo "tsan: churn soak FAILED"
  grep -m1 '^soak' build-tsan/soak.log || true
  grep '^FAIL' build-tsan/soak.log || true
  grep -A40 -m1 'WARNING: ThreadSanitizer' build-tsan/soak.log || tail -30 build-tsan/soak.log
  failed=1
fi
exit $failed
