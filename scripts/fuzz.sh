#!/bin/sh
# fuzz.sh DIR SECONDS - runs every fuzzer built under DIR/fuzz/ (make fuzz, make fuzz-regress).
#
# SECONDS > 0: each fuzzer that long, from its committed seeds (tests/fuzz/corpus/<name>/) and
# what earlier runs learned (DIR/corpus/<name>/, where new inputs go). A crash, a leak, undefined
# behaviour or an input slower than 10 s stops that fuzzer: its input is left as
# DIR/crash/<name>/crash-* (or leak-, timeout-), which `DIR/fuzz/<name> FILE` replays; copy it into
# tests/fuzz/corpus/<name>/ with the fix, so that make fuzz-regress keeps it fixed.
# SECONDS = 0: each fuzzer runs every committed seed once, and nothing else.
set -u
dir=$1
secs=$2
failed=""
ran=0
for bin in "$dir"/fuzz/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  seeds=tests/fuzz/corpus/$name
  mkdir -p "$seeds" "$dir/crash/$name"
  ran=$((ran + 1))
  if [ "$secs" -gt 0 ]; then
    mkdir -p "$dir/corpus/$name"
    echo "fuzz: $name for $secs s"
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$dir/crash/$name/" "$dir/corpus/$name" "$seeds" > "$dir/$name.log" 2>&1
  else
    "$bin" -runs=0 -timeout=10 -rss_limit_mb=4096 -artifact_prefix="$dir/crash/$name/" "$seeds" \
      > "$dir/$name.log" 2>&1
  fi
  rc=$?
  if [ $rc -ne 0 ]; then
    failed="$failed $name"
    echo "fuzz: $name FAILED (exit $rc); its log, $dir/$name.log, ends:"
    tail -n 40 "$dir/$name.log" | sed 's/^/    /'
  else
    stats=$(grep -E "stat::number_of_executed_runs|INITED|DONE" "$dir/$name.log" | tr -s ' ' | tr '\n' ' ')
    echo "fuzz: $name ok ($stats)"
  fi
done
if [ $ran -eq 0 ]; then
  echo "fuzz: no fuzzer under $dir/fuzz" >&2
  exit 1
fi
if [ -n "$failed" ]; then
  echo "fuzz: $(echo $failed | wc -w) of $ran failed:$failed"
  exit 1
fi
echo "fuzz: $ran passed, 0 failed"
