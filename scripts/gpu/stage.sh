# Sourced by the device scripts (run.sh, tp.sh): a time budget for one device call.
# Expects BUDGET_S (seconds) and sets T0 when it is not set yet.
T0=${T0:-$(date +%s)}
elapsed() { echo $(( $(date +%s) - T0 )); }
# stage NAME LIMIT_S CMD...: run CMD under `timeout` (shortened to what is left of the budget)
stage() {
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET_S - $(elapsed) ))
  # status lines go to stderr so that the output filters below never hide them
  if [ "$left" -lt 20 ]; then echo "== $name: SKIPPED (budget of ${BUDGET_S}s spent)" >&2; return 99; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s, at $(elapsed)s)" >&2
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  [ $rc -eq 124 ] && echo "== $name: TIMED OUT after ${limit}s" >&2
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "== $name: exit $rc" >&2
  return $rc
}
