#!/bin/sh
# compare_ddp.sh - the synthetic benchmark under kolo and under PyTorch DDP (gloo backend), with
# 1 and 2 workers, in one run; prints images/sec and scaling efficiency side by side.
#
#   sh examples/pytorch/compare_ddp.sh [benchmark arguments, e.g. --model resnet20 --batch-size 64]
#
# Same script, same model, same threads per worker; only the gradient exchange differs:
# kolo's DistributedOptimizer (hooks + engine) versus DistributedDataParallel's gloo buckets.
# Each configuration runs REPEAT times (default 1); the table shows the median.
set -e
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
KOLORUN=$ROOT/build/bin/kolorun
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
REPEAT=${REPEAT:-1}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kolo-ddp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
BENCH=examples/pytorch/pytorch_synthetic_benchmark.py

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

one() {  # framework workers rep -> prints img/sec
  fw=$1; n=$2; out="$TMP/$fw.$n.$3"; shift 3
  if [ "$fw" = ddp ]; then
    "$KOLORUN" -np "$n" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$(free_port)" "$PY" "$BENCH" --ddp --threads 1 "$@" \
      >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
  else
    "$KOLORUN" -np "$n" "$PY" "$BENCH" --threads 1 "$@" >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
  fi
  sed -n 's/.*RESULT .*img_per_sec=\([0-9.]*\).*/\1/p' "$out"
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

shift_args="$*"
for fw in kolo ddp; do for n in 1 2; do : >"$TMP/r.$fw.$n"; done; done
i=1
while [ "$i" -le "$REPEAT" ]; do
  # interleaved, so that a change of load on the machine hits both frameworks alike
  for n in 1 2; do
    for fw in kolo ddp; do
      # shellcheck disable=SC2086
      v=$(one "$fw" "$n" "$i" $shift_args)
      echo "  run $i: $fw, $n worker(s): $v img/sec"
      echo "$v" >>"$TMP/r.$fw.$n"
    done
  done
  i=$((i + 1))
done
K1=$(median <"$TMP/r.kolo.1"); K2=$(median <"$TMP/r.kolo.2")
D1=$(median <"$TMP/r.ddp.1"); D2=$(median <"$TMP/r.ddp.2")
echo
echo "== synthetic benchmark ($shift_args), images/sec in total, 1 thread per worker"
awk -v k1="$K1" -v k2="$K2" -v d1="$D1" -v d2="$D2" 'BEGIN {
  printf "  %-22s %12s %12s %12s\n", "", "1 worker", "2 workers", "efficiency";
  printf "  %-22s %12.1f %12.1f %11.0f%%\n", "kolo", k1, k2, 100 * k2 / (2 * k1);
  printf "  %-22s %12.1f %12.1f %11.0f%%\n", "PyTorch DDP (gloo)", d1, d2, 100 * d2 / (2 * d1);
  printf "  kolo / DDP with 2 workers: %.2fx\n", k2 / d2;
}'
echo "  (load average now: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores)"
