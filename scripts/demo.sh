#!/bin/sh
# demo.sh - the main job (`make demo`): trains a CNN on generated digits with kolo, first with
# 2 workers and then with 1 on this machine, and prints the throughput of each and the scaling
# efficiency. Each worker gets one core (one torch thread), so the comparison is per worker,
# as Horovod reports scaling. Takes about a minute on an idle 2-core machine.
#
#   sh scripts/demo.sh [extra arguments for examples/pytorch/pytorch_synthetic_digits.py]
set -e
cd "$(dirname "$0")/.."
ROOT=$(pwd)

# Debian's python3 is the one with python3-torch (a pyenv python3 first on PATH has no torch).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
if ! "$PY" -c "import torch, numpy" 2>/dev/null; then
  echo "demo: PyTorch or NumPy missing for $PY; installing Debian's python3-torch and python3-numpy"
  sh scripts/deps.sh
fi
KOLORUN=$ROOT/build/bin/kolorun
if [ ! -x "$KOLORUN" ] || [ ! -f "$ROOT/build/lib/libkolo.so" ]; then
  echo "demo: building kolo"
  make -s all
fi
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kolo-demo.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
EPOCHS=${DEMO_EPOCHS:-4}

run() {
  n=$1; shift
  echo "== $n worker(s): $KOLORUN -np $n $PY examples/pytorch/pytorch_synthetic_digits.py --epochs $EPOCHS --threads 1 $*"
  "$KOLORUN" -np "$n" "$PY" examples/pytorch/pytorch_synthetic_digits.py --epochs "$EPOCHS" --threads 1 \
      --checkpoint-dir "$TMP/ckpt$n" "$@" | tee "$TMP/out$n"
  if ! grep -q '^\[0\]<stdout>:RESULT ' "$TMP/out$n"; then
    echo "demo: the $n-worker run printed no result" >&2
    exit 1
  fi
}

run 2 "$@"
echo
run 1 "$@"

field() { sed -n "s/^\[0\]<stdout>:RESULT .*$2=\([0-9.]*\).*/\1/p" "$TMP/out$1" | tail -1; }
T2=$(field 2 img_per_sec); T1=$(field 1 img_per_sec)
A2=$(field 2 val_acc); A1=$(field 1 val_acc)
echo
echo "== kolo demo: $EPOCHS epochs of generated digits, LeNet-style CNN, batch 64 per worker, 1 core per worker"
awk -v t1="$T1" -v t2="$T2" -v a1="$A1" -v a2="$A2" 'BEGIN {
  printf "  %-9s %14s %16s %10s\n", "workers", "images/sec", "per worker", "val acc";
  printf "  %-9d %14.0f %16.0f %10.3f\n", 1, t1, t1, a1;
  printf "  %-9d %14.0f %16.0f %10.3f\n", 2, t2, t2 / 2, a2;
  printf "  speed-up %.2fx, scaling efficiency %.0f%% (throughput of 2 workers / (2 x throughput of 1))\n",
         t2 / t1, 100 * t2 / (2 * t1);
}'
load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || true)
[ -n "$load" ] && echo "  (load average during the run: $load on $(nproc) cores; other work on the machine lowers the numbers)"
exit 0
