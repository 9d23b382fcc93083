#!/bin/bash
# Pod start with a ResourceClaim through the real scheduler and kubelet of the 1.36 lab
# (../shared/lab), our DRA driver beside Kubernetes' reference driver (test/e2e/dra/test-driver),
# both registered with the lab's kubelet at once, in one interleaved run (issue #45).
#
#   bench/lab-dra-podstart.sh          (as root, the lab up; about 3 minutes with ROUNDS=20)
#
# Each round creates, one after another in an order that alternates, a pod with no claim (the
# node's floor), a pod with a claim of one of ours (DeviceClass edgetpu.edgeaccel.io) and a pod
# with a claim of the reference's (a DeviceClass made here), each from a ResourceClaimTemplate, and
# times each from just before `kubectl create` to the moment a watch started before it shows the pod
# Running (its lines looked at every 5 ms): the scheduler allocating the claim, the kubelet preparing it (our NodePrepareResources,
# or the reference's), containerd with CDI starting the container. Each pod is deleted, and its
# claim gone, before the next is made. Prints p50/p99 per kind, each claim kind's extra over the
# floor, and what the kubelet itself measured of each driver's calls
# (dra_grpc_operations_duration_seconds, read from its /metrics before and after: mean ms).
#
# Environment: BUILD (default build; DAEMON, FIXTURE default to its edgeaccel-device-plugin and
# edgeaccel-fixture), REFERENCE (default /opt/k8s-lab-1.36/bin/dra-test-driver), ROUNDS (default
# 20), NAMESPACE (default edgeaccel-podstart; refused if it exists). Leaves nothing behind: the
# namespace (pods, claims, templates), the reference's DeviceClass, both drivers and their
# sockets, CDI specs and state, the fixture, the device nodes it made.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lab-lib.sh
BUILD=${BUILD:-build}
DAEMON=${DAEMON:-$BUILD/edgeaccel-device-plugin}
FIXTURE=${FIXTURE:-$BUILD/edgeaccel-fixture}
REFERENCE=${REFERENCE:-$LAB/bin/dra-test-driver}
ROUNDS=${ROUNDS:-20}
NAMESPACE=${NAMESPACE:-edgeaccel-podstart}
NODE=127.0.0.1
OURS=edgetpu.edgeaccel.io
REF=test-driver.cdi.k8s.io
KUBELET_ROOT=/var/lib/kubelet
CDI=/var/run/cdi
PKI=$LAB/pki

[ "$(id -u)" = 0 ] || { echo "needs root (device nodes, the kubelet's directories)"; exit 1; }
for f in "$DAEMON" "$FIXTURE" "$REFERENCE"; do [ -x "$f" ] || { echo "missing $f"; exit 1; }; done
if kubectl get namespace "$NAMESPACE" >/dev/null 2>&1 || kubectl get deviceclass "$REF" >/dev/null 2>&1; then
  echo "namespace $NAMESPACE or DeviceClass $REF exists; not touching what this script did not make"
  exit 1
fi
for d in "$KUBELET_ROOT/plugins/$OURS" "$KUBELET_ROOT/plugins/$REF"; do
  [ -e "$d" ] && { echo "$d exists: another driver of that name is here"; exit 1; }
done

