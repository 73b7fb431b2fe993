#!/bin/sh
# demo.sh - the main job (run by `make demo`): allreduce throughput on 4 local ranks with kolo-bench.
set -e
cd "$(dirname "$0")/.."
echo "== kolo-bench allreduce, 4 ranks on this machine (shared memory) =="
build/bin/kolo-bench allreduce -np 4 -b 8 -e 64M -f 4 -n 10 -w 3
