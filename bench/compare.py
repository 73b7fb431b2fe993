#!/usr/bin/python3
"""bench/compare.py - kolo against Open MPI, MPICH, torch.distributed (Gloo) and Horovod, side by side.

Runs the same sweep (sizes, iterations, collectives, types, rank counts) through every peer and
through build/bin/kolo-bench, repeats it, interleaves the peers launch by launch within each
repetition (the order of the peers rotates each rep), takes medians, and writes under bench/results/:

    <date>-compare.md     side-by-side tables, kolo's speedup over each peer, machine, versions
    <date>-compare.csv    one row per (ranks, peer, collective, type, size)
    <date>-<coll>.png     busbw against message size, one line per peer

With --mem thp every peer's buffers are in transparent huge pages and the files are named
<date>-thp-*; such a run leaves latest.md (the default run's) alone.

Normally started by bench/compare.sh (which installs and builds the peers first). Python 3 stdlib.
See bench/README.md for the columns and the method.
"""

import argparse
import csv
import glob
import datetime
import math
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from benchcommon import bus_factor  # noqa: E402  (busbw as nccl-tests defines it, shared with the peers)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile as prof  # noqa: E402  (bench/profile.py: perf profiles of the unmet targets)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "bench")
KOLO_BENCH = os.path.join(ROOT, "build", "bin", "kolo-bench")
ENGINE_BENCH = os.path.join(ROOT, "build", "bin", "engine-bench")
KOLORUN = os.path.join(ROOT, "build", "bin", "kolorun")
PY = "/usr/bin/python3"  # Debian's python: python3-torch and Horovod live there
COLLS = ["allreduce", "allgather", "broadcast", "reducescatter", "alltoall"]
DTYPES = ["float32", "float16"]
NCPU = os.cpu_count() or 1
TYPE_NAMES = {"float": "float32", "float32": "float32", "f32": "float32", "fp32": "float32",
              "half": "float16", "float16": "float16", "f16": "float16", "fp16": "float16"}
COLL_NAMES = {"all_reduce": "allreduce", "all_reduce_perf": "allreduce", "all_gather": "allgather",
              "all_gather_perf": "allgather", "bcast": "broadcast", "broadcast_perf": "broadcast",
              "reduce_scatter": "reducescatter", "reduce_scatter_perf": "reducescatter",
              "all_to_all": "alltoall", "alltoall_perf": "alltoall"}


# ---------------------------------------------------------------- sizes and sweeps

def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = str(s).strip()
    if s and s[-1].lower() in mult:
        return int(float(s[:-1]) * mult[s[-1].lower()])
    return int(float(s))


def fmt_size(b):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d %s" % (b // m, unit)
    return "%d B" % b


def short_size(b):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d%s" % (b // m, unit)
    return str(b)


class Band:
    """Sizes lo, lo*factor, ... <= hi, each timed over `iters` calls after `warmup` calls."""

    def __init__(self, lo, hi, iters, warmup, factor):
        self.lo, self.hi, self.iters, self.warmup, self.factor = lo, hi, iters, warmup, factor

    def spec(self):
        return "%s:%s:%d:%d:%g" % (short_size(self.lo), short_size(self.hi), self.iters,
                                   self.warmup, self.factor)

    def capped(self, iters, warmup):
        return Band(self.lo, self.hi, min(self.iters, iters), min(self.warmup, warmup),
                    self.factor)


def sweep_sizes(bands):
    out, last = [], 0
    for b in bands:
        s = b.lo
        while s <= b.hi:
            if s > last:
                out.append(s)
                last = s
            nxt = int(s * b.factor)
            s = nxt if nxt > s else s + 1
    return out


# ---------------------------------------------------------------- output parsing

PREFIX = re.compile(r"^\[\d+(?:,\d+)?\]<std(?:out|err)>:")  # horovodrun / mpirun --tag-output
START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")


def _num(s):
    try:
        return float(s)
    except ValueError:
        return None


def _wrong(s):
    try:
        return int(s)
    except ValueError:
        return None


def parse_rows(text, coll_hint=None):
    """nccl-tests rows -> list of dicts, and the '#' comment lines."""
    rows, comments, coll = [], [], coll_hint
    for raw in text.splitlines():
        line = PREFIX.sub("", raw).rstrip()
        if not line.strip():
            continue
        if line.lstrip().startswith("#"):
            comments.append(line)
            m = START.match(line.strip())
            if m:  # "# Collective test starting: [tool] <coll>"
                for tok in line.split(":", 1)[1].split():
                    tok = tok.lower()
                    if tok in COLLS or tok in COLL_NAMES:
                        coll = COLL_NAMES.get(tok, tok)
            continue
        f = line.split()
        if len(f) < 13 or not f[0].isdigit() or not f[1].isdigit():
            continue
        dtype = TYPE_NAMES.get(f[2].lower())
        if dtype is None or coll is None:
            continue
        place = {}
        for key, off in (("oop", 5), ("ip", 9)):
            t = _num(f[off])
            if t is not None and t > 0:
                place[key] = (t, _wrong(f[off + 3]))
        rows.append({"coll": coll, "dtype": dtype, "size": int(f[0]), "count": int(f[1]),
                     "place": place})
    return rows, comments


def sweep_us(row):
    """A parsed row's time per call as the sweep compares it: out-of-place where the row has it.
    Not the mean of both placements: Open MPI's in-place alltoall takes another, far slower path
    (4 MiB, 2 ranks: 1.27 ms against 0.24 out of place), and with that mean the profiles of the
    unmet targets had found the sweep's gap "not reproduced" (kolo 0.28 ms against 0.83 at 4 MiB
    in 2026-11-29_1211)."""
    return (row["place"].get("oop") or row["place"]["ip"])[0]


# ---------------------------------------------------------------- peers

class Launch:
    def __init__(self, cmd, env=None, coll=None):
        self.cmd, self.env, self.coll = cmd, env or {}, coll
        self.cpu = 0.0  # CPU seconds of the launch and its descendants, set by run_launch
        # how many "# Collective test concluded" lines the launch prints when it has measured
        # everything (one per collective and type); run_launch gives it EXIT_GRACE seconds to
        # exit after the last, so a benchmark that hangs in its library's shutdown loses no rows
        # and no time (MPICH 4.0.2 with UCX once spun in MPI_Finalize until the time limit)
        self.ends = 1 if coll else None


class Peer:
    """One library on one transport."""
    key = label = transport = family = ""
    oversub_slow = False  # too slow when oversubscribed: capped sweep, first rep only
    oversub_why = ""

    def available(self):
        return True, ""

    def launches(self, np, colls, dtypes, bands, check):
        raise NotImplementedError

    def example(self, np):
        ls = self.launches(np, ["allreduce"], ["float32"], [Band(8, 256 << 20, 20, 5, 2)], 1)
        env = " ".join("%s=%s" % kv for kv in sorted(ls[0].env.items()) if kv[1] is not None
                       and not kv[0].startswith("OMPI_ALLOW"))
        return (env + " " if env else "") + " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT)
                                                     else c for c in ls[0].cmd)


class MpiPeer(Peer):
    family_names = {"openmpi": "Open MPI", "mpich": "MPICH"}

    def __init__(self, mpi, transport):
        self.mpi, self.transport = mpi, transport
        self.family = "ompi" if mpi == "openmpi" else "mpich"
        self.key = "%s-%s" % (self.family, transport)
        how = {("openmpi", "shm"): "shared memory (vader)",
               ("openmpi", "tcp"): "TCP (btl self,tcp)",
               ("mpich", "shm"): "shared memory (UCX)",
               ("mpich", "tcp"): "TCP (UCX_TLS=tcp,self)"}[(mpi, transport)]
        self.label = "%s %s" % (self.family_names[mpi], how)
        self.short = "%s %s" % (self.family_names[mpi], transport)
        self.binary = os.path.join(BUILD, "mpi_coll_bench." + mpi)
        self.mpirun = "mpirun." + mpi
        self.oversub_slow = mpi == "mpich"
        self.oversub_why = "it spins when oversubscribed" if self.oversub_slow else ""

    def available(self):
        if not shutil.which(self.mpirun):
            return False, "%s not found (Debian package %s)" % (
                self.mpirun, "openmpi-bin" if self.mpi == "openmpi" else "mpich")
        if not os.access(self.binary, os.X_OK):
            return False, "%s not built (bench/compare.sh builds it with mpicc.%s)" % (
                os.path.relpath(self.binary, ROOT), self.mpi)
        return True, ""

    def launches(self, np, colls, dtypes, bands, check):
        env = {}
        cmd = [self.mpirun, "-np", str(np)]
        if self.mpi == "openmpi":
            env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
            cmd += ["--mca", "pml", "ob1", "--mca", "btl",
                    "self,vader" if self.transport == "shm" else "self,tcp"]
            if np > NCPU:
                cmd += ["--oversubscribe"]
        elif self.transport == "tcp":
            env.update({"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"})
        # one launch per type, collective and band, like kolo's, so that the launches of the
        # peers can alternate one by one (see run_reps)
        huge = ["-H", "1"] if MEM == "thp" else []
        return [Launch(cmd + [self.binary, c, "-d", dt, "-B", b.spec(), "-c", str(check), "-W", str(WARM_MS)] + huge,
                       env, coll=c)
                for dt in dtypes for c in colls for b in bands]


class PyPeer(Peer):
    def __init__(self, family):
        self.family = family
        self.transport = "tcp"
        self.key = family + "-gloo"
        if family == "torch":
            self.label = "torch.distributed Gloo (TCP on lo)"
            self.short = "torch gloo"
            self.script = os.path.join(ROOT, "bench", "peers", "torch_dist_bench.py")
            self.module = "torch.distributed"
        else:
            self.label = "Horovod Gloo (TCP on lo)"
            self.short = "Horovod"
            self.script = os.path.join(ROOT, "bench", "peers", "horovod_bench.py")
            self.module = "horovod.torch"
            # its uncapped 4-rank sweep hit the 900 s limit at 64 MiB (2026-11-21 run)
            self.oversub_slow = True
            self.oversub_why = "its full sweep at 4 ranks on 2 cores takes more than 15 minutes"

    def available(self):
        if not os.access(PY, os.X_OK):
            return False, "%s not found" % PY
        r = subprocess.run([PY, "-c", "import %s" % self.module], capture_output=True, text=True,
                           cwd="/")
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["import failed"])[-1]
            return False, "cannot import %s with %s: %s" % (self.module, PY, last)
        return True, ""

    def launches(self, np, colls, dtypes, bands, check):
        cmd = [PY, self.script, ",".join(colls), "-np", str(np), "-d", ",".join(dtypes),
               "-B", ",".join(b.spec() for b in bands), "-c", str(check), "-W", str(WARM_MS)]
        if MEM == "thp":
            cmd += ["-H", "1"]
        ln = Launch(cmd, {"GLOO_SOCKET_IFNAME": "lo"})
        ln.ends = len(colls) * len(dtypes)
        return [ln]


class KoloPeer(Peer):
    def __init__(self, transport):
        self.family = "kolo"
        self.transport = transport
        self.key = "kolo-" + transport
        self.label = "kolo " + ("shared memory" if transport == "shm" else "TCP (KOLO_TRANSPORT=tcp)")
        self.short = "kolo " + transport
        self.use_kolorun = False

    def available(self):
        if not os.access(KOLO_BENCH, os.X_OK):
            return False, "kolo-bench not built (%s missing)" % os.path.relpath(KOLO_BENCH, ROOT)
        return True, ""

    def launches(self, np, colls, dtypes, bands, check):
        env = {"KOLO_TRANSPORT": "tcp"} if self.transport == "tcp" else {}
        out = []
        for dt in dtypes:
            for c in colls:
                for b in bands:
                    args = [c, "-b", str(b.lo), "-e", str(b.hi), "-f", "%g" % b.factor,
                            "-n", str(b.iters), "-w", str(b.warmup), "-W", str(WARM_MS), "-c", str(check),
                            "-d", dt, "-o", "sum"] + (["--mem", "thp"] if MEM == "thp" else [])
                    if self.use_kolorun:
                        cmd = [KOLORUN, "-np", str(np), KOLO_BENCH] + args
                    else:
                        cmd = [KOLO_BENCH] + args + ["-np", str(np)]
                    out.append(Launch(cmd, env, coll=c))
        return out


def all_peers():
    return [KoloPeer("shm"), MpiPeer("openmpi", "shm"), MpiPeer("mpich", "shm"),
            KoloPeer("tcp"), MpiPeer("openmpi", "tcp"), MpiPeer("mpich", "tcp"),
            PyPeer("torch"), PyPeer("horovod")]


# ---------------------------------------------------------------- running

EXIT_GRACE = 10.0
CONCLUDED = re.compile(r"#\s*Collective test concluded")


def _kill_group(p):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_launch(launch, timeout, log):
    """Runs one command in its own session; returns (stdout text, rc, timed_out, seconds).
    A launch that printed all its results (launch.ends "concluded" lines) and then does not
    exit within EXIT_GRACE seconds is stopped, keeps its rows, and is noted in the log."""
    env = dict(os.environ)
    for k, v in launch.env.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    log.write("$ %s %s\n" % (" ".join("%s=%s" % kv for kv in launch.env.items() if kv[1]),
                             " ".join(launch.cmd)))
    log.flush()
    t0 = time.monotonic()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen(launch.cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace",
                         start_new_session=True)
    timed_out, hung_at_exit = False, False
    lines, ended = [], [None]  # ended[0]: when the last "concluded" line came

    def reader():
        n = 0
        for line in p.stdout:
            lines.append(line)
            if launch.ends and CONCLUDED.search(line):
                n += 1
                if n >= launch.ends:
                    ended[0] = time.monotonic()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    try:
        while True:
            try:
                p.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if ended[0] is not None and now - ended[0] > EXIT_GRACE:
                    hung_at_exit = True
                    _kill_group(p)
                    break
                if now - t0 > timeout:
                    timed_out = True
                    _kill_group(p)
                    break
    except KeyboardInterrupt:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        th.join(5)
        raise
    th.join(10)
    out = "".join(lines)
    if hung_at_exit:
        out += "# did not exit within %.0f s of printing its last result: stopped (rows kept)\n" % EXIT_GRACE
    dt = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    launch.cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    log.write(out or "")
    rc = 0 if hung_at_exit else p.returncode
    log.write("# rc=%s timed_out=%s seconds=%.1f\n\n" % (rc, timed_out, dt))
    log.flush()
    return out or "", rc, timed_out, dt


def _cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v[:8]), idle


def cpu_busy(seconds=0.25):
    """Fraction of all CPUs busy over `seconds` (between launches: other people's work)."""
    try:
        t0, i0 = _cpu_times()
        time.sleep(seconds)
        t1, i1 = _cpu_times()
        return 1.0 - (i1 - i0) / max(1, t1 - t0)
    except (OSError, ValueError, IndexError):
        return float("nan")


def wait_idle(max_wait, run):
    """Before a peer's round: wait up to max_wait s for other processes to use less than 25 % of
    the CPUs."""
    t0 = time.monotonic()
    while max_wait > 0 and cpu_busy(0.5) > 0.25 and time.monotonic() - t0 < max_wait:
        time.sleep(1.0)
    run.waited += time.monotonic() - t0


