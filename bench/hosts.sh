#!/bin/sh
# bench/hosts.sh - kolo across hosts on one machine: the flat ring against the hierarchical
# collectives (src/coll/hier.c), with two network namespaces standing for two hosts.
#
#   sh bench/hosts.sh [--rate 10gbit|none] [--per-host L] [--rounds R] [--coll allreduce|allgather|reducescatter|engine]
#                     [--min SIZE] [--max SIZE] [--iters N] [--gloo]
#
# Needs root (ip netns, tc) and a built tree (make all). The namespaces "kh<pid>a" and "kh<pid>b"
# are joined by a veth pair (10.79.0.1 and .2), its sending side shaped by tc's token bucket to
# --rate (default 10gbit; none: as fast as the kernel copies); each runs --per-host ranks (2),
# started by hand (KOLO_RANK, KOLO_RENDEZVOUS, rank 0 serving the store). Every round runs the
# collective once with KOLO_HIERARCHICAL_ALLREDUCE/_ALLGATHER=0 (the flat ring) and once with 1,
# one after the other, and the table gives each size's median time over the rounds and the
# median of the rounds' ratios, hierarchical over flat (below 1: hierarchical is faster).
# --coll engine runs engine-bench (ResNet-50's gradients through the engine) instead of
# kolo-bench. --gloo adds torch.distributed's Gloo (bench/peers/torch_dist_bench.py, Debian's
# python3-torch) to every round, the same ranks in the same namespaces, and compares kolo's
# hierarchical run with it (in place for allreduce, Gloo's only form; out of place for
# allgather). The namespaces are deleted at the end, however the script ends.
set -eu
RATE=10gbit PER=2 ROUNDS=3 COLL=allreduce MIN=128K MAX=64M ITERS=10 GLOO=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE=$2; shift 2 ;;
    --per-host) PER=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --coll) COLL=$2; shift 2 ;;
    --min) MIN=$2; shift 2 ;;
    --max) MAX=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --gloo) GLOO=1; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "hosts.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
case "$COLL" in allreduce|allgather|reducescatter|engine) ;;
  *) echo "hosts.sh: --coll allreduce, allgather, reducescatter or engine" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "hosts.sh: needs root (ip netns, tc)" >&2; exit 2; }
BIN=build/bin/kolo-bench
[ "$COLL" = engine ] && BIN=build/bin/engine-bench
[ -x "$BIN" ] || { echo "hosts.sh: $BIN not built (make all)" >&2; exit 2; }
if [ "$GLOO" = 1 ]; then
  case "$COLL" in allreduce|allgather) ;; *) echo "hosts.sh: --gloo compares allreduce or allgather (torch 1.13's Gloo has no reduce-scatter)" >&2; exit 2 ;; esac
  /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
    { echo "hosts.sh: --gloo needs Debian's python3-torch (/usr/bin/python3)" >&2; exit 2; }
fi

A=kh$$a B=kh$$b TMP=$(mktemp -d)
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT INT TERM
ip netns add "$A"
ip netns add "$B"
ip link add "v$$a" type veth peer name "v$$b"
ip link set "v$$a" netns "$A"
ip link set "v$$b" netns "$B"
ip -n "$A" addr add 10.79.0.1/24 dev "v$$a"
ip -n "$B" addr add 10.79.0.2/24 dev "v$$b"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "v$$a" up
ip -n "$B" link set "v$$b" up
if [ "$RATE" != none ]; then
  ip netns exec "$A" tc qdisc add dev "v$$a" root tbf rate "$RATE" burst 256kb latency 50ms
  ip netns exec "$B" tc qdisc add dev "v$$b" root tbf rate "$RATE" burst 256kb latency 50ms
fi

