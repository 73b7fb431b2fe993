#!/bin/sh
# deps-ray.sh - a virtual environment with Ray for kolo.ray's tests, made when missing.
#
# Ray comes from PyPI (Debian has no package). The venv is made from /usr/bin/python3 WITH the
# system's site-packages, so that Ray's workers see Debian's python3-torch, -numpy and -pytest, as
# the other suites do; Ray brings its own small dependencies (msgpack, protobuf, ...) besides itself.
#
#   KOLO_RAY_VENV  where (default /var/tmp/kolo-ray-venv: outside the tree, kept across `make clean`)
#   KOLO_RAY_SPEC  what to install (default ray==2.60.0, the version the suite was written against)
#
# Idempotent: quiet and quick when the venv already has KOLO_RAY_SPEC. Prints the venv's python on
# its last line. Fails loudly (non-zero exit) when anything cannot be installed: the Ray suite is
# part of `make test` and is never skipped silently.
set -eu
VENV=${KOLO_RAY_VENV:-/var/tmp/kolo-ray-venv}
SPEC=${KOLO_RAY_SPEC:-ray==2.60.0}
BASE=/usr/bin/python3
[ -x "$BASE" ] || BASE=$(command -v python3)
STAMP="$VENV/kolo-ray-spec"

ready() {
  [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$SPEC" ] &&
    "$VENV/bin/python" -c "import numpy, pytest, torch, ray" >/dev/null 2>&1
}

NAME=deps-ray
. "$(dirname "$0")/venv-common.sh"
venv_begin

start=$(date +%s)
echo "deps-ray: installing $SPEC into $VENV (about 250 MB from PyPI on first use)" >&2
[ -x "$VENV/bin/python" ] || "$BASE" -m venv --system-site-packages "$VENV"
rm -f "$STAMP"
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$SPEC" >&2; then
  echo "deps-ray: FAILED to install $SPEC into $VENV (no network? no PyPI?). The Ray suite needs it;" \
       "install it by hand or point KOLO_RAY_VENV at a venv that has ray, torch, numpy and pytest." >&2
  exit 1
fi
if ! "$VENV/bin/python" -c "import numpy, pytest, torch, ray" >&2; then
  echo "deps-ray: FAILED: $VENV/bin/python cannot import ray (or Debian's torch, numpy, pytest)" >&2
  exit 1
fi
echo "$SPEC" >"$STAMP"
echo "deps-ray: installed in $(( $(date +%s) - start )) s" >&2
echo "$VENV/bin/python"
