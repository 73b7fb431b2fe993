#!/usr/bin/env python3
"""train_compare.py - end-to-end training throughput of kolo, Horovod and PyTorch DDP, side by side.

    make bench-train                                       # 3 repetitions, ResNet-18, 1 and 2 workers
    python3 bench/train_compare.py --reps 1 -- --model resnet20 --batch-size 4 --num-iters 1
    python3 bench/train_compare.py --help

Runs examples/pytorch/pytorch_synthetic_benchmark.py under each framework: kolo
(`import kolo.torch as hvd`, started by kolorun), Horovod (`import horovod.torch as hvd`, the same
code, started by `horovodrun --gloo`) and torch DistributedDataParallel with the gloo backend
(started by kolorun, which exports RANK/WORLD_SIZE/LOCAL_WORLD_SIZE), and, as the ceiling, the same
workers alone (`--framework alone`: each trains a model of its own and exchanges nothing, so N
of them give what this machine allows N copies of the compute; a framework's share of that is
what its communication costs, waiting, copies and the cores and caches it takes from the
compute included). Every worker gets the same number of torch threads. Each repetition runs every framework once per worker count, and the order
of the frameworks rotates by one each repetition, so that a change of load on the machine hits them
alike. The tables give medians over the repetitions, the scaling efficiency, and kolo's ratio to
each peer and its share of the ceiling at the largest worker count, as a ratio of medians and per
repetition.

Writes bench/results/<date>_<time>-train-compare.md (machine, versions, the exact commands, every
run, the medians) and keeps every launch's output under build/bench/logs/<date>_<time>-train-compare/.
Arguments after `--` (or any this script does not know) go to the benchmark. Python standard
library only; the workers run with /usr/bin/python3 (Debian's, which has torch) unless --python.
Horovod is not installed here: when it does not import, the comparison says why and goes on with
kolo and DDP (`make bench-compare`, i.e. bench/compare.sh, builds Horovod 0.28.1 with Gloo).
"""

import argparse
import datetime
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from benchcommon import free_port  # noqa: E402 (a port outside the ephemeral range, for DDP)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = "examples/pytorch/pytorch_synthetic_benchmark.py"
KOLORUN = "build/bin/kolorun"
NAMES = {"kolo": "kolo", "horovod": "Horovod (gloo)", "ddp": "PyTorch DDP (gloo)",
         "alone": "alone (no communication: the ceiling)"}


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="kolo vs Horovod vs PyTorch DDP: synthetic-benchmark images/sec, side by side. "
                    "Unknown arguments (or those after --) go to the benchmark script.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--reps", type=int, default=int(os.environ.get("REPEAT", "3")),
                   help="interleaved repetitions (default: $REPEAT, else 3)")
    p.add_argument("--workers", default="1,2", help="comma list of worker counts")
    p.add_argument("--frameworks", default="kolo,horovod,ddp,alone",
                   help="comma list from kolo, horovod, ddp, alone (the workers without communication)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker, every framework")
    p.add_argument("--timeout", type=float, default=900, help="seconds one launch may take")
    p.add_argument("--python", default="/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK)
                   else sys.executable, help="the workers' python (needs torch)")
    p.add_argument("--results-dir", default=os.path.join(ROOT, "bench", "results"),
                   help="where the Markdown results go")
    a, rest = p.parse_known_args(argv)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    a.bench_args = [x for x in rest if x != "--"]
    a.workers = [int(x) for x in a.workers.split(",") if x]
    a.frameworks = [x for x in a.frameworks.split(",") if x]
    for fw in a.frameworks:
        if fw not in NAMES:
            p.error("unknown framework %r (kolo, horovod, ddp, alone)" % fw)
    if a.reps < 1 or not a.workers or min(a.workers) < 1:
        p.error("--reps and --workers must be at least 1")
    for x in a.bench_args:
        if x in ("--threads", "--framework", "--ddp") or x.startswith(("--threads=", "--framework=")):
            p.error("%s is set by this script for every framework; use its own --threads / --frameworks" % x)
    return a


