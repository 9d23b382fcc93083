#!/usr/bin/env bash
# On the lab cluster of ../shared/lab (Kubernetes 1.36.2, up.sh run first), as root: a node on
# DRA is as visible as one on the device plugin (#42). The daemon runs on the host with
# --dra=coral-pcie against a fixture (two PCIe TPUs): a claim pod holds one; the other TPU is
# heated over its threshold and cooled again. Prints /metrics' device lines, /healthz, the pod's
# allocatedResourcesStatus (and again after 100 s without a change), then /healthz of a second
# daemon whose kubelet root no kubelet watches.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lab-lib.sh
D=${DAEMON:-build/edgeaccel-device-plugin}
OUT=${OUT:-build/lab-dra-visibility}; rm -rf "$OUT"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
FIX=$(build/edgeaccel-fixture coral-pcie | tail -1)
make_device_nodes
COMMON=(--host-root=$FIX --families=coral-pcie --dra=coral-pcie --node-name=127.0.0.1 --kubeconfig=$KUBECONFIG
        --cdi-dir=/var/run/cdi)
kubectl apply -f manifests/components/dra/deviceclasses.yaml >/dev/null
$D "${COMMON[@]}" --metrics-address=127.0.0.1:19407 > "$OUT/daemon.log" 2>&1 & PID=$!
m() { curl -s 127.0.0.1:19407/metrics | grep -E "^edgeaccel_(device_healthy|edgetpu_temperature_celsius|dra_registered|dra_slice_published)" ; }
h() { echo "$(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:$1/healthz) $(curl -s 127.0.0.1:$1/healthz)"; }
waitfor 30 grep -q "registered" "$OUT/daemon.log"
waitfor 30 bash -c "curl -s 127.0.0.1:19407/healthz | grep -q ok"
say "healthz: $(h 19407)"
{ claim_template; echo ---; claim_pod claim-pod; } | kubectl apply -f - >/dev/null
waitfor 60 running claim-pod
DEV=$(kubectl get resourceclaims -o jsonpath='{.items[0].status.allocation.devices.results[0].device}')
N=$([[ $DEV == tpu-0000-03-00-0 ]] && echo 0 || echo 1)
say "claim-pod holds $DEV (apex_$N)"
status() { kubectl get pod claim-pod -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}'; }
echo 101300 > "$FIX/sys/class/apex/apex_$N/temp"
waitfor 30 bash -c "curl -s 127.0.0.1:19407/metrics | grep -q 'edgeaccel_device_healthy{.*api=\"dra\"} 0'"
say "apex_$N at 101.3 °C; /metrics:"; m | sed 's/^/    /'
waitfor 30 bash -c "kubectl get pod claim-pod -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}' | grep -q Unhealthy"
say "pod status: $(status)"
echo 45050 > "$FIX/sys/class/apex/apex_$N/temp"
waitfor 30 bash -c "kubectl get pod claim-pod -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}' | grep -q '\"health\":\"Healthy\"'"
say "cooled; pod status: $(status)"
# The kubelet turns a report older than its health_check_timeout_seconds (30 s by default)
# Unknown; the driver reports on changes only.
sleep 100
say "100 s without a change; pod status: $(status)"
# A daemon whose DRA driver no kubelet registers: its kubelet root is one no kubelet watches.
mkdir -p "$OUT/nokubelet"
$D "${COMMON[@]}" --kubelet-root="$OUT/nokubelet" --metrics-address=127.0.0.1:19408 > "$OUT/unregistered.log" 2>&1 & LONE=$!
T0=$SECONDS
waitfor 30 bash -c "[[ \$(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:19408/healthz) == 503 ]]"
say "unregistered daemon after $((SECONDS - T0)) s: $(h 19408)"
kill -TERM $LONE; wait $LONE
kubectl delete pod claim-pod --wait=true >/dev/null
waitfor 60 bash -c '[[ -z $(kubectl get resourceclaims -o name) ]]'
kubectl delete resourceclaimtemplate edgetpu >/dev/null
kill -TERM $PID; wait $PID
rm -rf "$FIX"
say done
