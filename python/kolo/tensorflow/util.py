"""Small helpers under the names of horovod.tensorflow.util, which Horovod scripts and tests import
(`from horovod.tensorflow.util import _executing_eagerly`)."""

import tensorflow as tf


def _executing_eagerly():
    """True when ops run as they are called (not while tf.function traces them)."""
    return tf.executing_eagerly()


def _make_subgraph(f):
    """f as a tf.function."""
    return tf.function(f)


def _cache(f):
    """f memoized on its (hashable) arguments, separately eagerly and while tracing."""
    results = {}

    def cached(*args):
        key = (args, tf.executing_eagerly())
        if key not in results:
            results[key] = f(*args)
        return results[key]
    return cached


def vars_to_refs(variables):
    """A variable, or a nested list of them, as hashable references (tuples for lists)."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs):
    """vars_to_refs undone."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
