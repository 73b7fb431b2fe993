# venv-common.sh - what deps-tf.sh, deps-spark.sh and deps-ray.sh share in making a venv for a test suite.
# Sourced after setting NAME (for messages), VENV, BASE (the python that makes the venv) and a
# function ready() that is true when the venv has everything its suite needs.

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
