"""bench/profile.py - where a launch's CPU time goes, for the results' account of unmet targets.

compare.py profiles kolo's launch for each target it did not meet (and the peer's launch at the
same size, for the targets that compare against one) with `perf record -e cpu-clock`: every
PERIOD_NS of CPU time any thread of the launch runs, perf takes a sample (a software event, so it
works on virtual machines without hardware counters). `perf report` gives samples per (thread
name, binary, symbol); each symbol is put in one of the CATEGORIES below, and the samples become
CPU milliseconds per call (samples x PERIOD_NS / calls). Blocked time (a rank asleep in futex or
poll) takes no samples; spinning does.

perf starts with its events off (--delay=-1) and listens on a control fifo; the benchmark's rank 0
turns them on right before its timed calls and off right after (bench/perf_ctl.h), so the setup
(fork, rendezvous, buffers first touched), the warm-up and the checks are not in the profile.

Python 3 stdlib only.
"""

import os
import re
import shutil
import subprocess
import tempfile

PERIOD_NS = 200000  # one sample per 0.2 ms of CPU time (5 kHz per busy CPU)

# (key, label, what it is) in the order the tables show them
CATEGORIES = [
    ("copy", "copying", "memcpy and kolo's streamed copies in user space; the kernel's copies "
                        "(single-copy reads between processes, socket buffers)"),
    ("reduce", "reducing", "the reduction kernels (sum, max, scale, float16 conversion)"),
    ("pin", "pinning pages", "the kernel finding and pinning the pages a single-copy read "
                             "(process_vm_readv) touches, and releasing them"),
    ("net", "TCP stack", "the kernel's TCP/IP and socket code, besides its copies"),
    ("wait", "waiting", "spinning on flags, yielding, the scheduler, progress loops that find "
                        "nothing to do"),
    ("faults", "page faults", "page faults and zeroing new pages"),
    ("bench", "the benchmark", "the benchmark program's own fill and check loops, not the library"),
    ("other", "other", "everything else (protocol, bookkeeping, system calls' entry and exit)"),
]
CAT_KEYS = [c[0] for c in CATEGORIES]
CAT_LABEL = {c[0]: c[1] for c in CATEGORIES}

# Checked in this order; the first rule whose pattern matches the symbol decides. A rule's scope
# says whose symbols it applies to: "kernel" (kolo's own tcp_* functions are not the TCP stack),
# "user" (the kernel's check_stack_object is not the benchmark's check loop) or "any". The
# benchmarks' own loops by their exact names: kolo-bench links the library in, whose argument
# checks (check_dtype_op, on every call) a pattern like check_\w+ took for the benchmark's (a CI
# run found one such sample within the timed calls and failed the test that wants none).
_RULES = [
    ("bench", "user", r"^(fill|check|expect|expected_value|verify|put|get|__fmax|__fmin)$"),
    ("pin", "kernel", r"follow_page|get_user_pages|gup_|grab_folio|unpin_user|process_vm_rw|pte_offset|"
                      r"vm_normal_page|mod_node_page_state|pte_val|vma_pgtable|follow_p[mu4]d|"
                      r"folio_add_pin|try_get_folio|pin_user|check_vma_flags"),
    ("faults", "kernel", r"page_fault|clear_page|do_anonymous_page|handle_mm_fault|get_page_from_freelist|"
                         r"alloc_pages|__alloc_|lru_add|folio_batch|do_huge_pmd|zap_|unmap_page|free_pages|"
                         r"free_unref|release_pages|rmqueue|__pte_alloc"),
    ("copy", "any", r"mem(move|cpy)|stream_copy|copy_to_iter|copy_from_iter|copy_user|copy_page|"
                    r"copy_folio|rep_movs|copy_mc|_copy_|skb_copy_datagram|memcpy_|csum_partial_copy|"
                    r"check_(heap|stack)_object|check_object_size"),
    ("reduce", "any", r"^(sum|prod|max|min|scale|band|bor|bxor|land|lor|lxor)_\w+|half|bf16|f16|fp16|"
                      r"reduce_|_reduce\b|ompi_op_|op_avx|op_base|MPIR_\w*(SUM|MAX|MIN|PROD)|cvt"),
    ("net", "kernel", r"tcp|skb|sock|^ip_|_ip_|^inet|netif|net_rx|__dev_queue|loopback|napi|sendmsg|"
                      r"recvmsg|sys_send|sys_recv|^sk_|nf_hook|^dst_"),
    ("wait", "any", r"kolo__wait|wait|yield|futex|poll|epoll|nanosleep|schedule|sched_|pause|spin|"
                    r"progress|idle|finish_task_switch|clock_gettime|__vdso|hrtimer|cond_|sem_|"
                    r"mwait|cpu_relax|pv_queued|switch_to|context_switch|timerfd"),
]
_COMPILED = [(k, scope, re.compile(p)) for k, scope, p in _RULES]


