#!/bin/sh
# test-python.sh - kolo's Python test suites (`make test-python`, also the last part of `make test`).
#
#   1. the multi-rank suites (python/tests/test_*.py) under `kolorun -np 2`, then under
#      `kolorun -np 3` (sizes that are not a power of two: uneven rows, rings of three);
#   2. the job suite (python/tests/test_jobs.py), outside kolorun: it starts its own jobs
#      (failures, lost peers, stalls, pip install, the examples);
#   3. the Spark suites (python/tests/test_spark.py: kolo.spark.run on a local[2] Spark, and
#      test_spark_estimator.py: the estimators of kolo.spark.torch), outside
#      kolorun, with the python of a venv that adds PyPI's pyspark to Debian's python3 packages
#      (scripts/deps-spark.sh makes it, and installs a Java runtime when there is none);
#      KOLO_SPARK_PYTHON=/path/to/python uses another interpreter, KOLO_TEST_SPARK=0 leaves it out;
#   4. the Ray suite (python/tests/test_ray.py: kolo.ray.RayExecutor on a local Ray cluster), outside
#      kolorun, with the python of a venv that adds PyPI's ray to Debian's python3 packages
#      (scripts/deps-ray.sh makes it); KOLO_RAY_PYTHON=/path/to/python uses another interpreter,
#      KOLO_TEST_RAY=0 leaves it out;
#   5. the TensorFlow suite (python/tests/test_tensorflow.py: kolo.tensorflow, kolo.keras) under
#      `kolorun -np 3` (KOLO_TEST_TF_NP="2 3": under -np 2 first), then its example job and
#      kolo.spark.keras's estimator (test_spark_keras_estimator.py, on a local[2] Spark) outside
#      kolorun, with the python of a venv
#      that has TensorFlow from PyPI (scripts/deps-tf.sh makes it on first use; PyPI's numpy must not
#      reach Debian's python3, whose torch is built against Debian's numpy). KOLO_TF_PYTHON=/path/to/python
#      uses another interpreter; KOLO_TEST_TF=0 leaves these suites out (said in the summary),
#      KOLO_TEST_TF=only runs nothing else (`make test-tensorflow`). A venv that cannot be made (no
#      network) fails the run.
# Exits non-zero when any suite fails. Extra arguments go to every pytest (e.g. -x, -k name). The
# suites outside kolorun print their 5 slowest tests (how near each comes to its deadline).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)

# Debian's python3 is the one with python3-torch, -numpy and -pytest (a pyenv python3 may come
# first on PATH without them). KOLO_TEST_PYTHON=/path/to/venv/bin/python runs the suites under
# another interpreter (e.g. PyTorch 2.x from PyPI: make test-python-torch2); that one must bring
# numpy, pytest and torch itself.
if [ -n "${KOLO_TEST_PYTHON:-}" ]; then
  PY=$KOLO_TEST_PYTHON
  if ! "$PY" -c "import numpy, pytest, torch" 2>/dev/null; then
    echo "test-python: KOLO_TEST_PYTHON=$PY cannot import numpy, pytest and torch" >&2
    exit 1
  fi
else
  PY=/usr/bin/python3
  [ -x "$PY" ] || PY=$(command -v python3)
  if ! "$PY" -c "import numpy, pytest, torch" 2>/dev/null; then
    echo "test-python: installing numpy, pytest and torch for $PY (scripts/deps.sh)"
    sh scripts/deps.sh || exit 1
  fi
fi
VERSIONS=$("$PY" -c "import sys, numpy, pytest, torch; print('python %s, torch %s, numpy %s, pytest %s' % (sys.version.split()[0], torch.__version__, numpy.__version__, pytest.__version__))" 2>/dev/null)
echo "test-python: $PY: $VERSIONS"
if [ ! -x build/bin/kolorun ] || [ ! -f build/lib/libkolo.so ]; then
  echo "test-python: building kolo first"
  make -s all || exit 1
fi
KOLORUN=$ROOT/build/bin/kolorun
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
export COLUMNS=${COLUMNS:-200}  # pytest's summary lines keep the failure's reason
export KOLO_TEST_TIMEOUT=${KOLO_TEST_TIMEOUT:-60}
# A stalled name (a test that failed on one rank only) becomes an error instead of a wait.
export KOLO_STALL_SHUTDOWN_TIME=${KOLO_STALL_SHUTDOWN_TIME:-45}

LOG=$(mktemp -d "${TMPDIR:-/tmp}/kolo-pytest.XXXXXX")
trap 'rm -rf "$LOG"' EXIT INT TERM
MULTI="python/tests/test_basics.py python/tests/test_numpy.py python/tests/test_torch_ops.py python/tests/test_torch_optimizer.py python/tests/test_elastic.py"
status=0
summary=""

run() {  # label, command...
  label=$1; shift
  echo "== $label: $*"
  start=$(date +%s)
  "$@" 2>&1 | tee "$LOG/out" | grep -v -E '^\[[0-9]+\]<stdout>: *$'
  rc=$(cat "$LOG/rc" 2>/dev/null || echo 1)
  took=$(( $(date +%s) - start ))
  # the summary line of every rank (pytest prints "N passed, M failed in T s"), then the tests
  # that failed, from -rfEx's "FAILED file::test - reason" lines, each once with the number of
  # ranks that reported it: the end of the log alone then names them
  lines=$(grep -E '(passed|failed|error|no tests ran).* in [0-9.]+s' "$LOG/out" | sed 's/^/    /')
  failed=$(sed -n 's/^\(\[[0-9]*\]<stdout>:\)\{0,1\}\(\(FAILED\|ERROR\|XPASS\) .*\)$/\2/p' "$LOG/out" |
           cut -c1-300 | sort | uniq -c | sed 's/^ *\([0-9]*\) /    (\1x) /')
  # and the first lines of the first failure's explanation (pytest's "E   ..." lines)
  # from one rank
  who=$(grep -m 1 -oE '^(\[[0-9]+\]<stdout>:)?E  ' "$LOG/out")
  explain=$(grep -F "$who" "$LOG/out" | grep -m 12 -E '^(\[[0-9]+\]<stdout>:)?E  ' | cut -c1-220 | sed 's/^/      /')
  [ -z "$failed" ] || lines="$lines
$failed
$explain"
  summary="$summary
  $label: exit $rc after ${took}s
$lines"
  [ "$rc" = 0 ] || status=1
}

