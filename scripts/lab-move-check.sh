#!/usr/bin/env bash
# On the lab cluster of ../shared/lab (Kubernetes 1.36.2, up.sh run first), as root: a node moved
# device plugin -> DRA -> device plugin while a pod holds an Edge TPU (docs/lab-checks.md). The daemon
# runs on the host against a fixture tree (build/edgeaccel-fixture coral-pcie); /dev/apex_0 and
# /dev/apex_1 are made on the host (char 120:0, 120:1) for the pods. Prints timestamped lines; the
# daemon logs go to $OUT. Leaves the lab running, its pods deleted.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lab-lib.sh
D=${DAEMON:-build/edgeaccel-device-plugin}
OUT=${OUT:-build/lab-move}; mkdir -p "$OUT"
FIX=$(build/edgeaccel-fixture coral-pcie | tail -1)
say "fixture $FIX"
make_device_nodes
COMMON=(--host-root=$FIX --registration=kubelet --families=coral-pcie --node-name=127.0.0.1 --kubeconfig=$KUBECONFIG --verbosity=1)
pod() { lab_pod "$1" "ls -l /dev/apex*; sleep 3600" "{limits: {coral.ai/edgetpu: 1}}"; }
alloc() { kubectl get node 127.0.0.1 -o jsonpath='{.status.capacity.coral\.ai/edgetpu}/{.status.allocatable.coral\.ai/edgetpu}'; }
phase() { kubectl get pod "$1" -o jsonpath='{.status.phase}{" "}{.status.containerStatuses[0].state}' 2>&1; }
kubectl apply -f manifests/components/dra/deviceclasses.yaml >/dev/null
say "== 1. device plugin"
$D "${COMMON[@]}" --metrics-address=127.0.0.1:19405 > $OUT/dp1.log 2>&1 & DP=$!
waitfor 40 bash -c '[[ $(kubectl get node 127.0.0.1 -o jsonpath="{.status.allocatable.coral\.ai/edgetpu}") == 2 ]]'; say "capacity/allocatable $(alloc)"
pod dp-pod | kubectl apply -f - >/dev/null
waitfor 60 running dp-pod; say "dp-pod: $(phase dp-pod)"; sleep 1; say "dp-pod sees: $(kubectl logs dp-pod | head -1)"
kill -TERM $DP; wait $DP; say "device plugin stopped (exit $?)"
say "== 2. DRA"
$D "${COMMON[@]}" --dra=coral-pcie --cdi-dir=/var/run/cdi --metrics-address=127.0.0.1:19405 > $OUT/dra.log 2>&1 & DRA=$!
waitfor 30 bash -c 'kubectl get resourceslices -o json | grep -q in-use-by-device-plugin'
say "slice: $(kubectl get resourceslices -o jsonpath='{range .items[*].spec.devices[*]}{.name}{" "}{.taints[*].key}{"="}{.taints[*].value}{"; "}{end}')"
sleep 12; say "capacity/allocatable $(alloc)"
pod ext-pod-1 | kubectl apply -f - >/dev/null
waitfor 60 running ext-pod-1; say "ext-pod-1: $(phase ext-pod-1)"; sleep 1; say "ext-pod-1 sees: $(kubectl logs ext-pod-1 2>&1 | head -1)"
pod ext-pod-2 | kubectl apply -f - >/dev/null
sleep 10; say "ext-pod-2 (only the held TPU left): $(phase ext-pod-2) $(kubectl get pod ext-pod-2 -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')"
say "dp-pod still: $(phase dp-pod)"
kubectl delete pod dp-pod --wait=true >/dev/null; say "dp-pod deleted"
waitfor 90 running ext-pod-2; say "ext-pod-2: $(phase ext-pod-2)"; sleep 1; say "ext-pod-2 sees: $(kubectl logs ext-pod-2 2>&1 | head -1)"
say "slice: $(kubectl get resourceslices -o jsonpath='{range .items[*].spec.devices[*]}{.name}{" "}{.taints[*].key}{"; "}{end}')"
say "claims: $(kubectl get resourceclaims -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.allocation.devices.results[*].device}{"; "}{end}')"
kill -TERM $DRA; wait $DRA; say "DRA daemon stopped (exit $?)"
say "== 3. back to the device plugin"
$D "${COMMON[@]}" --metrics-address=127.0.0.1:19405 > $OUT/dp2.log 2>&1 & DP=$!
sleep 15; say "capacity/allocatable $(alloc)"
say "podres: $($LAB/bin/podres 2>&1 | tr -d '\n ' | head -c 600)"
pod dp-pod-2 | kubectl apply -f - >/dev/null
sleep 10; say "dp-pod-2 (both TPUs held by claims): $(phase dp-pod-2) $(kubectl get pod dp-pod-2 -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')"
say "ext pods: $(phase ext-pod-1) / $(phase ext-pod-2)"
grep -h "held by\|no longer held\|registered with no devices\|in-use\|PreStart" $OUT/*.log | cut -c1-220 | head -20
kill -TERM $DP; wait $DP
# Clean up: the pods go, and the DRA driver runs once more so the kubelet can unprepare their
# claims (it retries until a driver answers), then stops.
kubectl delete pod --all --wait=false >/dev/null 2>&1
$D "${COMMON[@]}" --dra=coral-pcie --cdi-dir=/var/run/cdi --metrics-address=127.0.0.1:19405 > $OUT/cleanup.log 2>&1 & DRA=$!
waitfor 90 bash -c '[[ -z $(kubectl get resourceclaims -o name) ]]'; say "claims left: $(kubectl get resourceclaims -o name | wc -l)"
kill -TERM $DRA; wait $DRA
rm -rf "$FIX"
say done
