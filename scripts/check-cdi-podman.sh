#!/usr/bin/env bash
# A real CDI consumer starts containers from the spec the daemon writes: podman 4.3 (Debian's)
# resolves `--device edgeaccel.io/edgetpu=<id>` from /var/run/cdi, as containerd and CRI-O do
# for the CDI names in an Allocate answer.
#   1. the daemon runs against a fixture host with two Edge TPUs, --cdi, the real /var/run/cdi;
#   2. the tests' kubelet sees them registered and gets an Allocate answer with a CDI name;
#   3. podman starts a container with that name: the device node is inside, as a char device
#      with the TPU's numbers and the mode and owner of the node the daemon saw;
#   4. one TPU is unplugged: the daemon rewrites the spec, and podman refuses the stale name;
#   5. a discrete GPU whose "driver" is a shared object built here (libcuda.so.<version> with the
#      soname libcuda.so.1, in the fixture's ld.so cache written by the real ldconfig): podman
#      starts a container from the spec alone (no hook, no NVIDIA runtime) from a Debian-family
#      root whose LD_LIBRARY_PATH names a directory of its own, and the container's program
#      dlopen()s "libcuda.so.1" by name and calls it: the image's LD_LIBRARY_PATH is still there,
#      the driver's libcuda is found in the loader's own /usr/lib/<triplet> (mount, soname,
#      read-only), and a libcuda.so.1 the image puts in its own directory (CUDA's forward
#      compatibility) is found first, judged by a real runtime. The same for a Jetson whose
#      container file lists (CSV) name its nodes and its libcuda by a `sym` entry. A root whose
#      loader searches /usr/lib64 only (RHEL's glibc) cannot be built from Debian's packages:
#      Debian's glibc searches its multiarch directories, /lib and /usr/lib
#      (`ld.so --help`); the spec's /usr/lib64 mounts are checked by the unit tests.
# The spec's hostPath is the host's own /dev/apex_N, so the nodes are made there for the run
# (char 120:N, no driver behind them) and removed after. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh podman runc busybox-static gcc libc6-dev
scripts/build.sh edgeaccel-device-plugin edgeaccel-fixture edgeaccel-test-kubelet > /dev/null

work=$(mktemp -d /tmp/edgeaccel-cdi.XXXXXX)
tree=$(build/edgeaccel-fixture coral-pcie)
spec=/var/run/cdi/edgeaccel.io-edgetpu.json
made_nodes=()
made_dirs=()
daemon=""
cleanup() {
  [ -z "$daemon" ] || kill "$daemon" 2>/dev/null || true
  wait 2>/dev/null || true
  for node in "${made_nodes[@]}"; do rm -f "$node"; done
  for dir in "${made_dirs[@]}"; do rmdir "$dir" 2>/dev/null || true; done
  rm -f "$spec" /var/run/cdi/edgeaccel.io-gpu.json
  rm -rf "$work" "$tree" "${gpu_tree:-}" "${jetson_tree:-}"
}
trap cleanup EXIT
fail() { echo "check-cdi-podman: $*"; [ -z "$daemon" ] || tail -20 "$work/daemon.log"; exit 1; }

for n in 0 1; do
  if [ ! -e "/dev/apex_$n" ]; then mknod "/dev/apex_$n" c 120 "$n"; made_nodes+=("/dev/apex_$n"); fi
done
# podman's own settings for this kind of machine (as scripts/images.sh), a busybox rootfs.
cat > "$work/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF="$work/containers.conf"
mkdir -p "$work/rootfs/bin"
cp /bin/busybox "$work/rootfs/bin/busybox"

rm -f "$spec"
build/edgeaccel-device-plugin --host-root="$tree" --kubelet-root="$work/kubelet" \
  --device-plugin-dir="$work/kubelet/device-plugins" --metrics-address= --cdi \
  --cdi-dir=/var/run/cdi > "$work/daemon.log" 2>&1 &
daemon=$!
build/edgeaccel-test-kubelet "$work/kubelet" 30 coral.ai/edgetpu=2 > "$work/kubelet.log" 2>&1 ||
  fail "the test kubelet did not see both TPUs: $(cat "$work/kubelet.log")"
