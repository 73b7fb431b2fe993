"""kolo.ray.ray_logger: values a rank sends to the driver's callbacks during RayExecutor.run.

    from kolo.ray import ray_logger
    ray_logger.log({"epoch": epoch, "loss": loss})   # in the function run() runs

Each value reaches every callback passed to RayExecutor.run(fn, callbacks=[...]), on the driver,
while the job runs (horovod.ray.ray_logger's API). chief_only=True (the default) sends only rank
0's values: the ranks agree after an allreduce, so one copy is enough. Outside a RayExecutor
worker, or in a run() without callbacks, log() does nothing.

In an ElasticRayExecutor's worker (a process kolorun started, not an actor) the value goes to
the driver over its service's connection instead, with the worker's rank in the current round.
"""

import os
import pickle

_queue = None
_rank = None


def configure(queue, rank=None):
    """Called by the executor in each worker before a run: the queue the driver reads."""
    global _queue, _rank
    _queue = queue
    _rank = rank


def log(info, chief_only=True):
    """Sends info (anything picklable) to the driver's callbacks; with chief_only, rank 0's only."""
    if _queue is None:
        if os.environ.get("KOLO_DRIVER_SERVICE") and os.environ.get("KOLO_ELASTIC"):
            _log_elastic(info, chief_only)
        return
    if chief_only and _rank not in (0, None):
        return
    _queue.put((_rank, info))


def _log_elastic(info, chief_only):
    import kolo
    from kolo import _elastic_task
    rank = kolo.rank() if kolo.is_initialized() else None
    if chief_only and rank not in (0, None):
        return
    _elastic_task.request("log", pickle.dumps(info), rank=rank)
