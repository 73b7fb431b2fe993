#!/bin/sh
# test.sh - `make test` after `make all`: the C suites and the Python suites in two lanes at once.
#
#   C lane (foreground):  make test-c-all (scripts/test-c.sh): the C suite, the ASan+UBSan and
#                         TSan builds and suites, the install test (printed as they run);
#   Python lane:          scripts/test-python.sh, its output into $O/test-python.log (`tail -f`
#                         it to watch), printed here whole when the C lane is done, then the rest
#                         as it comes.
#
# Why two lanes: neither keeps this 2-core machine busy alone. The C suites' tests wait on
# timeouts and on processes they start, the Python suites on JVMs, Ray's daemons and imports; the
# whole of `make test` took 23-24 minutes in one lane here for about 22 minutes of CPU. The
# suites are built to pass on a loaded machine (the C suite passes with two busy loops beside it;
# every wait has a deadline far from what it needs), and the lanes share nothing: every job picks
# its ports with port 0, its shared memory and files by job id, its namespaces by pid.
# KOLO_TEST_LANES=1 runs them one after the other, as before (the C lane's output first).
# Exits non-zero when either lane fails; the last lines say which.
set -u
cd "$(dirname "$0")/.."
MAKE=${MAKE:-make}
O=${O:-build}
mkdir -p "$O"
PYLOG=$O/test-python.log
RC=$(mktemp -d "${TMPDIR:-/tmp}/kolo-test.XXXXXX")
py=""
stop() {
  [ -z "$py" ] || kill -TERM -"$py" "$py" 2>/dev/null
  rm -rf "$RC"
}
trap 'stop; exit 130' INT TERM
trap 'rm -rf "$RC"' EXIT

start=$(date +%s)
if [ "${KOLO_TEST_LANES:-2}" = 1 ]; then
  $MAKE test-c-all
  echo $? >"$RC/c"
  sh scripts/test-python.sh
  echo $? >"$RC/python"
else
  # the Python lane, in a process group of its own (its pid) that an interrupted run ends whole
  : >"$PYLOG"
  setsid -w sh -c 'sh scripts/test-python.sh >>"$1" 2>&1; echo $? >"$2"' lane "$PYLOG" "$RC/python" &
  py=$!
  echo "== the Python suites run beside the C suites: their output goes to $PYLOG, printed below when the C suites are done"
  $MAKE test-c-all
  echo $? >"$RC/c"
  echo "== C suites done after $(( $(date +%s) - start ))s (exit $(cat "$RC/c")); the Python suites' output:"
  # what the Python lane has written so far, then the rest as it comes, until it ends
  tail -n +1 -f --pid="$py" "$PYLOG"
  wait "$py"
  py=""
fi
c=$(cat "$RC/c" 2>/dev/null || echo 1)
p=$(cat "$RC/python" 2>/dev/null || echo 1)
echo "== make test: C suites exit $c, Python suites exit $p, ${KOLO_TEST_LANES:-2} lane(s), $(( $(date +%s) - start ))s"
[ "$c" = 0 ] && [ "$p" = 0 ]
