#!/bin/sh
# bench/hosts.sh - kolo across hosts on one machine: the flat ring against the hierarchical
# collectives (src/coll/hier.c), with two network namespaces standing for two hosts.
#
#   sh bench/hosts.sh [--rate 10gbit|none] [--per-host L] [--rounds R]
#                     [--coll allreduce|allgather|reducescatter|engine] [--min SIZE] [--max SIZE]
#                     [--iters N] [--gloo] [--ompi] [--calls] [--out FILE]
#
# Needs root (ip netns, tc) and a built tree (make all). The namespaces "kh<pid>a" and "kh<pid>b"
# are joined by a veth pair (10.79.0.1 and .2), its sending side shaped by tc's token bucket to
# --rate (default 10gbit; none: as fast as the kernel copies); each runs --per-host ranks (2),
# started by hand (KOLO_RANK, KOLO_RENDEZVOUS, rank 0 serving the store). Every round runs the
# collective once with KOLO_HIERARCHICAL_ALLREDUCE/_ALLGATHER=0 (flat: the ring, or for
# allreduce and the engine's buckets recursive halving) and once with 1, one after the other,
# sizes up to 1 MiB in a launch of their own with 5N calls a size, larger ones with N (--iters,
# 10); the table gives each size's median time over the rounds and the median of the rounds'
# ratios, hierarchical over flat (below 1: hierarchical is faster).
# --calls times every call instead (kolo-bench --calls 1, mpi_coll_bench -C 1: the slowest
# rank's time of each) and gives the median and the 90th percentile of all the rounds' calls
# together, the ratios of those: a launch's mean moves with its few slow calls (4 ranks taking
# turns on 2 vCPUs, TCP's stalls), which hides what most calls take. Not with --gloo or the engine.
# --coll engine runs engine-bench (ResNet-50's gradients through the engine) instead of
# kolo-bench. --gloo adds torch.distributed's Gloo (bench/peers/torch_dist_bench.py, Debian's
# python3-torch) to every round, the same ranks in the same namespaces, and compares kolo's
# hierarchical run with it (in place for allreduce, Gloo's only form; out of place for
# allgather). --ompi adds Open MPI (bench/peers/mpi_coll_bench.c, Debian's openmpi-bin, built here
# when missing) the same way: one mpirun in the first namespace starts the ranks of both, the
# second through an rsh agent that enters its namespace; each namespace has its own host name
# (unshare --uts) so that Open MPI sees two nodes (vader within, tcp between). Ranks of both yield
# when idle (below). --out FILE also writes the table, with the machine and versions, as
# Markdown. The namespaces are deleted at the end, however the script ends.
set -eu
RATE=10gbit PER=2 ROUNDS=3 COLL=allreduce MIN=128K MAX=64M ITERS=10 GLOO=0 OMPI=0 CALLS=0 OUT=
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
    --ompi) OMPI=1; shift ;;
    --calls) CALLS=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "hosts.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
case "$COLL" in allreduce|allgather|reducescatter|engine) ;;
  *) echo "hosts.sh: --coll allreduce, allgather, reducescatter or engine" >&2; exit 2 ;; esac
[ "$CALLS" = 0 ] || { [ "$GLOO" = 0 ] && [ "$COLL" != engine ]; } ||
  { echo "hosts.sh: --calls times kolo-bench's and Open MPI's calls, not with --gloo or --coll engine" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "hosts.sh: needs root (ip netns, tc)" >&2; exit 2; }
BIN=build/bin/kolo-bench
[ "$COLL" = engine ] && BIN=build/bin/engine-bench
[ -x "$BIN" ] || { echo "hosts.sh: $BIN not built (make all)" >&2; exit 2; }
if [ "$GLOO" = 1 ]; then
  case "$COLL" in allreduce|allgather) ;; *) echo "hosts.sh: --gloo compares allreduce or allgather (torch 1.13's Gloo has no reduce-scatter)" >&2; exit 2 ;; esac
  /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
    { echo "hosts.sh: --gloo needs Debian's python3-torch (/usr/bin/python3)" >&2; exit 2; }