class Store:
    """Timings per (np, peer, coll, dtype, size): placement -> list of us, plus #wrong, and for
    each timing the repetition it came from and the shared-memory pings measured just before and
    just after its launch (the machine's state at both ends)."""

    def __init__(self):
        self.t = {}
        self.split = None  # ping (us) above which the machine counts as in its far state

    def add(self, np, peer, row, ping=None, rep=None):
        """ping: (before, after) the launch, or one figure."""
        k = (np, peer, row["coll"], row["dtype"], row["size"])
        e = self.t.setdefault(k, {"count": row["count"], "oop": [], "ip": [], "wrong": None,
                                  "oop_ping": [], "ip_ping": [], "oop_rep": [], "ip_rep": []})
        for place, (us, wrong) in row["place"].items():
            e[place].append(us)
            e[place + "_ping"].append(ping)
            e[place + "_rep"].append(rep)
            if wrong is not None:
                e["wrong"] = (e["wrong"] or 0) + wrong

    def get(self, np, peer, coll, dtype, size):
        return self.t.get((np, peer, coll, dtype, size))

    def state(self, ping):
        """"near" or "far"; for a launch's (before, after), "mixed" when the two ends fall on
        either side of the split (the machine changed state during the launch); "one" when the
        machine stayed in one state all run (no split); None when the pings are unknown."""
        ends = [x for x in (ping if isinstance(ping, tuple) else (ping,)) if x is not None]
        if not ends:
            return None
        if self.split is None:
            return "one"
        far = [x > self.split for x in ends]
        return "mixed" if any(far) != all(far) else ("far" if far[0] else "near")

    def med(self, np, peer, coll, dtype, size, place, state=None):
        """Median over the repetitions; with state ("near"/"far"), over those launched in it."""
        e = self.get(np, peer, coll, dtype, size)
        if not e or not e[place]:
            return None
        v = [t for t, p in zip(e[place], e[place + "_ping"])
             if state is None or self.state(p) == state]
        return statistics.median(v) if v else None

    def count(self, np, peer, coll, dtype, size, place, state):
        e = self.get(np, peer, coll, dtype, size)
        return sum(1 for p in (e[place + "_ping"] if e else []) if self.state(p) == state)

    def pairs(self, np, a, b, coll, dtype, size, place):
        """[(a's us, b's us, state)] for the repetitions in which the launches of both peers ran
        wholly in one machine state, the same for both; and how many repetitions both measured."""
        ea, eb = self.get(np, a, coll, dtype, size), self.get(np, b, coll, dtype, size)
        if not ea or not eb:
            return [], 0
        side = [{r: (t, self.state(p)) for t, p, r in zip(e[place], e[place + "_ping"], e[place + "_rep"])
                 if r is not None} for e in (ea, eb)]
        both = sorted(set(side[0]) & set(side[1]))
        out = [(side[0][r][0], side[1][r][0], side[0][r][1]) for r in both
               if side[0][r][1] in ("near", "far", "one") and side[0][r][1] == side[1][r][1]]
        return out, len(both)


class Run:
    """What the repetitions collect."""

    def __init__(self):
        self.store = Store()
        self.comments, self.notes, self.loads = [], [], []
        self.cpu = {}  # (peer key, np) -> [CPU seconds, wall seconds]
        self.pings = []  # (before, after): the shared-memory pings around every launch (us; None: not measured)
        self.waited = 0.0  # seconds spent waiting for an idle machine (--idle-wait)
        self.huge = {}  # --mem thp: peer key -> MiB of rank 0's memory in huge pages, per launch
        self.thp_mode = None  # the kernel's THP mode, as the benchmarks read it


def brief(cmd):
    """A launch's benchmark and its arguments, without the launcher's: 'mpi_coll_bench.mpich
    broadcast -d float16 -B 128K:16M:10:3:2'."""
    for i, x in enumerate(cmd):
        b = os.path.basename(x)
        if b.startswith(("mpi_coll_bench", "kolo-bench", "horovod_bench", "torch_dist_bench")):
            rest = list(cmd[i + 1:])
            if "-c" in rest[:-1]:  # the check flag says nothing about what hung
                k = rest.index("-c")
                del rest[k:k + 2]
            return " ".join([b] + rest)
    return " ".join(os.path.basename(x) for x in cmd[:6])


def run_round(p, np, rep, bands, check, a, logdir, run):
    """One peer, one rank count, one repetition: all its launches, as a generator that yields
    after each launch (run_reps alternates the peers' rounds launch by launch). Returns (rows,
    failures) as its StopIteration value."""
    nrows, fails = 0, []
    with open(os.path.join(logdir, "%s-np%d-rep%d.log" % (p.key, np, rep + 1)), "w") as log:
        launches = p.launches(np, a.coll_list, a.dtype_list, bands, check)
        # a peer too slow when oversubscribed runs its capped sweep as one launch that can
        # take most of --timeout (Horovod at 4 ranks on 2 cores: 594 s of 600 once)
        limit = a.timeout * (2 if np > NCPU and p.oversub_slow else 1)
        i = 0
        while i < len(launches):
            yield
            ln = launches[i]
            run.loads.append(cpu_busy(0.1))
            ping = state_ping()
            if ping is not None:
                log.write("# shm ping before this launch: %.3f us\n" % ping)
            out, rc, to, secs = run_launch(ln, limit, log)
            after = state_ping()
            if after is not None:
                log.write("# shm ping after this launch: %.3f us\n" % after)
            if (ping, after) != (None, None):
                run.pings.append((ping, after))
            rows, com = parse_rows(out, ln.coll)
            if (p.family == "kolo" and not rows and rc and not p.use_kolorun
                    and os.access(KOLORUN, os.X_OK)):
                # this kolo-bench cannot fork its own ranks: run it under kolorun instead
                p.use_kolorun = True
                launches = p.launches(np, a.coll_list, a.dtype_list, bands, check)
                run.notes.append("kolo-bench -np failed; ran it under kolorun")
                continue
            i += 1
            c = run.cpu.setdefault((p.key, np), [0.0, 0.0])
            c[0] += ln.cpu
            c[1] += secs
            run.comments += com
            for line in com:  # bench_mem.h's line (and benchcommon's): how much the kernel gave
                m = HUGE_LINE.search(line)
                if m:
                    run.huge.setdefault(p.key, []).append(int(m.group(2)))
                    run.thp_mode = m.group(1)
            for r in rows:
                run.store.add(np, p.key, r, (ping, after), rep)
            nrows += len(rows)
            if "did not exit within" in out:
                run.notes.append("%s, %d ranks, rep %d: `%s` printed all its results, then did not exit "
                                 "within %.0f s; stopped, rows kept" % (p.label, np, rep + 1, brief(ln.cmd),
                                                                       EXIT_GRACE))
            for line in com:
                msg = line.lstrip("# ")
                if "not supported" in line and rep == 0:
                    note = "%s, %d ranks: %s" % (p.label, np, msg)
                    if note not in run.notes:
                        run.notes.append(note)
            wrong = any((w or 0) > 0 for r in rows for _, w in r["place"].values())
            if to:
                last = rows[-1]["size"] if rows else 0
                fails.append("timed out after %d s (last size %s)" % (limit, fmt_size(last)))
            elif rc and wrong:
                fails.append("exit %s after reporting wrong results" % rc)
            elif rc:
                tail = " / ".join(l.strip() for l in out.strip().splitlines()[-3:])
                fails.append("exit %s: %s" % (rc, tail[:300]))
    for f in fails:
        run.notes.append("%s, %d ranks, rep %d: %s" % (p.label, np, rep + 1, f))
    return nrows, fails


def run_reps(order, np, rep, check, a, logdir, run):
    """Repetition `rep` of every peer in `order` at np ranks, one launch of each in turn: kolo's
    allreduce band, then Open MPI's, then MPICH's, ..., then the next band. On a machine whose
    speed changes every few minutes (this VM moves its vCPUs between cores that share a cache and
    cores that do not), launches seconds apart see the same machine, where whole rounds of one
    peer after another did not. A peer with a single launch (the Python peers) runs as one turn.
    Returns the seconds spent on peers that run only in the first repetition (a capped sweep with
    more ranks than cores)."""
    wait_idle(a.idle_wait, run)
    first_only = 0.0
    active = []
    for p in order:
        bands = a.band_list
        if np > NCPU and p.oversub_slow:
            bands = [b.capped(a.oversub_iters, a.oversub_warmup) for b in bands]
        g = run_round(p, np, rep, bands, check, a, logdir, run)
        active.append([p, g, 0.0])
    while active:
        for e in list(active):
            p, g = e[0], e[1]
            t0 = time.monotonic()
            try:
                next(g)
                e[2] += time.monotonic() - t0
            except StopIteration as done:
                e[2] += time.monotonic() - t0
                nrows, fails = done.value
                active.remove(e)
                if np > NCPU and p.oversub_slow:
                    first_only += e[2]
                print("compare: rep %d/%d np %d %-13s %6.1f s %4d rows%s" % (
                    rep + 1, a.reps, np, p.key, e[2], nrows,
                    "  (" + "; ".join(fails)[:200] + ")" if fails else ""), flush=True)
    return first_only


# ---------------------------------------------------------------- machine limits and the bound

def state_ping():
    """The shared-memory ping between cpus 0 and 1 right now (us), or None. Some VMs move their
    vCPUs between cores that share a cache and cores that do not, every few minutes; this
    project's 2-vCPU VM reads 0.05 us in the first state and 0.24 us in the second, and the
    shared-memory figures of every peer depend on it, kolo's ring copies most. So it is measured
    before every launch (about 0.01 s) and reported with the figures."""
    tool = os.path.join(BUILD, "machine_limits")
    if NCPU < 2 or not os.access(tool, os.X_OK):
        return None
    try:
        out = subprocess.run([tool, "--ping"], capture_output=True, text=True, timeout=30).stdout
        m = re.search(r"shm_ping_oneway_us\s+([0-9.]+)", out)
        return float(m.group(1)) if m else None
    except (OSError, subprocess.SubprocessError):
        return None


def state_split(pings):
    """The ping that separates the two states, or None when the machine stayed in one: the
    geometric mean of the 10th percentile and the highest ping, when the highest is more than
    2.5 times the 10th percentile (this VM: about 0.05 and 0.24 us, split near 0.11)."""
    if len(pings) < 2:
        return None
    v = sorted(pings)
    lo, hi = v[len(v) // 10], v[-1]
    return math.sqrt(lo * hi) if lo > 0 and hi > 2.5 * lo else None


def machine_limits(quick):
    tool = os.path.join(BUILD, "machine_limits")
    if not os.access(tool, os.X_OK):
        return {}, "machine_limits not built"
    args = [tool, "-r", "3" if quick else "5"]
    r = subprocess.run(args, capture_output=True, text=True)
    lim = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) == 2 and not line.startswith("#"):
            lim[f[0]] = float(f[1])
    return lim, r.stdout


def best_limits(runs):
    """The machine's limits from several measurements: the highest rate and the lowest latency
    seen. The bound is what the hardware allows, and on this project's VMs the same kernel reads
    50 GB/s in one minute and 86 in the next (the host's other tenants, the vCPUs' placement), so
    one measurement at the start can put the wall below what a collective then reaches. Also
    returns the range of B over the measurements, (lowest, highest, how many)."""
    runs = [r for r in runs if r]
    best = {}
    for r in runs:
        for k, v in r.items():
            if k not in best or (v < best[k] if k.endswith("_us") else v > best[k]):
                best[k] = v
    bs = [r["dram_traffic_GBps"] for r in runs if r.get("dram_traffic_GBps")]
    return best, ((min(bs), max(bs), len(bs)) if bs else None)


def traffic_per_rank(coll, n, S):
    """Bytes read + written per rank when every input byte is read once and every output byte
    written once, spread evenly over the ranks: the least any algorithm can move when ranks read
    and write each other's buffers directly (mapped shared memory). S = nccl-tests' size."""
    if coll == "allreduce":        # n inputs of S read, n outputs of S written
        return 2.0 * S
    if coll == "allgather":        # the n blocks (S in all) read once, n outputs of S written
        return S * (1 + 1 / n)
    if coll == "broadcast":        # the root's S read once, n - 1 outputs of S written
        return float(S)
    if coll == "reducescatter":    # n inputs of S read, n blocks of S/n written
        return S * (1 + 1 / n)
    if coll == "alltoall":         # n send buffers of S read, n outputs of S written
        return 2.0 * S
    return None


BOUND_FORMULAS = [
    ("allreduce", "2 · S", "every rank's input read once (n · S), every rank's output written once (n · S)"),
    ("allgather", "(1 + 1/n) · S", "each rank's block read once (S in all), written into n outputs"),
    ("broadcast", "S", "the root's buffer read once, written into the other n - 1 outputs"),
    ("reducescatter", "(1 + 1/n) · S", "every input read once (n · S), one block written per rank (S)"),
    ("alltoall", "2 · S", "every send buffer read once, every output written once"),
]
DRAM_MIN = 32 << 20   # out of cache from here on (machine.md: the cliff is between 16 and 32 MiB)
LAT_MAX = 4096


def bound_time_us(coll, n, S, lim):
    """Lower bound on the time (us), or None where the model does not apply."""
    if S >= DRAM_MIN and lim.get("dram_traffic_GBps"):
        return n * traffic_per_rank(coll, n, S) / (lim["dram_traffic_GBps"] * 1e3)
    if S <= LAT_MAX and n <= NCPU and lim.get("shm_ping_oneway_us"):
        return lim["shm_ping_oneway_us"] * max(1, math.ceil(math.log2(n)))
    return None


# ---------------------------------------------------------------- versions and machine

