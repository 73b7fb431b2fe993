#!/bin/sh
# bench/compare.sh - kolo side by side with Open MPI, MPICH, torch.distributed (Gloo) and Horovod.
#
#   sh bench/compare.sh [--quick] [compare.py options]      (make bench-compare runs it bare)
#
# Installs what the comparison needs when it is missing (idempotent; a second run installs nothing),
# builds the peers' benchmarks into build/bench/, then runs bench/compare.py, which writes the
# tables, CSV and plots under bench/results/. A peer that cannot be installed or built is skipped
# and the reason lands in the results. Extra arguments may also come from $KOLO_BENCH_ARGS.
#
# Debian's openmpi-bin and mpich both provide mpicc/mpirun through alternatives, so everything here
# uses the explicit binaries: mpicc.openmpi / mpirun.openmpi and mpicc.mpich / mpirun.mpich.
# Torch lives in Debian's python (/usr/bin/python3), not in whatever python3 is first on PATH.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=build/bench
mkdir -p "$OUT"
STATUS=$OUT/peer_status          # "<family>: <why it is unavailable>", read by compare.py
: > "$STATUS"
PY=/usr/bin/python3
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

say() { echo "compare.sh: $*"; }
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# ---- Debian packages
need=""
for p in build-essential openmpi-bin libopenmpi-dev mpich libmpich-dev python3-torch python3-numpy \
         libtorch-dev pybind11-dev python3-dev python3-pip cmake g++ gnuplot-nox linux-perf; do
  have_pkg "$p" || need="$need $p"
done
if [ -n "$need" ]; then
  say "installing Debian packages:$need"
  $SUDO apt-get update -qq >/dev/null 2>&1
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need \
       > "$OUT/apt.log" 2>&1; then
    # one by one, so one unavailable package does not keep the others out
    for p in $need; do
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$p" \
        >> "$OUT/apt.log" 2>&1 || say "could not install $p (see $OUT/apt.log)"
    done
  fi
fi
have_pkg gnuplot-nox || have_pkg gnuplot || have_pkg python3-matplotlib || {
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    python3-matplotlib >> "$OUT/apt.log" 2>&1 || say "no gnuplot and no matplotlib: no plots"; }

# ---- Horovod 0.28.1 from PyPI, built with Gloo against Debian's torch
HVD_VERSION=0.28.1
hvd_installed() {
  (cd / && $PY -c "import horovod, horovod.torch as h, sys; \
sys.exit(0 if horovod.__version__ == '$HVD_VERSION' and h.gloo_built() else 1)" 2>/dev/null)
}
if ! hvd_installed; then
  if ! (cd / && $PY -c "import torch" 2>/dev/null); then
    echo "horovod: not built: Debian's torch does not import with $PY" >> "$STATUS"
  else
    say "building Horovod $HVD_VERSION with Gloo against Debian's torch (about 10 minutes on 2 cores; log: $OUT/horovod-build.log)"
    # --no-build-isolation: build against the installed (Debian) torch, not a PyPI one.
    if HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
       HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 MAKEFLAGS="-j$(nproc)" \
       $PY -m pip install --break-system-packages --no-build-isolation --no-cache-dir \
         "horovod==$HVD_VERSION" > "$OUT/horovod-build.log" 2>&1 && hvd_installed; then
      say "Horovod $HVD_VERSION installed"
    else
      why=$(grep -m1 -iE "error[: ]|fatal" "$OUT/horovod-build.log" | cut -c1-200)
      echo "horovod: pip build of horovod==$HVD_VERSION failed: ${why:-see $OUT/horovod-build.log} (log: $OUT/horovod-build.log)" >> "$STATUS"
      say "Horovod did not build; going on without it (see $OUT/horovod-build.log)"
    fi
  fi
fi

# ---- the MPI benchmark, once per MPI, and the machine-limits tool
CFLAGS="-std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra"
for mpi in openmpi mpich; do
  bin=$OUT/mpi_coll_bench.$mpi
  fam=$([ $mpi = openmpi ] && echo ompi || echo mpich)
  if ! command -v "mpicc.$mpi" >/dev/null 2>&1; then
    echo "$fam: mpicc.$mpi not found (Debian package $([ $mpi = openmpi ] && echo libopenmpi-dev || echo libmpich-dev))" >> "$STATUS"
    continue
  fi
  if [ ! -x "$bin" ] || [ bench/peers/mpi_coll_bench.c -nt "$bin" ] || [ bench/perf_ctl.h -nt "$bin" ] || [ bench/bench_mem.h -nt "$bin" ]; then
    if ! "mpicc.$mpi" $CFLAGS -o "$bin" bench/peers/mpi_coll_bench.c > "$OUT/mpicc.$mpi.log" 2>&1; then
      echo "$fam: mpicc.$mpi failed: $(head -c 200 "$OUT/mpicc.$mpi.log")" >> "$STATUS"
      rm -f "$bin"
    fi
  fi
done
if [ ! -x "$OUT/machine_limits" ] || [ bench/peers/machine_limits.c -nt "$OUT/machine_limits" ]; then
  ${CC:-cc} $CFLAGS -pthread -o "$OUT/machine_limits" bench/peers/machine_limits.c || \
    say "machine_limits did not build; the results will have no bound"
fi
[ -x build/bin/kolo-bench ] || say "kolo-bench not built (make all builds it); comparing the peers only"

# ---- run
# shellcheck disable=SC2086
exec $PY bench/compare.py ${KOLO_BENCH_ARGS:-} "$@"