fi
MPIB=build/bench/mpi_coll_bench.openmpi
if [ "$OMPI" = 1 ]; then
  [ "$COLL" != engine ] || { echo "hosts.sh: --ompi compares collectives, not the engine's step" >&2; exit 2; }
  command -v mpirun.openmpi >/dev/null && command -v mpicc.openmpi >/dev/null ||
    { echo "hosts.sh: --ompi needs Debian's openmpi-bin and libopenmpi-dev" >&2; exit 2; }
  command -v unshare >/dev/null || { echo "hosts.sh: --ompi needs unshare (util-linux)" >&2; exit 2; }
  if [ ! -x "$MPIB" ] || [ bench/peers/mpi_coll_bench.c -nt "$MPIB" ]; then
    mkdir -p build/bench
    mpicc.openmpi -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -o "$MPIB" bench/peers/mpi_coll_bench.c
  fi
fi

for v in "--rounds $ROUNDS" "--iters $ITERS" "--per-host $PER"; do
  case "${v#* }" in
    '' | *[!0-9]* | 0) echo "hosts.sh: ${v% *} takes a whole number above 0, not '${v#* }'" >&2; exit 2 ;;
  esac
done
bytes() { # 32K, 1M, 4096 -> bytes
  case "$1" in
    *[!0-9kKmMgG]* | [!0-9]* | *[kKmMgG]?*)
      echo "hosts.sh: '$1' is not a size (4096, 32K, 64M, 1G)" >&2; exit 2 ;;
    *[kK]) echo $((${1%?} << 10)) ;; *[mM]) echo $((${1%?} << 20)) ;; *[gG]) echo $((${1%?} << 30)) ;;
    *) echo "$1" ;; esac
}
# Up to 1 MiB a call takes tens of microseconds to a millisecond, and a few slow calls (4 ranks
# taking turns on 2 vCPUs) move a launch's mean by much: the same 256 KiB allreduce averaged
# 220-500 us over 50 calls from launch to launch, 0.3-1.07 ms over 10. Those sizes run in a
# launch of their own with 5x the calls (and 5 to warm up).
SMALL_TOP=$((1 << 20))
BANDS=
if [ "$COLL" = engine ]; then BANDS="- - $ITERS 2"
else
  lo=$(bytes "$MIN") && hi=$(bytes "$MAX") || exit 2
  [ "$lo" -ge 1 ] && [ "$hi" -ge "$lo" ] ||
    { echo "hosts.sh: --min ($MIN) must be 1 or more and --max ($MAX) at least --min" >&2; exit 2; }
  if [ "$lo" -le $SMALL_TOP ]; then
    top=$hi; [ "$top" -gt $SMALL_TOP ] && top=$SMALL_TOP
    BANDS="$lo $top $((ITERS * 5)) 5"
  fi
  if [ "$hi" -gt $SMALL_TOP ]; then
    b=$lo; [ "$b" -le $SMALL_TOP ] && b=$((SMALL_TOP * 2))
    BANDS="$BANDS $b $hi $ITERS 3"
  fi
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
# Each namespace's ranks see the machine's cores as their host's, but the other namespace's ranks
# run on them too, and ranks spinning while they wait take the cores from the ranks they wait for
# (kolo's flat 128 KiB allreduce took 558 us spinning, 163 us yielding). kolo counts the ranks on
# the machine's cores across namespaces (kolo__core_sharers, src/net/mesh.c) and yields at once;
# Open MPI cannot tell, and is told to (mpi_yield_when_idle). KOLO_SPIN_US passes through if set.
# Open MPI's rsh agent: `agent HOST COMMAND...` runs COMMAND in HOST's namespace, under its name
cat > "$TMP/agent" <<AGENT
#!/bin/sh
case "\$1" in 10.79.0.1) ns=$A name=hosta ;; 10.79.0.2) ns=$B name=hostb ;;
  *) echo "hosts.sh agent: unknown host \$1" >&2; exit 1 ;; esac