def sh(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def dpkg_version(pkg):
    return sh(["dpkg-query", "-W", "-f=${Version}", pkg]) or "not installed"


def machine_info():
    # A VM may name its CPU only "AMD EPYC": family and model tell the generation (AMD 25 is
    # Zen 3/4, 26 Zen 5), and the vector extensions which of kolo's kernels run.
    model, fam, mod, flags = "", "", "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k, v = k.strip(), v.strip()
                if k == "model name" and not model:
                    model = v
                elif k == "cpu family" and not fam:
                    fam = v
                elif k == "model" and not mod:
                    mod = v
                elif k == "flags":
                    flags = set(v.split())
                    break
    except OSError:
        pass
    if fam:
        isa = [n for f, n in (("avx512f", "AVX-512"), ("avx512_fp16", "AVX512-FP16"),
                              ("avx512_bf16", "AVX512-BF16"), ("f16c", "F16C")) if f in flags]
        model += " (family %s, model %s%s)" % (fam, mod, "; " + ", ".join(isa) if isa else "")
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = "%.1f GiB" % (kb / 1048576)
    except (OSError, ValueError, IndexError):
        pass
    # a container inside a VM is both (this project's machines: docker on KVM); plain
    # systemd-detect-virt names only the container
    def detect(what):  # a name such as kvm or docker; "" for none, or no systemd-detect-virt
        x = sh(["systemd-detect-virt", what])
        return x if re.fullmatch(r"[a-z0-9_-]+", x) and x != "none" else ""
    vm, ct = detect("--vm"), detect("--container")
    virt = ", ".join(([vm.upper() + " guest"] if vm else []) + (["in a %s container" % ct] if ct else []))
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            cc = f.read().strip()
    except OSError:
        cc = ""
    return {"cpu": model, "cores": NCPU, "memory": mem, "kernel": platform.release(), "tcp_cc": cc,
            "os": sh(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
            "glibc": " ".join(platform.libc_ver()), "virt": virt}


def versions(comments):
    v = {}
    libs = {}
    for c in comments:
        m = re.search(r"mpi_coll_bench \(([^)]*)\)", c)
        if m:
            lib = " ".join(m.group(1).split())
            libs["Open MPI" if "Open MPI" in lib else "MPICH"] = lib
        m = re.search(r"horovod_bench \(horovod ([^,]+),", c)
        if m:
            libs["Horovod"] = m.group(1)
    v["Open MPI"] = libs.get("Open MPI") or sh(["mpirun.openmpi", "--version"]).split("\n")[0]
    v["MPICH"] = (libs.get("MPICH") or sh(["mpichversion"]).split("\n")[0]) + \
        " (device %s, UCX %s)" % (
            (re.search(r"Device:\s*(\S+)", sh(["mpichversion"])) or [None, "?"])[1],
            dpkg_version("libucx0"))
    v["torch"] = sh([PY, "-c", "import torch; print(torch.__version__)"]).split("\n")[-1] + \
        " (Debian python3-torch %s, Gloo bundled)" % dpkg_version("python3-torch")
    hv = sh([PY, "-c", "import horovod; print(horovod.__version__)"]).split("\n")[-1]
    v["Horovod"] = (hv + " (pip, built with Gloo against Debian's torch)"
                    if re.match(r"^\d", hv) else "not installed")
    kv = sh([KOLO_BENCH, "--version"]).split("\n")[0] if os.access(KOLO_BENCH, os.X_OK) else ""
    rev = sh(["git", "rev-parse", "--short", "HEAD"])
    dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"])
    v["kolo"] = (kv or "kolo-bench not built") + " (git %s%s)" % (rev, ", dirty tree" if dirty else "")
    v["gcc"] = sh(["gcc", "-dumpfullversion"])
    v["python"] = sh([PY, "--version"])
    v["gnuplot"] = sh(["gnuplot", "--version"]) or "not installed"
    return v


# ---------------------------------------------------------------- report

def primary(store, np, peer, coll, dtype, size):
    """(time us, placement) of the placement the peer is compared on: out-of-place if it has one."""
    for place in ("oop", "ip"):
        t = store.med(np, peer, coll, dtype, size, place)
        if t is not None:
            return t, place
    return None, None


def matched(store, np, kolo, peer, coll, dtype, size, state=None):
    """kolo's and the peer's time on the same placement (out-of-place preferred); with state,
    from the launches in that machine state only."""
    for place in ("oop", "ip"):
        a = store.med(np, kolo, coll, dtype, size, place, state)
        b = store.med(np, peer, coll, dtype, size, place, state)
        if a is not None and b is not None:
            return a, b, place
    return None, None, None


def cell(t_us, coll, np, size, place=None):
    if t_us is None:
        return "—"
    star = "*" if place == "ip" else ""
    if size < (64 << 10):
        return fmt_us(t_us) + star
    bw = size / 1e3 / t_us * bus_factor(coll, np)
    return "%.2f GB/s%s" % (bw, star)


def fmt_us(t):
    return "%.3g us" % t if t < 1000 else "%.0f us" % t


def ratio_cell(r):
    if r is None:
        return "—"
    return "**%.2f×**" % r if r >= 1 else "%.2f×" % r


# The issue's targets against Open MPI (2 ranks, float32): allreduce 64 MiB busbw at least
# BAR_ALLREDUCE_64M times Open MPI's, allreduce 8 B at most 1.5 times its time (kolo x at least
# BAR_LATENCY_8B), each of TARGET_COLLS at least as fast from 64 KiB; md_targets judges them,
# recheck_items picks the uncertain ones.
BAR_ALLREDUCE_64M = 1.3
BAR_LATENCY_8B = 1 / 1.5
TARGET_COLLS = ("broadcast", "allgather", "reducescatter", "alltoall")


class Report:
    def __init__(self, args, store, peers, status, notes, lim, lim_text, info, vers, sizes,
                 stamp, elapsed, loads, reps_done):
        self.args, self.store, self.peers, self.status, self.notes = args, store, peers, status, notes
        self.lim, self.lim_text, self.info, self.vers, self.sizes = lim, lim_text, info, vers, sizes
        self.stamp, self.elapsed, self.loads, self.reps_done = stamp, elapsed, loads, reps_done
        self.cpu, self.waited, self.oversub = {}, 0.0, []
        self.kolo = {p.transport: p.key for p in peers if p.family == "kolo"
                     and status[p.key][0]}

    # ---- CSV
    def write_csv(self, path):
        date = self.stamp
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["date", "ranks", "transport", "peer", "collective", "type", "size_B",
                        "count", "reps", "oop_time_us", "oop_algbw_GBps", "oop_busbw_GBps",
                        "ip_time_us", "ip_algbw_GBps", "ip_busbw_GBps", "wrong",
                        "kolo_speedup", "compared_placement", "bound_busbw_GBps",
                        "share_of_bound", "launch_pings_us"])  # per launch: before/after
            for (np, peer, coll, dt, size), e in sorted(self.store.t.items(),
                                                        key=lambda kv: self._order(kv[0])):
                p = self.peer(peer)
                row = [date, np, p.transport, peer, coll, dt, size, e["count"],
                       max(len(e["oop"]), len(e["ip"]))]
                for place in ("oop", "ip"):
                    t = self.store.med(np, peer, coll, dt, size, place)
                    if t is None:
                        row += ["", "", ""]
                    else:
                        alg = size / 1e3 / t
                        row += ["%.3f" % t, "%.4f" % alg, "%.4f" % (alg * bus_factor(coll, np))]
                row.append("" if e["wrong"] is None else e["wrong"])
                kolo = self.kolo.get(p.transport)
                if kolo and p.family != "kolo":
                    _, _, place = matched(self.store, np, kolo, peer, coll, dt, size)
                    r, _, _, _ = paired_how(self.store, kolo, peer, coll, size, dt, np)
                    row += ["%.3f" % r, place] if r else ["", ""]
                else:
                    row += ["", ""]
                if p.family == "kolo" and p.transport == "shm":
                    tb = bound_time_us(coll, np, size, self.lim)
                    t, _ = primary(self.store, np, peer, coll, dt, size)
                    if tb and t:
                        row += ["%.4f" % (size / 1e3 / tb * bus_factor(coll, np)), "%.3f" % (tb / t)]
                    else:
                        row += ["", ""]
                else:
                    row += ["", ""]
                pings = e["oop_ping"] if e["oop"] else e["ip_ping"]
                row.append(";".join("/".join("%.3f" % x for x in (p if isinstance(p, tuple) else (p,))
                                             if x is not None) for p in pings if p is not None))
                w.writerow(row)

    def peer(self, key):
        return next(p for p in self.peers if p.key == key)

    def _order(self, k):
        np, peer, coll, dt, size = k
        keys = [p.key for p in self.peers]
        return (np, COLLS.index(coll), DTYPES.index(dt), keys.index(peer), size)

    # ---- Markdown
    def write_md(self, path, csv_name, pngs):
        L = []
        a = self.args
        L.append("# kolo vs. Open MPI, MPICH, torch.distributed (Gloo) and Horovod — %s%s" %
                 (self.stamp.replace("_", " "), ", buffers in huge pages" if MEM == "thp" else ""))
        L.append("")
        # the command as given (compare.sh passes its arguments on, and $KOLO_BENCH_ARGS too)
        given, skip = [], False
        for x in sys.argv[1:]:  # less where the results went
            if not skip and not x.startswith("--out"):
                given.append(x)
            skip = x == "--out"
        partial = a.peers or a.colls or a.nranks or a.dtypes or a.bands
        L.append("Made by `%s` (%s) in %.1f minutes; %d of %d repetitions ran. CSV: `%s`." % (
            "sh bench/compare.sh " + " ".join(shlex.quote(x) for x in given) if given else "make bench-compare",
            "quick mode" if a.quick else "full mode, a part of the sweep" if partial else "full mode",
            self.elapsed / 60, self.reps_done, a.reps, csv_name))
        L.append("")
        L += self.md_machine()
        L += self.md_versions()
        L += self.md_method()
        L += self.md_headline()
        L += self.md_targets()
        L += self.md_rechecks()
        L += self.md_states()
        L += self.md_bound()
        L += self.md_profiles()
        L += self.md_peers_status()
        L += self.md_oversub()
        if pngs:
            L.append("## Plots")
            L.append("")
            for png in pngs:
                L.append("![%s](%s)" % (os.path.basename(png), os.path.basename(png)))
            L.append("")
        L += self.md_tables()
        with open(path, "w") as f:
            f.write("\n".join(L) + "\n")

    def md_machine(self):
        i, lim = self.info, self.lim
        L = ["## Machine", ""]
        L.append("%s, **%d cores**%s, %s RAM, %s, kernel %s, %s." % (
            i["cpu"], i["cores"], " (%s)" % i["virt"] if i["virt"] else "", i["memory"], i["os"], i["kernel"],
            i["glibc"]))
        L.append("")
        if i.get("tcp_cc"):
            L.append("TCP congestion control: the system's default is %s; the peers run it, kolo's connections "
                     "within one host run cubic (`KOLO_TCP_CONGESTION=auto`, see the README)." % i["tcp_cc"])
            L.append("")
        if lim:
            rng = getattr(self, "lim_range", None)
            if rng and rng[2] > 1:
                L.append("Measured by `bench/peers/machine_limits.c` %d times in this run, before the sweep, "
                         "after each repetition and after each paired launch with `kolo_mem_alloc` buffers; each figure is the best "
                         "of the %d (each a median of its passes), as the bound is what the hardware "
                         "allows; B read %.2f to %.2f GB/s over the run. The row of the targets with "
                         "`kolo_mem_alloc` buffers sets each launch against the B measured right after it." % (rng[2], rng[2], rng[0], rng[1]))
            else:
                L.append("Measured by `bench/peers/machine_limits.c` in this run (medians):")
            L.append("")
            L.append("| quantity | 1 thread | 2 threads |")
            L.append("|---|---:|---:|")
            for k, name in (("memcpy", "memcpy (glibc), 256 MiB per thread, GB/s copied"),
                            ("memcpy_nt", "memcpy with non-temporal stores, GB/s copied"),
                            ("add_f32", "float32 `a[i] += b[i]`, 256 MiB, GB/s of `a`"),
                            ("sum_nt_f32", "float32 `c[i] = a[i] + b[i]`, non-temporal stores, GB/s of `c`")):
                L.append("| %s | %s | %s |" % (name, lim.get(k + "_1t_GBps", "—"),
                                              lim.get(k + "_2t_GBps", "—")))
            L.append("| memcpy / add in L2 (2 × 128 KiB) | %s / %s | |" % (
                lim.get("memcpy_l2_1t_GBps", "—"), lim.get("add_f32_l2_1t_GBps", "—")))
            L.append("| **DRAM traffic rate B** (best of the above, bytes read + written per s) "
                     "| | **%s GB/s** |" % lim.get("dram_traffic_GBps", "—"))
            L.append("| 8 B one-way latency, shared-memory spin flag between 2 processes "
                     "| %s us | |" % lim.get("shm_ping_oneway_us", "—"))
            L.append("")
        else:
            L += ["Machine limits not measured: %s." % self.lim_text, ""]
        loads = [x for x in self.loads if x == x]
        if loads:
            L.append("**Other work on the machine**: CPU use by other processes, sampled for "
                     "0.1 s before each of the %d launches: median %.0f %%, max %.0f %%, %d "
                     "launches above 25 %%%s. Such load is noise that the interleaving spreads "
                     "over every peer alike, but it lowers and scatters all figures." % (
                         len(loads), 100 * statistics.median(loads), 100 * max(loads),
                         sum(1 for x in loads if x > 0.25),
                         " (waited %.0f s in all for it to drop, --idle-wait %g)" % (
                             self.waited, self.args.idle_wait) if self.args.idle_wait else ""))
            L.append("")
        return L

    def md_versions(self):
        L = ["## Versions", "", "| component | version |", "|---|---|"]
        for k, v in self.vers.items():
            L.append("| %s | %s |" % (k, v.replace("|", "/")))
        L.append("")
        return L

    def md_huge(self):
        """--mem thp: the Method's line on the buffers, with what the kernel gave each peer."""
        keys = [p.key for p in self.peers]
        got = "; ".join("%s %s" % (self.peer(k).short, "%d MiB" % min(v) if min(v) == max(v) else "%d-%d MiB" % (min(v), max(v)))
                        for k, v in sorted(self.huge.items(), key=lambda kv: keys.index(kv[0])))
        return ("- **Buffers in transparent huge pages** (`--mem thp`): every peer's send and receive buffers are "
                "2 MiB-aligned anonymous memory advised `MADV_HUGEPAGE` before their first touch (`kolo-bench --mem thp`, "
                "`mpi_coll_bench -H 1`, the Python peers' `-H 1`: torch tensors on such a mapping), as NumPy gives "
                "arrays from 4 MiB and PyTorch >= 2.2 CPU tensors with `THP_MEM_ALLOC_ENABLE=1`. The kernel's THP mode: "
                "%s. Rank 0's memory in huge pages, as each launch printed it: %s." % (
                    self.thp_mode or "not reported", got or "no launch reported it"))

    def md_method(self):
        a = self.args
        L = ["## Method", ""]
        L.append("- Sizes: %s to %s, %d sizes, in bands (step, timed / warm-up iterations): %s. "
                 "`time` is the mean per call, averaged over ranks, as in nccl-tests; before "
                 "each band the MPI and Python peers warm up at its largest and smallest size "
                 "(as nccl-tests does), kolo-bench at up to 1 MiB and per size; then every peer "
                 "keeps calling at the first size until %g ms have passed (`-W`, the ranks agreeing "
                 "after every call: this machine runs copies slower in its first moments of work)." % (
                     fmt_size(self.sizes[0]), fmt_size(self.sizes[-1]), len(self.sizes),
                     "; ".join("%s–%s ×%g, %d / %d" % (fmt_size(b.lo), fmt_size(b.hi), b.factor,
                                                      b.iters, b.warmup) for b in a.band_list),
                     WARM_MS))
        L.append("- Collectives %s; types %s; %s ranks (this machine has %d cores, so more "
                 "ranks than that are oversubscribed)." % (", ".join(a.coll_list),
                                                           ", ".join(a.dtype_list),
                                                           " and ".join(map(str, a.np_list)), NCPU))
        if MEM == "thp":
            L.append(self.md_huge())
        L.append("- %d repetitions, **interleaved launch by launch**: within a repetition the "
                 "peers take turns, one launch (one collective, type and size band) each, and the "
                 "order of the peers rotates by one each repetition, so a change in machine speed "
                 "hits all peers alike. Each figure is the **median** over the repetitions. "
                 "Results are checked (`#wrong`) in the first repetition only." % a.reps)
        L.append("- The targets' ratios against Open MPI are **paired**: kolo's launch and Open MPI's "
                 "of the same repetition and band (seconds apart) make a pair, and a pair counts when the "
                 "shared-memory pings before and after both launches put both in one machine state "
                 "(see the machine's state at each launch); the ratio is the median over those pairs, "
                 "or, at a size with none, the ratio of the two peers' medians over their launches in "
                 "one state (near where both have some, else far), and where they share no state, of the "
                 "medians over all launches. Each target "
                 "row also gives the count by the medians over all launches.")
        if a.recheck > 0:
            L.append("- Sizes whose verdict against Open MPI the sweep left uncertain get more pairs of launches after "
                     "it, %g min in all at most (see Rechecked target sizes)." % a.recheck)
        L.append("- busbw = algbw × 2(n−1)/n for allreduce, (n−1)/n for allgather, "
                 "reducescatter and alltoall, 1 for broadcast; algbw = size / time (GB/s = 1e9 B/s).")
        L.append("- Cells: time (us) below 64 KiB, busbw (GB/s) from 64 KiB on. **kolo ×** = "
                 "peer time / kolo time on the same placement (out-of-place when both have it): "
                 "above 1 kolo is faster. `*` marks in-place figures, for calls that have no "
                 "out-of-place form (torch `all_reduce`, `broadcast`).")
        L.append("- float16 with the MPIs: MPI 3.1 has no half type, so float16 runs as a "
                 "contiguous 2-byte type with a user-defined sum (F16C); that keeps the MPI on its "
                 "generic user-op path. torch.distributed's Gloo backend has no reduce_scatter "
                 "in torch 1.13.")
        if max(a.np_list) > NCPU:
            L.append("- MPICH/UCX spins when oversubscribed (%d ranks on %d cores take "
                     "milliseconds per small operation), and Horovod's full sweep at %d ranks takes "
                     "more than 15 minutes, so their runs with more ranks than cores are "
                     "capped: at most %d timed / %d warm-up iterations and only in the first "
                     "repetition." % (max(a.np_list), NCPU, max(a.np_list), a.oversub_iters,
                                      a.oversub_warmup))
        L.append("- Every launch has a %d s time limit (a capped sweep with more ranks than cores "
                 "%d s); a launch that hits it keeps the rows it printed." % (a.timeout, 2 * a.timeout))
        L.append("- Example commands (2 ranks):")
        L.append("")
        for p in self.peers:
            if self.status[p.key][0]:
                L.append("      %s" % p.example(2))
        L.append("")
        return L

    def md_headline(self):
        L = ["## Headline: allreduce, float32, 2 ranks", ""]
        if 2 not in self.args.np_list or "allreduce" not in self.args.coll_list:
            return L + ["(not in this sweep)", ""]
        pick = [s for s in (8, 1 << 20, 64 << 20, 256 << 20) if s in self.sizes]
        hdr = ["peer / transport", "8 B latency" if 8 in pick else None] + \
            ["%s busbw" % fmt_size(s) for s in pick if s != 8]
        L.append("| " + " | ".join(h for h in hdr if h) + " |")
        L.append("|---|" + "---:|" * (len([h for h in hdr if h]) - 1))
        for p in self.peers:
            if not self.status[p.key][0]:
                continue
            cells = []
            for s in pick:
                t, place = primary(self.store, 2, p.key, "allreduce", "float32", s)
                if t is None:
                    cells.append("—")
                elif s == 8:
                    cells.append(fmt_us(t) + ("*" if place == "ip" else ""))
                else:
                    cells.append(cell(t, "allreduce", 2, s, place).replace(" GB/s", ""))
            name = "**%s**" % p.label if p.family == "kolo" else p.label
            L.append("| %s | %s |" % (name, " | ".join(cells)))
        L.append("")
        L.append("busbw in GB/s; `*` in-place.")
        L.append("")
        return L

    def gap(self, name, kind, kolo, coll, size, ref=None, dtype="float32", mem="malloc"):
        """Records an unmet target for the profiles (md_targets calls it; profile_gaps runs them).
        kind: "peer" (kolo against ref at size), "bound" (kolo alone against the memory-traffic
        bound), "engine" (engine-bench), "timeline" (engine-bench writing the timeline)."""
        self.gaps.append({"name": name, "kind": kind, "kolo": kolo, "coll": coll, "size": size,
                          "ref": ref, "dtype": dtype, "mem": mem})

    def md_targets(self):
        L = ["## Issue #6 targets (2 ranks unless said)", ""]
        self.gaps = []
        ks, kt = self.kolo.get("shm"), self.kolo.get("tcp")
        if not ks and not kt:
            return L + ["kolo-bench was not available in this run, so no target could be "
                        "checked (%s)." % self.status["kolo-shm"][1], ""]
        L.append("| target | measured | met |")
        L.append("|---|---|---|")
        st = self.store

        def t(peer, coll, dt, size, place="oop", np=2):
            return st.med(np, peer, coll, dt, size, place)
        M = 64 << 20
        if ks:
            a, b = t(ks, "allreduce", "float32", M), t("ompi-shm", "allreduce", "float32", M)
            if a and b:
                r, used, both, state = paired_how(self.store, ks, "ompi-shm", "allreduce", M)
                L.append("| allreduce 64 MiB float32 busbw ≥ %g × Open MPI shm | %.2f× (%s; medians %.2f vs "
                         "%.2f GB/s) | %s |" % (BAR_ALLREDUCE_64M, r, pair_note(used, both, state), M / 1e3 / a,
                                               M / 1e3 / b, _met(r >= BAR_ALLREDUCE_64M, r / BAR_ALLREDUCE_64M)))
                if r < BAR_ALLREDUCE_64M:
                    self.gap("allreduce 64 MiB ≥ 1.3 × Open MPI shm", "peer", ks, "allreduce", M, "ompi-shm")
            tb = bound_time_us("allreduce", 2, M, self.lim)
            if a and tb:
                L.append("| allreduce 64 MiB ≥ 80 %% of the memory-traffic bound | %.0f %% of "
                         "%.2f GB/s | %s |" % (100 * tb / a, M / 1e3 / tb,
                                               _met(tb / a >= 0.8, tb / a / 0.8)))
                if tb / a < 0.8:
                    self.gap("allreduce 64 MiB ≥ 80 % of the memory-traffic bound", "bound", ks, "allreduce", M)
            mc = getattr(self, "memc", None) or {}
            pm = mc.get("mem") or []
            if tb and pm:
                mm, k = (statistics.median(x[i] for x in pm) for i in (0, 1))
                far = sum(1 for x in pm if self.store.state(x[2]) == "far")
                # each launch against B measured right after it, when it was: the memory system's
                # speed drifts by minutes on a VM, as the peers' does, and the pairing cancels it
                B = self.lim["dram_traffic_GBps"]
                beside = [(tb * B / x[3], x) for x in pm if len(x) > 3 and x[3]]
                if beside:
                    share = statistics.median(bt / x[1] for bt, x in beside)
                    share_m = statistics.median(bt / x[0] for bt, x in beside)
                    how = ("; each launch against B measured right after it (%.1f to %.1f GB/s), per launch "
                           "%s; against the run's best B: %.0f %%" % (
                               min(x[3] for _, x in beside), max(x[3] for _, x in beside),
                               ", ".join("%.0f %%" % (100 * bt / x[1]) for bt, x in beside), 100 * tb / k))
                else:
                    share, share_m, how = tb / k, tb / mm, ""
                L.append("| the same with buffers from `kolo_mem_alloc` (ranks read and write each other's buffers; "
                         "`kolo-bench --vs mem`: each of %d launches, %d in the far state, times malloc'd and "
                         "shared buffers call by call) | %.0f %% (%.2f GB/s; malloc'd in the same launches: "
                         "%.0f %%, %.2f GB/s%s)%s | %s |" % (
                             len(pm), far, 100 * share, M / 1e3 / k, 100 * share_m, M / 1e3 / mm, how,
                             "; %d WRONG elements" % mc["wrong"] if mc.get("wrong") else "",
                             _met(share >= 0.8 and not mc.get("wrong"), share / 0.8)))
                if share < 0.8:
                    self.gap("allreduce 64 MiB with `kolo_mem_alloc` buffers ≥ 80 % of the bound", "bound", ks,
                             "allreduce", M, mem="kolo")
            a, b = t(ks, "allreduce", "float32", 8), t("ompi-shm", "allreduce", "float32", 8)
            if a and b:
                r, used, both, state = paired_how(self.store, ks, "ompi-shm", "allreduce", 8)
                L.append("| allreduce 8 B latency ≤ 1.5 × Open MPI shm | %.2f× Open MPI's time (%s; medians %.2f us "
                         "vs %.2f us) | %s |" % (1 / r, pair_note(used, both, state), a, b,
                                                 _met(r >= BAR_LATENCY_8B, r / BAR_LATENCY_8B)))
                if r < BAR_LATENCY_8B:
                    self.gap("allreduce 8 B latency ≤ 1.5 × Open MPI shm", "peer", ks, "allreduce", 8, "ompi-shm")
            a16, a32 = t(ks, "allreduce", "float16", M), t(ks, "allreduce", "float32", M)
            sweep = ("the sweep's medians, separate launches: %.2f vs %.2f GB/s" % (M / 1e3 / a16, M / 1e3 / a32)
                     if a16 and a32 else "")
            pf = mc.get("float16") or []
            if pf:
                rs = [x[0] / x[1] for x in pf]
                r = statistics.median(rs)
                t32, t16 = (statistics.median(x[i] for x in pf) for i in (0, 1))
                L.append("| float16 allreduce 64 MiB byte rate ≥ float32's | %.2f× (`kolo-bench --vs "
                         "float16`: both types call by call in each of %d launches, float16 on either side "
                         "of the pair in turn; per launch %s; %.2f vs "
                         "%.2f GB/s)%s | %s |" % (r, len(pf), ", ".join("%.2f" % x for x in rs), M / 1e3 / t16,
                                                M / 1e3 / t32, "; " + sweep if sweep else "", _met(r >= 1, r)))
                if r < 1:
                    self.gap("float16 allreduce 64 MiB byte rate ≥ float32's", "peer", ks, "allreduce", M, ks,
                             dtype="float16")
            elif sweep:
                L.append("| float16 allreduce 64 MiB byte rate ≥ float32's | %s | %s |" % (
                    sweep, _met(a16 <= a32, a32 / a16)))
        for kolo, ref, what in ((ks, "ompi-shm", "shared memory"), (kt, "ompi-tcp", "TCP")):
            if not kolo:
                continue
            for coll in TARGET_COLLS:
                ps = self.paired_speedups(kolo, ref, coll)
                if ps:
                    worst = min(ps)
                    ok = sum(1 for r, *_ in ps if r >= 1)
                    used, both = sum(x[2] for x in ps), sum(x[3] for x in ps)
                    bare = [x for x in ps if not x[2]]
                    in_state = [x for x in bare if x[4]]
                    rs = self.speedups(kolo, ref, coll)
                    L.append("| %s ≥ Open MPI %s at ≥ 64 KiB | %d of %d sizes; worst %.2f× at %s (pairs of "
                             "launches in one state: %d of %d used%s); the medians over all launches: %d of %d%s "
                             "| %s |" % (coll, what, ok, len(ps), worst[0], fmt_size(worst[1]), used, both,
                                         bare_note(len(bare), len(in_state)) if bare else "", sum(1 for r, _ in rs if r >= 1), len(rs),
                                         self.by_state(kolo, ref, coll), _met(ok == len(ps), worst[0])))
                    if ok < len(ps):
                        self.gap("%s ≥ Open MPI %s at ≥ 64 KiB (worst size, %s)" % (coll, what, fmt_size(worst[1])),
                                 "peer", kolo, coll, worst[1], ref)
        # in place: what frameworks call (Horovod's fusion buffer, DDP's buckets, allreduce_), and
        # a path of its own in both libraries (Open MPI's in place skips its copy of the input)
        ps = self.paired_speedups(ks, "ompi-shm", "allreduce", places=("ip",)) if ks else []
        if ps:
            behind = sorted((r, s) for r, s, *_ in ps if r < 1)
            L.append("| (no target) allreduce in place, the form frameworks call, ≥ Open MPI shm in place at "
                     "≥ 64 KiB | %d of %d sizes%s (pairs of launches in one state: %d of %d used) | — |" % (
                         len(ps) - len(behind), len(ps), "; below: %s" % ", ".join(
                             "%s %.2f×" % (fmt_size(s), r) for r, s in behind) if behind else "",
                         sum(x[2] for x in ps), sum(x[3] for x in ps)))
        for np in self.args.np_list:
            if np <= NCPU or not ks:
                continue
            wrong = sum((e["wrong"] or 0) for (n, p, *_), e in st.t.items() if n == np and p == ks)
            rows = sum(1 for (n, p, *_) in st.t if n == np and p == ks)
            L.append("| %d ranks on %d cores: correct | %d sizes measured, %d wrong elements | "
                     "%s |" % (np, NCPU, rows, wrong, _met(rows > 0 and wrong == 0, None)))
        for np in self.args.np_list:
            if np != 2:
                L += self.md_counts(np)
        for o in self.oversub:
            if o["peer"].family != "kolo":
                continue
            wrong = sum((w or 0) for r in o["rows"] for _, w in r["place"].values())
            L.append("| %d ranks on %d cores stay correct | %d of %d sizes, %d wrong elements; "
                     "CPU/wall %s (%d.0 = every core busy; see Oversubscribed) | %s |" % (
                         o["np"], NCPU, len(o["rows"]), len(OVERSUB_SIZES), wrong,
                         "%.2f" % o["cpu"] if o["cpu"] is not None else "—", NCPU,
                         _met(len(o["rows"]) == len(OVERSUB_SIZES) and wrong == 0
                              and not o["fails"], None)))
        L += self.md_engine_targets()
        L.append("")
        return L

    def md_rechecks(self):
        """What the recheck (recheck_targets) added, size by size: the sweep's pairs against all."""
        rc = getattr(self, "rechecks", None)
        if rc is None:
            return []
        L = ["## Rechecked target sizes", ""]
        if not rc:
            return L + ["No size of a target against Open MPI needed a recheck, or it was off (`--recheck 0`).", ""]
        L.append("After the sweep, each size of a target against Open MPI whose verdict was uncertain (fewer than %d "
                 "pairs of launches in one machine state, or a paired ratio within %d %% of its bar, above or below) "
                 "got %d more pairs of launches of that size alone, kolo's first in every other pair, least certain "
                 "first, %d at a time for as long as all its pairs so far left it uncertain (%d at most); %g "
                 "min in all at most. They count in the targets above like the sweep's pairs "
                 "(and in the side-by-side medians of those sizes). **kolo ×** = Open MPI time / kolo time; for "
                 "8 B the bar is 1 / 1.5." % (RECHECK_MIN_PAIRS, 100 * RECHECK_BAND, RECHECK_ROUNDS, RECHECK_ROUNDS,
                                                               RECHECK_ROUNDS * RECHECK_PASSES, self.args.recheck))
        L.append("")
        L.append("| transport | collective | size | bar | the sweep's | with the recheck | pairs added |")
        L.append("|---|---|---:|---:|---|---|---:|")

        def how(r, used, both):
            return "%.2f× (%s)" % (r, "%d of %d pairs in one state" % (used, both) if used
                                   else "no pair in one state")
        for tr, coll, size, bar, before, rounds in rc:
            r, used, both, _ = paired_how(self.store, "kolo-" + tr, "ompi-" + tr, coll, size)
            L.append("| %s | %s | %s | %.2f× | %s | %s | %d |" % (
                tr, coll, fmt_size(size), bar, how(*before), how(r, used, both) if r else "—", rounds))
        L.append("")
        return L

    def md_states(self):
        """kolo against Open MPI over shared memory and TCP, split by the machine state each launch
        saw."""
        launches = getattr(self, "pings", [])
        pings = [b for b, _ in launches if b is not None]
        L = ["## The machine's state at each launch", ""]
        if not pings:
            return L + ["Not measured (machine_limits --ping was not available).", ""]
        st, split = self.store, self.store.split
        L.append("Before and after every launch the harness measures the shared-memory ping between cpus 0 "
                 "and 1 (`machine_limits --ping`, where the ranks are bound). %d launches: %.3f to "
                 "%.3f us before, median %.3f." % (len(launches), min(pings), max(pings),
                                                  statistics.median(pings)))
        if split is None:
            return L + ["", "No ping was 2.5 times slower than the 10th percentile: the machine "
                        "stayed in one state.", ""]
        states = [st.state(e) for e in launches]
        n_near, n_far, n_mixed = (states.count(x) for x in ("near", "far", "mixed"))
        L.append("Above %.3f us the machine counts as **far**. A launch whose pings before and after "
                 "both fall on one side ran in that state: %d near, %d far; %d changed state while they "
                 "ran (**mixed**: in the medians over all launches, in neither state's). "
                 "On a VM whose vCPUs the host moves between cores that share a cache and cores "
                 "that do not, every shared-memory figure depends on this, and a median over "
                 "repetitions that fell in different states mixes two machines. Below, kolo and "
                 "Open MPI over shared memory and over TCP (loopback moves its bytes between "
                 "the same two cores), 2 ranks, float32, out-of-place, each from the launches "
                 "in one state only (median, with how many); **kolo ×** = Open MPI time / kolo "
                 "time. The targets' ratios against Open MPI pair the launches of one repetition "
                 "(seconds apart) and use the pairs whose two launches ran in the same state." % (
                     split, n_near, n_far, n_mixed))
        L.append("")
        if 2 not in self.args.np_list or not self.kolo:
            return L + ["(kolo at 2 ranks was not in this run)", ""]
        L.append("| transport | collective | size | near: kolo | near: Open MPI | near: kolo × | far: kolo | "
                 "far: Open MPI | far: kolo × |")
        L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        pick = [x for x in (8, 64 << 10, 1 << 20, 16 << 20, 64 << 20) if x in self.sizes]
        for tr, ref in (("shm", "ompi-shm"), ("tcp", "ompi-tcp")):
            ks = self.kolo.get(tr)
            if not ks:
                continue
            for coll in self.args.coll_list:
                for size in pick:
                    if size == 8 and coll != "allreduce":
                        continue
                    cells = []
                    for state in ("near", "far"):
                        a = st.med(2, ks, coll, "float32", size, "oop", state)
                        b = st.med(2, ref, coll, "float32", size, "oop", state)
                        na = st.count(2, ks, coll, "float32", size, "oop", state)
                        nb = st.count(2, ref, coll, "float32", size, "oop", state)
                        cells += ["%s (%d)" % (cell(a, coll, 2, size), na) if a else "—",
                                  "%s (%d)" % (cell(b, coll, 2, size), nb) if b else "—",
                                  ratio_cell(b / a) if a and b else "—"]
                    L.append("| %s | %s | %s | %s |" % (tr, coll, fmt_size(size), " | ".join(cells)))
        L.append("")
        return L

    def paired_speedups(self, kolo, ref, coll, places=("oop", "ip"), np=2):
        """[(ratio, size, used, both, state)] as paired_how() for np ranks, float32, from 64 KiB."""
        out = []
        for s in self.sizes:
            if s >= (64 << 10):
                r, used, both, state = paired_how(self.store, kolo, ref, coll, s, np=np, places=places)
                if r is not None:
                    out.append((r, s, used, both, state))
        return out

    def speedups(self, kolo, ref, coll, state=None):
        """[(peer time / kolo time, size)] for 2 ranks, float32, from 64 KiB, at the sizes both
        measured (with state: both measured in launches in that machine state)."""
        rs = []
        for s in self.sizes:
            if s >= (64 << 10):
                a, b, _ = matched(self.store, 2, kolo, ref, coll, "float32", s, state)
                if a and b:
                    rs.append((b / a, s))
        return rs

    def md_counts(self, np):
        """Rows, with no target, of the sizes from 64 KiB at which kolo is at least as fast as Open
        MPI at np ranks, per transport and collective, with the sizes behind. The issue's targets
        are at 2 ranks; the README quotes this count for the sweep at 4. Each size's ratio is
        paired as the targets' are (paired_how): the 4-rank run 2026-12-04_2352 read 97 of 110 by
        the medians over all launches and 104 by pairs in one state, its TCP broadcast 2 MiB 0.75x
        by the medians (kolo's launches far, Open MPI's near) and 1.46x by its 2 pairs."""
        L = []
        for key, ref, what in (("shm", "ompi-shm", "shared memory"), ("tcp", "ompi-tcp", "TCP")):
            kolo = self.kolo.get(key)
            if not kolo:
                continue
            parts, sizes, unpaired = [], 0, 0
            for coll in self.args.coll_list:
                ps = self.paired_speedups(kolo, ref, coll, np=np)
                if not ps:
                    continue
                sizes += len(ps)
                unpaired += sum(1 for _, _, used, _, _ in ps if not used)
                behind = sorted((r, sz) for r, sz, *_ in ps if r < 1)
                parts.append("%s %d of %d%s" % (coll, len(ps) - len(behind), len(ps), " (%s)" % ", ".join(
                    "%s %.2f×" % (fmt_size(sz), r) for r, sz in behind) if behind else ""))
            if parts:
                reps = max((len(set(e["oop_rep"] + e["ip_rep"])) for (n, p, *_), e in self.store.t.items()
                            if n == np and p == kolo), default=0)
                how = ("; one launch per size" if reps <= 1 else
                       "; %d repetitions, each size's ratio the median over its pairs of launches in one "
                       "machine state%s" % (reps, " (%d of %d sizes without one: by the medians)" % (unpaired, sizes)
                                            if unpaired else ""))
                L.append("| (no target) %d ranks: kolo ≥ Open MPI %s at ≥ 64 KiB, float32, sizes at or above "
                         "(below, worst first)%s | %s | — |" % (np, what, how, "; ".join(parts)))
        return L

    def by_state(self, kolo, ref, coll):
        """'; per state: near 5 of 6, far 2 of 5' -- the sizes at which kolo is at least as fast,
        counting only sizes where both had launches in that state."""
        if self.store.split is None:
            return ""
        parts = []
        for state in ("near", "far"):
            rs = self.speedups(kolo, ref, coll, state)
            if rs:
                parts.append("%s %d of %d" % (state, sum(1 for r, _ in rs if r >= 1), len(rs)))
        return "; per state: " + ", ".join(parts) if parts else ""

    def md_engine_targets(self):
        """The engine's and the end-to-end targets: from engine_check, and from the latest
        bench/results/*-train-compare.md (make bench-train)."""
        L = []
        e = getattr(self, "engine", None) or {}
        if e.get("ratio"):
            r = statistics.median(e["ratio"])
            L.append("| ResNet-50-sized step through the engine ≤ 1.15 × one direct allreduce of the "
                     "same bytes (engine-bench, 2 ranks) | %.2f× (median of %d; %s) | %s |" % (
                         r, len(e["ratio"]), ", ".join("%.2f" % x for x in e["ratio"]),
                         _met(r <= 1.15, 1.15 / r)))
            if r > 1.15:
                self.gap("ResNet-50-sized step through the engine ≤ 1.15 × direct allreduce", "engine",
                         self.kolo.get("shm"), "allreduce", 0)
        else:
            L.append("| ResNet-50-sized step through the engine ≤ 1.15 × direct allreduce | not "
                     "measured in this run%s | — |" % (": " + e["why"] if e.get("why") else ""))
        if e.get("m_step") and e.get("off"):
            ms, off = statistics.median(e["m_step"]), statistics.median(e["off"])
            L.append("| (no target) the same step with the gradients in one `kolo_mem_alloc` arena "
                     "(`engine-bench -m 1`: buckets read mapped, as kolo.torch places gradients) | %.1f ms "
                     "against %.1f ms malloc'd (%.2f× faster; launches alternating, median of %d); %.2f× "
                     "one direct allreduce of the same bytes in such memory | — |" % (
                         ms, off, off / ms, len(e["m_step"]), statistics.median(e["m_ratio"])))
        elif e.get("m_why"):
            L.append("| (no target) the step with gradients in a `kolo_mem_alloc` arena | not measured: %s "
                     "| — |" % e["m_why"])
        lat = e.get("lat") or {}
        if lat.get("kolo"):
            k = statistics.median(lat["kolo"])
            hv = ("; Horovod 0.28.1 (horovod.torch, Gloo) %.2f ms (%s): kolo %.2f× as fast" % (
                statistics.median(lat["horovod"]) / 1e3, ", ".join("%.2f" % (x / 1e3) for x in lat["horovod"]),
                statistics.median(lat["horovod"]) / k) if lat.get("horovod") else "")
            L.append("| (no target) a latency-bound step through the Python API, the same code on both "
                     "(`bench/peers/step_latency.py`: 161 one-element tensors, `allreduce_async_` then "
                     "`synchronize`, 2 ranks, launches alternating; median of each launch's 300 steps) | kolo "
                     "%.2f ms (%s)%s%s | — |" % (k / 1e3, ", ".join("%.2f" % (x / 1e3) for x in lat["kolo"]), hv,
                                                 "; " + e["lat_why"] if e.get("lat_why") else ""))
        elif e.get("lat_why"):
            L.append("| (no target) a latency-bound step through the Python API | not measured: %s | — |" %
                     e["lat_why"])
        large = e.get("large") or {}
        if large.get("kolo"):
            def med(lib, c):
                return statistics.median(x[c] for x in large[lib])
            k = ", ".join("%s %.1f ms" % (c, med("kolo", c)) for c in LARGE_CASES)
            hv = ("; Horovod 0.28.1 (horovod.torch, Gloo) %s: kolo %s as fast" % (
                ", ".join("%s %.1f ms" % (c, med("horovod", c)) for c in LARGE_CASES),
                ", ".join("%.1f×" % (med("horovod", c) / med("kolo", c)) for c in LARGE_CASES))
                if large.get("horovod") else "")
            L.append("| (no target) collectives that return new large tensors through the Python API, the same "
                     "code on both (`bench/peers/large_outputs.py`: out-of-place allreduce of 64 MB, allgather of "
                     "64 MB from each rank, allgather of 29-32 MB drawn at random per call; 2 ranks, %d launches "
                     "each alternating, medians of each launch's 15 calls, then over launches) | kolo %s%s%s | — |" % (
                         len(large["kolo"]), k, hv, "; " + e["large_why"] if e.get("large_why") else ""))
        elif e.get("large_why"):
            L.append("| (no target) collectives that return new large tensors through the Python API | not "
                     "measured: %s | — |" % e["large_why"])
        if e.get("pairs") or e.get("b_pairs"):
            per_step = ""
            if e.get("pairs"):
                off, on = statistics.median(e["off"]), statistics.median(e["on"])
                per_step = ("started before and stopped after every step (`engine-bench -t`, each step paired "
                            "with one without): %+.1f %% (median of %d launches' medians: %s; step median %.1f "
                            "ms with, %.1f ms without)" % (
                                100 * (statistics.median(e["pairs"]) - 1), len(e["pairs"]),
                                ", ".join("%+.1f" % (100 * (x - 1)) for x in e["pairs"]), on, off))
            if e.get("b_pairs"):
                ov = statistics.median(e["b_pairs"]) - 1
                L.append("| timeline on costs ≤ 3 %% of the engine step | %+.1f %% with the timeline running, "
                         "as a job runs it (`engine-bench -t -T %d`: blocks of %d steps under one timeline paired "
                         "with blocks of %d without, the stop timed with the block's last step; "
                         "median of %d launches' medians: %s). %s | %s |" % (
                             100 * ov, TIMELINE_BLOCK, TIMELINE_BLOCK, TIMELINE_BLOCK, len(e["b_pairs"]),
                             ", ".join("%+.1f" % (100 * (x - 1)) for x in e["b_pairs"]),
                             ("With a timeline " + per_step + ".") if per_step else "",
                             _met(ov <= 0.03, 1.03 / (1 + ov))))
            else:
                ov = statistics.median(e["pairs"]) - 1
                L.append("| timeline on costs ≤ 3 %% of the engine step | timeline %s; the blocks under one "
                         "running timeline were not measured%s | %s |" % (
                             per_step, ": " + e["b_why"] if e.get("b_why") else "", _met(ov <= 0.03, 1.03 / (1 + ov))))
            if ov > 0.03:
                self.gap("timeline on costs ≤ 3 % of the engine step", "timeline", self.kolo.get("shm"),
                         "allreduce", 0)
        tc = latest_train_compare(self.args.out)
        if tc:
            name, ratios = tc
            for peer, x in ratios:
                L.append("| PyTorch synthetic benchmark, 2 workers: kolo ≥ %s (`%s`, make bench-train) "
                         "| %.2f× | %s |" % (peer, name, x, _met(x >= 1.0, x)))
        else:
            L.append("| PyTorch synthetic benchmark against Horovod and DDP | no "
                     "`*-train-compare.md` in the results directory (run `make bench-train`) | — |")
        return L

    def md_profiles(self):
        """Where the time goes in each unmet target: perf's CPU time per call by category, kolo
        beside the peer, and what the profile says would close the gap."""
        pr = getattr(self, "profiles", None)
        if pr is None:
            return []
        L = ["## Where the time goes in the unmet targets", ""]
        if pr["why"]:
            return L + ["Not profiled: %s." % pr["why"], ""]
        if not pr["items"]:
            return L + ["Every target was met; nothing to profile.", ""]
        L.append("For each target not met, the harness ran kolo's launch (and the peer's, at the "
                 "same size, where the target compares against one) once more under `perf record -e "
                 "cpu-clock -c %d`: a sample every %.1f ms of CPU time any thread of the launch runs "
                 "(a software event; this VM has no hardware counters), taken only during the timed "
                 "calls (rank 0 turns perf on and off through its control fifo, bench/perf_ctl.h), "
                 "about two seconds of them. Samples become CPU milliseconds per call, all ranks "
                 "together, by what the sampled code does:"
                 % (prof.PERIOD_NS, prof.PERIOD_NS / 1e6))
        L.append("")
        for key, label, what in prof.CATEGORIES:
            L.append("- **%s**: %s" % (label, what))
        L.append("")
        L.append("A rank asleep (futex, poll) takes no samples; one that spins does. Wall time is the "
                 "profiled launch's own figure per call, under perf: out-of-place where the call has "
                 "that form, as the sweep's ratios are; the samples cover its in-place calls too.")
        L.append("")
        for it in pr["items"]:
            g, sides = it["gap"], [x for x in it["sides"] if "cats" in x[3]]
            L.append("### %s" % g["name"])
            L.append("")
            for label, cmd, env, summ, wall in it["sides"]:
                envs = " ".join("%s=%s" % (k, os.path.basename(v) if k == "KOLO_TIMELINE" else v)
                                for k, v in sorted(env.items()))
                L.append("- %s: `%s%s`%s" % (label, envs + " " if envs else "", brief(cmd),
                                            "" if "cats" in summ else " — not profiled: " + summ["why"]))
            L.append("")
            if not sides:
                continue
            L.append("| per call | " + " | ".join(x[0] for x in sides) + " |")
            L.append("|---|" + "---:|" * len(sides))
            L.append("| wall time | " + " | ".join("%.3g ms" % x[4] if x[4] else "—" for x in sides) + " |")
            L.append("| CPU, all ranks | " + " | ".join("%.3g ms" % x[3]["cpu_ms"] for x in sides) + " |")
            for key, label, _ in prof.CATEGORIES:
                if any(x[3]["cats"][key] >= 0.005 * x[3]["cpu_ms"] for x in sides):
                    L.append("| %s | " % label + " | ".join(
                        "%.3g ms (%.0f %%)" % (x[3]["cats"][key], 100 * x[3]["cats"][key] / x[3]["cpu_ms"])
                        for x in sides) + " |")
            L.append("")
            for label, _, _, summ, _ in sides:
                L.append("Busiest in %s: %s." % (label, ", ".join(
                    "`%s` (%s) %.3g ms" % (sym, dso, ms) for ms, sym, dso, _ in summ["top"][:6])))
                L.append("")
            k = sides[0]
            p = sides[1] if len(sides) > 1 else None
            transport = self.peer(g["kolo"]).transport if g["kolo"] else "shm"
            bound = None
            if g["kind"] == "bound":
                tb = bound_time_us(g["coll"], 2, g["size"], self.lim)
                bound = tb / 1e3 if tb else None
            shows, close = prof.diagnose(k[3], p[3] if p else None, transport,
                                         p[0] if p else "", k[4], p[4] if p else None, bound)
            if g["kind"] == "bound" and g["mem"] == "malloc":
                close.insert(0, "Malloc'd buffers are private to each process: another rank's bytes "
                                "reach a rank only by a kernel copy (process_vm_readv, pinning every "
                                "page) or through a shared ring (two copies), never by the single read "
                                "and write per byte the bound counts. Buffers from `kolo_mem_alloc` "
                                "get there (the next row of the targets).")
            if g["kind"] == "timeline":
                w = k[3]["threads"].get("kolo-timeline", 0.0)
                shows.append("The timeline's writer thread (`kolo-timeline`) used %.3g ms of CPU per "
                             "step, %.1f %% of the step's CPU." % (w, 100 * w / k[3]["cpu_ms"]))
                e = getattr(self, "engine", None) or {}
                pairs = e.get("b_pairs") or e.get("pairs")
                ov = statistics.median(pairs) - 1 if pairs else None
                if ov is not None and w < 0.5 * ov * k[3]["cpu_ms"]:
                    close = ["The writer's own CPU is less than half the measured cost (%+.1f %%), and the "
                             "engine thread records most events in sequences (one slot per bucket phase, "
                             "about 40 ns per event; docs/timeline.md). By hand, the writer at idle "
                             "priority, waking every 100 ms instead of 5, or writing to tmpfs measured "
                             "within noise of the present one, and the same pairing with the timeline never "
                             "started reads 0.98-1.03 per launch: what is left is near what one launch can "
                             "resolve. What remains to cut is the writer's formatting (75-100 ns per event "
                             "on the other core, a fifth of it the kernel's page-cache copy): on two cores "
                             "that run two ranks in lock-step, every microsecond of it shows in a step that "
                             "does nothing but allreduce." % (100 * ov)]
                else:
                    close = ["The writer's formatting and writing is the cost: a binary format written "
                             "raw and converted to JSON after the run would cut it."]
            if shows:
                L.append("**What it shows.** " + " ".join(shows))
                L.append("")
            if close:
                L.append("**What would close it.** " + " ".join(close))
                L.append("")
        return L

    def md_bound(self):
        L = ["## The memory-traffic bound", ""]
        B = self.lim.get("dram_traffic_GBps")
        L.append("For messages of %s and more (out of cache), the time of a collective on n "
                 "ranks is bounded below by **t ≥ n · T(S) / B**, where B = %s GB/s is the "
                 "machine's measured DRAM traffic rate (bytes read plus written per second with "
                 "both cores, the best of memcpy ×2 and streaming add and sum ×3 over the run's measurements) and T(S) is what one rank "
                 "reads and writes when every input byte is read once and every output byte is "
                 "written once, shared evenly: the least any algorithm can move, reached when the "
                 "ranks read and write each other's buffers directly, as kolo's allreduce does on "
                 "`kolo_mem_alloc` buffers (S = nccl-tests' size). Results files up to "
                 "2026-11-22_0931 used a looser model (each rank writing only its own output: "
                 "allreduce 2.5 S at n = 2):" % (fmt_size(DRAM_MIN), B if B else "?"))
        L.append("")
        L.append("| collective | T(S) per rank | why |")
        L.append("|---|---|---|")
        for c, f, why in BOUND_FORMULAS:
            L.append("| %s | %s | %s |" % (c, f, why))
        L.append("")
        L.append("For messages up to %s with no more ranks than cores, the bound is the "
                 "measured one-way shared-memory flag latency (%s us) × ⌈log2 n⌉. In between, "
                 "the data is (partly) cache-resident and no bound is given. **share of bound** = "
                 "bound time / measured time, on kolo's shared-memory figures; 100 %% is the "
                 "wall." % (fmt_size(LAT_MAX), self.lim.get("shm_ping_oneway_us", "?")))
        if B:
            t = bound_time_us("allreduce", 2, 64 << 20, self.lim)
            L.append("Example: allreduce of 64 MiB on 2 ranks moves 2 × 2 × 64 MiB = 268 MB, so "
                     "t ≥ %.1f ms, a busbw bound of %.2f GB/s." % (t / 1e3, (64 << 20) / 1e3 / t))
        L.append("")
        return L

    def md_peers_status(self):
        L = ["## Peers in this run", ""]
        for p in self.peers:
            ok, why = self.status[p.key]
            L.append("- %s: %s" % (p.label, "ran" if ok else "**not run**: " + why))
        for n in self.notes:
            L.append("- %s" % n)
        L.append("")
        if self.cpu:
            L.append("CPU time / wall time of each peer's launches (all ranks and launchers; %d "
                     "cores, so %d.0 means every core was kept busy — ranks that spin while "
                     "waiting push this to the core count even when they have nothing to do):"
                     % (NCPU, NCPU))
            L.append("")
            nps = self.args.np_list
            L.append("| peer | " + " | ".join("%d ranks" % n for n in nps) + " |")
            L.append("|---|" + "---:|" * len(nps))
            for p in self.peers:
                cells = []
                for n in nps:
                    c = self.cpu.get((p.key, n))
                    cells.append("%.2f" % (c[0] / c[1]) if c and c[1] > 0 else "—")
                if any(x != "—" for x in cells):
                    L.append("| %s | %s |" % (p.label, " | ".join(cells)))
            L.append("")
        return L

    def md_oversub(self):
        if not self.oversub:
            return []
        L = ["## Oversubscribed: more ranks than cores", ""]
        L.append("allreduce, float32, out-of-place, checked, one run each. CPU/wall is CPU time "
                 "over wall time of the whole launch (%d cores): ranks that spin while they "
                 "wait keep it near %d even when the work is small." % (NCPU, NCPU))
        L.append("")
        hdr = ["peer", "ranks"] + ["%s time" % fmt_size(s) for s, _, _ in OVERSUB_SIZES] + \
            ["#wrong", "CPU/wall", "problems"]
        L.append("| " + " | ".join(hdr) + " |")
        L.append("|---|---:|" + "---:|" * (len(OVERSUB_SIZES) + 2) + "---|")
        for o in self.oversub:
            by = {r["size"]: r for r in o["rows"]}
            cells = []
            wrong = 0
            for s, _, _ in OVERSUB_SIZES:
                r = by.get(s)
                t = r["place"].get("oop") if r else None
                cells.append(fmt_us(t[0]) if t else "—")
                if r:
                    wrong += sum((w or 0) for _, w in r["place"].values())
            L.append("| %s | %d | %s | %d | %s | %s |" % (
                o["peer"].label, o["np"], " | ".join(cells), wrong,
                "%.2f" % o["cpu"] if o["cpu"] is not None else "—",
                "; ".join(o["fails"]) or "—"))
        L.append("")
        return L

    def md_tables(self):
        L = ["## Side by side", ""]
        L.append("Each peer's column is its median over all launches, whatever machine state each met; **kolo ×** "
                 "compares kolo with that peer as the targets do: by pairs of launches (seconds apart) that both ran "
                 "in one state, else by both peers' medians over their launches in one state, else over all "
                 "launches. Where the two columns' launches fell in different states, the ratio is not their "
                 "quotient.")
        L.append("")
        a = self.args
        for coll in a.coll_list:
            for dt in a.dtype_list:
                for np in a.np_list:
                    for tr, trname in (("shm", "shared memory"), ("tcp", "TCP")):
                        peers = [p for p in self.peers if p.transport == tr
                                 and self.status[p.key][0]]
                        if not peers:
                            continue
                        kolo = self.kolo.get(tr)
                        others = [p for p in peers if p.family != "kolo"]
                        L.append("### %s · %s · %d ranks · %s" % (coll, dt, np, trname))
                        L.append("")
                        hdr = ["size"]
                        if kolo:
                            hdr.append("kolo")
                        for p in others:
                            hdr.append(p.short)
                            if kolo:
                                hdr.append("kolo ×")
                        show_bound = kolo and tr == "shm"
                        if show_bound:
                            hdr.append("share of bound")
                        L.append("| " + " | ".join(hdr) + " |")
                        L.append("|---:|" + "---:|" * (len(hdr) - 1))
                        any_row = False
                        for s in self.sizes:
                            r = [fmt_size(s)]
                            have = False
                            if kolo:
                                t, pl = primary(self.store, np, kolo, coll, dt, s)
                                have |= t is not None
                                r.append(cell(t, coll, np, s, pl))
                            for p in others:
                                t, pl = primary(self.store, np, p.key, coll, dt, s)
                                have |= t is not None
                                r.append(cell(t, coll, np, s, pl))
                                if kolo:
                                    rr, _, _, _ = paired_how(self.store, kolo, p.key, coll, s, dt, np)
                                    r.append(ratio_cell(rr))
                            if show_bound:
                                tb = bound_time_us(coll, np, s, self.lim)
                                t, _ = primary(self.store, np, kolo, coll, dt, s)
                                r.append("%.0f %%" % (100 * tb / t) if tb and t else "—")
                            if have:
                                any_row = True
                                L.append("| " + " | ".join(r) + " |")
                        if not any_row:
                            L.pop()
                            L.pop()
                            L.append("(no peer measured this)")
                        L.append("")
        return L


def paired_how(store, kolo, ref, coll, size, dtype="float32", np=2, places=("oop", "ip")):
    """(peer time / kolo time, used, both, state) from a Store: the median ratio over the
    repetitions whose two launches (kolo's and the peer's, seconds apart) both ran wholly in one machine state, the
    same for both; `used` such pairs of the `both` repetitions that measured both. With no
    such pair, the ratio of the two peers' medians over their launches in one state, from
    any repetitions (the near state where both have launches in it, else the far one; used
    = 0), and with no state both met, of the medians over all launches (used = 0). A pair
    split across states compares two machines: this VM's far state slows every peer's
    shared-memory and loopback figures about 2x, so a pair whose launches fell on either side
    of a switch reads a 2x gap either way that neither library has (run 2026-12-04_1340:
    kolo's TCP allgathers of 64 and 256 MiB all ran far, Open MPI's near, and the medians
    over all launches read 0.75x where by hand, alternating, kolo took 30 ms a call far
    against Open MPI's 31 and 15 near against 25). Out of place where both have it, else in
    place; `places` ("ip",) compares the in-place calls. `state`: the state whose
    launches a ratio without pairs compares, or None (all launches; or pairs were used)."""
    for place in places:
        pr, both = store.pairs(np, kolo, ref, coll, dtype, size, place)
        if pr:
            return statistics.median(b / a for a, b, _ in pr), len(pr), both, None
        for state in ("near", "far", "one"):
            a = store.med(np, kolo, coll, dtype, size, place, state)
            b = store.med(np, ref, coll, dtype, size, place, state)
            if a and b:
                return b / a, 0, both, state
        a = store.med(np, kolo, coll, dtype, size, place)
        b = store.med(np, ref, coll, dtype, size, place)
        if a and b:
            return b / a, 0, both, None
    return None, 0, 0, None


def bare_note(bare, in_state):
    """The targets' table: how the sizes without a pair of launches in one state were compared."""
    if in_state == bare:
        return "; %d sizes without one, by the medians of both peers' launches in one state" % bare
    if not in_state:
        return "; %d sizes without one, by all launches' medians" % bare
    return ("; %d sizes without one, %d by the medians of both peers' launches in one state, %d by all "
            "launches' medians" % (bare, in_state, bare - in_state))


def pair_note(used, both, state=None):
    """How a paired_how() ratio was made, for the targets' table."""
    if used:
        return "median of %d of %d pairs of launches in one machine state" % (used, both)
    if state:
        return ("ratio of the medians of both peers' launches in the %s state: no pair of launches in one "
                "state" % state)
    return "ratio of the medians over all launches: no pair of launches in one state"


# ---------------------------------------------------------------- rechecking uncertain verdicts

RECHECK_ROUNDS = 4  # per size and pass: two rounds with kolo's launch first, two with the peer's
RECHECK_BAND = 0.15  # a paired ratio within 15 % of its target's bar, either side, is rechecked
RECHECK_REP0 = 1000  # the rechecks' repetition numbers start here (the sweep's are 0, 1, ...)
RECHECK_PASSES = 3  # passes at most: a size still uncertain after one gets RECHECK_ROUNDS more pairs
# Fewer pairs in one machine state than this leave a verdict uncertain: the median of 2 is their
# mean, which one odd pair decides (run 2026-12-07_0724: alltoall 512 KiB 0.85x Open MPI by 2 pairs,
# just outside the band, so not rechecked; by hand, 6 rounds in the same state, at parity)
RECHECK_MIN_PAIRS = 3


def recheck_items(store, sizes, colls, keys):
    """The sizes of the targets against Open MPI (2 ranks, float32) whose verdict the sweep left
    uncertain, least certain first: [(transport, coll, size, bar, (ratio, used, both))]. Uncertain:
    fewer than RECHECK_MIN_PAIRS pairs of launches in one machine state, or a paired ratio within
    RECHECK_BAND of the bar on either side (so a size that barely met its bar is rechecked as much
    as one that barely missed it). `keys`: the peers that ran."""
    out = []
    for tr in ("shm", "tcp"):
        kolo, ref = "kolo-" + tr, "ompi-" + tr
        if kolo not in keys or ref not in keys:
            continue
        cands = []
        if tr == "shm" and "allreduce" in colls:
            cands += [("allreduce", 64 << 20, BAR_ALLREDUCE_64M), ("allreduce", 8, BAR_LATENCY_8B)]
        for coll in TARGET_COLLS:
            if coll in colls:
                cands += [(coll, s, 1.0) for s in sizes if s >= (64 << 10)]
        for coll, size, bar in cands:
            r, used, both, _ = paired_how(store, kolo, ref, coll, size)
            if r is None:
                continue
            off = abs(r / bar - 1)
            if used < RECHECK_MIN_PAIRS or off < RECHECK_BAND:
                out.append((used >= RECHECK_MIN_PAIRS, off, tr, coll, size, bar, (r, used, both)))
    out.sort(key=lambda x: x[:2])
    return [x[2:] for x in out]


def recheck_targets(a, running, run, logdir, minutes):
    """Runs RECHECK_ROUNDS more pairs of launches (kolo and Open MPI, one size, the sweep's
    iterations for it) for each uncertain size (recheck_items), alternating which goes first;
    then, while time is left, again for the sizes the pairs so far still leave uncertain (at most
    RECHECK_PASSES times), until `minutes` have passed. Their rows join the store under
    repetitions of their own, so the targets' pairs count them like the sweep's. Returns
    [(transport, coll, size, bar, before, rounds)] in the order first rechecked, before = (ratio,
    used, both) from the sweep alone, rounds = the pairs added."""
    store = run.store
    store.split = state_split([x for e in run.pings for x in e if x is not None])
    peers = {p.key: p for p in running}
    sizes = sweep_sizes(a.band_list)
    items = recheck_items(store, sizes, a.coll_list, set(peers)) if 2 in a.np_list else []
    if not items or minutes <= 0 or "float32" not in a.dtype_list:
        return []
    print("compare: rechecking %d uncertain target sizes against Open MPI (up to %g min)" % (len(items), minutes),
          flush=True)
    sub = argparse.Namespace(**vars(a))
    sub.dtype_list = ["float32"]
    t_end = time.monotonic() + minutes * 60
    done = {}  # (transport, coll, size) -> [bar, before, rounds]
    rep = RECHECK_REP0
    for _pass in range(RECHECK_PASSES):
        for tr, coll, size, bar, seen in items:
            if time.monotonic() >= t_end:
                break
            band = next((b for b in a.band_list if b.lo <= size <= b.hi), None)
            if band is None:
                continue
            sub.coll_list = [coll]
            one = [Band(size, size, band.iters, band.warmup, 2)]
            kolo, ref = peers["kolo-" + tr], peers["ompi-" + tr]
            e = done.setdefault((tr, coll, size), [bar, seen, 0])
            for k in range(RECHECK_ROUNDS):
                for p in ((kolo, ref) if k % 2 == 0 else (ref, kolo)):
                    for _ in run_round(p, 2, rep, one, 0, sub, logdir, run):
                        pass
                rep += 1
                e[2] += 1
                if time.monotonic() >= t_end:
                    break
            r, used, both, _ = paired_how(store, kolo.key, ref.key, coll, size)
            print("compare: recheck %s %s %s: %.2fx (%d of %d pairs) -> %.2fx (%d of %d)" % (
                tr, coll, fmt_size(size), seen[0], seen[1], seen[2], r, used, both), flush=True)
        if time.monotonic() >= t_end:
            break
        # the sizes still uncertain with every pair so far (only rechecked ones can have changed)
        items = [x for x in recheck_items(store, sizes, a.coll_list, set(peers)) if tuple(x[:3]) in done]
        if not items:
            break
    return [(tr, coll, size, bar, before, rounds) for (tr, coll, size), (bar, before, rounds) in done.items()]


def _met(ok, factor):
    if ok:
        return "yes"
    short = 100 * (1 - factor) if factor else 0
    # one decimal below 10 %: a 0.995x ratio read "0 % short" beside its "no"
    return "**no**" + ((" (%.1f %% short)" if short < 10 else " (%.0f %% short)") % short if factor else "")


# ---------------------------------------------------------------- plots

def plot(report, prefix):
    """One PNG per collective: busbw against size, panels per (ranks, type), a line per peer."""
    gp = shutil.which("gnuplot")
    a, store = report.args, report.store
    datadir = os.path.join(BUILD, "plotdata")
    os.makedirs(datadir, exist_ok=True)
    pngs = []
    panels = [(np, dt) for np in a.np_list for dt in a.dtype_list]
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    for coll in a.coll_list:
        series = []  # (panel index, label, datafile)
        for pi, (np, dt) in enumerate(panels):
            for p in report.peers:
                if not report.status[p.key][0]:
                    continue
                pts = []
                for s in report.sizes:
                    t, _ = primary(store, np, p.key, coll, dt, s)
                    if t:
                        bw = s / 1e3 / t * bus_factor(coll, np)
                        if bw > 0:
                            pts.append((s, bw))
                if not pts:
                    continue
                fn = os.path.join(datadir, "%s-%s-%d-%s-%s.dat" % (prefix, coll, np, dt, p.key))
                with open(fn, "w") as f:
                    for s, bw in pts:
                        f.write("%d %.6g\n" % (s, bw))
                series.append((pi, p, fn))
        if not series:
            continue
        png = os.path.join(a.out, "%s-%s.png" % (prefix, coll))
        if gp:
            script = ['set terminal pngcairo size %d,%d font "sans,9"' % (700 * cols, 430 * rows),
                      'set output "%s"' % png,
                      'set multiplot layout %d,%d title "%s: bus bandwidth vs message size (%s)"'
                      % (rows, cols, coll, report.stamp.replace("_", " ")),
                      "set logscale x 2", "set logscale y 10", "set grid", "set key left top font ',8'",
                      'set xlabel "message size (bytes)"', 'set ylabel "busbw (GB/s)"',
                      "set format x '%.0b%B'", "set format y '%g'", "set xtics 16", "set mytics 10",
                      "set yrange [0.001:*]"]
            for pi, (np, dt) in enumerate(panels):
                ss = [x for x in series if x[0] == pi]
                script.append('set title "%d ranks, %s"' % (np, dt))
                if not ss:
                    script.append("unset key; plot 2 notitle lc rgb 'white'; set key")
                    continue
                parts = []
                for _, p, fn in ss:
                    style = "lw 2.5" if p.family == "kolo" else "lw 1.2"
                    dash = "dt 1" if p.transport == "shm" else "dt 2"
                    parts.append("'%s' using 1:2 with linespoints %s %s pt 7 ps 0.4 title '%s'" % (
                        fn, style, dash, p.short))
                script.append("plot " + ", ".join(parts))
            script.append("unset multiplot")
            r = subprocess.run(["gnuplot"], input="\n".join(script), text=True,
                               capture_output=True)
            if r.returncode == 0 and os.path.exists(png):
                pngs.append(png)
            else:
                report.notes.append("gnuplot failed for %s: %s" % (coll, r.stderr.strip()[:200]))
        else:
            if not _plot_matplotlib(png, coll, panels, series, cols, rows, report.stamp):
                report.notes.append("no plot for %s: neither gnuplot nor matplotlib" % coll)
                continue
            pngs.append(png)
    return pngs


def _plot_matplotlib(png, coll, panels, series, cols, rows, stamp):
    code = r'''
import sys, json
import matplotlib; matplotlib.use("Agg")
import matplotlib.pyplot as plt
cfg = json.loads(sys.argv[1])
fig, axes = plt.subplots(cfg["rows"], cfg["cols"], figsize=(7 * cfg["cols"], 4.3 * cfg["rows"]),
                         squeeze=False)
for pi, (np_, dt) in enumerate(cfg["panels"]):
    ax = axes[pi // cfg["cols"]][pi % cfg["cols"]]
    for (i, label, fn, kolo, shm) in cfg["series"]:
        if i != pi: continue
        xs, ys = zip(*[tuple(map(float, l.split())) for l in open(fn)])
        ax.plot(xs, ys, marker=".", lw=2.5 if kolo else 1.2, ls="-" if shm else "--", label=label)
    ax.set_xscale("log", base=2); ax.set_yscale("log"); ax.grid(True, which="both", alpha=.3)
    ax.set_title("%d ranks, %s" % (np_, dt)); ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)"); ax.legend(fontsize=7)
fig.suptitle(cfg["title"]); fig.tight_layout(); fig.savefig(cfg["png"], dpi=90)
'''
    import json
    cfg = {"rows": rows, "cols": cols, "panels": panels, "png": png,
           "title": "%s: bus bandwidth vs message size (%s)" % (coll, stamp),
           "series": [(i, p.short, fn, p.family == "kolo", p.transport == "shm")
                      for i, p, fn in series]}
    r = subprocess.run([PY, "-c", code, json.dumps(cfg)], capture_output=True, text=True)
    return r.returncode == 0


# ---------------------------------------------------------------- main

# (size, iters, warmup). Six sizes, from latency-bound to bandwidth-bound: with three (8 B, 64
# KiB, 4 MiB) the 16-rank 64 KiB figure was the only sign of rings faulted in mid-launch
# (c313cc4), and nothing between 64 KiB and 4 MiB or above 4 MiB was looked at.
OVERSUB_SIZES = [(8, 20, 5), (4 << 10, 20, 5), (64 << 10, 10, 2), (1 << 20, 10, 2), (4 << 20, 5, 1),
                 (16 << 20, 3, 1)]


def latest_train_compare(outdir):
    """(file name, [(peer, kolo/peer at 2 workers)]) from the newest *-train-compare.md, or None."""
    files = sorted(f for f in os.listdir(outdir) if f.endswith("-train-compare.md")) if os.path.isdir(outdir) else []
    if not files:
        return None
    with open(os.path.join(outdir, files[-1])) as f:
        text = f.read()
    got = [(m.group(1), float(m.group(2))) for m in
           re.finditer(r"kolo / (.+?) with 2 workers: \**([0-9.]+)x", text)]
    return (files[-1], got) if got else None


TIMELINE_BLOCK = 5  # engine steps per timeline in the steady-state measurement (engine-bench -T)
# pairs of such blocks per launch: with 8, launches' medians read -1.4 to +9.8 % in run
# 2026-12-07_0724 (+4.9 % over 9); by hand there, 4 launches of 30 read +1.4 to +3.0 %
BLOCK_PAIRS = 24


def engine_check(a, logdir, reps=9):
    """engine-bench -np 2 -t: the engine's step against a direct allreduce of the same bytes, and
    what the timeline costs. Each launch pairs every engine step with one that writes the timeline
    (alternating order), so both sides of each pair meet the same machine state; the cost is the
    median over launches of each launch's median per-step ratio. That starts and stops a
    timeline (a writer thread, a file) around every timed step; a job starts one once. So after
    each, a launch pairs blocks of TIMELINE_BLOCK steps under one running timeline with blocks
    without (engine-bench -T): the cost of a timeline that is on. Then a launch with the
    gradients in one kolo_mem_alloc arena (engine-bench -m 1: buckets read mapped)."""
    out = {"ratio": [], "off": [], "on": [], "pairs": [], "b_pairs": [], "m_step": [], "m_ratio": []}
    if not os.access(ENGINE_BENCH, os.X_OK):
        out["why"] = "engine-bench not built"
        return out
    tl = os.path.join(logdir, "engine-timeline.json")
    cmd = [ENGINE_BENCH, "-np", "2", "-n", "20", "-w", "2", "-t", tl]
    with open(os.path.join(logdir, "engine-bench.log"), "w") as log:
        for rep in range(reps):
            text, rc, to, _ = run_launch(Launch(cmd), 300, log)
            log.write(text)
            step = re.search(r"engine step .*?median\s+([0-9.]+) ms", text)
            ratio = re.search(r"ratio engine / direct\s+([0-9.]+)", text)
            on = re.search(r"timeline on\s+median\s+([0-9.]+) ms; paired on / off median ([0-9.]+)", text)
            if rc or to or not (step and ratio and on):
                out["why"] = "engine-bench failed (exit %s%s); see %s" % (
                    rc, ", timed out" if to else "", os.path.relpath(log.name, ROOT))
                continue
            out["off"].append(float(step.group(1)))
            out["on"].append(float(on.group(1)))
            out["pairs"].append(float(on.group(2)))
            out["ratio"].append(float(ratio.group(1)))
            print("compare: engine-bench rep %d: step %s ms, with the timeline %s ms (paired %s), "
                  "engine/direct %s" % (rep + 1, step.group(1), on.group(1), on.group(2), ratio.group(1)),
                  flush=True)
            # the timeline as a job runs it: started once, then running; blocks of 5 steps per
            # timeline paired with blocks of 5 without
            text, rc, to, _ = run_launch(Launch(cmd[:3] + ["-n", str(BLOCK_PAIRS), "-w", "1", "-T",
                                                           str(TIMELINE_BLOCK), "-t", tl]), 300, log)
            log.write(text)
            on = re.search(r"timeline on\s+median\s+([0-9.]+) ms; paired on / off median ([0-9.]+)", text)
            if rc or to or not on:
                out["b_why"] = "engine-bench -T %d failed (exit %s%s); see %s" % (
                    TIMELINE_BLOCK, rc, ", timed out" if to else "", os.path.relpath(log.name, ROOT))
            else:
                out["b_pairs"].append(float(on.group(2)))
                print("compare: engine-bench -T %d rep %d: paired blocks %s" % (TIMELINE_BLOCK, rep + 1, on.group(2)),
                      flush=True)
            text, rc, to, _ = run_launch(Launch([ENGINE_BENCH, "-np", "2", "-n", "20", "-w", "2", "-m", "1"]), 300,
                                         log)
            log.write(text)
            step = re.search(r"engine step .*?median\s+([0-9.]+) ms", text)
            ratio = re.search(r"ratio engine / direct\s+([0-9.]+)", text)
            if rc or to or not (step and ratio):
                out["m_why"] = "engine-bench -m 1 failed (exit %s%s); see %s" % (
                    rc, ", timed out" if to else "", os.path.relpath(log.name, ROOT))
                continue
            out["m_step"].append(float(step.group(1)))
            out["m_ratio"].append(float(ratio.group(1)))
            print("compare: engine-bench -m 1 rep %d: step %s ms, engine/direct %s" % (
                rep + 1, step.group(1), ratio.group(1)), flush=True)
    for f in glob.glob(tl) + glob.glob(tl + ".*"):  # rank 0 writes tl, rank r tl.r
        os.remove(f)
    step_latency_check(out, logdir)
    large_outputs_check(out, logdir)
    return out


STEP_LATENCY = os.path.join(ROOT, "bench", "peers", "step_latency.py")
LARGE_OUTPUTS = os.path.join(ROOT, "bench", "peers", "large_outputs.py")
LARGE_CASES = ("allreduce", "allgather", "varying")


def python_pair(script, logname, parse, label, reps=3):
    """bench/peers/<script>: the same Python code through kolo.torch under kolorun and through
    horovod.torch under horovodrun, 2 ranks, launches alternating, `reps` of each, their output
    into the file logname. parse(lib, text)
    gives a launch's figure, or None when the launch failed. Returns ({"kolo": [figure per launch],
    "horovod": [...]}, why: what could not run, or "")."""
    got = {"kolo": [], "horovod": []}
    why = []
    launches = [("kolo", Launch([KOLORUN, "-np", "2", PY, script, "kolo"],
                                {"PYTHONPATH": os.path.join(ROOT, "python")}))]
    ok, hvd_why = PyPeer("horovod").available()
    runner = shutil.which("horovodrun") or "/usr/local/bin/horovodrun"
    if not ok or not os.access(runner, os.X_OK):
        why.append("Horovod: %s (make bench-compare builds it)" % (hvd_why or "%s not found" % runner))
    else:
        launches.append(("horovod", Launch([runner, "--gloo", "-np", "2", "-H", "localhost:2", "--network-interface",
                                            "lo", PY, script, "horovod"], {"GLOO_SOCKET_IFNAME": "lo"})))
    with open(logname, "w") as log:
        for rep in range(reps):
            for lib, ln in launches:
                text, rc, to, _ = run_launch(ln, 300, log)
                log.write(text)
                fig = None if rc or to else parse(lib, text)
                if fig is None:
                    why.append("%s failed (exit %s%s); see %s" % (lib, rc, ", timed out" if to else "",
                                                                 os.path.relpath(log.name, ROOT)))
                    continue
                got[lib].append(fig)
                print("compare: %s rep %d: %s %s" % (label, rep + 1, lib, fig), flush=True)
    return got, "; ".join(sorted(set(why)))


def step_latency_check(out, logdir, reps=3):
    """bench/peers/step_latency.py: a latency-bound step (161 one-element tensors submitted with
    allreduce_async_, then synchronized). Sets out["lat"] = {"kolo": [median us per launch],
    "horovod": [...]} and out["lat_why"] for what could not run."""
    def parse(lib, text):
        m = re.search(r"step_latency %s tensors \d+ steps \d+ median_us ([0-9.]+)" % lib, text)
        return float(m.group(1)) if m else None
    out["lat"], why = python_pair(STEP_LATENCY, os.path.join(logdir, "step-latency.log"), parse, "step latency",
                                  reps)
    if why:
        out["lat_why"] = why


def large_outputs_check(out, logdir, reps=3):
    """bench/peers/large_outputs.py: collectives that return new large tensors (out-of-place
    allreduce of 64 MB, allgather of 64 MB from each rank, allgather of 29-32 MB drawn at random
    per call). Sets out["large"] = {"kolo": [{case: median ms} per launch], "horovod": [...]} and
    out["large_why"] for what could not run."""
    def parse(lib, text):
        got = dict(re.findall(r"large_outputs %s (\w+) mb \d+ calls \d+ median_ms ([0-9.]+)" % lib, text))
        return {c: float(got[c]) for c in LARGE_CASES} if all(c in got for c in LARGE_CASES) else None
    out["large"], why = python_pair(LARGE_OUTPUTS, os.path.join(logdir, "large-outputs.log"), parse,
                                    "large outputs", reps)
    if why:
        out["large_why"] = why


def parse_paired(text):
    """kolo-bench --vs rows -> list of (size, A time us, B time us, #wrong or None)."""
    out = []
    for raw in text.splitlines():
        f = PREFIX.sub("", raw).split()
        if len(f) != 10 or not f[0].isdigit():
            continue
        ta, tb = _num(f[3]), _num(f[6])
        if ta and tb:
            out.append((int(f[0]), ta, tb, _wrong(f[9])))
    return out


def paired_check(a, logdir, reps=6, limits=None):
    """kolo-bench allreduce at 64 MiB, 2 ranks, in paired mode (--vs): each launch times its two
    sides call by call, so both meet the same machine. `mem`: buffers from malloc (A) against
    kolo_mem_alloc (B, the zero-copy path: how close kolo gets to the memory-traffic bound when
    the ranks can read and write each other's buffers); `float16`: float32 against float16 at the same bytes
    (whether the conversion costs byte rate), both types in the same buffers. float32 against
    float32 read 0.93-1.07 from launch to launch when the sides had buffers of their own (one
    launch's pages can suit one side better: on a Zen 3 VM side B won by 3-15 % in 6 launches
    of float16 against float32, whichever type it was), 0.97-1.04 in shared ones, hence medians
    over launches; and float16 takes side B in even repetitions and side A in odd ones, so a
    lasting bias between the sides cancels. Its entries are always (float32 us, float16 us).
    `limits`, when given, measures the machine's limits right after each `mem` launch, whose
    entry then carries the DRAM traffic rate B of that moment.
    Returns {"mem"|"float16": [(A us, B us, ping[, B GB/s])], "wrong": n}."""
    out = {"mem": [], "float16": [], "wrong": 0}
    if not os.access(KOLO_BENCH, os.X_OK):
        return out
    size = 64 << 20
    base = [KOLO_BENCH, "allreduce", "-b", str(size), "-e", str(size), "-n", "30", "-w", "3", "-c", "1",
            "-np", "2"]
    with open(os.path.join(logdir, "kolo-paired.log"), "w") as log:
        for rep in range(reps):
            for vs in (("mem", "float16") if rep % 2 == 0 else ("float16", "mem")):
                ping = state_ping()
                swap = vs == "float16" and rep % 2 == 1
                text, rc, to, _ = run_launch(Launch(base + (["-d", "float16", "--vs", "float32"] if swap else
                                                            ["--vs", vs])), 300, log)
                rows = parse_paired(text)
                if rc or to or not rows:
                    continue
                _, ta, tb, wrong = rows[0]
                if swap:
                    ta, tb = tb, ta
                out["wrong"] += wrong or 0
                print("compare: kolo-bench --vs %-7s 64 MiB allreduce %.0f us against %.0f us (ping %s)" % (
                    vs, ta, tb, "%.3f" % ping if ping is not None else "?"), flush=True)
                if vs == "mem" and limits:
                    out[vs].append((ta, tb, ping, limits().get("dram_traffic_GBps")))
                else:
                    out[vs].append((ta, tb, ping))
    return out


def profile_gaps(rep, logdir, timeout=180):
    """perf profiles for each unmet target (rep.gaps, from Report.md_targets): kolo's launch and,
    where the target compares against a peer, the peer's launch at the same size; for the
    timeline, the engine step with and without it. Each launch makes about two seconds of calls
    (from the sweep's own time at that size). Returns {"why": reason profiles are missing or "",
    "items": [{"gap", "sides": [(label, cmd, env, summary, wall ms per call)]}]}."""
    ok, why = prof.available()
    out = {"why": "" if ok else why, "items": []}
    if not ok or not rep.gaps:
        return out
    work = os.path.join(logdir, "profiles")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(logdir, "profiles.log"), "w") as log:
        def run(cmd, env):
            text, rc, to, _ = run_launch(Launch(cmd, env), timeout, log)
            log.write(text)
            return text, rc, to

        for i, g in enumerate(rep.gaps):
            item = {"gap": g, "sides": []}
            out["items"].append(item)
            if g["kind"] in ("engine", "timeline"):
                if not os.access(ENGINE_BENCH, os.X_OK):
                    continue
                cmd = [ENGINE_BENCH, "-np", "2", "-n", "30", "-w", "2", "-s", "1"]
                tl = os.path.join(work, "timeline.json")
                variants = [("kolo", {})] if g["kind"] == "engine" else \
                    [("kolo with the timeline", {"KOLO_TIMELINE": tl}), ("kolo without", {})]
                for j, (label, env) in enumerate(variants):
                    print("compare: profiling %s: %s" % (g["name"], label), flush=True)
                    summ, text = prof.profile(cmd, env, lambda _: 30, run, work, "gap%d-%d" % (i, j))
                    m = re.search(r"engine step .*?median\s+([0-9.]+) ms", text)
                    item["sides"].append((label, cmd, env, summ, float(m.group(1)) if m else None))
                for f in glob.glob(tl) + glob.glob(tl + ".*"):
                    os.remove(f)
                continue
            t_us = rep.store.med(2, g["kolo"], g["coll"], "float32", g["size"], "oop") or \
                rep.store.med(2, g["kolo"], g["coll"], "float32", g["size"], "ip") or 1000.0
            iters = int(min(100000, max(20, 2e6 / t_us)))
            warm = max(2, iters // 20)
            band = Band(g["size"], g["size"], iters, warm, 2.0)
            sides = [(g["kolo"], g["dtype"], g["mem"])]
            if g["ref"]:
                sides.append((g["ref"], "float32" if g["ref"] == g["kolo"] else g["dtype"], "malloc"))
            for j, (key, dt, mem) in enumerate(sides):
                peer = rep.peer(key)
                if not rep.status.get(key, (False,))[0]:
                    continue
                ln = peer.launches(2, [g["coll"]], [dt], [band], 0)[0]
                cmd = ln.cmd + (["--mem", "kolo"] if mem == "kolo" else [])
                label = peer.label if g["ref"] != g["kolo"] else "kolo %s" % dt
                print("compare: profiling %s: %s" % (g["name"], label), flush=True)
                def calls(text, size=g["size"], coll=g["coll"], n=iters):
                    # timed calls per rank: n for each placement the row has (out-of-place, in-place)
                    rows, _ = parse_rows(text, coll)
                    return sum(n * len(r["place"]) for r in rows if r["size"] == size)

                summ, text = prof.profile(cmd, ln.env, calls, run, work, "gap%d-%d" % (i, j))
                wall = None
                rows, _ = parse_rows(text, g["coll"])
                for r in rows:
                    if r["size"] == g["size"] and r["place"]:
                        wall = sweep_us(r) / 1e3
                item["sides"].append((label, cmd, ln.env, summ, wall))
    return out


def oversub_check(a, running, logdir, run):
    """kolo (and Open MPI, which yields when oversubscribed, for reference) at more ranks than
    cores: allreduce float32 at a few sizes, checked, once. Returns a list of result dicts."""
    out = []
    for np in a.oversub_list:
        for p in running:
            if p.key not in ("kolo-shm", "ompi-shm"):
                continue
            bands = [Band(s, s, it, wu, 2) for s, it, wu in OVERSUB_SIZES]
            launches = p.launches(np, ["allreduce"], ["float32"], bands, 1)
            rows, cpu, wall, fails = [], 0.0, 0.0, []
            with open(os.path.join(logdir, "%s-np%d-oversub.log" % (p.key, np)), "w") as log:
                for ln in launches:
                    text, rc, to, secs = run_launch(ln, 120, log)
                    got, _ = parse_rows(text, ln.coll)
                    rows += got
                    cpu += ln.cpu
                    wall += secs
                    if to:
                        fails.append("timed out after 120 s")
                    elif rc:
                        fails.append("exit %s" % rc)
            out.append({"peer": p, "np": np, "rows": rows, "cpu": cpu / wall if wall else None,
                        "fails": fails})
            print("compare: oversubscribed np %d %-13s %6.1f s %d rows%s" % (
                np, p.key, wall, len(rows), " (" + "; ".join(fails) + ")" if fails else ""),
                flush=True)
    return out


# Sizes and iterations. Sub-microsecond calls need many iterations, 256 MiB calls few; above
# 16 MiB the sweep steps by 4 (64 MiB, 256 MiB) to keep the full run near an hour here. 128 KiB
# to 1 MiB take 50 calls, as the small sizes do: with 10 after 3 warm-up calls their figures
# (60-600 us of calls in all) were the start of a launch, not the steady state a training loop
# meets; Open MPI's 128 KiB allgather read 5.6-6.3 us either way, kolo's 6.6-11.5 at 10 calls.
# Every benchmark, before its first timed size, keeps calling at that size until this many ms have
# passed (-W): this VM runs copies 1.5-2.5x slower in its first 20-50 ms of work, and a band's first
# size (50 calls of 128 KiB: ~0.3 ms) was timed in that state in some launches of every peer. 200
# ms since 2026-12-03 (50 before): at 64 MiB (1 warm-up call, 3 timed) kolo's choice between the
# ring and direct by CMA (src/coll/direct.c) had not yet timed both ways when the timed calls
# ran, so the row measured its first way, where a training loop runs the way it settles on
# within a dozen calls; a peer whose call takes longer than that pays at most one more call.
WARM_MS = 200
MEM = "malloc"  # --mem: where every peer's buffers come from (malloc'd, or in transparent huge pages)
HUGE_LINE = re.compile(r"buffers in transparent huge pages, asked for with madvise \(the kernel's mode: ([\w?]+)\): "
                       r"(\d+) MiB of rank 0's memory is in them")
FULL_BANDS = "8:64K:50:10:2,128K:1M:50:10:2,2M:16M:20:5:2,64M:256M:3:1:4"
QUICK_BANDS = "8:8:50:10:4,64:64K:50:10:4,256K:4M:10:3:4,16M:64M:3:1:4"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="fewer sizes (8 B, then 64 B..64 MiB by 4), 1 repetition, 2 ranks, "
                        "float32 (~5 min)")
    p.add_argument("--reps", type=int, help="repetitions (default 3; quick 1)")
    p.add_argument("--nranks", help="rank counts, e.g. 2,4 (default 2,4; quick 2)")
    p.add_argument("--colls", help="collectives (default all five)")
    p.add_argument("--dtypes", help="float32,float16 (default both; quick float32)")
    p.add_argument("--peers", help="peer keys: " + ",".join(x.key for x in all_peers()))
    p.add_argument("--bands", help="lo:hi:iters:warmup[:factor],... (default: %s; quick: %s)"
                   % (FULL_BANDS, QUICK_BANDS))
    p.add_argument("--factor", type=float, default=2.0,
                   help="size step of bands that give none (default 2)")
    p.add_argument("--idle-wait", type=float, default=0.0, metavar="S",
                   help="before each repetition wait up to S seconds for other processes to "
                        "use less than 25%% of the CPUs (default 0: do not wait)")
    p.add_argument("--timeout", type=int, default=None, help="seconds per launch (default 600; twice that for a peer's capped "
                        "sweep with more ranks than cores)")
    p.add_argument("--budget", type=float, default=None,
                   help="minutes; no new repetition starts past it (default 90; quick 5)")
    p.add_argument("--oversub", default=None,
                   help="rank counts for the oversubscription check of kolo and Open MPI "
                        "(default 8,16; quick none; 'none' to skip)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-profiles", action="store_true",
                   help="do not profile the unmet targets with perf after the sweep")
    p.add_argument("--recheck", type=float, default=None, metavar="MIN",
                   help="minutes, after the sweep, for more pairs of launches (kolo and Open MPI, alternating "
                        "which goes first) at the target sizes whose verdict the sweep left uncertain (fewer than 3 "
                        "pairs in one machine state, or within 15 %% of the bar either way); default 8, quick 0")
    p.add_argument("--mem", choices=["malloc", "thp"], default="malloc",
                   help="every peer's buffers: malloc'd (default), or thp: in transparent huge pages (2 MiB), "
                        "as NumPy gives arrays from 4 MiB and PyTorch >= 2.2 CPU tensors with THP_MEM_ALLOC_ENABLE=1; "
                        "results named <date>-thp-*, without kolo's own checks (engine, --vs, oversubscribed)")
    a = p.parse_args(argv)
    q = a.quick
    a.reps = a.reps or (1 if q else 3)
    a.np_list = [int(x) for x in (a.nranks or ("2" if q else "2,4")).split(",")]
    a.coll_list = (a.colls or ",".join(COLLS)).split(",")
    a.dtype_list = (a.dtypes or ("float32" if q else "float32,float16")).split(",")
    for c in a.coll_list:
        if c not in COLLS:
            p.error("unknown collective %s" % c)
    for d in a.dtype_list:
        if d not in DTYPES:
            p.error("unknown type %s" % d)
    spec = a.bands or (QUICK_BANDS if q else FULL_BANDS)
    a.band_list = []
    for tok in spec.split(","):
        f = tok.split(":")
        if len(f) not in (4, 5):
            p.error("bad band %r: want lo:hi:iters:warmup[:factor]" % tok)
        a.band_list.append(Band(parse_size(f[0]), parse_size(f[1]), int(f[2]), int(f[3]),
                                float(f[4]) if len(f) == 5 else a.factor))
    a.timeout = a.timeout or (300 if q else 600)
    a.budget = a.budget if a.budget is not None else (5.0 if q else 90.0)
    a.recheck = a.recheck if a.recheck is not None else (0.0 if q else 8.0)
    a.oversub_iters, a.oversub_warmup = 3, 1
    ov = a.oversub or ("none" if q else "8,16")
    a.oversub_list = [] if ov == "none" else [int(x) for x in ov.split(",")]
    return a


