"""Averaging gradients over the ranks: DistributedGradientTape and DistributedOptimizer for Keras optimizers
(Horovod's horovod.tensorflow and horovod.tensorflow.keras), and the batch they share.

Every gradient of a step goes to kolo's engine in one batch (one tf.numpy_function inside tf.function):
all requests are submitted before the first wait, so the engine negotiates them together and fuses them
into few collectives. Each request is named after its variable ("grad.dense/kernel"), the same on every
rank and at every step, so after the first step negotiation is a response-cache hit, and an error names
the variable.

Keras 3 (TensorFlow 2.16 and later) applies gradients in Optimizer.apply (apply_gradients calls it,
and so does Model.fit's train_step): the distributed class overrides apply. Keras 2 (tf_keras, or
TensorFlow before 2.16) applies them in apply_gradients: that is overridden there.

Local gradient aggregation (backward_passes_per_step=N, Horovod's LocalGradientAggregationHelperEager):
every call of apply adds its gradients to one buffer per variable and counts itself. The Nth call
since the last update allreduces the buffers in the same one batch as above (divided by N when
average_aggregated_gradients), empties them and hands the result to the wrapped optimizer; the
other calls communicate nothing and apply nothing, but add one to optimizer.iterations, as
Horovod's do. The buffers and the count are tf.Variables (created outside any tf.function, under
tf.init_scope) and the choice is a tf.cond, so one traced train step serves every call; eagerly the
tf.cond simply runs one branch. Every rank calls apply equally often, so every rank's Nth call is
the same one, and the collectives meet.
"""

import numbers

import tensorflow as tf

from kolo import _ops
from kolo.basics import Average, _elastic, c_op, global_process_set
from kolo.tensorflow.compression import Compression
from kolo.tensorflow.functions import unique_names
from kolo.tensorflow.mpi_ops import (_A, _allreduce_spec, _execute, _grouped_allreduce_spec, _pset, _size_as, _Spec,
                                     _tensor, check_sparse_op)


def _split_list(items, n):
    """n nearly equal consecutive parts."""
    k, m = divmod(len(items), n)
    return [items[i * k + min(i, m):(i + 1) * k + min(i + 1, m)] for i in range(n)]


def _groups_of(dense, variables, groups):
    """The dense gradients' indices, as lists reduced together: one each (groups None), groups
    nearly equal consecutive parts (an int), or the given lists of variables and one each for the
    rest."""
    if not groups:
        return [[i] for i in dense]
    if isinstance(groups, int):
        return [g for g in _split_list(dense, min(groups, len(dense)) or 1) if g]
    where = {}
    for k, group in enumerate(groups):
        for v in group:
            where[id(v)] = k
    parts = [[] for _ in groups]
    rest = []
    for i in dense:
        k = where.get(id(variables[i]))
        (rest.append([i]) if k is None else parts[k].append(i))
    return [p for p in parts if p] + rest


