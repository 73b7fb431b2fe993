"""The random mix of collectives the bindings' tests run (test_torch_ops.py, test_tensorflow.py):
one seeded plan that every rank draws alike, the values each rank puts in, and what each rank
must get back, computed with NumPy in float64. A request is a dict; its "dtype" is a NumPy-style
name ("bfloat16" too), which each test maps to its framework's type.

Kinds: "ar" allreduce, "ar_" in place, "grp" grouped allreduce, "ag" allgather (rows per rank),
"gag" grouped allgather, "bc" broadcast, "bc_" in place, "a2a" alltoall with splits, "rs"
reducescatter, "grs" grouped reducescatter. A binding without
in-place operations leaves "ar_" and "bc_" out of its kinds."""

import os
import random
import re
import subprocess

import numpy as np

import adasum_ref
from kolo.basics import Adasum, Average, Max, Min, Product, Sum

KINDS = ["ar", "ar", "ar_", "grp", "ag", "gag", "bc", "bc_", "a2a", "rs", "grs"]
OPS = [Sum, Average, Min, Max, Product]
REDUCING = ("ar", "ar_", "grp", "rs", "grs")
GROUPED = ("grp", "gag", "grs")


def start(n):
    """(seed, plan, process set members or None): KT_MIX_SEED=<number> draws another plan, the
    same on every rank; the set, {0, n - 1}, is there from 3 ranks."""
    seed = int(os.environ.get("KT_MIX_SEED", "0x6b6f6c6f"), 0)
    return seed, random.Random(seed), ([0, n - 1] if n > 2 else None)


def fate(seed, n, steps):
    """Where a kill mix's victim dies, the same on every rank: (victim, step, point); the victim
    leaves without a word (os._exit, as a crash would) before its point of the step: a submission,
    or from its count of submissions on, a wait (python/tests/test_jobs.py,
    test_tensorflow.py)."""
    f = random.Random(seed ^ 0x6b696c6c)
    return f.randrange(n), f.randrange(2, steps), f.randrange(16)


def kill_point(point, count):
    """Of count submissions then count waits, the one a fate's point falls on: (waits, index)"""
    k = point % (2 * count)
    return k >= count, k % count


class Fate:
    """A mix's fate(), or no death without kill; and on a survivor the errors its operations
    ended with, each of which must name the victim."""

    def __init__(self, seed, n, steps, kill):
        self.victim, self.step, self.point = fate(seed, n, steps) if kill else (-1, -1, 0)
        self.heard = []

    def lost(self, e, what):
        """Operation what raised e: the death's error, or the test fails"""
        if self.victim < 0 or not re.search(r"rank %d\b" % self.victim, str(e)):
            raise AssertionError("%s: %s" % (what, e)) from e
        self.heard.append("%s: %s" % (what, str(e).splitlines()[0]))

    def survived(self, r):
        """The line run_kill_job looks for, once rank r has heard of the death"""
        assert self.heard, "rank %d never heard of rank %d's death" % (r, self.victim)
        return "SURVIVOR %d: %d operations ended by the death of rank %d, first: %s" % (
            r, len(self.heard), self.victim, self.heard[0])


def run_kill_job(kolorun, python, test_file, np_, seed, steps, env):
    """Runs test_file's test_random_mix_a_rank_dies in a job of np_ ranks (it dies with its
    victim, so not in the suites' own jobs) and checks that every survivor passed it and said
    which rank died."""
    victim = fate(seed, np_, steps)[0]
    e = dict(env, KT_MIX_KILL="1", KT_MIX_SEED=str(seed))
    p = subprocess.run([kolorun, "-np", str(np_), python, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-k",
                        "random_mix_a_rank_dies", test_file], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=150, text=True)
    assert p.returncode == 0, p.stdout[-4000:]
    said = r"SURVIVOR (\d+): \d+ operations ended by the death of rank %d, first: .*rank %d\b" % (victim, victim)
    survivors = sorted(int(r) for r in re.findall(said, p.stdout))
    assert survivors == [r for r in range(np_) if r != victim], p.stdout[-4000:]
    assert len(re.findall(r"\b1 passed", p.stdout)) == np_ - 1, p.stdout[-4000:]


def rank_rng(seed, r, step):
    """Rank r's own choices in a step (its order, its pauses)"""
    return random.Random(seed * 7919 + r * 104729 + step)


def is_float(dtype):
    return "float" in dtype


def plan_one(rng, n, ps_members, dtypes, kinds=KINDS):
    """The next request of the plan: the same on every rank that draws from the same rng."""
    q = {"kind": rng.choice(kinds), "dtype": rng.choice(dtypes), "op": rng.choice(OPS),
         "pre": 1.0, "post": 1.0, "salt": rng.randrange(1 << 30), "width": rng.randint(1, 4),
         "members": list(range(n)), "noncontig": rng.random() < 0.25,
         "ntensors": rng.randint(2, 3), "keep": rng.random() < 0.2}
    if ps_members and rng.random() < 0.25:
        q["members"] = ps_members
    if q["kind"] in ("ag", "gag", "bc", "bc_", "a2a"):
        q["op"] = Sum
    if is_float(q["dtype"]) and q["op"] == Sum and q["kind"] in ("ar", "ar_", "grp") and rng.random() < 0.5:
        q["op"] = Adasum  # each tensor its own vector, fused or not
    if is_float(q["dtype"]) and q["op"] in (Sum, Average, Adasum) and q["kind"] not in ("rs", "grs"):
        q["pre"], q["post"] = rng.choice([1.0, 0.5, 2.0]), rng.choice([1.0, 0.25, 4.0])
    size = rng.randrange(100)
    count = rng.randrange(64) if size < 70 else rng.randrange(64, 4096) if size < 95 else rng.randrange(65536, 300000)
    if q["kind"] != "ar":
        count = min(count, 70000)
    q["rows"] = count // q["width"]
    q["root"] = rng.choice(q["members"])
    return q


