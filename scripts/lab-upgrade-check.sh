#!/usr/bin/env bash
# On the lab cluster of ../shared/lab (Kubernetes 1.36.2, up.sh run first), as root: the daemon
# replaced by another build and back (OLD -> NEW -> OLD, e.g. the previous release and this one),
# with a DRA claim prepared (PCIe Edge TPUs through DRA) and a device-plugin pod running (the USB
# Accelerator through the device plugin) throughout (docs/lab-checks.md). Pods keep running, the
# claim stays prepared, and once the pods go no CDI spec is left behind.
#   OLD=/path/to/old/edgeaccel-device-plugin [NEW=build/edgeaccel-device-plugin] scripts/lab-upgrade-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lab-lib.sh
OLD=${OLD:?the other build: OLD=/path/to/edgeaccel-device-plugin}
NEW=${NEW:-build/edgeaccel-device-plugin}
OUT=${OUT:-build/lab-upgrade}; mkdir -p "$OUT"
state() { echo "$(kubectl get pod dp-pod -o jsonpath='{.status.phase}/{.status.containerStatuses[0].restartCount}') $(kubectl get pod claim-pod -o jsonpath='{.status.phase}/{.status.containerStatuses[0].restartCount}') claims: $(kubectl get resourceclaims -o jsonpath='{range .items[*]}{.metadata.name}={.status.allocation.devices.results[*].device} {end}') checkpoint: $(grep -o '"name": "[^"]*"' /var/lib/kubelet/plugins/edgetpu.edgeaccel.io/checkpoint.json 2>/dev/null | tr '\n' ' ') specs: $(ls /var/run/cdi | grep -c 'edgetpu.edgeaccel.io-claim')"; }
FIX=$(build/edgeaccel-fixture coral-pcie coral-usb | tail -1)
make_device_nodes usb
FLAGS=(--host-root=$FIX --registration=kubelet --families=coral-pcie,coral-usb --dra=coral-pcie --node-name=127.0.0.1
       --kubeconfig=$KUBECONFIG --cdi-dir=/var/run/cdi --metrics-address=127.0.0.1:19406)
kubectl apply -f manifests/components/dra/deviceclasses.yaml >/dev/null
start() { "$1" "${FLAGS[@]}" > "$OUT/$2.log" 2>&1 & PID=$!; waitfor 30 bash -c "grep -q 'registered with the kubelet' $OUT/$2.log"; say "$2 ($1) serving: $(grep -o 'prepared claim(s) from[^,]*' "$OUT/$2.log" | head -1)"; }
stop() { kill -TERM $PID; wait $PID; say "stopped (exit $?)"; }
start "$OLD" old-1
# The USB TPU through the device plugin: allocatable 1 before the pod comes (at 0 the scheduler
# hands coral.ai/edgetpu to DRA, which the shipped DeviceClass maps).
waitfor 40 bash -c '[[ $(kubectl get node 127.0.0.1 -o jsonpath="{.status.allocatable.coral\.ai/edgetpu}") == 1 ]]'
{
  lab_pod dp-pod "ls -l /dev/bus/usb/*/*; sleep 3600" "{limits: {coral.ai/edgetpu: 1}}"
  echo ---
  cat <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: edgetpu}
spec: {spec: {devices: {requests: [{name: tpu, exactly: {deviceClassName: edgetpu.edgeaccel.io}}]}}}
---
YAML
  lab_pod claim-pod "ls -l /dev/apex*; sleep 3600" "{claims: [{name: tpu}]}" \
    "  resourceClaims: [{name: tpu, resourceClaimTemplateName: edgetpu}]"
} | kubectl apply -f - >/dev/null
waitfor 60 running dp-pod; waitfor 60 running claim-pod
say "with OLD: $(state)"
say "dp-pod sees $(kubectl logs dp-pod | head -1 | awk '{print $NF}'), claim-pod sees $(kubectl logs claim-pod | head -1 | awk '{print $NF}')"
stop; start "$NEW" new
say "with NEW: $(state)"
stop; start "$OLD" old-2
say "with OLD again: $(state)"
kubectl delete pod claim-pod dp-pod --wait=true >/dev/null
waitfor 60 bash -c '[[ -z $(kubectl get resourceclaims -o name) ]]'
say "pods deleted: $(state)"
stop
grep -h "unreadable\|prepared claim\|unprepared\|ERROR\|E1129" "$OUT"/*.log | cut -c1-200 | head
kubectl delete resourceclaimtemplate edgetpu >/dev/null
rm -rf "$FIX"
say done