def _sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv):
    global MEM
    a = parse_args(argv)
    MEM = a.mem
    signal.signal(signal.SIGTERM, _sigterm)  # stop like ^C: kill the launch, write the results
    t_start = time.monotonic()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M")
    os.makedirs(a.out, exist_ok=True)
    logdir = os.path.join(BUILD, "logs", stamp)
    os.makedirs(logdir, exist_ok=True)

    peers = all_peers()
    if a.peers:
        want = a.peers.split(",")
        peers = [p for p in peers if p.key in want or p.family in want]
    status, notes = {}, []
    for p in all_peers():
        status[p.key] = (False, "not selected (--peers)")
    for p in peers:
        status[p.key] = p.available()
    # reasons compare.sh recorded (failed installs or builds)
    st_file = os.path.join(BUILD, "peer_status")
    if os.path.exists(st_file):
        with open(st_file) as f:
            for line in f:
                line = line.strip()
                if line:
                    fam, _, why = line.partition(": ")
                    for p in peers:
                        if p.family == fam and not status[p.key][0]:
                            status[p.key] = (False, why)
    for p in peers:
        ok, why = status[p.key]
        print("compare: %-13s %s" % (p.key, "ready" if ok else "skipped: " + why), flush=True)
    running = [p for p in peers if status[p.key][0]]

    print("compare: measuring the machine's limits", flush=True)
    lim, lim_text = machine_limits(a.quick)
    for line in lim_text.splitlines():
        print("  " + line)
    lim_runs = [lim]

    def limits_again():
        again, _ = machine_limits(True)
        lim_runs.append(again)
        if again.get("dram_traffic_GBps"):
            print("compare: machine limits again: B %.2f GB/s" % again["dram_traffic_GBps"], flush=True)
        return again

    sizes = sweep_sizes(a.band_list)
    run = Run()
    run.notes = notes
    reps_done = 0
    rep_times = []
    rechecks = None
    try:
        for rep in range(a.reps):
            elapsed = time.monotonic() - t_start
            # the next repetition is estimated from the last one, less the capped sweeps of the
            # peers that spin when oversubscribed, which only the first runs (on this VM the
            # first took 31 minutes, 8 of them Horovod's capped 4-rank sweep)
            if rep and elapsed + rep_times[-1] > a.budget * 60:
                notes.append("stopped after %d of %d repetitions: the next one would pass the "
                             "%.0f-minute budget (--budget)" % (rep, a.reps, a.budget))
                print("compare: " + notes[-1], flush=True)
                break
            t_rep = time.monotonic()
            check = 1 if rep == 0 else 0
            first_only = 0.0
            for np in a.np_list:
                k = rep % max(1, len(running))
                first_only += run_reps([p for p in running[k:] + running[:k]
                                        if not (np > NCPU and p.oversub_slow and rep > 0)],
                                       np, rep, check, a, logdir, run)
            limits_again()
            rep_times.append(time.monotonic() - t_rep - first_only)
            reps_done += 1
        rechecks = recheck_targets(a, running, run, logdir, a.recheck)
        if MEM == "thp":  # kolo's own checks run on their own buffers: the default run's
            oversub, engine, memc = [], {}, {}
            notes.append("buffers in huge pages (--mem thp): the oversubscribed, engine and paired (--vs) checks "
                         "were not run; they are the default run's")
        else:
            oversub = oversub_check(a, running, logdir, run)
            engine = engine_check(a, logdir) if any(p.family == "kolo" for p in running) else {}
            memc = (paired_check(a, logdir, limits=limits_again if lim else None)
                    if any(p.key == "kolo-shm" for p in running) and 2 in a.np_list else {})
    except KeyboardInterrupt:
        oversub, engine, memc = [], {}, {}
        notes.append("interrupted by the user after %d repetitions" % reps_done)
        print("\ncompare: interrupted; writing what was measured", flush=True)

    for np in a.np_list:
        for p in running:
            if p.oversub_slow and np > NCPU:
                notes.append("%s with %d ranks on %d cores: capped sweep (%d/%d iterations, "
                             "first repetition only), because %s" % (
                                 p.label, np, NCPU, a.oversub_iters, a.oversub_warmup, p.oversub_why))
    store = run.store
    store.split = state_split([x for e in run.pings for x in e if x is not None])
    wrong = [(k, e["wrong"]) for k, e in store.t.items() if e["wrong"]]
    for (np, peer, coll, dt, size), w in wrong:
        notes.append("WRONG RESULTS: %s %s %s %d ranks %s: %d elements" % (
            peer, coll, dt, np, fmt_size(size), w))

    elapsed = time.monotonic() - t_start
    info = machine_info()
    vers = versions(run.comments)
    lim, lim_range = best_limits(lim_runs) if lim else (lim, None)
    rep = Report(a, store, peers, status, notes, lim, lim_text, info, vers, sizes, stamp,
                 elapsed, run.loads, reps_done)
    rep.cpu = run.cpu
    rep.lim_range = lim_range
    rep.oversub = oversub
    rep.engine = engine
    rep.memc = memc
    rep.waited = run.waited
    rep.pings = run.pings
    rep.huge, rep.thp_mode = run.huge, run.thp_mode
    rep.rechecks = rechecks
    rep.md_targets()  # finds the unmet targets (rep.gaps) for the profiles
    try:
        rep.profiles = profile_gaps(rep, logdir) if not a.no_profiles else None
    except KeyboardInterrupt:
        rep.profiles = {"why": "interrupted by the user", "items": []}
    prefix = stamp + ("-thp" if MEM == "thp" else "") + ("-quick" if a.quick else "")
    pngs = [] if a.no_plots else plot(rep, prefix)
    csv_path = os.path.join(a.out, prefix + "-compare.csv")
    md_path = os.path.join(a.out, prefix + "-compare.md")
    rep.write_csv(csv_path)
    rep.write_md(md_path, os.path.basename(csv_path), pngs)
    if not (a.quick or a.peers or a.colls or a.nranks or a.dtypes or a.bands or MEM != "malloc"):
        shutil.copyfile(md_path, os.path.join(a.out, "latest.md"))  # a full run only
    print("compare: done in %.1f min" % (elapsed / 60))
    print("compare: results %s" % os.path.relpath(md_path, ROOT))
    print("compare: csv     %s" % os.path.relpath(csv_path, ROOT))
    for png in pngs:
        print("compare: plot    %s" % os.path.relpath(png, ROOT))
    # the headline, on the terminal
    with open(md_path) as f:
        text = f.read()
    m = re.search(r"## Headline.*?(?=\n## )", text, re.S)
    if m:
        print("\n" + m.group(0).strip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