def sh(cmd, cwd=None):
    """A command's stripped stdout, or "" when it cannot run."""
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              cwd=cwd, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine():
    model, mem = "?", "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
        with open("/proc/meminfo") as f:
            mem = "%.1f GiB" % (int(f.readline().split()[1]) / 1048576)
    except (OSError, ValueError, IndexError):
        pass
    os_name = sh(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]) or "?"
    virt = sh(["systemd-detect-virt"])
    return "%d CPUs (%s), %s RAM, %s, Linux %s%s" % (
        os.cpu_count() or 0, model, mem, os_name, platform.release(),
        ", virtualization %s" % virt if virt and virt != "none" else "")


def horovod_status(py):
    """(version, None) when horovod.torch imports with Gloo and horovodrun exists, else (None, why)."""
    # From /, as bench/compare.sh checks it: a horovod/ directory in the current one would shadow it.
    p = subprocess.run([py, "-c", "import horovod, horovod.torch as h; print(horovod.__version__, h.gloo_built())"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        return None, "horovod.torch does not import with %s (%s)" % (py, err)
    version, gloo = p.stdout.split()[-2:]
    if gloo != "True":
        return None, "Horovod %s is built without Gloo" % version
    if not horovodrun():
        return None, "Horovod %s imports but horovodrun is not on PATH" % version
    return version, None


def horovodrun():
    return shutil.which("horovodrun") or next(
        (x for x in ("/usr/local/bin/horovodrun", "/usr/bin/horovodrun") if os.access(x, os.X_OK)), None)


def command(a, fw, n, port="<free port>"):
    bench = [a.python, BENCH, "--framework", fw, "--threads", str(a.threads)] + a.bench_args
    if fw == "horovod":
        return [horovodrun() or "horovodrun", "-np", str(n), "-H", "localhost:%s" % n, "--gloo"] + bench
    if fw == "ddp":
        return [KOLORUN, "-np", str(n), "-x", "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=%s" % port] + bench
    return [KOLORUN, "-np", str(n)] + bench


def result(lines, n):
    """images/sec in total from a launch's output: the RESULT line rank 0 printed, or, for workers
    alone (a `rank=` in their lines), the sum of all n workers' lines; None when they are not all there."""
    total, ranks = None, {}
    for line in lines:
        if "RESULT " not in line or "img_per_sec=" not in line:
            continue
        value = float(line.split("img_per_sec=")[1].split()[0])
        if " rank=" in line:
            ranks[int(line.split(" rank=")[1].split()[0])] = value
        else:
            total = value
    if ranks:
        return sum(ranks.values()) if sorted(ranks) == list(range(n)) else None
    return total


def launch(cmd, n, log, timeout):
    """Runs one job of n workers in its own process group; (img/sec or None, wall s, CPU s of the job,
    exit code)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") +
               (":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log, "w") as out:
        out.write("$ %s\n" % " ".join(cmd))
        out.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
            # The launchers stop their workers on SIGTERM; SIGKILL whatever is left of this group.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if isinstance(e, KeyboardInterrupt):
                raise
            out.write("\ntrain_compare: killed after the %.0f s time limit (--timeout)\n" % timeout)
            rc = "timeout"
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    with open(log) as f:
        value = result(f, n)
    return value, wall, cpu, rc


def tail(path, n=12):
    with open(path) as f:
        return [ln.rstrip("\n") for ln in f.readlines()[-n:]]


def fmt(x, spec="%.1f"):
    return "—" if x is None else spec % x


def _sigterm(signum, frame):
    raise KeyboardInterrupt  # stop like ^C: end the running launch, write what was measured


def main(argv):
    a = parse_args(argv)
    os.chdir(ROOT)
    if not os.access(KOLORUN, os.X_OK):
        sys.exit("train_compare: %s is missing: run make first" % KOLORUN)
    signal.signal(signal.SIGTERM, _sigterm)
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d_%H%M")
    os.makedirs(a.results_dir, exist_ok=True)
    # Claimed now, so that two runs in the same minute keep apart, logs included.
    path, i = os.path.join(a.results_dir, stamp + "-train-compare.md"), 2
    while True:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
            break
        except FileExistsError:
            path, i = os.path.join(a.results_dir, "%s-train-compare-%d.md" % (stamp, i)), i + 1
    logdir = os.path.join(ROOT, "build", "bench", "logs", os.path.basename(path)[:-3])
    os.makedirs(logdir, exist_ok=True)

    notes = []
    frameworks = list(a.frameworks)
    names = dict(NAMES)
    hvd_version = None
    if "horovod" in frameworks:
        hvd_version, why = horovod_status(a.python)
        if why:
            frameworks.remove("horovod")
            msg = ("Horovod left out: %s. `make bench-compare` (bench/compare.sh) builds Horovod 0.28.1 "
                   "with Gloo against Debian's torch, about 10 minutes; going on with %s."
                   % (why, " and ".join(names[f] for f in frameworks) or "nothing"))
            print("train_compare: " + msg, flush=True)
            notes.append(msg)
        else:
            names["horovod"] = "Horovod %s (gloo)" % hvd_version
    if not frameworks:
        os.remove(path)
        sys.exit("train_compare: no framework left to run")

    torch_v = sh([a.python, "-c", "import torch; print(torch.__version__)"], cwd="/") or "does not import"
    rev = sh(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT) or "?"
    dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT)
    versions = [("torch", "%s (%s)" % (torch_v, a.python)),
                ("Horovod", hvd_version or "not used"),
                ("kolo", "git %s%s" % (rev, ", tree with uncommitted changes" if dirty else "")),
                ("", sh([a.python, "--version"]) or "Python ?")]
    # Settings that would change what is measured, when the caller's environment has them.
    knobs = sorted(k for k in os.environ if k.startswith(("KOLO_", "HOROVOD_", "OMP_", "MKL_", "GLOO_")))
    settings = ", ".join("`%s=%s`" % (k, os.environ[k]) for k in knobs) or \
        "no KOLO_*, HOROVOD_*, GLOO_*, OMP_* or MKL_* variable set: every framework at its defaults"
    print("train_compare: %d repetition(s) of %s with %s worker(s), %d torch thread(s) each; logs in %s"
          % (a.reps, ", ".join(frameworks), " and ".join(map(str, a.workers)), a.threads,
             os.path.relpath(logdir, ROOT)), flush=True)

    runs = []  # dicts: rep, fw, n, value, wall, cpu, load, rc, log
    interrupted = False
    try:
        for rep in range(a.reps):
            k = rep % len(frameworks)
            order = frameworks[k:] + frameworks[:k]
            for n in a.workers:
                for fw in order:
                    cmd = command(a, fw, n, free_port() if fw == "ddp" else None)
                    log = os.path.join(logdir, "%s.%d.%d.log" % (fw, n, rep + 1))
                    load = os.getloadavg()[0]
                    value, wall, cpu, rc = launch(cmd, n, log, a.timeout)
                    runs.append(dict(rep=rep + 1, fw=fw, n=n, value=value, wall=wall, cpu=cpu, load=load,
                                     rc=rc, log=log))
                    print("  rep %d  %-22s %d worker(s): %s img/sec  (%.0f s, load before %.2f)%s"
                          % (rep + 1, names[fw], n, fmt(value), wall, load,
                             "" if value is not None else "  FAILED: exit %s, see %s" % (rc, log)),
                          flush=True)
    except KeyboardInterrupt:
        interrupted = True
        notes.append("Interrupted: only the runs listed were made.")
        print("train_compare: interrupted; writing what was measured", flush=True)

    def med(fw, n):
        v = [r["value"] for r in runs if r["fw"] == fw and r["n"] == n and r["value"] is not None]
        return statistics.median(v) if v else None

    def value(fw, n, rep):
        return next((r["value"] for r in runs if (r["fw"], r["n"], r["rep"]) == (fw, n, rep)), None)

    top, one = max(a.workers), min(a.workers)
    lines = []
    lines.append("| images/sec in total, median of %d | %s | scaling efficiency at %d |"
                 % (a.reps, " | ".join("%d worker%s" % (n, "s" if n > 1 else "") for n in a.workers), top))
    lines.append("|---|" + "---:|" * (len(a.workers) + 1))
    for fw in frameworks:
        eff = None
        if top != one and med(fw, top) and med(fw, one):
            eff = 100.0 * med(fw, top) * one / (top * med(fw, one))
        lines.append("| %s | %s | %s |" % (names[fw], " | ".join(fmt(med(fw, n)) for n in a.workers),
                                           fmt(eff, "%.0f %%")))
    ratios = []
    if "kolo" in frameworks:
        for fw in frameworks:
            if fw in ("kolo", "alone"):
                continue
            k, p = med("kolo", top), med(fw, top)
            pairs = []
            for rep in range(1, a.reps + 1):
                kv, pv = value("kolo", top, rep), value(fw, top, rep)
                pairs.append(fmt(kv / pv if kv and pv else None, "%.2f"))
            ratios.append("kolo / %s with %d worker%s: **%s** (ratio of medians; per repetition %s)"
                          % (names[fw], top, "s" if top > 1 else "", fmt(k / p if k and p else None, "%.2fx"),
                             ", ".join(pairs)))
    if "alone" in frameworks:
        for fw in frameworks:
            if fw == "alone":
                continue
            k, p = med(fw, top), med("alone", top)
            shares = []
            for rep in range(1, a.reps + 1):
                kv, pv = value(fw, top, rep), value("alone", top, rep)
                shares.append(fmt(100.0 * kv / pv if kv and pv else None, "%.0f %%"))
            ratios.append("%s with %d worker%s reaches **%s** of the same workers alone (ratio of medians; per "
                          "repetition %s)" % (names[fw], top, "s" if top > 1 else "",
                                               fmt(100.0 * k / p if k and p else None, "%.0f %%"), ", ".join(shares)))

    print("\n== synthetic benchmark, %d torch thread(s) per worker (%s)" % (a.threads, " ".join(a.bench_args) or
                                                                          "the script's defaults"))
    for ln in lines:
        print("  " + ln)
    for r in ratios:
        print("  " + r.replace("**", ""))

    # ---- the results file
    md = ["# Training throughput: kolo, Horovod and PyTorch DDP, synthetic benchmark", ""]
    if "alone" in frameworks:
        md += ["The ceiling, \"alone\": the same workers started alike, each training a model of its own "
               "with no communication at all; a framework's share of it is what its communication costs.", ""]
    md.append("- Date: %s (local time of the machine)" % now.strftime("%Y-%m-%d %H:%M"))
    md.append("- Machine: %s" % machine())
    md.append("- Versions: " + "; ".join(("%s %s" % kv).strip() for kv in versions))
    md.append("- Environment: " + settings)
    md.append("- Benchmark: `%s %s`, %d torch thread%s per worker in every framework"
              % (BENCH, " ".join(a.bench_args) or "(the script's defaults)", a.threads, "s" if a.threads > 1 else ""))
    scaling = ("images/sec per worker with %d workers / images/sec per worker with %d" % (top, one) if top != one
               else "none (one worker count)")
    md.append("- Method: %d repetition%s; in each, every framework once per worker count, the order of the "
              "frameworks rotated by one per repetition; medians over the repetitions. Scaling efficiency: "
              "%s. Driver: `python3 bench/train_compare.py %s`"
              % (a.reps, "s" if a.reps > 1 else "", scaling, " ".join(argv)))
    md += ["", "## Medians", ""] + lines + [""]
    md += ["- " + r for r in ratios]
    md += ["", "## Commands", "", "Run from the repository root with `PYTHONPATH=python`; N is the number of workers.", "",
           "```"]
    for fw in frameworks:
        md.append("# %s" % names[fw])
        md.append(" ".join(command(a, fw, "N")))
    md += ["```", "", "## Every run", "",
           "CPU/wall: CPU seconds of the whole job (launcher and workers) per wall second; load: the "
           "1-minute load average right before the launch (other work on the machine).", "",
           "| rep | workers | framework | images/sec | wall s | CPU/wall | load before | log |",
           "|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in runs:
        md.append("| %d | %d | %s | %s | %.1f | %.2f | %.2f | %s |" % (
            r["rep"], r["n"], names[r["fw"]], fmt(r["value"]) if r["value"] is not None else "failed (exit %s)" % r["rc"],
            r["wall"], r["cpu"] / r["wall"] if r["wall"] > 0 else 0, r["load"], os.path.relpath(r["log"], ROOT)))
    failed = [r for r in runs if r["value"] is None]
    for r in failed:
        notes.append("%s with %d worker(s), repetition %d failed (exit %s); its last lines:\n\n    %s"
                     % (names[r["fw"]], r["n"], r["rep"], r["rc"], "\n    ".join(tail(r["log"]))))
    if notes:
        md += ["", "## Notes", ""] + ["- " + x for x in notes]
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\ntrain_compare: wrote %s" % (os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path))
    return 1 if failed or interrupted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
