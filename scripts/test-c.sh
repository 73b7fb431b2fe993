#!/bin/sh
# test-c.sh - `make test-c-all` after `make all`: the C suite, under ASan+UBSan and under TSan,
# then the install test and the fuzzers' seeds; clang's static analyzer beside them.
#
#   1. the ASan, TSan and fuzzer builds start in the background, at low priority (nice: the plain
#      suite's processes come first), their output into $O/test-sanitizer-builds.log; then, in the
#      same lane, clang's static analyzer (make test-analyze: make analyze, which fails on any
#      report; skipped, saying so, where scan-build is not installed), its output into
#      $O/test-analyze.log, its reports under $O/analyze/, its verdict printed after the plain suite;
#   2. the plain suite runs (printed as it runs);
#   3. once the builds are done, the ASan suite (printed as it runs) and the TSan suite (into
#      $O/test-tsan.log, printed when the ASan suite is done) run at once;
#   4. the install test;
#   5. every fuzzer over its committed seeds, once (make fuzz-regress; tests/fuzz/README.md): the
#      inputs that once found a bug. Under half a minute of building, a second of running.
#
# Why the overlap: one after the other, `make test` took 17 m 39 s on this 2-core machine for
# 15 m 33 s of user and 4 m 56 s of system time: 42 % of the CPUs idle, the suites waiting on the
# processes they start and on timeouts, and the C lane the longer of `make test`'s two lanes
# (scripts/test.sh). The suites pass on a loaded machine (every wait has a deadline far from
# what it needs, scaled by KT_TIMEOUT_SCALE under the sanitizers), and share nothing: every test
# makes its own scratch directory, every job picks its ports with port 0 and names its shared
# memory by job id. The multihost tests, which set up network namespaces, run in the plain
# suite only (ASAN_TESTS, TSAN_TESTS in the Makefile leave them out). So overlapped, the C lane
# took 760 and 798 s instead of 1040, and `make test` 12 m 57 s and 13 m 35 s (2 runs), the two
# lanes ending together; no test came near its deadline (at most 30 % of it, plain; 8 % under
# the sanitizers).
#
# ASAN_TESTS and TSAN_TESTS (from the Makefile): the suites' test selections, as shell words.
# Exits non-zero when any part failed; the last line says which.
set -u
cd "$(dirname "$0")/.."
MAKE=${MAKE:-make}
O=${O:-build}
BUILDLOG=$O/test-sanitizer-builds.log
TSANLOG=$O/test-tsan.log
ANALYZELOG=$O/test-analyze.log
. scripts/lanes.sh

# 1. the sanitizer builds, then the analyzer. It runs here, where the plain suite leaves the CPUs
# idle while its tests wait, not in the foreground (80 s of both cores alone): so, beside the plain
# suite, the builds were done after 97 s, the analyzer after 200 and the plain suite after 444 (362
# tests, 2026-12-08, another job on the machine): no wall time added. Its status is kept apart
# from the builds', so that a report does not keep the sanitizer suites from running.
keep analyze 1
lane_start builds "$BUILDLOG" sh -c 'nice -n 10 $0 -j2 O=build/asan SAN=asan OPT=-O1 all &&
                                     nice -n 10 $0 -j2 O=build/tsan SAN=tsan OPT=-O1 all &&
                                     nice -n 10 $0 -j2 O=build/fuzz SAN=fuzz CC=clang OPT=-O1 fuzzers || exit
                                     nice -n 10 $0 test-analyze >"$1" 2>&1; echo $? >"$2"' \
  "$MAKE" "$ANALYZELOG" "$LANES_RC/analyze"

# 2. the plain suite
$MAKE test-c
keep plain $?

lane_wait
if [ "$(kept builds)" != 0 ]; then
  cat "$BUILDLOG"
  echo "== test-c: the sanitizer builds failed (above); plain suite exit $(kept plain)"
  exit 1
fi
echo "== the ASan and TSan builds are done ($BUILDLOG)"
grep -E '^(scan-build|test-analyze):|warning:' "$ANALYZELOG"
echo "== the static analyzer is done (exit $(kept analyze); $ANALYZELOG, reports under $O/analyze/)"

# 3. the two sanitizer suites at once
eval "set -- ${TSAN_TESTS:-}"
lane_start tsan "$TSANLOG" env KT_TIMEOUT_SCALE=4 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  build/tsan/tests/kolo-tests "$@"
echo "== the TSan suite runs beside the ASan suite: its output goes to $TSANLOG, printed below when the ASan suite is done"
eval "set -- ${ASAN_TESTS:-}"
KT_TIMEOUT_SCALE=3 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$(pwd)/tests/lsan-suppressions.txt build/asan/tests/kolo-tests "$@"
keep asan $?
echo "== the ASan suite is done (exit $(kept asan)); the TSan suite's output:"
lane_show "$TSANLOG"

# 4. the install test
$MAKE test-install
keep install $?

# 5. the fuzzers' seeds
sh scripts/fuzz.sh build/fuzz 0
keep fuzz $?

echo "== test-c: plain exit $(kept plain), ASan exit $(kept asan), TSan exit $(kept tsan), install exit $(kept install)," \
  "fuzz seeds exit $(kept fuzz), analyzer exit $(kept analyze)"
[ "$(kept plain)" = 0 ] && [ "$(kept asan)" = 0 ] && [ "$(kept tsan)" = 0 ] && [ "$(kept install)" = 0 ] &&
  [ "$(kept fuzz)" = 0 ] && [ "$(kept analyze)" = 0 ]
