#!/usr/bin/env bash
# Builds both container images for real and smoke-tests them, with nothing but Debian's mirror:
#   1. installs podman, buildah, debootstrap and qemu-user-static (arm64 emulation);
#   2. makes a debian:<suite>-slim-like build image (make-base-image.sh; amd64, where both
#      Dockerfiles compile: the arm64 one cross-compiles); IMAGES_DEBIAN picks the release the
#      images are built from: bookworm (Debian 12, the default) or trixie (Debian 13);
#   3. builds Dockerfile.amd64 and Dockerfile.arm64: one static binary on `scratch` each, with
#      the NVML helper and the glibc it needs, and checks that each image holds exactly those
#      files and is at most 20 MB;
#   4. runs each image's binary: --help, and --discover against fixture host trees mounted at
#      /host (the arm64 binary under qemu-user-static), and checks what it found;
#   5. runs each image as the DaemonSet does, against fixture trees and the tests' kubelet;
#   6. gives each image bad API server settings (a name that does not resolve, a CA file that
#      is missing, a kubeconfig naming a host) and checks that it says so and keeps serving.
# Rootful podman; this script's own containers.conf sets what this kind of machine needs.
# Builds build/edgeaccel-fixture and build/edgeaccel-test-kubelet if they are missing.
#   IMAGES_TIMEOUT (seconds, default 2400) bounds the whole run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${EDGEACCEL_IMAGES_TIMED:-}" ]; then
  export EDGEACCEL_IMAGES_TIMED=1
  exec timeout --kill-after=30 "${IMAGES_TIMEOUT:-2400}" "$0" "$@"
fi

scripts/deps.sh podman buildah debootstrap qemu-user-static binfmt-support runc uidmap \
  ca-certificates
[ -x build/edgeaccel-fixture ] && [ -x build/edgeaccel-test-kubelet ] ||
  scripts/build.sh edgeaccel-fixture edgeaccel-test-kubelet

conf_dir=$(mktemp -d /tmp/edgeaccel-images.XXXXXX)
fixtures=()
cleanup() {
  rm -rf "$conf_dir"
  for f in "${fixtures[@]}"; do rm -rf "$f"; done
}
trap cleanup EXIT
cat > "$conf_dir/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF="$conf_dir/containers.conf"

# arm64 binaries run through binfmt_misc and qemu-aarch64-static.
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  update-binfmts --enable qemu-aarch64 2>/dev/null || update-binfmts --import qemu-aarch64
fi

step() { echo "--- $*"; }
suite=${IMAGES_DEBIAN:-bookworm}
step "build image amd64, Debian $suite"
start=$SECONDS
scripts/make-base-image.sh amd64 "$suite"
echo "    $((SECONDS - start)) s"

