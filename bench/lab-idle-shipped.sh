#!/usr/bin/env bash
# Idle API requests of the shipped DRA configuration on a real node, per node-hour: the lab's own
# node (../shared/lab, Kubernetes 1.36, up.sh run first; as root), whose kubelet registers the
# drivers and runs two pods with a prepared claim each.
#
#   bench/lab-idle-shipped.sh [WINDOW_SECONDS] [BASELINE_SECONDS]     (defaults: 1200, 600)
#
# The daemon runs on the host against a fixture of a Jetson AGX Orin with two PCIe Edge TPUs, with
# the chart's default arguments (every family; --dra=coral-pcie,coral-usb,tegra: two drivers,
# edgetpu.edgeaccel.io and gpu.edgeaccel.io; node labels and Events on). Two pods each hold one
# TPU through a ResourceClaim. After SETTLE seconds, the API server's own apiserver_request_total
# is read before and after WINDOW seconds for the resources the daemon touches (resourceslices,
# resourceclaims, nodes, events); a window of BASELINE seconds before the daemon starts (0: none)
# is scaled to the same length and subtracted (the kubelet patches its Node and records Events
# too). Prints requests per node-hour by resource and verb. Leaves the node as it found it.
#
# Environment: DAEMON (default build/edgeaccel-device-plugin), FIXTURE (default
# build/edgeaccel-fixture), SETTLE (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lab-lib.sh
WINDOW=${1:-1200}
BASELINE=${2:-600}
DAEMON=${DAEMON:-build/edgeaccel-device-plugin}
FIXTURE=${FIXTURE:-build/edgeaccel-fixture}
SETTLE=${SETTLE:-60}
work=$(mktemp -d /tmp/edgeaccel-idle-shipped.XXXXXX)
pid=

cleanup() {
  kubectl delete pod idle-claim-1 idle-claim-2 --ignore-not-found --wait=true >/dev/null 2>&1 || true
  kubectl delete resourceclaimtemplate edgetpu --ignore-not-found >/dev/null 2>&1 || true
  [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; }
  [ -n "${host:-}" ] && rm -rf "$host"
  rm -rf "$work"
}
trap cleanup EXIT

counts() {
  kubectl get --raw /metrics | awk '
    /^apiserver_request_total\{/ {
      match($0, /resource="[^"]*"/); r = substr($0, RSTART + 10, RLENGTH - 11)
      match($0, /verb="[^"]*"/); v = substr($0, RSTART + 6, RLENGTH - 7)
      if (r == "resourceslices" || r == "resourceclaims" || r == "nodes" || r == "events") n[r ":" v] += $NF
    }
    END { for (k in n) print k, n[k] }' | sort
}
# The difference of two counts files: "resource:verb n".
delta() {
  join -a 2 -e 0 -o 0,1.2,2.2 "$1" "$2" | awk '{ d = $3 - $2; if (d > 0) print $1, d }'
}

if (( BASELINE > 0 )); then
  say "baseline: ${BASELINE}s without the daemon"
  counts >"$work/b0"; sleep "$BASELINE"; counts >"$work/b1"
  delta "$work/b0" "$work/b1" >"$work/base"
else
  : >"$work/base"
fi

host=$("$FIXTURE" coral-pcie jetson-agx-orin | tail -1)
make_device_nodes
kubectl apply -f manifests/components/dra/deviceclasses.yaml >/dev/null
"$DAEMON" --host-root="$host" --node-name=127.0.0.1 --kubeconfig="$KUBECONFIG" \
  --dra=coral-pcie,coral-usb,tegra --cdi-dir=/var/run/cdi --label-node --node-events \
  --metrics-address=127.0.0.1:0 >"$work/daemon.log" 2>&1 &
pid=$!
waitfor 60 bash -c '[[ $(kubectl get resourceslices --field-selector spec.nodeName=127.0.0.1 -o name | wc -l) -ge 2 ]]' ||
  { echo "no slices:"; cat "$work/daemon.log"; exit 1; }
{ claim_template; echo ---; claim_pod idle-claim-1; echo ---; claim_pod idle-claim-2; } | kubectl apply -f - >/dev/null
waitfor 90 running idle-claim-1 && waitfor 90 running idle-claim-2 ||
  { echo "pods not running:"; kubectl get pods -o wide; tail -20 "$work/daemon.log"; exit 1; }
say "daemon $("$DAEMON" --version 2>/dev/null | head -1): $(kubectl get resourceslices --field-selector spec.nodeName=127.0.0.1 -o jsonpath='{range .items[*]}{.spec.driver}({.spec.devices[*].name}) {end}')"
say "claims prepared: $(grep -c 'prepared ResourceClaim' "$work/daemon.log")"
sleep "$SETTLE"
kill -0 "$pid" || { echo "daemon ended:"; cat "$work/daemon.log"; exit 1; }
say "${WINDOW}s idle"
counts >"$work/r0"; sleep "$WINDOW"; counts >"$work/r1"
delta "$work/r0" "$work/r1" >"$work/run"
echo "requests in the window (resource:verb: with the daemon, baseline scaled to ${WINDOW}s):"
join -a 1 -a 2 -e 0 -o 0,1.2,2.2 "$work/run" "$work/base" |
  awk -v w="$WINDOW" -v b="$BASELINE" '{ base = (b > 0 ? $3 * w / b : 0); d = $2 - base; total += d
      printf "  %-24s %6d %8.1f  -> %7.1f per node-hour\n", $1, $2, base, d * 3600 / w }
    END { printf "  %-24s %25s %7.1f per node-hour\n", "total", "", total * 3600 / w }'
echo "the daemon's own DRA lines in the window:"
grep -cE "ResourceSlice|ResourceClaim" "$work/daemon.log" | sed 's/^/  log lines naming slices or claims (whole run): /'
