# venv-common.sh - what deps-tf.sh, deps-spark.sh and deps-ray.sh share in making a venv for a test suite.
# Sourced after setting NAME (for messages), VENV, BASE (the python that makes the venv) and what
# venv_install below names; the script then defines ready(), true when the venv has everything its
# suite needs (venv_ready, and anything else), and calls venv_begin, then venv_install.

apt_install() {  # Debian packages, as root or through sudo
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# When ready, prints the venv's python and exits 0. Otherwise takes the venv's lock (one installer
# at a time: two checkouts may share the venv), exits the same way if another installer finished
# meanwhile, and makes sure BASE can make venvs (Debian's python3 needs python3-venv for ensurepip).
venv_begin() {
  if ready; then
    echo "$VENV/bin/python"
    exit 0
  fi
  mkdir -p "$(dirname "$VENV")"
  exec 9>"$VENV.lock"
  if command -v flock >/dev/null 2>&1; then
    flock 9
  fi
  if ready; then
    echo "$VENV/bin/python"
    exit 0
  fi
  if ! "$BASE" -c "import ensurepip, venv" >/dev/null 2>&1; then
    echo "$NAME: installing python3-venv" >&2
    apt_install python3-venv
  fi
}

# True when the venv has SPEC (its stamp) and imports IMPORTS.
venv_ready() {
  [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$SPEC" ] &&
    "$VENV/bin/python" -c "import $IMPORTS" >/dev/null 2>&1
}

# Makes the venv (from BASE, with VENV_FLAGS), pip-installs "$@", checks that IMPORTS import,
# stamps SPEC and prints the venv's python; on any failure says why and exits 1. Uses NAME,
# VENV, VENV_VAR (the variable that names another venv), BASE, STAMP, SPEC, IMPORTS, SUITE (what
# needs it) and SIZE (how much comes from PyPI on first use).
venv_install() {
  start=$(date +%s)
  echo "$NAME: installing $* into $VENV ($SIZE from PyPI on first use)" >&2
  [ -x "$VENV/bin/python" ] || "$BASE" -m venv $VENV_FLAGS "$VENV"
  rm -f "$STAMP"
  if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2; then
    echo "$NAME: FAILED to install $* into $VENV (no network? no PyPI?). The $SUITE needs it;" \
         "install it by hand or point $VENV_VAR at a venv that has $IMPORTS." >&2
    exit 1
  fi
  if ! "$VENV/bin/python" -c "import $IMPORTS" >&2; then
    echo "$NAME: FAILED: $VENV/bin/python cannot import $IMPORTS after installing $*" >&2
    exit 1
  fi
  echo "$SPEC" >"$STAMP"
  echo "$NAME: installed in $(( $(date +%s) - start )) s" >&2
  echo "$VENV/bin/python"
}
