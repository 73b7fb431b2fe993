#!/bin/sh
# test.sh - `make test` after `make all`: the C suites and the Python suites in two lanes at once.
#
#   C lane (foreground):  make test-c-all (scripts/test-c.sh): the C suite, the ASan+UBSan and
#                         TSan builds and suites, clang's static analyzer, the install test
#                         (printed as they run);
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
. scripts/lanes.sh

start=$(date +%s)
if [ "${KOLO_TEST_LANES:-2}" = 1 ]; then
  $MAKE test-c-all
  keep c $?
  sh scripts/test-python.sh
  keep python $?
else
  lane_start python "$PYLOG" sh scripts/test-python.sh
  echo "== the Python suites run beside the C suites: their output goes to $PYLOG, printed below when the C suites are done"
  $MAKE test-c-all
  keep c $?
  echo "== C suites done after $(( $(date +%s) - start ))s (exit $(kept c)); the Python suites' output:"
  lane_show "$PYLOG"
fi
c=$(kept c)
p=$(kept python)
echo "== make test: C suites exit $c, Python suites exit $p, ${KOLO_TEST_LANES:-2} lane(s), $(( $(date +%s) - start ))s"
[ "$c" = 0 ] && [ "$p" = 0 ]