version=$(sed -n 's/^project(edgeaccel VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
for arch in amd64 arm64; do
  step "build Dockerfile.$arch"
  start=$SECONDS
  podman build --pull=never --network=host --platform "linux/$arch" \
    --build-arg BUILDPLATFORM="linux/$(dpkg --print-architecture)" \
    --build-arg BUILD_IMAGE="localhost/debian-$suite-slim:amd64" \
    -f "Dockerfile.$arch" -t "localhost/edgeaccel-device-plugin:$version-$arch" . \
    > "$conf_dir/build-$arch.log" 2>&1 || { tail -60 "$conf_dir/build-$arch.log"; exit 1; }
  image="localhost/edgeaccel-device-plugin:$version-$arch"
  got=$(podman image inspect --format '{{.Os}}/{{.Architecture}}' "$image")
  [ "$got" = "linux/$arch" ] || { echo "$image is $got, not linux/$arch"; exit 1; }
  size=$(podman image inspect --format '{{.Size}}' "$image")
  echo "    $image: $(numfmt --to=iec "$size") ($size bytes), built in $((SECONDS - start)) s"
  ((size <= 20000000)) || { echo "$image is $size bytes, over the 20 MB budget"; exit 1; }
  # Nothing but the daemon, the NVML helper and the glibc the helper loads NVML with: no shell,
  # no package manager.
  container=$(podman create --arch="$arch" "$image")
  files=$(podman export "$container" | tar -t | grep -v '/$' | grep -v -x -E 'etc/(hosts|hostname|resolv.conf)|run/.containerenv' | sort | xargs || true)
  podman rm "$container" > /dev/null
  if [ "$arch" = amd64 ]; then
    triplet=x86_64-linux-gnu loader=lib64/ld-linux-x86-64.so.2
  else
    triplet=aarch64-linux-gnu loader=lib/ld-linux-aarch64.so.1
  fi
  want=$(printf '%s\n' usr/bin/edgeaccel-device-plugin usr/bin/edgeaccel-nvml-helper "$loader" \
    "lib/$triplet/libc.so.6" "lib/$triplet/libm.so.6" "lib/$triplet/libdl.so.2" \
    "lib/$triplet/libpthread.so.0" "lib/$triplet/librt.so.1" | sort | xargs)
  [ "$files" = "$want" ] ||
    { echo "$image holds other files than expected:"; echo "  got:  $files"; echo "  want: $want"; exit 1; }
done

# --discover with a fixture tree as /host; prints the report, then checks the lines that must be
# there. The container gets no network and a read-only root, as in the DaemonSet.
discover() {
  local image=$1; shift
  local tree
  tree=$(build/edgeaccel-fixture "$@")
  fixtures+=("$tree")
  podman run --rm --arch="$arch" --network=none --read-only --cap-drop=ALL --security-opt=no-new-privileges \
    -v "$tree:/host:ro" "$image" --discover --host-root=/host
}
expect() {  # expect REPORT LINE...
  local report=$1; shift
  for line in "$@"; do
    grep -q -F -- "$line" <<< "$report" || { echo "missing from --discover: $line"; echo "$report"; exit 1; }
  done
}
# The daemon as the DaemonSet runs it (manifests/base plus components/jetson-l4t): unprivileged,
# read-only root, the kubelet's two directories at their default places and the host's /dev,
# /sys, /proc/meminfo and /etc/nv_tegra_release read-only under /host, here from a fixture tree
# (Edge TPUs on PCIe and USB, and a Jetson AGX Orin). The kubelet is the tests' stand-in
# (edgeaccel-test-kubelet): it must see both resources registered with every device healthy,
# and get the right device node from Allocate. SIGTERM must stop the daemon with status 0 and
# take its sockets away.
run_as_daemonset() {
  local image=$1 tree kubelet
  tree=$(build/edgeaccel-fixture coral-pcie coral-usb jetson-agx-orin)
  kubelet=$(mktemp -d /tmp/edgeaccel-kubelet.XXXXXX)
  fixtures+=("$tree" "$kubelet")
  build/edgeaccel-test-kubelet "$kubelet" 120 coral.ai/edgetpu=3 nvidia.com/gpu=1 \
    > "$kubelet.out" 2>&1 &
  local kubelet_pid=$!
  fixtures+=("$kubelet.out")
  for _ in $(seq 100); do [ -S "$kubelet/device-plugins/kubelet.sock" ] && break; sleep 0.1; done
  local container
  container=$(podman run -d --arch="$arch" --network=none --read-only --cap-drop=ALL \
    --security-opt=no-new-privileges --user=0:0 \
    -v "$kubelet/device-plugins:/var/lib/kubelet/device-plugins" \
    -v "$kubelet/plugins_registry:/var/lib/kubelet/plugins_registry" \
    -v "$tree/dev:/host/dev:ro" -v "$tree/sys:/host/sys:ro" \
    -v "$tree/proc/meminfo:/host/proc/meminfo:ro" \
    -v "$tree/etc/nv_tegra_release:/host/etc/nv_tegra_release:ro" \
    -e NODE_NAME=node-1 "$image" --host-root=/host --metrics-address=)
  local ok=0
  wait "$kubelet_pid" || ok=$?
  podman stop -t 10 "$container" > /dev/null
  local status
  status=$(podman inspect --format '{{.State.ExitCode}}' "$container")
  local log
  log=$(podman logs "$container" 2>&1)
  podman rm "$container" > /dev/null
  sed 's/^/    /' "$kubelet.out"
  if [ "$ok" -ne 0 ] || [ "$status" -ne 0 ] || ls "$kubelet"/device-plugins/edgeaccel-* > /dev/null 2>&1; then
    echo "    the DaemonSet-like run failed: kubelet check $ok, daemon exit status $status"
    ls -l "$kubelet/device-plugins"
    echo "$log" | tail -30
    exit 1
  fi
  expect "$(cat "$kubelet.out")" \
    "coral.ai/edgetpu: 3 healthy, registered via kubelet; Allocate 0000:03:00.0 -> 1 node: /dev/apex_0" \
    "nvidia.com/gpu: 1 healthy, registered via kubelet; Allocate tegra234-igpu0 -> 35 nodes: "
}

# Bad API server settings, given to the image's own binary (static glibc resolving names, our
# TLS client reading files): each must be a clear log line while the daemon keeps serving.
bad_api_settings() {
  local image=$1 dir
  dir=$(mktemp -d /tmp/edgeaccel-api.XXXXXX)
  fixtures+=("$dir")
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=api -keyout "$dir/ca.key" \
    -out "$dir/ca.crt" 2> /dev/null
  echo token > "$dir/token"
  cat > "$dir/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://kube-api.example.internal:6443
    certificate-authority-data: $(base64 -w0 "$dir/ca.crt")
users:
- name: u
  user:
    token: secret
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
KUBECONFIG
  chmod -R a+rX "$dir"
  local cases=(
    "--api-server=https://api.invalid:6443 --api-ca-file=/api/ca.crt|cannot resolve the API server's name api.invalid"
    "--api-server=https://apiserver.test:6443 --api-ca-file=/api/missing-ca.crt|cannot read the API server's CA file /api/missing-ca.crt: No such file or directory"
    "--kubeconfig=/api/kubeconfig|cannot resolve the API server's name kube-api.example.internal"
    "--api-server=https://apiserver.test:6443 --api-ca-file=/api/ca.crt|cannot connect to the API server at apiserver.test:6443: Connection refused")
  local c args want container log
  for c in "${cases[@]}"; do
    args=${c%%|*}
    want=${c#*|}
    # shellcheck disable=SC2086 # the case's flags are words
    container=$(podman run -d --arch="$arch" --network=none --read-only --cap-drop=ALL \
      --add-host=apiserver.test:127.0.0.1 -v "$dir:/api:ro" "$image" \
      --host-root=/ --kubelet-root=/nonexistent --metrics-address= --label-node \
      --node-name=node-1 --api-token-file=/api/token $args)
    for _ in $(seq 50); do
      log=$(podman logs "$container" 2>&1)
      grep -q -F -- "$want" <<< "$log" && break
      sleep 0.2
    done
    local running
    running=$(podman inspect --format '{{.State.Running}}' "$container")
    podman rm -f -t 0 "$container" > /dev/null
    if ! grep -q -F -- "$want" <<< "$log" || [ "$running" != true ]; then
      echo "    $args: expected \"$want\" from a running daemon (running: $running); it logged:"
      echo "$log" | tail -20
      exit 1
    fi
    echo "    $args: \"$want\""
  done
}

for arch in amd64 arm64; do
  image="localhost/edgeaccel-device-plugin:$version-$arch"
  step "run $image"
  start=$SECONDS
  help=$(podman run --rm --arch="$arch" --network=none "$image" --help 2>&1 || true)
  expect "$help" "--host_root" "--kubelet_root" "--device_plugin_dir" "--metrics_address"
  report=$(discover "$image" coral-pcie coral-usb)
  expect "$report" "coral.ai/edgetpu: 3 device(s), 3 healthy" "0000:03:00.0  Healthy" \
    "device node: /dev/apex_1 -> /dev/apex_1 (rw)" "2-1  Healthy"
  report=$(discover "$image" jetson-agx-orin)
  expect "$report" "nvidia.com/gpu: 1 device(s), 1 healthy" "tegra234-igpu0  Healthy" \
    "nvidia.com/jetson.l4t.release=36.4.7"
  report=$(discover "$image" nvidia)
  expect "$report" "nvidia.com/gpu: 1 device(s), 1 healthy" \
    "GPU-3291dfa4-fcc4-0110-615b-c894a0d7c689  Healthy" "device node: /dev/nvidia0 -> /dev/nvidia0 (rw)" \
    "NVML: not available: no libnvidia-ml.so.1 on the host"
  # The image's helper, with the image's glibc, loading a libnvidia-ml.so.1 from the host (the
  # fake one the tests build, for amd64): on amd64 NVML answers; the arm64 helper (under qemu)
  # starts and refuses an amd64 library, which shows it runs and says why.
  report=$(discover "$image" nvidia nvml)
  if [ "$arch" = amd64 ]; then
    expect "$report" "NVML: /usr/lib64/libnvidia-ml.so.1 (found by the driver directories), driver 580.159.04, CUDA 13.0" \
      "nvidia.com/gpu.memory=22491" "nvidia.com/gpu.family=ada-lovelace" "nvidia.com/cuda.runtime.major=13"
  else
    expect "$report" "NVML: not available: cannot load /host/usr/lib64/libnvidia-ml.so.1"
  fi
  echo "    --help and --discover (Edge TPU, Jetson, discrete GPU with and without NVML) as expected, $((SECONDS - start)) s"

  start=$SECONDS
  run_as_daemonset "$image"
  echo "    as the DaemonSet runs it: registered, served, stopped cleanly, $((SECONDS - start)) s"

  start=$SECONDS
  bad_api_settings "$image"
  echo "    bad API server settings: each a clear error, the daemon still running, $((SECONDS - start)) s"
done
# The build stages' layers are not needed once the images exist. Tidying only: a layer still
# held by a build container left from an interrupted earlier run cannot go, and says so.
podman image prune -f > /dev/null ||
  echo "images.sh: some dangling layers are still in use (leftover build containers: buildah rm --all)" >&2
