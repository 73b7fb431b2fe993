"""Adasum in NumPy, the reference the tests compare kolo's op=Adasum with (not a test file).

Two vectors combine as a (+) b = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b, a vector whose
squared norm is (nearly) zero keeping the coefficient 1. The members combine as a binary tree: with
p2 the largest power of two <= n and extra = n - p2, members 2i and 2i + 1 (i < extra) combine first
(2i is a) into virtual member i, member j >= 2 * extra is virtual member j - extra; then, level by
level, virtual member v combines with v ^ 1 (the lower one is a), the pairs' results likewise, until
one vector is left. Everything here is float64.
"""

import numpy as np

EPS = 1e-30  # a squared norm below this counts as zero (kolo's exact threshold is its own)


def combine(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    ab, aa, bb = float(np.vdot(a, b)), float(np.vdot(a, a)), float(np.vdot(b, b))
    ca = 1.0 if aa < EPS else 1.0 - ab / (2.0 * aa)
    cb = 1.0 if bb < EPS else 1.0 - ab / (2.0 * bb)
    return ca * a + cb * b


def adasum(vectors, prescale=1.0, postscale=1.0):
    """The Adasum of the members' vectors (a list in member order, any shapes alike)."""
    level = [np.asarray(v, np.float64) * prescale for v in vectors]
    n = len(level)
    extra = n - (1 << (n.bit_length() - 1))
    level = [combine(level[2 * i], level[2 * i + 1]) for i in range(extra)] + level[2 * extra:]
    while len(level) > 1:
        level = [combine(level[k], level[k + 1]) for k in range(0, len(level), 2)]
    return level[0] * postscale


def member_vectors(n, shape, seed, dtype=np.float64):
    """Every member's vector for a test: normal values, each member at its own scale (so that the
    order of combination shows), rounded to dtype. Member k's is the k-th."""
    out = []
    for k in range(n):
        rng = np.random.default_rng(1000 * seed + k)
        out.append((rng.standard_normal(shape) * (1.0 + k)).astype(dtype))
    return out


_RTOL = {"float16": 4e-3, "bfloat16": 2e-2, "float32": 2e-6, "float64": 1e-12}


def tolerance(dtype, ref):
    """assert_allclose arguments for a result of dtype (NumPy's, or torch's, or a name) against the
    float64 reference: float16 and bfloat16 results are rounded once more than the arithmetic."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype).replace("torch.", "")
    rtol = _RTOL[name]
    scale = float(np.max(np.abs(ref))) if np.size(ref) else 1.0
    return dict(rtol=rtol, atol=rtol * scale)
