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
NAME=deps-ray
VENV=${KOLO_RAY_VENV:-/var/tmp/kolo-ray-venv}
VENV_VAR=KOLO_RAY_VENV
VENV_FLAGS=--system-site-packages
SPEC=${KOLO_RAY_SPEC:-ray==2.60.0}
IMPORTS="numpy, pytest, torch, ray"
SUITE="Ray suite"
SIZE="about 250 MB"
BASE=/usr/bin/python3
[ -x "$BASE" ] || BASE=$(command -v python3)
STAMP="$VENV/kolo-ray-spec"
. "$(dirname "$0")/venv-common.sh"
ready() { venv_ready; }

venv_begin
venv_install "$SPEC"
