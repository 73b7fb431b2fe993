#!/bin/sh
# deps.sh - installs from Debian's packages what building and testing kolo needs, when missing.
# Idempotent and quiet when everything is there. Needs root (or sudo) only to install.
set -e
need=""
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in build-essential libssl-dev pkg-config python3 python3-numpy python3-pytest python3-torch python3-cloudpickle \
         openmpi-bin libopenmpi-dev libpmix-dev mpich slurmctld slurmd slurm-client munge procps iproute2 openssh-server openssh-client linux-perf gdb \
         clang libclang-rt-dev clang-tools; do
  have_pkg "$p" || need="$need $p"
done
if [ -n "$need" ]; then
  echo "deps: installing$need"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null
fi
