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
NAME=deps-spark
VENV=${KOLO_SPARK_VENV:-/var/tmp/kolo-spark-venv}
VENV_VAR=KOLO_SPARK_VENV
VENV_FLAGS=--system-site-packages
SPEC=${KOLO_SPARK_SPEC:-pyspark==3.5.8}
IMPORTS="numpy, pytest, torch, pyspark, pyarrow, pandas"
EXTRA="pyarrow==17.0.0 pandas==2.2.3"
SUITE="Spark suite"
SIZE="about 400 MB"
BASE=/usr/bin/python3
[ -x "$BASE" ] || BASE=$(command -v python3)
STAMP="$VENV/kolo-spark-spec"
. "$(dirname "$0")/venv-common.sh"
ready() { command -v java >/dev/null 2>&1 && venv_ready; }

venv_begin
if ! command -v java >/dev/null 2>&1; then
  echo "deps-spark: installing a Java runtime for Spark (default-jre-headless)" >&2
  apt_install default-jre-headless
fi
venv_install "$SPEC" $EXTRA