def allreduce_gradients(grads, variables, op=Average, compression=Compression.none, sparse_as_dense=False,
                        gradient_predivide_factor=1.0, groups=None, process_set=global_process_set, prefix="grad"):
    """Returns grads (a list, None entries allowed) averaged (op) over the process set, in one batch.
    variables names them. Dense gradients are allreduced (grouped as groups says), tf.IndexedSlices are
    allgathered (values and indices; Average and Sum only) unless sparse_as_dense. With op=Adasum every
    gradient is its own Adasum vector (Horovod's TensorFlow 2 and Keras rule: the gradients are
    combined, not the updates)."""
    process_set = _pset(process_set)
    grads = list(grads)
    # One rank has nothing to reduce, unless in an elastic job, where a traced step must still
    # reduce when a later round has more workers.
    if not process_set.included() or (process_set.size() == 1 and not _elastic()):
        return grads
    names = unique_names(prefix, variables)
    # Average divides by the set's size in the engine; gradient_predivide_factor f moves a factor f
    # of that before the sum.
    pre, post = (1.0 / gradient_predivide_factor, gradient_predivide_factor) if op == Average else (1.0, 1.0)
    inputs, specs, dtypes, shapes, ctxs = [], [], [], [], {}
    dense, sparse = [], []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                grads[i] = g = tf.convert_to_tensor(g)
            else:
                check_sparse_op(op, "DistributedGradientTape and DistributedOptimizer")
                sparse.append(i)
                continue
        c, ctxs[i] = compression.compress(_tensor(g, "allreduce"))
        grads[i] = c
        dense.append(i)
    order = []  # the gradient index of each output
    for part in _groups_of(dense, variables, groups):
        ts = [grads[i] for i in part]
        if len(part) == 1:
            specs.append(_allreduce_spec(names[part[0]], op, pre, post, process_set))
        else:
            specs.append(_grouped_allreduce_spec(len(part), names[part[0]], op, pre, post, process_set))
        inputs += ts
        dtypes += [t.dtype for t in ts]
        shapes += [t.shape for t in ts]
        order += part
    for i in sparse:
        g = grads[i]
        vals, ctxs[i] = compression.compress(_tensor(g.values, "allreduce"))
        for t, nm in ((vals, names[i] + ".values"), (_tensor(g.indices, "allreduce"), names[i] + ".indices")):
            specs.append(_Spec(1, lambda x, nm=nm: [_ops.allgather_async(_A, x, nm, process_set)]))
            inputs.append(t)
            dtypes.append(t.dtype)
            shapes.append(tf.TensorShape([None]).concatenate(t.shape[1:]))
    if not specs:
        return grads
    outs = _execute(specs, inputs, dtypes, shapes, "allreduce_gradients")
    result = list(grads)
    for i, o in zip(order, outs):
        result[i] = compression.decompress(o, ctxs[i])
    rest = outs[len(order):]
    for k, i in enumerate(sparse):
        vals, idx = compression.decompress(rest[2 * k], ctxs[i]), rest[2 * k + 1]
        if op == Average:
            vals = vals / _size_as(process_set, vals.dtype)
        result[i] = tf.IndexedSlices(vals, idx, dense_shape=grads[i].dense_shape)
    return result


def reduce_gradients(grads, variables, local, scale_local_gradients, opts):
    """allreduce_gradients(grads, variables, **opts), except for the variables in local (a dict keyed
    by id): their gradients stay this rank's own, divided by the process set's size when
    scale_local_gradients (Horovod's rule for local layers; the others are averaged, a sum divided by
    that size too)."""
    if not local:
        return allreduce_gradients(grads, variables, **opts)
    grads = list(grads)
    shared = [i for i, v in enumerate(variables) if id(v) not in local]
    reduced = allreduce_gradients([grads[i] for i in shared], [variables[i] for i in shared], **opts)
    out = list(grads)
    for i, g in zip(shared, reduced):
        out[i] = g
    ps = _pset(opts.get("process_set"))
    if scale_local_gradients and ps.included() and (ps.size() > 1 or _elastic()):
        for i, v in enumerate(variables):
            g = grads[i]
            if id(v) not in local or g is None:
                continue
            if isinstance(g, tf.IndexedSlices):
                out[i] = tf.IndexedSlices(g.values / _size_as(ps, g.values.dtype), g.indices, g.dense_shape)
            else:
                out[i] = g / _size_as(ps, g.dtype)
    return out


