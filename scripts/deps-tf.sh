#!/bin/sh
# deps-tf.sh - a virtual environment with TensorFlow (CPU) for kolo.tensorflow's tests, made when missing.
#
# PyPI's TensorFlow brings its own numpy; put into /usr/bin/python3's site-packages it would shadow
# Debian's python3-numpy, against which python3-torch is built. So it lives in a venv of its own,
# made from /usr/bin/python3 without the system's site-packages:
#
#   KOLO_TF_VENV  where (default /var/tmp/kolo-tf-venv: outside the tree, kept across `make clean`)
#   KOLO_TF_SPEC  what to install (default tensorflow-cpu==2.21.0, the version the suites were written
#                 against; e.g. KOLO_TF_SPEC='tensorflow-cpu' for the newest)
#
# kolo.spark.keras's KerasEstimator is tested here too, so the venv also gets PyPI's pyspark, pyarrow
# and pandas, and Java comes from Debian (default-jre-headless) when `java` is missing.
#
# Idempotent: quiet and quick when the venv already has KOLO_TF_SPEC, numpy and pytest. Prints the
# venv's python on its last line. Fails loudly (non-zero exit) when anything cannot be installed, e.g.
# without network: the TensorFlow suites are part of `make test` and are never skipped silently.
set -eu
NAME=deps-tf
VENV=${KOLO_TF_VENV:-/var/tmp/kolo-tf-venv}
VENV_VAR=KOLO_TF_VENV
VENV_FLAGS=
SPEC=${KOLO_TF_SPEC:-tensorflow-cpu==2.21.0}
IMPORTS="numpy, pytest, tensorflow, pyspark, pyarrow, pandas"
SUITE="TensorFlow suites"
SIZE="about 650 MB"
BASE=/usr/bin/python3
[ -x "$BASE" ] || BASE=$(command -v python3)
STAMP="$VENV/kolo-tf-spec"
. "$(dirname "$0")/venv-common.sh"
ready() { command -v java >/dev/null 2>&1 && venv_ready; }

venv_begin
if ! command -v java >/dev/null 2>&1; then
  echo "deps-tf: installing a Java runtime for Spark (default-jre-headless)" >&2
  apt_install default-jre-headless
fi
venv_install "$SPEC" numpy pytest pyspark==3.5.8 pyarrow==17.0.0 pandas==2.2.3
