#!/bin/bash
# Idle API requests per node-hour, measured on a real API server (the 1.36 lab of
# ../shared/lab, or any cluster an admin kubeconfig reaches).
#
#   bench/lab-idle-requests.sh [DAEMONS] [WINDOW_SECONDS]     (defaults: 3 daemons, 240 s)
#
# Runs DAEMONS copies of build/edgeaccel-device-plugin, each as its own node (a Node object
# edgeaccel-idle-<i> it creates, two PCIe Edge TPUs of a fixture tree, `--dra=coral-pcie`,
# labels and Events on, its own kubelet root so the lab's kubelet is left alone), lets them
# settle, then reads the API server's own apiserver_request_total before and after WINDOW
# seconds, counting the requests on the resources a daemon touches (resourceslices,
# resourceclaims, nodes, events). A window of the same length without the daemons is measured
# first and subtracted (the kubelet and controllers touch nodes and events too). Prints the
# requests per node-hour by resource and verb. Leaves nothing behind (Nodes, slices, trees).
#
# It also prints the time from the first daemon's start until every node's slices are published,
# the memory (RSS) of all daemons together, and the API server's CPU time in the window.
#
# Environment: KUBECONFIG (default /opt/k8s-lab-1.36/kubeconfig/admin.kubeconfig), KUBECTL
# (default the lab's), DAEMON (default build/edgeaccel-device-plugin), FIXTURE (default
# build/edgeaccel-fixture), HOSTS (the fixture's hosts, default "coral-pcie"; the shipped
# Jetson-with-Coral: "coral-pcie jetson-agx-orin"), DRA (--dra, default coral-pcie; the chart's:
# coral-pcie,coral-usb,tegra), SLICES (slices each node publishes, default 1; 2 for the
# Jetson with a Coral), BASELINE (0: no window without the daemons), EXTRA_FLAGS (more flags),
# LAB_PIDS (the lab's pid files, for the API server's CPU; default /opt/k8s-lab-1.36/run/pids).
#
# With CHURN=K, after the idle window, a claim churn: on every node at once, K claims one after
# another, each made and allocated one of its driver's devices, prepared and unprepared through a
# kubelet double, and deleted (build/edgeaccel-dra-churn, bench/dra_churn_main.cc; CHURN_DRIVER,
# default edgetpu.edgeaccel.io). Prints the requests of that window by resource and verb, the
# drivers' per claim (the churn tool's own POST, PATCH and DELETE taken out), the requests a
# second, and the API server's CPU.
#
# The fleet of #45 (100 nodes of the shipped configuration):
#   HOSTS="coral-pcie jetson-agx-orin" DRA=coral-pcie,coral-usb,tegra SLICES=2 BASELINE=0 \
#     bench/lab-idle-requests.sh 100 900
# and its claim churn (10 claims on each node):
#   HOSTS="coral-pcie jetson-agx-orin" DRA=coral-pcie,coral-usb,tegra SLICES=2 BASELINE=0 \
#     CHURN=10 bench/lab-idle-requests.sh 100 60
set -euo pipefail
cd "$(dirname "$0")/.."
DAEMONS=${1:-3}
WINDOW=${2:-240}
export KUBECONFIG=${KUBECONFIG:-/opt/k8s-lab-1.36/kubeconfig/admin.kubeconfig}
KUBECTL=${KUBECTL:-/opt/k8s-lab-1.36/bin/kubectl}
DAEMON=${DAEMON:-build/edgeaccel-device-plugin}
FIXTURE=${FIXTURE:-build/edgeaccel-fixture}
CHURN=${CHURN:-0}
CHURN_TOOL=${CHURN_TOOL:-build/edgeaccel-dra-churn}
CHURN_DRIVER=${CHURN_DRIVER:-edgetpu.edgeaccel.io}
CHURN_NAMESPACE=edgeaccel-churn
SETTLE=${SETTLE:-20}
HOSTS=${HOSTS:-coral-pcie}
DRA=${DRA:-coral-pcie}
SLICES=${SLICES:-1}
BASELINE=${BASELINE:-1}
LAB_PIDS=${LAB_PIDS:-/opt/k8s-lab-1.36/run/pids}
work=$(mktemp -d /tmp/edgeaccel-idle-requests.XXXXXX)
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$CHURN" != 0 ]; then
    "$KUBECTL" delete namespace "$CHURN_NAMESPACE" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  for i in $(seq 1 "$DAEMONS"); do
    "$KUBECTL" delete resourceslices --field-selector "spec.nodeName=edgeaccel-idle-$i" \
      --ignore-not-found >/dev/null 2>&1 || true
    "$KUBECTL" delete node "edgeaccel-idle-$i" --ignore-not-found >/dev/null 2>&1 || true
  done
  [ -n "${host:-}" ] && rm -rf "$host"
  rm -rf "$work"
}
trap cleanup EXIT