def _local_layer_variables(local_layers):
    """The trainable variables of local_layers: None, one Keras layer or a collection of them."""
    if local_layers is None:
        return []
    layer_class = tf.keras.layers.Layer
    if isinstance(local_layers, layer_class):
        local_layers = [local_layers]
    local_layers = list(local_layers)
    if not all(isinstance(layer, layer_class) for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    return [v for layer in local_layers for v in layer.trainable_weights]


def _check_options(op, gradient_predivide_factor):
    c_op(op)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")


def _check_passes(backward_passes_per_step):
    """The number of calls of apply whose gradients are summed locally before one allreduce."""
    n = backward_passes_per_step
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError("backward_passes_per_step must be an integer > 0, not %r" % (n,))
    if n <= 0:
        raise ValueError("backward_passes_per_step must be > 0, got %d" % n)
    return int(n)


def _variable_name(v):
    return getattr(v, "path", None) or getattr(v, "name", None) or "?"


class _LocalAggregation:
    """One optimizer's local gradient aggregation: a count of the calls since the last update and
    a buffer per variable holding the sum of their gradients. A plain object, not a Trackable, so
    that neither Keras nor tf.train.Checkpoint saves it with the optimizer (a model saved mid-cycle
    loses the partial sums; Horovod's optimizer does not save them either)."""

    def __init__(self, passes, average, sparse_as_dense):
        self.passes, self.average, self.sparse_as_dense = passes, average, sparse_as_dense
        self.count = None
        self.sums = {}  # id(variable) -> (variable, its buffer); the variable keeps the id unique

    def _build(self, variables):
        # init_scope: made eagerly even when the first call is being traced (or is inside a
        # tf.cond), and again only for variables not seen before.
        new = [v for v in variables if id(v) not in self.sums]
        if self.count is not None and not new:
            return
        with tf.init_scope():
            if self.count is None:
                self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="kolo_aggregation_count")
            for v in new:
                buf = tf.Variable(tf.zeros(tf.TensorShape(v.shape), tf.as_dtype(v.dtype)), trainable=False,
                                  name="kolo_aggregated_gradient")
                self.sums[id(v)] = (v, buf)

    def _add(self, buf, g, v):
        if isinstance(g, tf.IndexedSlices):
            if not self.sparse_as_dense:
                raise ValueError(
                    "IndexedSlices are not supported when `backward_passes_per_step` > 1 and `sparse_as_dense` "
                    "is False: the gradient of %s is a tf.IndexedSlices. Pass sparse_as_dense=True to "
                    "DistributedOptimizer (the passes' slices are then summed into a dense buffer, which is "
                    "allreduced)." % _variable_name(v))
            if g.values.dtype != buf.dtype:
                g = tf.IndexedSlices(tf.cast(g.values, buf.dtype), g.indices, g.dense_shape)
            return buf.scatter_add(g)
        g = tf.convert_to_tensor(g)
        return buf.assign_add(g if g.dtype == buf.dtype else tf.cast(g, buf.dtype))

    def step(self, grads, variables, reduce, apply, skip):
        """Adds grads (None entries allowed) to the sums. On the passes-th call since the last
        update: reduces the sums of the variables whose gradient is not None now with
        reduce(sums, variables) (divided by passes if average), empties every buffer and calls
        apply(reduced grads, None where grads has None); otherwise calls skip(). Returns True for
        an update, False otherwise (a bool tensor)."""
        self._build(variables)
        present = [i for i, g in enumerate(grads) if g is not None]
        bufs = [self.sums[id(variables[i])][1] for i in present]
        for i, buf in zip(present, bufs):
            self._add(buf, grads[i], variables[i])
        count = self.count.assign_add(1)

        def update():
            summed = [buf.read_value() for buf in bufs]
            reduced = reduce(summed, [variables[i] for i in present])
            if self.average:
                reduced = [g / tf.cast(self.passes, g.dtype) for g in reduced]
            # The buffers are emptied once the allreduce has read them (tf.function orders a
            # variable's read before its later assign anyway; eagerly this is program order).
            with tf.control_dependencies(reduced):
                for _, buf in self.sums.values():
                    buf.assign(tf.zeros_like(buf))
                self.count.assign(0)
            out = [None] * len(grads)
            for i, g in zip(present, reduced):
                out[i] = g
            apply(out)
            return tf.constant(True)

        def no_update():
            skip()
            return tf.constant(False)
        return tf.cond(tf.equal(count, self.passes), update, no_update)


