# Sourced by scripts that run one check per item (scripts/fuzz.sh, scripts/tsan.sh):
#   each_in_parallel JOBS RESULTS_DIR FUNCTION ITEM...
# runs `FUNCTION ITEM` for every item, JOBS at a time, each with its output in
# RESULTS_DIR/ITEM.result; once all have ended, prints those outputs in the items' order and
# returns 1 if any call returned non-zero (0 otherwise). One check per core keeps each as fast as
# it runs alone, and the stage takes 1/JOBS of the time.
each_in_parallel() {
  local jobs=$1 results=$2 check=$3 item running=0 failed=0
  shift 3
  mkdir -p "$results"
  for item in "$@"; do
    if ((running >= jobs)); then wait -n || true; running=$((running - 1)); fi
    ( if "$check" "$item"; then touch "$results/$item.ok"; fi ) > "$results/$item.result" 2>&1 &
    running=$((running + 1))
  done
  wait || true
  for item in "$@"; do
    cat "$results/$item.result"
    [ -e "$results/$item.ok" ] || failed=1
    rm -f "$results/$item.ok"
  done
  return $failed
}