name=$(grep -o 'CDI edgeaccel.io/edgetpu=[0-9a-f:.]*' "$work/kubelet.log" | cut -d' ' -f2)
[ -n "$name" ] || fail "Allocate named no CDI device: $(cat "$work/kubelet.log")"
echo "check-cdi-podman: Allocate answered $name"

# run DEVICE COMMAND...: a container from the busybox rootfs with one --device.
run_opts=()  # more podman options for run
run() {
  local device=$1; shift
  podman run --rm --network=none "${run_opts[@]}" --device "$device" --rootfs "$work/rootfs" "$@"
}
# The node in the container has the mode and owner of the host's node as the daemon sees it
# (the spec's fileMode, uid, gid), not the runtime's default (0666 on containerd 2.1).
chmod 0660 "$tree/dev/apex_0"
chown 0:44 "$tree/dev/apex_0"
for _ in $(seq 100); do grep -q '"fileMode": 432, "uid": 0, "gid": 44' "$spec" && break; sleep 0.1; done
grep -q '"fileMode": 432, "uid": 0, "gid": 44' "$spec" ||
  fail "the spec does not carry the node's mode and owner: $(cat "$spec")"
out=$(run "$name" /bin/busybox stat -c '%n %F %t:%T %a %u:%g' /dev/apex_0 2>&1) ||
  fail "podman could not start a container with $name: $out"
[ "$out" = "/dev/apex_0 character special file 78:0 660 0:44" ] ||
  fail "the container's /dev/apex_0 is not the TPU's node (char 120:0, 0660, 0:44): $out"
echo "check-cdi-podman: podman resolved $name: $out"

# Unplugged: the node goes (devtmpfs), then sysfs; the daemon rewrites the spec without it.
rm -f "$tree/dev/apex_1"
rm -rf "$tree/sys/class/apex/apex_1" "$tree/sys/devices/pci0000:00/0000:04:00.0"
for _ in $(seq 100); do grep -q '0000:04:00.0' "$spec" || break; sleep 0.1; done
grep -q '0000:04:00.0' "$spec" && fail "the spec still names the unplugged TPU"
if out=$(run edgeaccel.io/edgetpu=0000:04:00.0 /bin/busybox true 2>&1); then
  fail "podman started a container with the unplugged TPU's stale name"
fi
grep -q "unresolvable CDI devices edgeaccel.io/edgetpu=0000:04:00.0" <<<"$out" ||
  fail "podman refused the stale name, but not as unresolvable: $out"
echo "check-cdi-podman: stale name refused: $(tail -1 <<<"$out")"
run "$name" /bin/busybox true || fail "the TPU still plugged in no longer starts"
kill "$daemon"; wait "$daemon" 2>/dev/null || true; daemon=""

# --- The NVIDIA driver's libraries, as a CDI-only runtime gets them -------------------------------
# The container's program: no CUDA headers, no link to libcuda; the loader must find it by name.
mkdir -p "$work/probe"
cat > "$work/probe/probe.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  const char* search = getenv("LD_LIBRARY_PATH");
  printf("LD_LIBRARY_PATH=%s; ", search == NULL ? "(unset)" : search);
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (cuda == NULL) { printf("dlopen: %s\n", dlerror()); return 1; }
  int (*get_version)(int*) = (int (*)(int*))dlsym(cuda, "cuDriverGetVersion");
  if (get_version == NULL) { printf("dlsym: %s\n", dlerror()); return 1; }
  int version = 0;
  const int rc = get_version(&version);
  Dl_info info;
  dladdr((void*)get_version, &info);
  const int fd = open(info.dli_fname, O_WRONLY);
  printf("libcuda.so.1 at %s: cuDriverGetVersion rc=%d version=%d, open for writing: %s\n",
         info.dli_fname, rc, version, fd < 0 ? strerror(errno) : "allowed");
  return rc;
}
C
# driver VERSION SONAME FILE: a "driver" library whose cuDriverGetVersion answers VERSION.
driver() {
  printf 'int cuDriverGetVersion(int* v) { *v = %s; return 0; }\n' "$1" > "$work/probe/cuda$1.c"
  mkdir -p "$(dirname "$3")"
  cc -shared -fPIC -Wl,-soname,"$2" -o "$3" "$work/probe/cuda$1.c"
}
cc -o "$work/rootfs/bin/probe" "$work/probe/probe.c"
# The probe's loader and C library, where its own machine's loader looks (no ld.so.cache inside).
for lib in $(ldd "$work/rootfs/bin/probe" | grep -o '/[^ ]*'); do
  mkdir -p "$work/rootfs$(dirname "$lib")"
  cp -L "$lib" "$work/rootfs$lib"