shift
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$name; \$*"
AGENT
chmod +x "$TMP/agent"
launch() { # launch HIER|g|m ROUND LO HI ITERS WARMUP: one launch (g: Gloo, m: Open MPI), rank 0's output added to $TMP/out.HIER.ROUND
  h=$1 rnd=$2 lo=$3 hi=$4 it=$5 wu=$6
  if [ "$h" = m ]; then
    ip netns exec "$A" unshare --uts sh -c 'hostname hosta; exec "$@"' sh mpirun.openmpi --allow-run-as-root \
      -np $N -H 10.79.0.1:$PER,10.79.0.2:$PER --mca plm_rsh_agent "$TMP/agent" --mca plm_rsh_no_tree_spawn 1 \
      --mca oob_tcp_if_include 10.79.0.0/24 --mca btl_tcp_if_include 10.79.0.0/24 --mca pml ob1 \
      --mca btl self,vader,tcp --mca mpi_yield_when_idle 1 \
      "$MPIB" "$COLL" -b "$lo" -e "$hi" -n "$it" -w "$wu" -c 1 -C "$CALLS" > "$TMP/launch" 2>&1 ||
      { echo "hosts.sh: Open MPI failed:" >&2; tail -20 "$TMP/launch" >&2; exit 1; }
    cat "$TMP/launch" >> "$TMP/out.$h.$rnd"
    return
  fi
  port=$((20000 + $(od -An -N2 -tu2 /dev/urandom) % 20000))
  r=0
  while [ $r -lt $N ]; do
    ns=$A dev=v$$a
    [ $r -ge $PER ] && ns=$B dev=v$$b
    if [ "$h" = g ]; then
      ip netns exec "$ns" env RANK=$r WORLD_SIZE=$N LOCAL_RANK=$((r % PER)) MASTER_ADDR=10.79.0.1 MASTER_PORT=$port \
        GLOO_SOCKET_IFNAME=$dev /usr/bin/python3 bench/peers/torch_dist_bench.py "$COLL" -b "$lo" -e "$hi" \
        -n "$it" -w "$wu" -c 1 > "$TMP/out.$r" 2>&1 &
    else
      if [ "$COLL" = engine ]; then set -- -n "$it" -w "$wu" -s 1; else set -- "$COLL" -b "$lo" -e "$hi" -n "$it" -w "$wu" -c 1 --calls "$CALLS"; fi
      ip netns exec "$ns" env KOLO_RANK=$r KOLO_SIZE=$N KOLO_RENDEZVOUS=10.79.0.1:$port KOLO_RENDEZVOUS_SERVER=rank0 \
        KOLO_JOB_ID=hosts$$.$h.$rnd.$port KOLO_HIERARCHICAL_ALLREDUCE=$h KOLO_HIERARCHICAL_ALLGATHER=$h \
        "$BIN" "$@" > "$TMP/out.$r" 2>&1 &
    fi
    r=$((r + 1))
  done
  wait
  cat "$TMP/out.0" >> "$TMP/out.$h.$rnd"
}
i=1
while [ $i -le "$ROUNDS" ]; do
  set -- $BANDS
  while [ $# -ge 4 ]; do
    lo=$1 hi=$2 it=$3 wu=$4
    shift 4
    for h in 0 1 g m; do
      [ $h = g ] && [ "$GLOO" = 0 ] && continue
      [ $h = m ] && [ "$OMPI" = 0 ] && continue
      (launch $h $i "$lo" "$hi" "$it" "$wu")
    done
  done
  i=$((i + 1))
done

python3 - "$TMP" "$ROUNDS" "$COLL" "$GLOO" "$OMPI" "$RATE" "$PER" "$OUT" "$CALLS" <<'EOF'
import os, platform, re, statistics, subprocess, sys, time
tmp, rounds, coll, gloo, ompi = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", sys.argv[5] == "1"
rate, per, out_md, calls = sys.argv[6], sys.argv[7], sys.argv[8], sys.argv[9] == "1"
def num(s):
    try:
        return float(s)
    except ValueError:
        return None  # "-": a form this peer does not run
def percall(h):  # {size: [times of every out-of-place call of every round]}
    out = {}
    for r in range(1, rounds + 1):
        for line in open(f"{tmp}/out.{h}.{r}"):
            m = re.match(r"# calls (\d+) out-of-place: (.*)", line)
            if m:
                out.setdefault(int(m.group(1)), []).extend(float(x) for x in m.group(2).split())
    if not out:
        sys.exit(f"hosts.sh: no per-call times in {tmp}/out.{h}.1")
    return out
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
runs = (0, 1) + (("g",) if gloo else ()) + (("m",) if ompi else ())
data = {(h, r): rows(h, r) for h in runs for r in range(1, rounds + 1)}
keys = sorted(data[(0, 1)], key=lambda k: (isinstance(k, str), k))
unit = "ms" if coll == "engine" else "us"
col = 1 if coll == "allreduce" else 0  # Gloo's form: in place for allreduce, out of place for allgather
cols = ["" if coll == "engine" else "size (B)", f"flat {unit}", f"hierarchical {unit}", "hierarchical / flat"]
if gloo:
    cols += [f"hierarchical {'in place' if col else 'out of place'} {unit}", f"Gloo {unit}", "kolo / Gloo"]
if ompi:
    cols += [f"Open MPI {unit}", "kolo hierarchical / Open MPI"]
med = statistics.median
R = range(1, rounds + 1)
def vs(mine, theirs):  # medians of both, and the median of the rounds' ratios
    if None in theirs:
        return ["-"] * 3
    return [f"{med(mine):.1f}", f"{med(theirs):.1f}", f"{med(a / b for a, b in zip(mine, theirs)):.2f}"]
def pct(v, q):  # the q-quantile of v, nearest rank
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]
if calls:  # every call of every round: medians and 90th percentiles
    pc = {h: percall(h) for h in runs}
    cols = ["size (B)", "calls", "flat median us", "hierarchical median us", "hierarchical / flat"]
    if ompi:
        cols += ["Open MPI median us", "kolo hierarchical / Open MPI", "hierarchical p90 us", "Open MPI p90 us",
                 "p90 ratio"]
    table = ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    for k in sorted(pc[0]):
        fl, hi = pc[0][k], pc[1].get(k, [])
        if not hi:
            continue
        cells = [f"{k}", f"{len(hi)}", f"{med(fl):.1f}", f"{med(hi):.1f}", f"{med(hi) / med(fl):.2f}"]
        if ompi:
            mp = pc["m"].get(k, [])
            cells += ([f"{med(mp):.1f}", f"{med(hi) / med(mp):.2f}", f"{pct(hi, 0.9):.1f}", f"{pct(mp, 0.9):.1f}",
                       f"{pct(hi, 0.9) / pct(mp, 0.9):.2f}"] if mp else ["-"] * 5)
        table.append("| " + " | ".join(cells) + " |")
