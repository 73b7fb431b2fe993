"""Output buffers that stay in memory from one step to the next.

A collective's output is new memory every call. Fresh memory costs a page fault for every 4 KiB
the first time it is written, and once the array is freed the allocator hands large blocks back
to the kernel, so every step pays again: on a 2-core VM, writing 100 MB of fresh pages took
78-91 ms against 15 ms for pages already in memory, three times what kolo's engine takes to
allreduce the same bytes. A training step's outputs have the same sizes at every step.

empty(shape, dtype) returns an array over a block kept here: when the last reference to the array
goes (TensorFlow, given the array by tf.numpy_function, keeps it as the tensor's memory until the
tensor goes), the block comes back and the next request of that size gets it, pages already in
place. Idle blocks are kept up to the most bytes out at once lately (what the job has shown it
needs), so the pool adds no memory beyond one step's outputs; beyond that the blocks that came back
longest ago are freed, so that sizes no longer asked for (one large allgather at the start) do not
keep the sizes of every step out. "Lately" is this window of WINDOW_S and the one before, as in the
engine's kept blocks (src/engine/request.c): bytes a job held at once only in its first steps go
back a window or two later, while a step that comes round within a window keeps its blocks. The
cap falls only at a call; a job that stops calling keeps its idle blocks until the next call or
kolo.shutdown(). Small outputs are not kept: the allocator's heap keeps them.

Every output starts on a 64-byte boundary: TensorFlow takes the array tf.numpy_function returns as
the tensor's memory only when it is aligned so, and copies it otherwise (NumPy promises 16 bytes).
161 outputs of 640 KB: 3.8 ms a call aligned, 19.5 ms not.
"""

import collections
import threading
import time

import numpy as np

POOLED_MIN = 64 << 10  # smaller outputs come from the allocator's heap, already cheap
# NumPy's and PyTorch's outputs are kept here only from this size (empty_large): below it glibc's
# malloc, which both use, keeps a freed block for the next one (its threshold for handing blocks to
# the kernel rises to at most 32 MiB), and the pool's ~25 us a call in Python made kolo.torch's
# out-of-place allreduce slower there (2 ranks: 64 KB 125 us against 83, 4 MB 836 against 600)
MALLOC_KEEPS = 32 << 20
ALIGN = 64  # TensorFlow takes a NumPy output as a tensor's memory only at this alignment; else it copies
WINDOW_S = 60.0  # the cap on idle bytes remembers a peak for this window and the next


def aligned_empty(nbytes):
    """nbytes of uninitialized memory starting on an ALIGN-byte boundary (NumPy promises 16)."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes]


class _Lease:
    """Holds a block while an array made from it lives; gives it back when the array goes."""
    __slots__ = ("__array_interface__", "_pool", "_block")

    def __init__(self, pool, block):
        self._pool, self._block = pool, block
        self.__array_interface__ = block.__array_interface__

    def __del__(self):
        try:
            self._pool._give_back(self._block)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class BufferPool:
    def __init__(self, window_s=WINDOW_S, clock=time.monotonic):
        self._lock = threading.RLock()  # a lease may come back (gc) while this thread holds it
        self._free = {}  # nbytes -> [idle blocks]
        self._order = collections.OrderedDict()  # id(block) -> idle block, the longest idle first
        self._idle = 0
        self._out = 0
        self.window_s, self._clock = window_s, clock
        self._peak = 0  # the most out at once in this window
        self._prev_peak = 0  # and in the one before
        self._window_start = clock()

    def _roll(self):
        """Starts a new window if this one is over (lock held). A window that passed without a call
        had self._out out all along, so that is its peak."""
        now = self._clock()
        if now - self._window_start >= self.window_s:
            self._prev_peak = self._out if now - self._window_start >= 2 * self.window_s else self._peak
            self._peak = self._out
            self._window_start = now

    def _trim(self):
        """Frees the longest-idle blocks until the idle ones fit the cap (lock held)."""
        while self._idle > max(self._peak, self._prev_peak):
            _, old = self._order.popitem(last=False)
            same = self._free[old.nbytes]
            del same[next(i for i, b in enumerate(same) if b is old)]
            self._idle -= old.nbytes

    def empty(self, shape, dtype):
        """An uninitialized C-contiguous array of shape and dtype, from a kept block when one of its
        size is idle."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < POOLED_MIN:
            return aligned_empty(nbytes).view(dtype).reshape(shape)
        with self._lock:
            self._roll()
            blocks = self._free.get(nbytes)
            block = blocks.pop() if blocks else None
            if block is not None:
                del self._order[id(block)]
                self._idle -= nbytes
            self._out += nbytes
            self._peak = max(self._peak, self._out)
            self._trim()
        if block is None:
            block = aligned_empty(nbytes)
        # the array's base is the lease (through the uint8 view), which holds the block
        return np.asarray(_Lease(self, block)).view(dtype).reshape(shape)

    def empty_like(self, a):
        return self.empty(a.shape, a.dtype)

    def _give_back(self, block):
        nbytes = block.nbytes
        with self._lock:
            self._roll()  # before _out drops: a window that starts here saw this block out
            self._out -= nbytes
            self._free.setdefault(nbytes, []).append(block)
            self._order[id(block)] = block
            self._idle += nbytes
            self._trim()  # never this block: its bytes were out in this window, so the cap covers them

    def clear(self):
        """Frees the idle blocks (kolo's shutdown: the next job may need other sizes)."""
        with self._lock:
            self._free.clear()
            self._order.clear()
            self._idle = 0
            self._peak, self._prev_peak = self._out, 0  # (outputs may outlive the job)
            self._window_start = self._clock()

    def stats(self):
        with self._lock:
            return {"idle_bytes": self._idle, "out_bytes": self._out,
                    "peak_bytes": max(self._peak, self._prev_peak)}


outputs = BufferPool()


def empty_large(shape, dtype):
    """NumPy's outputs: from the pool from MALLOC_KEEPS bytes, where the allocator returns memory to
    the kernel at every free; np.empty below (kolo.tensorflow takes every size from the pool, which
    aligns them as TensorFlow needs)."""
    dtype = np.dtype(dtype)
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize < MALLOC_KEEPS:
        return np.empty(shape, dtype)
    return outputs.empty(shape, dtype)


def empty_like_large(a):
    return empty_large(a.shape, a.dtype)