done
# make_nodes TREE NODE...: the fixture's nodes on the real /dev (the spec's hostPath), same numbers.
make_nodes() {
  local tree=$1; shift
  for node in "$@"; do
    [ -e "$node" ] && continue
    local dir=$(dirname "$node") new=()
    while [ ! -d "$dir" ]; do new=("$dir" "${new[@]}"); dir=$(dirname "$dir"); done
    mkdir -p "$(dirname "$node")"
    for ((i = ${#new[@]} - 1; i >= 0; i--)); do made_dirs+=("${new[i]}"); done  # deepest first
    mknod "$node" c "$((16#$(stat -c %t "$tree$node")))" "$((16#$(stat -c %T "$tree$node")))"
    made_nodes+=("$node")
  done
}
# gpu_container TREE KUBELET FAMILY: runs the daemon on TREE, allocates the GPU, and runs the
# probe in a container from the CDI name; what it printed goes to $work/probe.out.
gpu_container() {
  local tree=$1 kubelet=$2 family=$3 out
  rm -f /var/run/cdi/edgeaccel.io-gpu.json
  build/edgeaccel-device-plugin --host-root="$tree" --kubelet-root="$kubelet" --families="$family" \
    --device-plugin-dir="$kubelet/device-plugins" --metrics-address= --cdi --nvml=false \
    --cdi-dir=/var/run/cdi > "$work/daemon.log" 2>&1 &
  daemon=$!
  build/edgeaccel-test-kubelet "$kubelet" 30 nvidia.com/gpu=1 > "$work/kubelet.log" 2>&1 ||
    fail "the test kubelet did not see the GPU: $(cat "$work/kubelet.log")"
  local cdi_name
  cdi_name=$(grep -o 'CDI edgeaccel.io/gpu=[A-Za-z0-9.:-]*' "$work/kubelet.log" | cut -d' ' -f2)
  [ -n "$cdi_name" ] || fail "Allocate named no CDI device: $(cat "$work/kubelet.log")"
  echo "check-cdi-podman: $family: Allocate answered $(grep -o 'Allocate.*' "$work/kubelet.log")"
  grep -q '"hooks"' /var/run/cdi/edgeaccel.io-gpu.json && fail "the spec has a hook"
  out=$(run "$cdi_name" /bin/probe 2>&1) || fail "$family: the probe failed in a container from $cdi_name: $out"
  kill "$daemon"; wait "$daemon" 2>/dev/null || true; daemon=""
  echo "$out" > "$work/probe.out"
  gpu_cdi_name=$cdi_name  # the spec stays on disk after the daemon: run again with it
}
# The image's own library directory, named by the LD_LIBRARY_PATH it sets.
mkdir -p "$work/rootfs/opt/own/lib"
run_opts=(--env LD_LIBRARY_PATH=/opt/own/lib)
triplet=$(cc -print-multiarch)

# A discrete GPU: driver 515.76 (the fixture's kernel module), its libcuda a real shared object
# at a host path of this run, found by the daemon through the fixture's ld.so cache.
gpu_tree=$(build/edgeaccel-fixture nvidia)
version=515.76
driver 13000 libcuda.so.1 "$work/driver/libcuda.so.$version"
mkdir -p "$gpu_tree$work/driver" "$gpu_tree/etc"
cp "$work/driver/libcuda.so.$version" "$gpu_tree$work/driver/"
echo "$work/driver" > "$gpu_tree/etc/ld.so.conf"
ldconfig -r "$gpu_tree"  # the soname link and the cache entry, as on a node
make_nodes "$gpu_tree" /dev/nvidia0 /dev/nvidiactl /dev/nvidia-modeset /dev/nvidia-uvm /dev/nvidia-uvm-tools
gpu_container "$gpu_tree" "$work/kubelet-gpu" nvidia
out=$(cat "$work/probe.out")
want="LD_LIBRARY_PATH=/opt/own/lib; libcuda.so.1 at /usr/lib/$triplet/libcuda.so.1: cuDriverGetVersion rc=0 version=13000, open for writing: Read-only file system"
[ "$out" = "$want" ] || fail "the discrete GPU's container did not load the driver's libcuda.so.1 with its own LD_LIBRARY_PATH kept: $out"
for dir in "/usr/lib/$triplet" /usr/lib64; do
  grep -q "mount $work/driver/libcuda.so.$version -> $dir/libcuda.so.1 (ro)" "$work/kubelet.log" ||
    fail "Allocate's Mounts lack the driver's libcuda in $dir: $(cat "$work/kubelet.log")"
done
grep -q '"LD_LIBRARY_PATH=' /var/run/cdi/edgeaccel.io-gpu.json && fail "the spec sets LD_LIBRARY_PATH"
echo "check-cdi-podman: discrete GPU: $out"
# CUDA's forward compatibility: a libcuda.so.1 of the image's own, in the directory its
# LD_LIBRARY_PATH names, comes first; the driver's is still what the loader finds without it.
driver 13010 libcuda.so.1 "$work/rootfs/opt/own/lib/libcuda.so.1"
out=$(run "$gpu_cdi_name" /bin/probe 2>&1) || fail "the probe failed with the image's own libcuda: $out"
want="LD_LIBRARY_PATH=/opt/own/lib; libcuda.so.1 at /opt/own/lib/libcuda.so.1: cuDriverGetVersion rc=0 version=13010, open for writing: allowed"
[ "$out" = "$want" ] || fail "the image's own libcuda.so.1 (its LD_LIBRARY_PATH) did not come first: $out"
echo "check-cdi-podman: discrete GPU, the image's own libcuda first: $out"
rm -f "$work/rootfs/opt/own/lib/libcuda.so.1"

# A Jetson (AGX Orin, R36) with container file lists: two nodes and libcuda by a `sym` entry.
jetson_tree=$(build/edgeaccel-fixture jetson-agx-orin)
tegra=$work/tegra/usr/lib/aarch64-linux-gnu/tegra
driver 12060 libcuda.so.1 "$tegra/libcuda.so.1.1"
mkdir -p "$jetson_tree$tegra"
cp "$tegra/libcuda.so.1.1" "$jetson_tree$tegra/"
ln -s libcuda.so.1.1 "$jetson_tree$tegra/libcuda.so.1"
lists=$jetson_tree/etc/nvidia-container-runtime/host-files-for-container.d
mkdir -p "$lists"
printf 'dev, /dev/nvmap\ndev, /dev/nvgpu/igpu0/ctrl\ndev, /dev/nvhost-vic\n' > "$lists/devices.csv"
printf 'sym, %s/libcuda.so.1\nlib, %s/libnvos.so\n' "$tegra" "$tegra" > "$lists/drivers.csv"
make_nodes "$jetson_tree" /dev/nvmap /dev/nvgpu/igpu0/ctrl
gpu_container "$jetson_tree" "$work/kubelet-jetson" tegra
out=$(cat "$work/probe.out")
want="LD_LIBRARY_PATH=/opt/own/lib; libcuda.so.1 at /usr/lib/$triplet/libcuda.so.1: cuDriverGetVersion rc=0 version=12060, open for writing: Read-only file system"
[ "$out" = "$want" ] || fail "the Jetson's container did not load the lists' libcuda.so.1: $out"
nodes=$(grep -o 'Allocate [^;]*' "$work/kubelet.log")
[[ "$nodes" == *"-> 2 nodes: /dev/nvgpu/igpu0/ctrl /dev/nvmap" ]] ||
  fail "the Jetson's Allocate holds other nodes than the lists name and the host has: $nodes"
echo "check-cdi-podman: Jetson: $out"
echo "check-cdi-podman: ok"