def categorize(sym, dso=""):
    """One of CAT_KEYS for a symbol as perf prints it (without the [k]/[.] mark) and its binary."""
    s = sym.strip()
    kernel = "kernel" in dso or dso.startswith("[")
    for key, scope, rx in _COMPILED:
        if scope in ("any", "kernel" if kernel else "user") and rx.search(s):
            return key
    return "other"


def available():
    """(True, "") when perf can sample cpu-clock here, else (False, why)."""
    perf = shutil.which("perf")
    if not perf:
        return False, "perf is not installed (Debian: linux-perf)"
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "probe.data")
        try:
            p = subprocess.run([perf, "record", "-q", "-e", "cpu-clock", "-c", str(PERIOD_NS), "-o", data,
                                "--", "true"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, "perf record does not run: %s" % e
        if p.returncode != 0 or not os.path.exists(data):
            why = (p.stdout.strip().splitlines() or ["exit %d" % p.returncode])[0]
            return False, "perf record cannot sample here: %s" % why
    return True, ""


def wrap(cmd, env, data, workdir, tag):
    """The command under perf record (events off until the benchmark turns them on through the
    control fifo), writing its samples to data; returns (command, environment)."""
    ctl, ack = (os.path.join(workdir, "%s.%s" % (tag, x)) for x in ("ctl", "ack"))
    for f in (ctl, ack):
        if os.path.exists(f):
            os.remove(f)
        os.mkfifo(f)
    env = dict(env, KOLO_BENCH_PERF_CTL=ctl, KOLO_BENCH_PERF_ACK=ack)
    return (["perf", "record", "-q", "-e", "cpu-clock", "-c", str(PERIOD_NS), "-o", data, "--delay=-1",
             "--control=fifo:%s,%s" % (ctl, ack), "--"] + list(cmd), env)


def parse_report(text):
    """`perf report -n -t ';' --sort comm,dso,sym` -> [(samples, comm, dso, sym)]."""
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        f = [x.strip() for x in line.split(";")]
        if len(f) < 5 or not f[1].isdigit():
            continue
        sym = re.sub(r"^\[[k.]\]\s*", "", f[4])
        rows.append((int(f[1]), f[2], f[3], sym))
    return rows


def read(data):
    """Samples of a perf.data file -> [(samples, comm, dso, sym)], or raises RuntimeError."""
    p = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-n", "-t", ";", "-q",
                        "--sort", "comm,dso,sym"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("perf report failed: %s" % (p.stderr.strip().splitlines() or ["?"])[-1])
    return parse_report(p.stdout)


def summarize(rows, calls, top=8):
    """CPU milliseconds per call in each category, the total, the busiest symbols and the threads.
    rows: [(samples, comm, dso, sym)]; calls: calls made by each rank."""
    ms = PERIOD_NS / 1e6 / max(1, calls)
    cats = {k: 0.0 for k in CAT_KEYS}
    by_sym, by_comm = {}, {}
    for n, comm, dso, sym in rows:
        c = categorize(sym, dso)
        cats[c] += n * ms
        k = (sym, os.path.basename(dso), c)
        by_sym[k] = by_sym.get(k, 0) + n
        by_comm[comm] = by_comm.get(comm, 0) + n
    total = sum(cats.values())
    ranked = sorted(by_sym.items(), key=lambda kv: -kv[1])
    syms = ranked[:top]
    return {
        "calls": calls,
        "cpu_ms": total,
        "cats": cats,
        "top": [(n * ms, sym, dso, c) for (sym, dso, c), n in syms],
        # the busiest few of each category, so that a stray sample can be named
        "by_cat": {k: [(n, sym, dso) for (sym, dso, c), n in ranked if c == k][:3] for k in CAT_KEYS},
        "threads": {k: v * ms for k, v in by_comm.items()},
        "samples": sum(r[0] for r in rows),
    }


def profile(cmd, env, calls, run, workdir, tag):
    """Runs cmd under perf through run(cmd, env) -> (text, rc, timed_out) and summarizes it.
    calls(text) -> the timed calls each rank made, from the launch's output. Returns (summary,
    launch output); the summary has "why" instead when the launch could not be profiled."""
    data = os.path.join(workdir, tag + ".perf.data")
    pcmd, penv = wrap(cmd, env, data, workdir, tag)
    text, rc, to = run(pcmd, penv)
    try:
        if rc or to or not os.path.exists(data):
            return {"why": "the launch failed (exit %s%s)" % (rc, ", timed out" if to else "")}, text
        rows = read(data)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return {"why": str(e)}, text
    finally:
        for f in (data, os.path.join(workdir, tag + ".ctl"), os.path.join(workdir, tag + ".ack")):
            try:
                os.remove(f)
            except OSError:
                pass
    n = calls(text)
    if not rows:
        return {"why": "perf took no samples (did the benchmark turn them on?)"}, text
    if not n:
        return {"why": "the launch printed no timed calls"}, text
    return summarize(rows, n), text


# What would cut each category's time in kolo, per transport ("any": both). The diagnosis names
# the categories where kolo spends more than the peer (or than the bound allows) and quotes these.
REMEDIES = {
    ("copy", "shm"): "Over shared memory kolo's ring copies each block twice (into the shared ring, "
                     "out of it) unless the transport reads the message by CMA; Open MPI's vader reads "
                     "large messages once by CMA. Reading the peers' buffers directly for this "
                     "collective, as allreduce does from 4 MiB (src/coll/direct.c, with its per-size "
                     "choice), would remove the second copy where CMA is not slower than the ring.",
    ("copy", "tcp"): "Over TCP both libraries pay the kernel's copies into and out of the socket "
                     "buffers; more copying in kolo means more bytes sent per call (the algorithm) or "
                     "copies that miss the cache (received blocks written to memory that then has to "
                     "be read back). Receiving straight into the output with fewer, larger reads "
                     "would cut it.",
    ("pin", "any"): "Single-copy reads (process_vm_readv) make the kernel find and pin every page they "
                    "read, per call. Mapping the peers' buffers once instead (kolo_mem_alloc's shared "
                    "buffers, or a registration cache over XPMEM/KNEM where the kernel has them) "
                    "removes the per-call pinning.",
    ("wait", "any"): "The ranks spend this time spinning or yielding while the other side works: the "
                     "handoff between them (chunk size, one flag per chunk) leaves one rank idle. "
                     "Larger pipeline chunks for this size, or splitting the work so both ranks copy "
                     "at once, would close it.",
    ("net", "tcp"): "More time in the kernel's TCP stack means more, smaller sends and receives per "
                    "call; larger writes, or MSG_ZEROCOPY for sends of a megabyte and more, would cut "
                    "it.",
    ("reduce", "any"): "The reduction kernels are vectorized (AVX-512/AVX2, F16C); more time here means "
                       "kolo reduces more bytes per call (its algorithm), or reduces data that is not "
                       "in cache: reducing each chunk while it is still cache-resident from its copy "
                       "would cut it.",
    ("faults", "any"): "Page faults inside the calls mean memory first touched there (a scratch buffer "
                       "allocated per call); keeping such buffers across calls would remove them.",
    ("other", "any"): "The rest is protocol and bookkeeping (descriptors, progress, system calls' entry "
                      "and exit); the symbols listed show where.",
}


def remedy(cat, transport):
    return REMEDIES.get((cat, transport)) or REMEDIES.get((cat, "any")) or ""


def _ms(x):
    return "%.3g ms" % x


def diagnose(k, p, transport, peer_label="the peer", wall_k=None, wall_p=None, bound_ms=None, nranks=2):
    """Sentences on what a profile shows and what would close the gap.
    k: kolo's summary; p: the peer's (or None); wall_*: wall ms per call of the profiled launches;
    bound_ms: the memory-traffic bound's time per call (bound targets)."""
    shows, close = [], []
    if p and "cats" in p:
        if wall_k and wall_p and wall_k <= 1.03 * wall_p:
            return ["In these launches kolo took %s per call against %s's %s: the gap did not "
                    "reproduce. The sweep's figure came from launches that met the machine in "
                    "another state or moment (see the machine's state per launch); kolo used %s of "
                    "CPU per call here, %s %s." % (_ms(wall_k), peer_label, _ms(wall_p),
                                                    _ms(k["cpu_ms"]), peer_label, _ms(p["cpu_ms"]))], []
        shows.append("Per call, all ranks: kolo used %s of CPU, %s %s%s." % (
            _ms(k["cpu_ms"]), peer_label, _ms(p["cpu_ms"]),
            "; wall time %s against %s" % (_ms(wall_k), _ms(wall_p)) if wall_k and wall_p else ""))
        d = sorted(((k["cats"][c] - p["cats"][c], c) for c in CAT_KEYS if c != "bench"), reverse=True)
        floor = 0.03 * max(k["cpu_ms"], p["cpu_ms"])
        more = [(x, c) for x, c in d if x > floor]
        less = [(x, c) for x, c in d if x < -floor]
        if more:
            shows.append("kolo spends more in " + ", ".join(
                "%s (+%s: %s against %s)" % (CAT_LABEL[c], _ms(x), _ms(k["cats"][c]), _ms(p["cats"][c]))
                for x, c in more) + ".")
        if less:
            shows.append("It spends less in " + ", ".join(
                "%s (%s)" % (CAT_LABEL[c], _ms(x)) for x, c in less) + ".")
        moving = [c for c in ("copy", "pin")]
        mk, mp = (sum(x["cats"][c] for c in moving) for x in (k, p))
        if any(c == "copy" for _, c in more) and mk <= 1.03 * mp:
            more = [(x, c) for x, c in more if c != "copy"]
            shows.append("kolo copies more, but %s pins pages to read them once by CMA: copying and "
                         "pinning together cost %s in kolo against %s, so the single copy gains it "
                         "nothing here." % (peer_label, _ms(mk), _ms(mp)))
        if wall_k and wall_p and wall_k > 1.05 * wall_p and k["cpu_ms"] <= p["cpu_ms"] * 1.03:
            shows.append("kolo does no more work than %s and still takes longer: the difference is "
                         "time in which a rank neither works nor spins (asleep waiting for the other, "
                         "or not scheduled)." % peer_label)
            close.append("Shortening the waits that sleep (a rank that yields or blocks while its "
                         "peer could already hand it the next chunk) would close it.")
        for _, c in more[:2]:
            close.append(remedy(c, transport))
    elif bound_ms:
        work = k["cats"]["copy"] + k["cats"]["reduce"]
        ideal = bound_ms * nranks
        shows.append("Per call, all ranks: %s of CPU; copying and reducing %s of it, against %s "
                     "that moving the same bytes at the machine's measured traffic rate takes "
                     "(the bound's time on each of the %d cores)%s." % (
                         _ms(k["cpu_ms"]), _ms(work), _ms(ideal), nranks,
                         "; wall time %s against the bound's %s" % (_ms(wall_k), _ms(bound_ms))
                         if wall_k else ""))
        over = sorted(((k["cats"][c], c) for c in ("wait", "pin", "faults", "other", "net")
                       if k["cats"][c] > 0.03 * k["cpu_ms"]), reverse=True)
        if over:
            shows.append("Besides the work: " + ", ".join(
                "%s %s" % (CAT_LABEL[c], _ms(x)) for x, c in over) + ".")
        if work > 1.15 * ideal:
            close.append("The copies and reductions themselves run at %.0f %% of the machine's rate: "
                         "they read or write more than the bound's bytes (data that falls out of the "
                         "cache between a copy and the reduction that reads it again), or run on one "
                         "core while the other waits. Fusing each reduction with the copy that "
                         "brings its data in, so every byte crosses memory once, would close it."
                         % (100 * ideal / work))
            if nranks == 2:
                close.append("Where a 2-rank call runs the ring, that fusion would cut the copying, not "
                             "the time: a build that skipped the receiver's copy out of the shared ring "
                             "altogether (results wrong, timing only) ran 16-256 MiB no faster by hand "
                             "(docs/performance.md, \"Copies the 2-rank ring does not wait for\").")
        for _, c in over[:2]:
            close.append(remedy(c, transport))
    return shows, [c for c in close if c]