else:  # each launch's mean per size: medians over the rounds
    table = ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    for k in keys:
        flat = [data[(0, r)][k][0] for r in R]
        hier = [data[(1, r)][k][0] for r in R]
        cells = ["ResNet-50 step" if k == "step" else f"{k}"] + vs(hier, flat)[1::-1] + [vs(hier, flat)[2]]
        if gloo:
            cells += vs([data[(1, r)][k][col] for r in R], [data[("g", r)].get(k, (None, None))[col] for r in R])
        if ompi:
            cells += vs(hier, [data[("m", r)].get(k, (None, None))[0] for r in R])[1:]
        table.append("| " + " | ".join(cells) + " |")
title = (f"# kolo across 2 hosts of {per} ranks (network namespaces, veth {rate}), {coll}, {rounds} rounds, "
         + time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()))
print(title)
print("\n".join(table))
if out_md:
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except OSError:
            return ""
    cpu = re.search(r"model name\s*: (.*)", open("/proc/cpuinfo").read())
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    peers = []
    if ompi:
        peers.append(sh(["mpirun.openmpi", "--version"]).split("\n")[0])
    if gloo:
        peers.append("torch " + sh(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"]))
    argv = " ".join(["sh bench/hosts.sh", f"--coll {coll}", f"--rate {rate}", f"--rounds {rounds}"]
                    + (["--gloo"] if gloo else []) + (["--ompi"] if ompi else []) + (["--calls"] if calls else []))
    with open(out_md, "w") as f:
        f.write(title + "\n\n")
        f.write(f"Made by `{argv}` (and its --min/--max/--iters). Machine: {cpu.group(1) if cpu else '?'}, "
                f"{os.cpu_count()} cores, {mem:.1f} GiB, kernel {platform.release()}; kolo "
                f"{sh(['git', 'describe', '--always', '--dirty'])}"
                + (f"; {'; '.join(peers)}" if peers else "")
                + (". Times are every out-of-place call's (the slowest rank's), the rounds' calls together: their "
                   "median and 90th percentile, ratios of those: below 1, kolo's is faster.\n\n" if calls else
                   ". Times are medians over the rounds (out of place unless said), ratios the medians of the rounds' "
                   "ratios: below 1, kolo's is faster.\n\n"))
        f.write("\n".join(table) + "\n")
EOF
