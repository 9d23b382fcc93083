#!/usr/bin/env bash
# On the lab cluster of ../shared/lab (Kubernetes 1.36.2, up.sh run first), as root: the daemon
# replaced by another build and back (OLD -> NEW -> OLD, e.g. the previous release and this one),
# with a DRA claim prepared (PCIe Edge TPUs through DRA) and a device-plugin pod running (the USB
# Accelerator through the device plugin) throughout (docs/lab-checks.md). Pods keep running, the
# claim stays prepared, and once the pods go no CDI spec is left behind. SURGE=1: each new daemon
# starts beside the one it replaces, which is stopped once the new one waits for it (a DaemonSet
# with maxSurge: 1, the shipped strategy), and a second claim pod is created while both run. The
# way back is stop-then-start unless SURGE_BACK=1 too: a rollback applies the old release's
# strategy (maxUnavailable: 1 up to stop 46), and a daemon from before DriverLock started beside
# this one would find dra.sock served and exit.
#   OLD=/path/to/old/edgeaccel-device-plugin [NEW=build/edgeaccel-device-plugin] [SURGE=1] scripts/lab-upgrade-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lab-lib.sh
OLD=${OLD:?the other build: OLD=/path/to/edgeaccel-device-plugin}
NEW=${NEW:-build/edgeaccel-device-plugin}
OUT=${OUT:-build/lab-upgrade}; mkdir -p "$OUT"
state() { echo "pods: $(kubectl get pods -o jsonpath='{range .items[*]}{.metadata.name}={.status.phase}/{.status.containerStatuses[0].restartCount} {end}')claims: $(kubectl get resourceclaims -o jsonpath='{range .items[*]}{.metadata.name}={.status.allocation.devices.results[*].device} {end}') checkpoint: $(grep -o '"name": "[^"]*"' /var/lib/kubelet/plugins/edgetpu.edgeaccel.io/checkpoint.json 2>/dev/null | tr '\n' ' ') specs: $(ls /var/run/cdi | grep -c 'edgetpu.edgeaccel.io-claim')"; }
FIX=$(build/edgeaccel-fixture coral-pcie coral-usb | tail -1)
make_device_nodes usb
FLAGS=(--host-root=$FIX --registration=kubelet --families=coral-pcie,coral-usb --dra=coral-pcie --node-name=127.0.0.1
       --kubeconfig=$KUBECONFIG --cdi-dir=/var/run/cdi --metrics-address=127.0.0.1:0)
kubectl apply -f manifests/components/dra/deviceclasses.yaml >/dev/null
start() { "$1" "${FLAGS[@]}" > "$OUT/$2.log" 2>&1 & PID=$!; waitfor 30 bash -c "grep -q 'registered with the kubelet' $OUT/$2.log"; say "$2 ($1) serving: $(grep -o 'prepared claim(s) from[^,]*' "$OUT/$2.log" | head -1)"; }
stop() { kill -TERM $PID; wait $PID; say "stopped (exit $?)"; }
N_CLAIM_PODS=1
# Replaces the running daemon by `$1` (log `$2`): stop then start, or with SURGE=1 the new one
# first, beside it.
replace() {  # $3: surge or not
  if [[ -z ${3:-} ]]; then stop; start "$1" "$2"; return; fi
  local old=$PID
  "$1" "${FLAGS[@]}" > "$OUT/$2.log" 2>&1 & PID=$!
  waitfor 30 grep -q "still serves\|still drives" "$OUT/$2.log"
  say "$2 ($1) started beside the old one: $(grep -o 'an earlier edgeaccel still [a-z]*' "$OUT/$2.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
  N_CLAIM_PODS=$((N_CLAIM_PODS + 1)); claim_pod claim-pod-$N_CLAIM_PODS | kubectl apply -f - >/dev/null
  waitfor 60 running claim-pod-$N_CLAIM_PODS; say "claim-pod-$N_CLAIM_PODS, made while both run: $(kubectl get pod claim-pod-$N_CLAIM_PODS -o jsonpath='{.status.phase}')"
  kill -TERM $old; wait $old; say "old one stopped (exit $?)"
  waitfor 30 grep -q "registered with the kubelet" "$OUT/$2.log"
  waitfor 30 grep -q "prepared claim(s) from" "$OUT/$2.log"
  say "$2 serving: $(grep -o 'prepared claim(s) from[^,]*' "$OUT/$2.log" | head -1)"
}
start "$OLD" old-1
# The USB TPU through the device plugin: allocatable 1 before the pod comes (at 0 the scheduler
# hands coral.ai/edgetpu to DRA, which the shipped DeviceClass maps).
waitfor 40 bash -c '[[ $(kubectl get node 127.0.0.1 -o jsonpath="{.status.allocatable.coral\.ai/edgetpu}") == 1 ]]'
{
  lab_pod dp-pod "ls -l /dev/bus/usb/*/*; sleep 3600" "{limits: {coral.ai/edgetpu: 1}}"
  echo ---
  claim_template
  echo ---
  claim_pod claim-pod
} | kubectl apply -f - >/dev/null
waitfor 60 running dp-pod; waitfor 60 running claim-pod
say "with OLD: $(state)"
say "dp-pod sees $(kubectl logs dp-pod | head -1 | awk '{print $NF}'), claim-pod sees $(kubectl logs claim-pod | head -1 | awk '{print $NF}')"
replace "$NEW" new "${SURGE:-}"
say "with NEW: $(state)"
# Its TPU back for the next claim pod (there are two), unprepared by the new daemon.
[[ -n ${SURGE:-} && -n ${SURGE_BACK:-} ]] && kubectl delete pod claim-pod-2 --wait=true >/dev/null && say "claim-pod-2 deleted: $(state)"
replace "$OLD" old-2 "${SURGE_BACK:-}"
say "with OLD again: $(state)"
kubectl delete pods --all --wait=true >/dev/null
waitfor 60 bash -c '[[ -z $(kubectl get resourceclaims -o name) ]]'
say "pods deleted: $(state)"
stop
grep -h "unreadable\|prepared claim\|unprepared\|ERROR\|E1129" "$OUT"/*.log | cut -c1-200 | head
kubectl delete resourceclaimtemplate edgetpu >/dev/null
rm -rf "$FIX"
say done