# Counts by "resource verb" of the requests on what the daemons touch, summed over codes.
counts() {
  "$KUBECTL" get --raw /metrics | awk '
    /^apiserver_request_total\{/ {
      match($0, /resource="[^"]*"/); r = substr($0, RSTART + 10, RLENGTH - 11)
      match($0, /verb="[^"]*"/); v = substr($0, RSTART + 6, RLENGTH - 7)
      if (r == "resourceslices" || r == "resourceclaims" || r == "nodes" || r == "events") n[r " " v] += $NF
    }
    END { for (k in n) print k, n[k] }' | sort
}

# Per node-hour from two counts files over $WINDOW seconds and $1 nodes (0: the raw difference).
rate() {
  join -a 2 -e 0 -o 0,1.2,2.2 <(sed 's/ /:/' "$1" | sort) <(sed 's/ /:/' "$2" | sort) |
    awk -v w="$WINDOW" -v nodes="$3" '{ d = $3 - $2; if (d > 0) printf "%s %.1f\n", $1, (nodes > 0 ? d * 3600 / w / nodes : d) }'
}

if [ "$BASELINE" != 0 ]; then
  echo "baseline: ${WINDOW}s without the daemons"
  counts >"$work/base0"; sleep "$WINDOW"; counts >"$work/base1"
else
  counts >"$work/base0"; cp "$work/base0" "$work/base1"
fi

# shellcheck disable=SC2086
host=$("$FIXTURE" $HOSTS | tail -1)
started=$(date +%s.%N)
for i in $(seq 1 "$DAEMONS"); do
  node=edgeaccel-idle-$i
  "$KUBECTL" create -f - >/dev/null <<EOF
{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "$node"}}
EOF
  mkdir -p "$work/kubelet-$i/device-plugins"
  # shellcheck disable=SC2086
  "$DAEMON" --host-root="$host" --kubelet_root="$work/kubelet-$i" \
    --device_plugin_dir="$work/kubelet-$i/device-plugins" --node_name="$node" \
    --kubeconfig="$KUBECONFIG" --dra="$DRA" --label_node --node_events \
    --metrics_address=127.0.0.1:0 --cdi_dir="$work/cdi-$i" ${EXTRA_FLAGS:-} \
    >"$work/daemon-$i.log" 2>&1 &
  pids+=($!)
done
want=$((DAEMONS * SLICES))
until [ "$("$KUBECTL" get resourceslices -o name 2>/dev/null | grep -c edgeaccel-idle-)" -ge "$want" ]; do
  (( $(date +%s) - ${started%.*} > 600 )) && { echo "not every slice published within 600 s"; break; }
  sleep 0.2
done
echo "every node's slices published ($want): $(echo "$(date +%s.%N) - $started" | bc | cut -c1-6) s after the first daemon started"
sleep "$SETTLE"
for i in $(seq 1 "$DAEMONS"); do
  kill -0 "${pids[$((i - 1))]}" 2>/dev/null || { echo "daemon $i ended:"; cat "$work/daemon-$i.log"; exit 1; }