work=$(mktemp -d /tmp/edgeaccel-podstart.XXXXXX)
pids=()
made_nodes=()
fix=
cleanup() {
  set +e
  kubectl delete namespace "$NAMESPACE" --wait=true --timeout=120s >/dev/null 2>&1
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  kubectl delete deviceclass "$REF" --ignore-not-found >/dev/null 2>&1
  kubectl delete resourceslices --field-selector "spec.driver=$REF" --ignore-not-found >/dev/null 2>&1
  kubectl delete resourceslices --field-selector "spec.driver=$OURS" --ignore-not-found >/dev/null 2>&1
  rm -rf "$KUBELET_ROOT/plugins/$OURS" "$KUBELET_ROOT/plugins/$REF" \
    "$KUBELET_ROOT/plugins_registry/$OURS-reg.sock" "$KUBELET_ROOT/plugins_registry/$REF-reg.sock"
  rm -f "$CDI"/k8s.$OURS-claim_*.json "$CDI"/$REF*.json "$CDI"/*test-driver*.json
  for n in "${made_nodes[@]}"; do rm -f "$n"; done
  [ -n "$fix" ] && rm -rf "$fix"
  rm -rf "$work"
  left=$( { kubectl get namespace "$NAMESPACE" -o name; kubectl get deviceclass "$REF" -o name
            kubectl get resourceslices --field-selector "spec.driver=$REF" -o name
            kubectl get resourceslices --field-selector "spec.driver=$OURS" -o name; } 2>/dev/null
          ls -d "$KUBELET_ROOT/plugins/$OURS" "$KUBELET_ROOT/plugins/$REF" 2>/dev/null)
  if [ -n "$left" ]; then echo "left behind (delete by hand):"; echo "$left"; else echo "cleaned up: nothing left behind"; fi
}
trap cleanup EXIT
trap "exit 1" INT TERM

# Ours: two PCIe Edge TPUs of the fixture tool, their device nodes on the host (the runtime opens
# the host's paths); the reference: two devices (its CDI spec sets environment variables only).
fix=$("$FIXTURE" coral-pcie | tail -1)
for i in 0 1; do
  [[ -e /dev/apex_$i ]] || { mknod -m 0640 /dev/apex_$i c 120 $i; made_nodes+=(/dev/apex_$i); }
done
kubectl apply -f manifests/components/dra/deviceclasses.yaml >/dev/null
kubectl create -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: $REF}
spec: {selectors: [{cel: {expression: "device.driver == '$REF'"}}]}
EOF
kubectl create namespace "$NAMESPACE" >/dev/null
kubectl -n "$NAMESPACE" create -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: ours}
spec: {spec: {devices: {requests: [{name: dev, exactly: {deviceClassName: $OURS}}]}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: ref}
spec: {spec: {devices: {requests: [{name: dev, exactly: {deviceClassName: $REF}}]}}}
EOF

"$DAEMON" --host-root="$fix" --families=coral-pcie --dra=coral-pcie --node-name=$NODE \
  --kubeconfig="$KUBECONFIG" --cdi-dir=$CDI --metrics-address=127.0.0.1:0 >"$work/ours.log" 2>&1 &
ours_pid=$!; pids+=("$ours_pid")
mkdir -p "$KUBELET_ROOT/plugins/$REF"
"$REFERENCE" kubelet-plugin --kubeconfig="$KUBECONFIG" --node-name=$NODE \
  --datadir="$KUBELET_ROOT/plugins" --plugin-registration-path="$KUBELET_ROOT/plugins_registry" \
  --cdi-dir=$CDI --num-devices=2 >"$work/ref.log" 2>&1 &
ref_pid=$!; pids+=("$ref_pid")

published() {  # driver: how many devices its slices for the node offer
  kubectl get resourceslices --field-selector "spec.nodeName=$NODE,spec.driver=$1" \
    -o jsonpath='{range .items[*].spec.devices[*]}{.name}{" "}{end}' | wc -w
}
two_published() { [ "$(published "$1")" -ge 2 ]; }
waitfor 60 two_published $OURS || { echo "ours published no slice"; tail -20 "$work/ours.log"; exit 1; }
waitfor 60 two_published $REF ||
  { echo "the reference published no slice"; tail -20 "$work/ref.log"; exit 1; }
waitfor 30 grep -q "registered" "$work/ours.log" || { echo "ours did not register"; tail -20 "$work/ours.log"; exit 1; }
sleep 2  # both registrations through the kubelet's plugin watcher
echo "slices: ours $(published $OURS) devices, reference $(published $REF); load average $(cut -d' ' -f1-3 /proc/loadavg)"

pod() {  # name, template or "": the manifest
  local claims="" spec=""
  if [ -n "$2" ]; then
    claims="claims: [{name: dev}]"
    spec="  resourceClaims: [{name: dev, resourceClaimTemplateName: $2}]"
  fi
  lab_pod "$1" "sleep 3600" "{$claims}" "$spec"
}
no_claims() { [ -z "$(kubectl -n "$NAMESPACE" get resourceclaims -o name)" ]; }
# Milliseconds from just before `kubectl create` until a watch begun before it (its lines going to
# a file, looked at every 5 ms) shows the pod Running.
start_ms() {  # name, template
  local name=$1 events=$work/events.$1
  kubectl -n "$NAMESPACE" get pods --watch --output-watch-events \
    -o jsonpath='{.object.metadata.name} {.object.status.phase}{"\n"}' >"$events" 2>/dev/null &
  local watcher=$!
  sleep 0.3  # the watch is open
  local t0 t1; t0=$(date +%s%3N)
  pod "$name" "$2" | kubectl -n "$NAMESPACE" create -f - >/dev/null
  local end=$((SECONDS + 60))
  until grep -q "^$name Running$" "$events"; do
    (( SECONDS < end )) || { echo "pod $name not Running within 60 s" >&2; kill "$watcher"; return 1; }
    sleep 0.005
  done
  t1=$(date +%s%3N)
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null || true
  echo $((t1 - t0))
  kubectl -n "$NAMESPACE" delete pod "$name" --wait=true >/dev/null
  waitfor 60 no_claims ||
    { echo "the claim of $name stayed" >&2; return 1; }
}
kubelet_dra() {  # the kubelet's dra_grpc_operations_duration_seconds sums and counts
  curl -sk --cert "$PKI/admin.crt" --key "$PKI/admin.key" https://127.0.0.1:10250/metrics |
    grep -E '^dra_grpc_operations_duration_seconds_(sum|count)' || true
}

kubelet_dra >"$work/kubelet.before"
kinds=(none ours ref)
for ((r = 0; r < ROUNDS; r++)); do
  for ((j = 0; j < 3; j++)); do
    kind=${kinds[$(( (r + j) % 3 ))]}
    template=$kind; [ "$kind" = none ] && template=
    ms=$(start_ms "p-$kind-$r" "$template") || exit 1
    echo "$kind $ms" >>"$work/times"
  done
done
kubelet_dra >"$work/kubelet.after"

echo "pod start, ms (from kubectl create to the watch seeing Running), $ROUNDS pods each:"
awk '
  { t[$1] = t[$1] " " $2 }
  function sorted(list, a,   n, i, j, x) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return n
  }
  function pct(a, n, p,   k) { k = int(p * (n - 1) + 0.5) + 1; return a[k] }
  END {
    for (kind in t) { n[kind] = sorted(t[kind], v); p50[kind] = pct(v, n[kind], 0.5); p99[kind] = pct(v, n[kind], 0.99) }
    printf "  %-22s p50 %6d  p99 %6d\n", "no claim (the floor)", p50["none"], p99["none"]
    printf "  %-22s p50 %6d  p99 %6d   over the floor at p50: %d\n", "a claim of ours", p50["ours"], p99["ours"], p50["ours"] - p50["none"]
    printf "  %-22s p50 %6d  p99 %6d   over the floor at p50: %d\n", "a claim of the reference", p50["ref"], p99["ref"], p50["ref"] - p50["none"]
    printf "  ours/reference: p50 %.2fx, p99 %.2fx\n", p50["ours"] / p50["ref"], p99["ours"] / p99["ref"]
  }' "$work/times"
echo "the kubelet's own measure of each driver's calls (dra_grpc_operations_duration_seconds), mean ms:"
join <(sort "$work/kubelet.after") <(sort "$work/kubelet.before") -a1 -e0 -o 0,1.2,2.2 2>/dev/null |
  awk '{ split($1, k, "{"); key = k[2]; sub(/}$/, "", key); d = $2 - $3
         if (k[1] ~ /_sum$/) sum[key] = d; else cnt[key] = d }
       END { for (key in cnt) if (cnt[key] > 0 && key ~ /'"$OURS"'|'"$REF"'/)
               printf "  %s: %.2f (%d calls)\n", key, 1000 * sum[key] / cnt[key], cnt[key] }' | sort
echo "machine: $(nproc) cores, $(uname -r); API server $(kubectl version -o json 2>/dev/null | sed -n 's/.*"gitVersion": "\([^"]*\)".*/\1/p' | tail -1)"
echo "ours: $DAEMON built $(date -u -r "$DAEMON" +%FT%TZ), the tree at $(git rev-parse --short HEAD 2>/dev/null)"
echo "reference: $REFERENCE built $(date -u -r "$REFERENCE" +%FT%TZ)"