# A suite's interpreter could not be found or made: the suite fails, and the summary says why.
no_python() {  # label, what the python lacks, the python (empty when its script failed), the script
  echo "test-python: no python with $2 (${3:-$4 failed}); the $1 suites FAIL" >&2
  summary="$summary
  $1: FAILED: no python with $2 (${3:-$4 failed}); see above"
  status=1
}

# tee hides the command's exit code: keep it in a file
wrap() { "$@"; echo $? >"$LOG/rc"; }

# A suite outside kolorun with the python of a venv its script makes: label, KOLO_TEST_<X> (0
# leaves it out), KOLO_<X>_PYTHON (another interpreter), the module it needs, the script, the tests
# and pytest's extra arguments. True when the suite ran (whether it passed or not).
venv_suite() {
  label=$1 skip=${2:-1} vpy=$3 module=$4 script=$5 tests=$6
  shift 6
  if [ "$skip" = 0 ]; then
    summary="$summary
  $label: SKIPPED (KOLO_TEST_$(echo "$label" | tr a-z A-Z)=0)"
    return 1
  fi
  vpy=${vpy:-$(sh "$script" | tail -n 1)}
  vv=$("$vpy" -c "import $module; print('$module %s' % $module.__version__)" 2>/dev/null)
  if [ -z "$vv" ]; then
    no_python "$label" "$module" "$vpy" "$script"
    return 1
  fi
  # shellcheck disable=SC2086 # tests: one or more files
  run "$label" wrap "$vpy" -m pytest -q -rfEx -p no:cacheprovider --durations=5 $tests "$@"
  VERSIONS="$VERSIONS; $vpy: $vv"
}

TF=${KOLO_TEST_TF:-1}
if [ "$TF" != only ]; then
  run "2 ranks" wrap "$KOLORUN" -np 2 "$PY" -m pytest -q -rfEx -p no:cacheprovider $MULTI "$@"
  run "3 ranks" wrap "$KOLORUN" -np 3 "$PY" -m pytest -q -rfEx -p no:cacheprovider $MULTI "$@"
  run "jobs" wrap "$PY" -m pytest -q -rfEx -p no:cacheprovider --durations=5 python/tests/test_jobs.py python/tests/test_elastic.py "$@"
  venv_suite spark "${KOLO_TEST_SPARK:-1}" "${KOLO_SPARK_PYTHON:-}" pyspark scripts/deps-spark.sh \
    "python/tests/test_spark.py python/tests/test_spark_estimator.py" "$@" &&
    VERSIONS="$VERSIONS, java $(java -version 2>&1 | head -n 1 | cut -d'"' -f2)"
  venv_suite ray "${KOLO_TEST_RAY:-1}" "${KOLO_RAY_PYTHON:-}" ray scripts/deps-ray.sh python/tests/test_ray.py "$@"
fi

if [ "$TF" = 0 ]; then
  summary="$summary
  tensorflow: SKIPPED (KOLO_TEST_TF=0)"
else
  start=$(date +%s)
  if [ -n "${KOLO_TF_PYTHON:-}" ]; then
    TFPY=$KOLO_TF_PYTHON
  else
    TFPY=$(sh scripts/deps-tf.sh | tail -n 1)
  fi
  TFVERSIONS=$(TF_CPP_MIN_LOG_LEVEL=2 "$TFPY" -c "import sys, numpy, tensorflow as tf
print('python %s, tensorflow %s, keras %s, numpy %s' % (sys.version.split()[0], tf.__version__,
      getattr(tf.keras, '__version__', '2 (tf_keras)'), numpy.__version__))" 2>/dev/null)
  if [ -z "$TFVERSIONS" ]; then
    no_python tensorflow TensorFlow "$TFPY" scripts/deps-tf.sh
  else
    echo "test-python: $TFPY: $TFVERSIONS (ready in $(( $(date +%s) - start ))s)"
    export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
    TFSUITE="python/tests/test_tensorflow.py python/tests/test_tensorflow_elastic.py python/tests/test_spark_keras_estimator.py"
    # at 3 ranks (uneven shares, rings of three, more ranks than cores): the bindings' code does
    # not branch on the job's size, and the core's 2-rank paths run in the PyTorch suites and the
    # C suite; KOLO_TEST_TF_NP="2 3" runs it at 2 ranks too
    for tfnp in ${KOLO_TEST_TF_NP:-3}; do
      run "tensorflow $tfnp ranks" wrap "$KOLORUN" -np "$tfnp" "$TFPY" -m pytest -q -rfEx -p no:cacheprovider $TFSUITE "$@"
    done
    run "tensorflow jobs" wrap "$TFPY" -m pytest -q -rfEx -p no:cacheprovider --durations=5 $TFSUITE "$@"
    VERSIONS="$VERSIONS; $TFPY: $TFVERSIONS"
  fi
fi

echo
echo "== Python test summary ($PY: $VERSIONS)$summary"
if [ "$status" = 0 ]; then echo "== all Python suites passed"; else echo "== some Python suites FAILED"; fi
exit $status
