#!/usr/bin/env bash
# On the lab cluster of ../shared/lab (Kubernetes 1.36.2, up.sh run first), as root: the daemon
# replaced HANDOVERS times while a pod asking for an Edge TPU is created every 100 ms
# (docs/lab-checks.md, "Rollouts"). Each replacement is done as a DaemonSet update does it:
#   MODE=surge        the new daemon starts beside the old one, which is stopped once the new one
#                     is up (maxSurge: 1, maxUnavailable: 0: the shipped strategy);
#   MODE=unavailable  the old one is stopped, the new one starts GAP seconds later (a pod start:
#                     maxUnavailable: 1, the strategy before).
# REG_OLD/REG_NEW: each side's --registration (kubelet or plugin-watcher; a registration mode
# change when they differ). Prints how many pods were created, admitted and refused
# (UnexpectedAdmissionError), and from the kubelet's log each window in which the resource had no
# healthy device. The daemon runs on the host against a fixture (2 PCIe TPUs, 16 replicas each).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lab-lib.sh
D=${DAEMON:-build/edgeaccel-device-plugin}
MODE=${MODE:-surge} HANDOVERS=${HANDOVERS:-6} GAP=${GAP:-2}
REG_OLD=${REG_OLD:-kubelet} REG_NEW=${REG_NEW:-$REG_OLD}
OUT=${OUT:-build/lab-rollout-$MODE}; rm -rf "$OUT"; mkdir -p "$OUT"
FIX=$(build/edgeaccel-fixture coral-pcie | tail -1)
make_device_nodes
KLOG=$LAB/logs/kubelet.log; KLOG_FROM=$(wc -l < "$KLOG")
flags() { echo --host-root=$FIX --registration=$1 --families=coral-pcie --replicas=coral.ai/edgetpu=16 \
  --node-name=127.0.0.1 --metrics-address=127.0.0.1:0 --verbosity=${VERBOSITY:-0}; }
N=0
start() {  # registration mode: starts daemon number N, its pid in PID
  N=$((N + 1)); $D $(flags "$1") > "$OUT/daemon-$N.log" 2>&1 & PID=$!
}
registered() { grep -q "registered with the kubelet" "$OUT/daemon-$1.log"; }
start "$REG_OLD"; OLD=$PID
waitfor 30 registered 1 || { say "daemon 1 did not register"; exit 1; }
waitfor 40 bash -c '[[ $(kubectl get node 127.0.0.1 -o jsonpath="{.status.allocatable.coral\.ai/edgetpu}") == 32 ]]'
say "daemon 1 ($REG_OLD) serving; allocatable $(kubectl get node 127.0.0.1 -o jsonpath='{.status.allocatable.coral\.ai/edgetpu}')"

# A pod every 100 ms, straight to the API server (a kubectl process per pod would not keep up on
# two cores): it asks for one TPU replica and exits at once.
API=https://127.0.0.1:6443 PKI=$LAB/pki
create_pods() {
  local i=0
  while [[ ! -e $OUT/stop ]]; do
    i=$((i + 1))
    curl -s -o /dev/null --cacert $PKI/ca.crt --cert $PKI/admin.crt --key $PKI/admin.key \
      -H 'Content-Type: application/json' -X POST "$API/api/v1/namespaces/default/pods" -d '{
      "apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "rollout-'$i'", "labels": {"lab": "rollout"}},
      "spec": {"hostNetwork": true, "restartPolicy": "Never", "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "bb", "image": "lab.local/busybox:1.36", "imagePullPolicy": "Never",
          "command": ["true"], "resources": {"limits": {"coral.ai/edgetpu": "1"}}}]}}' &
    sleep 0.1
  done
  wait
}
create_pods & CREATOR=$!
sleep 3
for ((h = 1; h <= HANDOVERS; h++)); do
  if [[ $MODE == surge ]]; then
    start "$REG_NEW"; NEW=$PID
    waitfor 10 grep -q "an earlier edgeaccel still serves" "$OUT/daemon-$N.log" || say "daemon $N: no wait seen"
    sleep 1
    kill -TERM $OLD; wait $OLD
  else
    kill -TERM $OLD; wait $OLD
    sleep "$GAP"
    start "$REG_NEW"; NEW=$PID
  fi
  waitfor 15 registered $N || say "daemon $N did not register"
  say "handover $h: daemon $N ($REG_NEW) registered"
  OLD=$NEW
  # Back to the old mode for the next change, so each handover is the same change.
  T=$REG_OLD; REG_OLD=$REG_NEW; REG_NEW=$T
  sleep 3
done
touch "$OUT/stop"; wait $CREATOR
# Every pod is admitted (and done) or refused by now, or still Pending (not yet scheduled).
waitfor 120 bash -c '[[ -z $(kubectl get pods -l lab=rollout --field-selector=status.phase!=Succeeded,status.phase!=Failed -o name) ]]'
kubectl get pods -l lab=rollout -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase} {.status.reason}{"\n"}{end}' > "$OUT/pods.txt"
say "MODE=$MODE, $HANDOVERS handovers: $(wc -l < "$OUT/pods.txt") pods created; $(grep -c ' Succeeded' "$OUT/pods.txt") admitted and done; $(grep -c UnexpectedAdmissionError "$OUT/pods.txt") refused (UnexpectedAdmissionError); $(grep -vc ' Succeeded\|UnexpectedAdmissionError' "$OUT/pods.txt") other"
grep UnexpectedAdmissionError "$OUT/pods.txt" | head -5
# The windows: the kubelet marks every device Unhealthy when a plugin's stream ends or it is
# deregistered, and Healthy again at the next ListAndWatch answer.
tail -n +"$KLOG_FROM" "$KLOG" | grep -E 'coral.ai/edgetpu' | grep -E 'Mark all resources Unhealthy|Got registration request|Device plugin connected|ListAndWatch ended|Deregistered client|DeRegisterPlugin|no healthy devices' \
  | cut -c1-200 > "$OUT/kubelet-window.txt"
say "kubelet lines about the resource: $OUT/kubelet-window.txt ($(wc -l < "$OUT/kubelet-window.txt") lines)"
kill -TERM $OLD; wait $OLD
kubectl delete pods -l lab=rollout --wait=false >/dev/null 2>&1
rm -rf "$FIX"
say done
