#!/bin/sh
# deps-spark.sh - a virtual environment with PySpark for kolo.spark's tests, made when missing.
#
# PySpark comes from PyPI (Debian has no package); it needs a Java runtime, which comes from
# Debian (default-jre-headless) when `java` is missing. The venv is made from /usr/bin/python3
# WITH the system's site-packages, so that the ranks Spark starts see Debian's python3-torch,
# -numpy and -pytest, as the other suites do; PySpark brings only py4j besides itself.
#
#   KOLO_SPARK_VENV  where (default /var/tmp/kolo-spark-venv: outside the tree, kept across `make clean`)
#   KOLO_SPARK_SPEC  what to install (default pyspark==3.5.8, the version the suite was written against)
#
# Idempotent: quiet and quick when the venv already has KOLO_SPARK_SPEC. Prints the venv's python
# on its last line. Fails loudly (non-zero exit) when anything cannot be installed: the Spark
# suite is part of `make test` and is never skipped silently.
set -eu
VENV=${KOLO_SPARK_VENV:-/var/tmp/kolo-spark-venv}
SPEC=${KOLO_SPARK_SPEC:-pyspark==3.5.8}
BASE=/usr/bin/python3
[ -x "$BASE" ] || BASE=$(command -v python3)
STAMP="$VENV/kolo-spark-spec"

ready() {
  command -v java >/dev/null 2>&1 && [ -x "$VENV/bin/python" ] &&
    [ "$(cat "$STAMP" 2>/dev/null)" = "$SPEC" ] &&
    "$VENV/bin/python" -c "import numpy, pytest, torch, pyspark" >/dev/null 2>&1
}

NAME=deps-spark
. "$(dirname "$0")/venv-common.sh"
venv_begin
if ! command -v java >/dev/null 2>&1; then
  echo "deps-spark: installing a Java runtime for Spark (default-jre-headless)" >&2
  apt_install default-jre-headless
fi

start=$(date +%s)
echo "deps-spark: installing $SPEC into $VENV (about 320 MB from PyPI on first use)" >&2
[ -x "$VENV/bin/python" ] || "$BASE" -m venv --system-site-packages "$VENV"
rm -f "$STAMP"
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$SPEC" >&2; then
  echo "deps-spark: FAILED to install $SPEC into $VENV (no network? no PyPI?). The Spark suite needs it;" \
       "install it by hand or point KOLO_SPARK_VENV at a venv that has pyspark, torch, numpy and pytest." >&2
  exit 1
fi
if ! "$VENV/bin/python" -c "import numpy, pytest, torch, pyspark" >&2; then
  echo "deps-spark: FAILED: $VENV/bin/python cannot import pyspark (or Debian's torch, numpy, pytest)" >&2
  exit 1
fi
echo "$SPEC" >"$STAMP"
echo "deps-spark: installed in $(( $(date +%s) - start )) s" >&2
echo "$VENV/bin/python"
