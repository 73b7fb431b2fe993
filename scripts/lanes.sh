# lanes.sh - sourced by scripts/test.sh and scripts/test-c.sh: a command that runs beside the
# foreground ones as a lane, in a process group of its own (its pid) that an interrupted run ends
# whole, its output into a log to print when the foreground is done; and exit statuses kept by
# name. One lane at a time.
#
#   lane_start NAME LOG COMMAND [ARG...]   starts COMMAND, its output into LOG (emptied first)
#   lane_wait                              waits for the lane to end
#   lane_show LOG                          prints LOG so far, then the rest as it comes, until
#                                          the lane ends
#   keep NAME STATUS                       keeps STATUS (an exit status) as NAME's; a lane's own
#                                          is kept as its NAME's when it ends
#   kept NAME                              prints NAME's status (1 when none was kept)
LANES_RC=$(mktemp -d "${TMPDIR:-/tmp}/kolo-lanes.XXXXXX")
lane_pid=""
lanes_stop() {
  [ -z "$lane_pid" ] || kill -TERM -"$lane_pid" "$lane_pid" 2>/dev/null
  rm -rf "$LANES_RC"
}
trap 'lanes_stop; exit 130' INT TERM
trap 'rm -rf "$LANES_RC"' EXIT

lane_start() {
  _log=$2 _rc=$LANES_RC/$1
  shift 2
  : >"$_log"
  setsid -w sh -c 'out=$1 rc=$2; shift 2; "$@" >>"$out" 2>&1; echo $? >"$rc"' lane "$_log" "$_rc" "$@" &
  lane_pid=$!
}

lane_wait() {
  wait "$lane_pid"
  lane_pid=""
}

lane_show() {
  tail -n +1 -f --pid="$lane_pid" "$1"
  lane_wait
}

keep() { echo "$2" >"$LANES_RC/$1"; }
kept() { cat "$LANES_RC/$1" 2>/dev/null || echo 1; }