def _aggregation(optimizer, passes, average, sparse_as_dense):
    """optimizer's _LocalAggregation, made on first use."""
    agg = optimizer.__dict__.get("_kolo_aggregation")
    if agg is None:
        agg = _LocalAggregation(passes, average, sparse_as_dense)
        optimizer._kolo_aggregation = agg
    return agg


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True,
                            backward_passes_per_step=1):
    """A tape whose gradient() returns gradients averaged over every rank (Horovod's
    DistributedGradientTape). Use it after recording:

        with tf.GradientTape() as tape:
            loss = loss_fn(model(x), y)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    or around the recording (`with hvd.DistributedGradientTape(tf.GradientTape()) as tape:`). The
    returned object is an instance of a subclass of the tape's class that shares its recording.
    groups: an int (that many grouped requests) or lists of variables reduced together; num_groups
    is its deprecated name. compression: Compression.none or Compression.fp16. sparse_as_dense: turn
    tf.IndexedSlices into dense tensors first (otherwise they travel as allgathers).
    tape.register_local_source(variable) keeps that variable's gradient on this rank (not
    allreduced), divided by the process set's size when scale_local_gradients, as in Horovod.
    backward_passes_per_step: only 1. Horovod's tape has no such argument, since a tape cannot tell
    which of its gradient() calls ends a step; aggregate with DistributedOptimizer(...,
    backward_passes_per_step=N) instead."""
    _check_options(op, gradient_predivide_factor)
    if backward_passes_per_step != 1:
        raise TypeError(
            "DistributedGradientTape does not aggregate gradients locally (backward_passes_per_step=%r; Horovod's "
            "tape has no such argument): a tape cannot tell which gradient() call ends a step. Wrap the Keras "
            "optimizer instead, hvd.DistributedOptimizer(opt, backward_passes_per_step=N), and give it the local "
            "gradients of a plain tf.GradientTape." % (backward_passes_per_step,))
    groups = groups if groups is not None else (num_groups or None)
    base = gradtape.__class__
    opts = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                gradient_predivide_factor=gradient_predivide_factor, groups=groups, process_set=process_set)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = base.gradient(self, target, sources, output_gradients, unconnected_gradients)
        flat = reduce_gradients(tf.nest.flatten(grads), tf.nest.flatten(sources), self._kolo_local_sources,
                                scale_local_gradients, opts)
        return tf.nest.pack_sequence_as(grads, flat)

    def register_local_source(self, source):
        """Keeps source's gradient on this rank: it is not allreduced (Horovod's model-parallel
        layers)."""
        self._kolo_local_sources[id(source)] = source

    cls = type(base.__name__, (base,), {"gradient": gradient, "register_local_source": register_local_source,
                                        "__module__": base.__module__, "_kolo_distributed": True})
    tape = cls.__new__(cls)
    tape.__dict__ = gradtape.__dict__  # one recording: entering or leaving either object is seen by both
    tape._kolo_local_sources = {}  # id -> variable (held, so that the id stays its own)
    return tape


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """DistributedGradientTape, except that the gradients of local_layers' trainable variables (one
    Keras layer or a collection of them) are not allreduced: each rank keeps its own, divided by the
    process set's size when scale_local_gradients (Horovod's default, True). For model-parallel
    layers that differ from rank to rank."""
    local = _local_layer_variables(local_layers)
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for v in local:
        tape.register_local_source(v)
    return tape


def _is_keras3_optimizer(cls):
    return hasattr(cls, "apply") and hasattr(cls, "stateless_apply")


def _local_vars(optimizer):
    """The variables registered with optimizer.register_local_var (id -> variable). Kept in the
    instance's __dict__, past Keras's attribute tracking, so that they never count among the
    optimizer's own variables."""
    local = optimizer.__dict__.get("_kolo_local_vars")
    if local is None:
        local = optimizer.__dict__["_kolo_local_vars"] = {}
    return local


def _register_local_var(self, var):
    """Keeps var's gradient on this rank: it is not allreduced (Horovod's model-parallel layers),
    and is divided by the process set's size when scale_local_gradients."""
    _local_vars(self)[id(var)] = var


