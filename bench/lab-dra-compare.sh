#!/bin/bash
# Our DRA driver and Kubernetes' reference DRA driver side by side on a real API server (the 1.36
# lab of ../shared/lab), in one interleaved run: NodePrepareResources / NodeUnprepareResources
# latency, p50/p99, cold (a claim's first prepare: the driver reads it from the API server) and
# warm (the same claim prepared again), one claim per call and a batch per call, ours/reference;
# then each process's idle CPU, context switches, threads and RSS over IDLE seconds.
#
#   bench/lab-dra-compare.sh            (as root; about 4 minutes)
#
# Sets up, under a temporary directory, on Node $NODE (made here, like bench/lab-idle-requests.sh
# does, so both drivers publish their slices for it; the lab's kubelet is left alone):
#  * ours: $DAEMON --dra=coral-pcie on a fixture tree with $DEVICES PCIe Edge TPUs (the fixture
#    tool's two, plus copies of the first at the next PCI addresses, device nodes made with
#    mknod), its own kubelet root, CDI dir and plugin registry;
#  * the reference: $REFERENCE kubelet-plugin (test/e2e/dra/test-driver of the lab's tree, driver
#    test-driver.cdi.k8s.io, built as ../shared/lab/README.md says) with --num-devices=$DEVICES,
#    its own data dir, plugin registry and CDI dir;
# waits for both slices, then runs $COMPARE (bench/dra_compare_main.cc), which makes the claims
# in namespace $NAMESPACE, registers both drivers with a kubelet double each and calls them.
# Every claim holds one device: a batch of $DEVICES claims holds every device of either driver.
# Leaves nothing behind: claims (the namespace), slices, the Node, its Events, both processes,
# the fixture, the temporary directory and the CDI files in it.
#
# Environment: KUBECONFIG (default the lab's admin kubeconfig), KUBECTL, BUILD (default build;
# DAEMON, FIXTURE and COMPARE default to its edgeaccel-device-plugin, edgeaccel-fixture and
# edgeaccel-dra-compare), REFERENCE (default /opt/k8s-lab-1.36/bin/dra-test-driver), NODE and
# NAMESPACE (default edgeaccel-dracmp; refused if they exist), DEVICES (per driver and batch size,
# default 8), ROUNDS (default 100), WARMUP (default 5), PAUSE_MS (before each call, default 40),
# IDLE (seconds, default 30).
set -euo pipefail
cd "$(dirname "$0")/.."
LAB=${LAB:-/opt/k8s-lab-1.36}
export KUBECONFIG=${KUBECONFIG:-$LAB/kubeconfig/admin.kubeconfig}
KUBECTL=${KUBECTL:-$LAB/bin/kubectl}
BUILD=${BUILD:-build}
DAEMON=${DAEMON:-$BUILD/edgeaccel-device-plugin}
FIXTURE=${FIXTURE:-$BUILD/edgeaccel-fixture}
COMPARE=${COMPARE:-$BUILD/edgeaccel-dra-compare}
REFERENCE=${REFERENCE:-$LAB/bin/dra-test-driver}
NODE=${NODE:-edgeaccel-dracmp}
NAMESPACE=${NAMESPACE:-edgeaccel-dracmp}
DEVICES=${DEVICES:-8}
ROUNDS=${ROUNDS:-100}
WARMUP=${WARMUP:-5}
PAUSE_MS=${PAUSE_MS:-40}
IDLE=${IDLE:-30}
OURS_DRIVER=edgetpu.edgeaccel.io
REF_DRIVER=test-driver.cdi.k8s.io

[ "$(id -u)" = 0 ] || { echo "needs root (the fixture's device nodes are made with mknod)"; exit 1; }
for f in "$DAEMON" "$FIXTURE" "$COMPARE" "$REFERENCE" "$KUBECTL"; do
  [ -x "$f" ] || { echo "missing $f"; exit 1; }
done
(( DEVICES >= 2 && DEVICES <= 32 )) || { echo "DEVICES must be 2..32"; exit 1; }
k() { "$KUBECTL" "$@"; }
if k get node "$NODE" >/dev/null 2>&1 || k get namespace "$NAMESPACE" >/dev/null 2>&1; then
  echo "Node $NODE or namespace $NAMESPACE exists already; not touching what this script did not make"
  exit 1
fi

work=$(mktemp -d /tmp/edgeaccel-dra-compare.XXXXXX)
host=
pids=()
made_node=0
made_ns=0
cleanup() {
  set +e
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  if [ "$made_ns" = 1 ]; then
    k delete namespace "$NAMESPACE" --wait=true --timeout=300s >/dev/null 2>&1
  fi
  if [ "$made_node" = 1 ]; then
    k delete resourceslices --field-selector "spec.nodeName=$NODE" --ignore-not-found >/dev/null 2>&1
    k delete node "$NODE" --ignore-not-found --wait=true >/dev/null 2>&1
    # The node controller's RemovingNode Event comes after the Node is gone: wait for it.
    for _ in $(seq 1 40); do
      k get events -A --field-selector "involvedObject.kind=Node,involvedObject.name=$NODE,reason=RemovingNode" \
        -o name 2>/dev/null | grep -q . && break
      sleep 0.5
    done
    k delete events -A --field-selector "involvedObject.kind=Node,involvedObject.name=$NODE" \
      --ignore-not-found >/dev/null 2>&1
  fi
  [ -n "$host" ] && rm -rf "$host"
  rm -rf "$work"
  left=$( { k get node "$NODE" -o name; k get namespace "$NAMESPACE" -o name
            k get resourceslices --field-selector "spec.nodeName=$NODE" -o name
            k get events -A --field-selector "involvedObject.kind=Node,involvedObject.name=$NODE" -o name; } 2>/dev/null)
  if [ -n "$left" ]; then echo "left behind (delete by hand):"; echo "$left"; else echo "cleaned up: nothing left behind"; fi
}
trap cleanup EXIT

