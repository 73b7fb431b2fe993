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
# Idempotent: quiet and quick when the venv already has KOLO_TF_SPEC, numpy and pytest. Prints the
# venv's python on its last line. Fails loudly (non-zero exit) when anything cannot be installed, e.g.
# without network: the TensorFlow suites are part of `make test` and are never skipped silently.
set -eu
VENV=${KOLO_TF_VENV:-/var/tmp/kolo-tf-venv}
SPEC=${KOLO_TF_SPEC:-tensorflow-cpu==2.21.0}
BASE=/usr/bin/python3
[ -x "$BASE" ] || BASE=$(command -v python3)
STAMP="$VENV/kolo-tf-spec"

ready() {
  [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$SPEC" ] &&
    "$VENV/bin/python" -c "import numpy, pytest, tensorflow" >/dev/null 2>&1
}

NAME=deps-tf
. "$(dirname "$0")/venv-common.sh"
venv_begin

start=$(date +%s)
echo "deps-tf: installing $SPEC, numpy and pytest into $VENV (about 250 MB from PyPI on first use)" >&2
[ -x "$VENV/bin/python" ] || "$BASE" -m venv "$VENV"
rm -f "$STAMP"
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$SPEC" numpy pytest >&2; then
  echo "deps-tf: FAILED to install $SPEC into $VENV (no network? no PyPI?). The TensorFlow suites need it;" \
       "install it by hand or point KOLO_TF_VENV at a venv that has tensorflow, numpy and pytest." >&2
  exit 1
fi
if ! "$VENV/bin/python" -c "import numpy, pytest, tensorflow" >&2; then
  echo "deps-tf: FAILED: $VENV/bin/python cannot import tensorflow after installing $SPEC" >&2
  exit 1
fi
echo "$SPEC" >"$STAMP"
echo "deps-tf: installed in $(( $(date +%s) - start )) s" >&2
echo "$VENV/bin/python"