def values(q, t, r, count):
    """The count values world rank r puts in tensor t of request q (for an alltoall, t is the
    destination): small integers, so that every result fits every dtype for up to 16 ranks (a
    product at most 2^6, an int8 sum at most 16 x 7) and is exact but for Average's division."""
    i = np.arange(count, dtype=np.int64)
    h = (q["salt"] % 1000003 * 2654435761 + (t * 31 + r) * 40503 + i * 2246822519) % 1000003
    if q["op"] == Product and q["kind"] in REDUCING:
        return np.where(r < 6, 1 + h % 2, 1)
    if q["dtype"] in ("uint8", "uint16"):
        return h % 11
    if q["dtype"] == "int8":
        return h % 15 - 7
    return h % 21 - 10


def reduced(q, t, rows):
    """Tensor t of a reducing request q, reduced over its members: a (rows, width) array."""
    vals = [values(q, t, m, rows * q["width"]).astype(np.float64) for m in q["members"]]
    op, m = q["op"], len(q["members"])
    if op == Adasum:
        acc = adasum_ref.adasum(vals, q["pre"], q["post"])
    elif op in (Sum, Average):
        acc = sum(v * q["pre"] for v in vals)
        if op == Average:
            acc = acc / m if is_float(q["dtype"]) else np.trunc(sum(vals) / m)
        acc = acc * q["post"]
    elif op == Min:
        acc = np.minimum.reduce(vals)
    elif op == Max:
        acc = np.maximum.reduce(vals)
    else:
        acc = np.multiply.reduce(vals)
    return acc.reshape(rows, q["width"])


def a2a_rows(q, src, dst):
    """The rows rank src sends rank dst in alltoall q"""
    return (q["salt"] + 3 * src + dst) % 3


def tensors(q):
    """How many tensors request q has"""
    return q["ntensors"] if q["kind"] in GROUPED else 1


def ag_rows(q, t, m):
    """The rows member m gives tensor t of allgather q"""
    return q["rows"] + (m + t) % 2


def inputs(q, r):
    """Rank r's input arrays for q (rows, width), as int64 or float64 values: one per tensor; an
    alltoall's one is its blocks for each member in turn, with a2a_splits(q, r)."""
    w = q["width"]
    if q["kind"] in ("ag", "gag"):
        return [values(q, t, r, ag_rows(q, t, r) * w).reshape(-1, w) for t in range(tensors(q))]
    if q["kind"] == "a2a":
        return [np.concatenate([values(q, d, r, a2a_rows(q, r, d) * w).reshape(-1, w) for d in q["members"]])]
    return [values(q, t, r, q["rows"] * w).reshape(-1, w) for t in range(tensors(q))]


def a2a_splits(q, r):
    return [a2a_rows(q, r, d) for d in q["members"]]


def expect(q, r):
    """What world rank r must get from request q: a list of arrays (grouped), or for an alltoall
    (output, received splits)."""
    mem, w = q["members"], q["width"]
    if q["kind"] in ("ar", "ar_", "grp"):
        return [reduced(q, t, q["rows"]) for t in range(tensors(q))]
    if q["kind"] in ("ag", "gag"):
        return [np.concatenate([values(q, t, m, ag_rows(q, t, m) * w).reshape(-1, w) for m in mem])
                for t in range(tensors(q))]
    if q["kind"] in ("bc", "bc_"):
        return [values(q, 0, q["root"], q["rows"] * w).reshape(-1, w)]
    if q["kind"] == "a2a":
        blocks = [values(q, r, s, a2a_rows(q, s, r) * w).reshape(-1, w) for s in mem]
        return [np.concatenate(blocks)], [a2a_rows(q, s, r) for s in mem]
    idx, m = mem.index(r), len(mem)  # rs, grs
    first, mine = sum(q["rows"] // m + (k < q["rows"] % m) for k in range(idx)), q["rows"] // m + (idx < q["rows"] % m)
    return [reduced(q, t, q["rows"])[first:first + mine] for t in range(tensors(q))]


def check(q, got, want, what):
    """got: the output as a float64 array; its dtype the test checks itself"""
    assert got.shape == want.shape, "%s: shape %s, want %s" % (what, got.shape, want.shape)
    tol = 0.0
    if q["op"] == Average and is_float(q["dtype"]) and q["kind"] in REDUCING:
        tol = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6}.get(q["dtype"], 1e-12)
    bound = tol * (np.abs(want) + 1)
    if q["op"] == Adasum:  # relative to the tensor's largest value (adasum_ref.py)
        t = adasum_ref.tolerance(q["dtype"], want)
        bound = t["atol"] + t["rtol"] * np.abs(want)
    bad = np.abs(got - want) > bound
    assert not bad.any(), "%s (%s, op %s): %d wrong elements, the first at %s: %s, want %s" % (
        what, q["dtype"], q["op"], int(bad.sum()), np.argwhere(bad)[0], got[bad][0], want[bad][0])