# The fixture: two PCIe Edge TPUs from the fixture tool, then copies of the first at
# 0000:05:00.0, 0000:06:00.0, ... (apex_2, apex_3, ...: sysfs attributes, class link, device node
# 120:N) so that each claim of a batch can hold a TPU of its own.
host=$("$FIXTURE" coral-pcie | tail -1)
pcis=$host/sys/devices/pci0000:00
for ((i = 2; i < DEVICES; i++)); do
  pci=$(printf '0000:%02x:00.0' $((i + 3)))
  cp -a "$pcis/0000:03:00.0" "$pcis/$pci"
  mv "$pcis/$pci/apex/apex_0" "$pcis/$pci/apex/apex_$i"
  sys=$pcis/$pci/apex/apex_$i
  echo "$pci" >"$sys/pci_address"
  echo "120:$i" >"$sys/dev"
  ln -sfn "../../../$pci" "$sys/device"
  ln -s "../../devices/pci0000:00/$pci/apex/apex_$i" "$host/sys/class/apex/apex_$i"
  mknod -m "$(stat -c %a "$host/dev/apex_0")" "$host/dev/apex_$i" c 120 "$i"
done
mkdir -p "$work/kubelet-ours/device-plugins" "$work/kubelet-ours/plugins_registry" "$work/cdi-ours"
echo "fixture: $("$DAEMON" --host-root="$host" --kubelet_root="$work/kubelet-ours" --discover 2>/dev/null |
  grep -o 'coral.ai/edgetpu: .*' | head -1)"

k create namespace "$NAMESPACE" >/dev/null && made_ns=1
k create -f - >/dev/null <<EOF && made_node=1
{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "$NODE", "labels": {"app.kubernetes.io/part-of": "edgeaccel-dra-compare"}}}
EOF

"$DAEMON" --host-root="$host" --kubelet_root="$work/kubelet-ours" \
  --device_plugin_dir="$work/kubelet-ours/device-plugins" --node_name="$NODE" \
  --kubeconfig="$KUBECONFIG" --dra=coral-pcie --cdi_dir="$work/cdi-ours" \
  --metrics_address=127.0.0.1:0 >"$work/ours.log" 2>&1 &
ours_pid=$!
pids+=("$ours_pid")
# The reference puts its socket in <datadir>/<driver>/dra.sock; that directory must exist.
mkdir -p "$work/kubelet-ref/plugins/$REF_DRIVER" "$work/kubelet-ref/plugins_registry" "$work/cdi-ref"
"$REFERENCE" kubelet-plugin --kubeconfig="$KUBECONFIG" --node-name="$NODE" \
  --datadir="$work/kubelet-ref/plugins" --plugin-registration-path="$work/kubelet-ref/plugins_registry" \
  --cdi-dir="$work/cdi-ref" --num-devices="$DEVICES" >"$work/ref.log" 2>&1 &
ref_pid=$!
pids+=("$ref_pid")

devices_of() {  # driver: the device names of its slices for $NODE, comma-separated
  k get resourceslices --field-selector "spec.nodeName=$NODE,spec.driver=$1" \
    -o jsonpath='{range .items[*].spec.devices[*]}{.name}{","}{end}' 2>/dev/null | sed 's/,$//'
}
count() { [ -z "$1" ] && echo 0 || tr ',' '\n' <<<"$1" | wc -l; }
end=$((SECONDS + 120))
until ours_devices=$(devices_of "$OURS_DRIVER"); ref_devices=$(devices_of "$REF_DRIVER")
      [ "$(count "$ours_devices")" -ge "$DEVICES" ] && [ "$(count "$ref_devices")" -ge "$DEVICES" ]; do
  for pid in "$ours_pid" "$ref_pid"; do
    kill -0 "$pid" 2>/dev/null || { echo "a driver ended:"; tail -20 "$work/ours.log" "$work/ref.log"; exit 1; }
  done
  (( SECONDS < end )) || { echo "slices not published within 120 s"; tail -20 "$work/ours.log" "$work/ref.log"; exit 1; }
  sleep 0.5
done
echo "slices: ours $ours_devices; reference $ref_devices"
echo "load average before the calls: $(cut -d' ' -f1-3 /proc/loadavg)"

"$COMPARE" --kubeconfig="$KUBECONFIG" --namespace="$NAMESPACE" --node="$NODE" \
  --ours-root="$work/kubelet-ours" --ours-driver="$OURS_DRIVER" --ours-devices="$ours_devices" --ours-pid="$ours_pid" \
  --ref-root="$work/kubelet-ref" --ref-driver="$REF_DRIVER" --ref-devices="$ref_devices" --ref-pid="$ref_pid" \
  --rounds="$ROUNDS" --warmup="$WARMUP" --batch="$DEVICES" --pause-ms="$PAUSE_MS" --idle-seconds="$IDLE" ||
  { echo "edgeaccel-dra-compare failed; the drivers' last lines:"; tail -20 "$work/ours.log" "$work/ref.log"; exit 1; }
echo "machine: $(nproc) cores, $(uname -r); API server $(k version -o json 2>/dev/null | sed -n 's/.*"gitVersion": "\([^"]*\)".*/\1/p' | tail -1)"
changes=$(git status --porcelain -- src include 2>/dev/null | head -1)
echo "ours: $DAEMON built $(date -u -r "$DAEMON" +%FT%TZ); the tree now at $(git rev-parse --short HEAD 2>/dev/null)${changes:+ with uncommitted changes in src/ or include/}"
echo "reference: $REFERENCE built $(date -u -r "$REFERENCE" +%FT%TZ)"