done
rss=0
for pid in "${pids[@]}"; do rss=$((rss + $(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status"))); done
echo "memory of the $DAEMONS daemons together: RSS $((rss / 1024)) MiB ($((rss / DAEMONS)) KiB each)"
apiserver_ticks() { awk '{ print $14 + $15 }' "/proc/$(cat "$LAB_PIDS/kube-apiserver.pid")/stat" 2>/dev/null || echo 0; }
echo "with $DAEMONS daemons: ${WINDOW}s idle, after ${SETTLE}s to settle"
ticks0=$(apiserver_ticks)
counts >"$work/run0"; sleep "$WINDOW"; counts >"$work/run1"
ticks1=$(apiserver_ticks)
echo "the API server's CPU in the window: $(( (ticks1 - ticks0) * 1000 / $(getconf CLK_TCK) )) ms ($(echo "scale=2; ($ticks1 - $ticks0) * 100 / $(getconf CLK_TCK) / $WINDOW" | bc)% of one core)"

rate "$work/base0" "$work/base1" 0 >"$work/base"
rate "$work/run0" "$work/run1" 0 >"$work/run"
echo "requests in each ${WINDOW}s window (resource:verb: without the daemons, with them):"
join -a 1 -a 2 -e 0 -o 0,1.2,2.2 <(sort "$work/base") <(sort "$work/run") |
  awk '{ printf "  %-28s %6d %6d\n", $1, $2, $3 }'
echo "requests per node-hour (resource:verb), the baseline window's subtracted:"
join -a 1 -e 0 -o 0,1.2,2.2 <(sort "$work/run") <(sort "$work/base") |
  awk -v w="$WINDOW" -v nodes="$DAEMONS" '{ d = $2 - $3; total += d; if (d != 0) printf "  %-28s %8.1f\n", $1, d * 3600 / w / nodes }
    END { printf "  %-28s %8.1f\n", "total", total * 3600 / w / nodes }'

if [ "$CHURN" != 0 ]; then
  devices=$("$KUBECTL" get resourceslices -o jsonpath='{.items[*].spec.devices[*].name}' \
    --field-selector "spec.nodeName=edgeaccel-idle-1,spec.driver=$CHURN_DRIVER" | tr ' ' ',')
  [ -n "$devices" ] || { echo "no $CHURN_DRIVER devices on edgeaccel-idle-1"; exit 1; }
  "$KUBECTL" create namespace "$CHURN_NAMESPACE" >/dev/null
  echo "claim churn: $CHURN claims on each of the $DAEMONS nodes at once ($CHURN_DRIVER: $devices)"
  # The tool registers a kubelet double with every driver first (each then syncs its slices, as
  # on a node whose kubelet starts), and starts the churn when told, once that has settled.
  mkfifo "$work/go"
  "$CHURN_TOOL" --kubeconfig="$KUBECONFIG" --namespace="$CHURN_NAMESPACE" --nodes="$DAEMONS" \
    --node-prefix=edgeaccel-idle- --root-prefix="$work/kubelet-" --driver="$CHURN_DRIVER" \
    --devices="$devices" --cycles="$CHURN" --wait-for-go <"$work/go" >"$work/churn.out" 2>&1 &
  churn_pid=$!
  exec 7>"$work/go"
  until grep -qx registered "$work/churn.out"; do
    kill -0 "$churn_pid" 2>/dev/null || { echo "the churn tool ended:"; cat "$work/churn.out"; exit 1; }
    sleep 0.2
  done
  sleep "$SETTLE"
  ticks0=$(apiserver_ticks)
  counts >"$work/churn0"
  churn_start=$(date +%s.%N)
  echo go >&7
  exec 7>&-
  churn_rc=0
  wait "$churn_pid" || churn_rc=$?
  grep -vx registered "$work/churn.out" || true
  [ "$churn_rc" = 0 ] || { echo "the churn failed (rc $churn_rc)"; exit 1; }
  churn_seconds=$(echo "$(date +%s.%N) - $churn_start" | bc)
  counts >"$work/churn1"
  ticks1=$(apiserver_ticks)
  cycles=$((DAEMONS * CHURN))
  echo "the API server's CPU in the churn: $(( (ticks1 - ticks0) * 1000 / $(getconf CLK_TCK) )) ms over $(printf %.1f "$churn_seconds") s"
  echo "requests in the churn window (resource:verb: all; the drivers', less the churn tool's own POST, PATCH, DELETE of each claim; per claim):"
  rate "$work/churn0" "$work/churn1" 0 |
    awk -v cycles="$cycles" -v s="$churn_seconds" '
      { own = ($1 == "resourceclaims:POST" || $1 == "resourceclaims:PATCH" || $1 == "resourceclaims:DELETE") ? cycles : 0
        d = $2 - own; theirs += d
        printf "  %-28s %8d %8d %8.2f\n", $1, $2, d, d / cycles }
      END { printf "  %-28s %17d %8.2f   (%.1f a second)\n", "drivers, total", theirs, theirs / cycles, theirs / s }'
fi
