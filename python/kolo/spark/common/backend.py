"""How an estimator runs its training function: Horovod's horovod.spark.common.backend.

SparkBackend runs it through kolo.spark.run (one Spark barrier stage of num_proc tasks, the ranks
of one kolo job). A Backend of one's own (num_processes() and run()) can run it any other way.
"""

__all__ = ["Backend", "SparkBackend"]


class Backend:
    """Runs a function as the ranks of one job and returns their values, ordered by rank."""

    def run(self, fn, args=(), kwargs=None, env=None):
        raise NotImplementedError()

    def num_processes(self):
        raise NotImplementedError()


class SparkBackend(Backend):
    """kolo.spark.run with these arguments: num_proc (default spark.default.parallelism), env and
    the rest of kolo.spark.run's keywords (stdout, stderr, verbose, nics, start_timeout, ...)."""

    def __init__(self, num_proc=None, env=None, **kwargs):
        if num_proc is not None and (not isinstance(num_proc, int) or isinstance(num_proc, bool) or num_proc < 1):
            raise ValueError("SparkBackend: num_proc must be a positive integer, got %r" % (num_proc,))
        self._num_proc = num_proc
        self._env = dict(env or {})
        self._kwargs = kwargs

    def run(self, fn, args=(), kwargs=None, env=None):
        import kolo.spark
        full_env = dict(self._env)
        full_env.update(env or {})
        return kolo.spark.run(fn, args=args, kwargs=kwargs, num_proc=self._num_proc, env=full_env or None,
                              **self._kwargs)

    def num_processes(self):
        if self._num_proc is None:
            from pyspark import SparkContext
            sc = SparkContext._active_spark_context
            if sc is None:
                raise RuntimeError("SparkBackend: no active SparkContext to take spark.default.parallelism "
                                   "from; start a SparkSession or give num_proc")
            self._num_proc = sc.defaultParallelism
        return self._num_proc