N=$((2 * PER))
run() { # run HIER|g ROUND: one launch (g: Gloo), rank 0's output into $TMP/out.HIER.ROUND
  h=$1 rnd=$2
  port=$((20000 + $(od -An -N2 -tu2 /dev/urandom) % 20000))
  r=0
  while [ $r -lt $N ]; do
    ns=$A dev=v$$a
    [ $r -ge $PER ] && ns=$B dev=v$$b
    if [ "$h" = g ]; then
      ip netns exec "$ns" env RANK=$r WORLD_SIZE=$N LOCAL_RANK=$((r % PER)) MASTER_ADDR=10.79.0.1 MASTER_PORT=$port \
        GLOO_SOCKET_IFNAME=$dev /usr/bin/python3 bench/peers/torch_dist_bench.py "$COLL" -b "$MIN" -e "$MAX" \
        -n "$ITERS" -w 3 -c 1 > "$TMP/out.$h.$rnd.$r" 2>&1 &
    else
      if [ "$COLL" = engine ]; then set -- -n "$ITERS" -w 2 -s 1; else set -- "$COLL" -b "$MIN" -e "$MAX" -n "$ITERS" -w 3 -c 1; fi
      ip netns exec "$ns" env KOLO_RANK=$r KOLO_SIZE=$N KOLO_RENDEZVOUS=10.79.0.1:$port KOLO_RENDEZVOUS_SERVER=rank0 \
        KOLO_JOB_ID=hosts$$.$h.$rnd KOLO_HIERARCHICAL_ALLREDUCE=$h KOLO_HIERARCHICAL_ALLGATHER=$h \
        "$BIN" "$@" > "$TMP/out.$h.$rnd.$r" 2>&1 &
    fi
    r=$((r + 1))
  done
  wait
  cp "$TMP/out.$h.$rnd.0" "$TMP/out.$h.$rnd"
}
i=1
while [ $i -le "$ROUNDS" ]; do
  run 0 $i
  run 1 $i
  [ "$GLOO" = 1 ] && run g $i
  i=$((i + 1))
done

echo "# kolo across 2 hosts of $PER ranks (network namespaces, veth $RATE), $COLL, $ROUNDS rounds, $(date -u +%Y-%m-%dT%H:%MZ)"
python3 - "$TMP" "$ROUNDS" "$COLL" "$GLOO" <<'EOF'
import statistics, sys
tmp, rounds, coll, gloo = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
def num(s):
    try:
        return float(s)
    except ValueError:
        return None  # "-": a form this peer does not run
def rows(h, r):
    out = {}
    for line in open(f"{tmp}/out.{h}.{r}"):
        f = line.split()
        if coll == "engine":
            if line.startswith("engine step"):
                out["step"] = (float(f[-5]), float(f[-5]))
        elif f and f[0].isdigit() and len(f) >= 13:
            if f[8] not in ("0", "N/A", "-") or f[12] not in ("0", "N/A", "-"):
                sys.exit(f"hosts.sh: wrong results in {tmp}/out.{h}.{r}: {line.strip()}")
            out[int(f[0])] = (num(f[5]), num(f[9]))
    if not out:
        sys.exit(f"hosts.sh: no results in {tmp}/out.{h}.{r}:\n" + open(f"{tmp}/out.{h}.{r}").read()[-2000:])
    return out
runs = (0, 1, "g") if gloo else (0, 1)
data = {(h, r): rows(h, r) for h in runs for r in range(1, rounds + 1)}
keys = sorted(data[(0, 1)], key=lambda k: (isinstance(k, str), k))
unit = "ms" if coll == "engine" else "us"
col = 1 if coll == "allreduce" else 0  # Gloo's form: in place for allreduce, out of place for allgather
head = f"| {'' if coll == 'engine' else 'size (B)'} | flat {unit} | hierarchical {unit} | hierarchical / flat |"
if gloo:
    head += f" hierarchical {'in place' if col else 'out of place'} {unit} | Gloo {unit} | kolo / Gloo |"
print(head)
print("|---:" * head.count(" | ") + "|---:|")
med = statistics.median
for k in keys:
    flat = [data[(0, r)][k][0] for r in range(1, rounds + 1)]
    hier = [data[(1, r)][k][0] for r in range(1, rounds + 1)]
    name = "ResNet-50 step" if k == "step" else f"{k}"
    line = f"| {name} | {med(flat):.1f} | {med(hier):.1f} | {med(h / f for h, f in zip(hier, flat)):.2f} |"
    if gloo:
        kh = [data[(1, r)][k][col] for r in range(1, rounds + 1)]
        gl = [data[("g", r)].get(k, (None, None))[col] for r in range(1, rounds + 1)]
        if None in gl:
            line += " | - | - |"
        else:
            line += f" {med(kh):.1f} | {med(gl):.1f} | {med(a / b for a, b in zip(kh, gl)):.2f} |"
    print(line)
EOF