def distributed_class(base, opts, backward_passes_per_step=1, average_aggregated_gradients=False,
                      scale_local_gradients=True):
    """A subclass of the Keras optimizer class `base` that averages gradients over the ranks before
    applying them (opts: allreduce_gradients' options), every backward_passes_per_step-th call (the
    others sum them locally; _LocalAggregation), except those of the variables registered with
    register_local_var. It keeps base's name and module, so a model saved with it loads without
    kolo as base."""
    if getattr(base, "_kolo_distributed", False):
        raise ValueError("%s is a kolo DistributedOptimizer already" % base.__name__)
    passes = _check_passes(backward_passes_per_step)
    average = bool(average_aggregated_gradients)
    sparse_as_dense = opts.get("sparse_as_dense", False)

    def reducer(self):
        local = _local_vars(self)
        return lambda grads, variables: reduce_gradients(grads, variables, local, scale_local_gradients, opts)
    if _is_keras3_optimizer(base):
        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            if trainable_variables is not None:
                trainable_variables = list(trainable_variables)
                variables = trainable_variables
            elif self.built:
                variables = list(self._trainable_variables)
            else:  # base.apply explains what is missing
                return base.apply(self, grads, trainable_variables)
            if passes == 1 or not grads:
                return base.apply(self, reducer(self)(grads, variables), trainable_variables)
            if not self.built:  # here, not inside the tf.cond below, where variables cannot be made
                self.build(variables)
            _aggregation(self, passes, average, sparse_as_dense).step(
                grads, variables, reducer(self), lambda reduced: base.apply(self, reduced, trainable_variables),
                lambda: self.iterations.assign_add(1))
        ns = {"apply": apply}
    elif hasattr(base, "apply_gradients"):
        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            gv = list(grads_and_vars)
            variables = [v for _, v in gv]
            grads = [g for g, _ in gv]
            if passes == 1 or not gv:
                grads = reducer(self)(grads, variables)
                return base.apply_gradients(self, list(zip(grads, variables)), *args, **kwargs)
            _aggregation(self, passes, average, sparse_as_dense).step(
                grads, variables, reducer(self),
                lambda reduced: base.apply_gradients(self, list(zip(reduced, variables)), *args, **kwargs),
                lambda: self.iterations.assign_add(1))
            return self.iterations
        ns = {"apply_gradients": apply_gradients}
    else:
        raise ValueError("%s is not a Keras optimizer (it has neither apply nor apply_gradients)" % base.__name__)
    ns.update(__module__=base.__module__, __qualname__=base.__qualname__, _kolo_distributed=True,
              register_local_var=_register_local_var)
    return type(base.__name__, (base,), ns)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A Keras optimizer like `optimizer` (a new one, made from its config, as Horovod does) that
    averages the gradients over every rank before applying them. Works with Model.fit and with
    custom loops (apply_gradients / apply). Options as DistributedGradientTape's; name renames the
    optimizer. backward_passes_per_step=N sums the gradients of N calls locally and allreduces and
    applies the sum on every Nth call (divided by N if average_aggregated_gradients); the other calls
    apply nothing but count in optimizer.iterations, as in Horovod. optimizer.register_local_var(v)
    keeps v's gradient on this rank (divided by the process set's size when scale_local_gradients,
    as in Horovod); see PartialDistributedOptimizer. TensorFlow 1 optimizers
    (tf.compat.v1.train.Optimizer) are not supported: use a Keras optimizer or DistributedGradientTape."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise NotImplementedError(
            "kolo.tensorflow.DistributedOptimizer wraps Keras optimizers; for a tf.compat.v1.train.Optimizer, "
            "average the gradients with hvd.DistributedGradientTape (or hvd.allreduce) before apply_gradients")
    _check_options(op, gradient_predivide_factor)
    if _check_passes(backward_passes_per_step) > 1 and getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError(
            "backward_passes_per_step=%d and the optimizer's gradient_accumulation_steps=%d would both sum gradients "
            "over steps: use one of them (backward_passes_per_step communicates once per update, Keras's "
            "gradient_accumulation_steps at every step)" % (backward_passes_per_step,
                                                           optimizer.gradient_accumulation_steps))
    groups = groups if groups is not None else (num_groups or None)
    opts = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                gradient_predivide_factor=gradient_predivide_factor, groups=groups, process_set=process_set)
    cls = distributed_class(optimizer.__class__, opts, backward_passes_per_step, average_aggregated_gradients,
                            scale_local_gradients)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """DistributedOptimizer, except that the gradients of local_layers' trainable variables (one
    Keras layer or a collection of them) are not allreduced: each rank applies its own, divided by
    the process set's size when scale_local_gradients (Horovod's default, True). The same as
    DistributedOptimizer(...) followed by register_local_var for each of those variables."""
    local = _local_layer_variables(local_layers)
    opt = DistributedOptimizer(optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                               backward_passes_per_step=backward_passes_per_step, op=op,
                               gradient_predivide_factor=gradient_predivide_factor,
                               average_aggregated_gradients=average_aggregated_gradients, groups=groups,
                               process_set=process_set, scale_local_gradients=scale_local_gradients)
    for v in local:
        opt.register_local_var(v)
    return opt
