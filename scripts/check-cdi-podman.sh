#!/usr/bin/env bash
# A real CDI consumer starts containers from the spec the daemon writes: podman 4.3 (Debian's)
# resolves `--device edgeaccel.io/edgetpu=<id>` from /var/run/cdi, as containerd and CRI-O do
# for the CDI names in an Allocate answer.
#   1. the daemon runs against a fixture host with two Edge TPUs, --cdi, the real /var/run/cdi;
#   2. the tests' kubelet sees them registered and gets an Allocate answer with a CDI name;
#   3. podman starts a container with that name: the device node is inside, as a char device
#      with the TPU's numbers and the mode and owner of the node the daemon saw;
#   4. one TPU is unplugged: the daemon rewrites the spec, and podman refuses the stale name.
# The spec's hostPath is the host's own /dev/apex_N, so the nodes are made there for the run
# (char 120:N, no driver behind them) and removed after. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh podman runc busybox-static
scripts/build.sh edgeaccel-device-plugin edgeaccel-fixture edgeaccel-test-kubelet > /dev/null

work=$(mktemp -d /tmp/edgeaccel-cdi.XXXXXX)
tree=$(build/edgeaccel-fixture coral-pcie)
spec=/var/run/cdi/edgeaccel.io-edgetpu.json
made_nodes=()
daemon=""
cleanup() {
  [ -z "$daemon" ] || kill "$daemon" 2>/dev/null || true
  wait 2>/dev/null || true
  for node in "${made_nodes[@]}"; do rm -f "$node"; done
  rm -f "$spec"
  rm -rf "$work" "$tree"
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
run() {
  local device=$1; shift
  podman run --rm --network=none --device "$device" --rootfs "$work/rootfs" "$@"
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
echo "check-cdi-podman: ok"
