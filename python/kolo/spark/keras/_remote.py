"""What each rank of a KerasEstimator's training job runs (train), and the prediction function of
KerasModel.transform (predict). Imported by name on the executors."""

import os
import tempfile

import numpy as np


def model_to_bytes(model):
    """A Keras model (architecture, weights, compile state) as the bytes of a .keras file."""
    with tempfile.TemporaryDirectory(prefix="kolo-keras-") as d:
        path = os.path.join(d, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(data, custom_objects=None, compile=False):
    import keras
    with tempfile.TemporaryDirectory(prefix="kolo-keras-") as d:
        path = os.path.join(d, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.models.load_model(path, custom_objects=custom_objects, compile=compile)


def _one_or_tuple(arrays):
    return arrays[0] if len(arrays) == 1 else tuple(arrays)


def model_shapes(tensors):
    """The shapes (batch dimension first) of a model's inputs or outputs."""
    try:
        return [tuple(t.shape) for t in tensors]
    except (AttributeError, TypeError, ValueError):
        return None


def shaped(a, given, model_shape):
    """A column's rows as the model takes them: by the shape given (batch dimension -1 or None
    first), else by the model's own shape where that is known and holds as many values per row,
    else as stored."""
    if given is not None:
        return a.reshape([-1 if s is None else s for s in given])
    if model_shape is None or any(d is None for d in model_shape[1:]):
        return a
    dims = list(model_shape[1:])
    width = int(np.prod(a.shape[1:])) if a.ndim > 1 else 1
    if int(np.prod(dims)) == width and tuple(a.shape[1:]) != tuple(dims):
        return a.reshape([-1] + dims)
    return a


def _columns(est, data, cols, given, model):
    return [shaped(est.np_input(data[c]), given[i] if given else None, model[i] if model else None)
            for i, c in enumerate(cols)]


def _dataset(tf, est, model, src, spec, batch_size, shuffle, seed):
    """A tf.data pipeline of endless batches from a rank's batch source: over the shard in memory,
    shuffled by tf.data; or the source's own streamed batches."""
    ins, outs, w = model_shapes(model.inputs), model_shapes(model.outputs), spec["sample_weight_col"]

    def parts(b):
        x = _one_or_tuple(_columns(est, b, spec["feature_cols"], None, ins))
        y = _one_or_tuple(_columns(est, b, spec["label_cols"], spec["label_shapes"], outs))
        return (x, y, np.asarray(b[w], dtype=np.float32)) if w else (x, y)

    if not src.streamed:
        ds = tf.data.Dataset.from_tensor_slices(parts(src.data))
        if shuffle:
            ds = ds.shuffle(src.rows, seed=seed, reshuffle_each_iteration=True)
        return ds.repeat().batch(batch_size)
    first = parts(src.next())
    sig = tf.nest.map_structure(lambda a: tf.TensorSpec((None,) + a.shape[1:], tf.as_dtype(a.dtype)), first)

    def gen():
        yield first
        while True:
            yield parts(src.next())
    return tf.data.Dataset.from_generator(gen, output_signature=sig)


def train(spec):
    import keras
    import tensorflow as tf
    import kolo.keras as hvd
    from kolo.spark.common import estimator as est
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if spec["seed"] is not None:
        keras.utils.set_random_seed(spec["seed"])
    feats, labels, wcol = spec["feature_cols"], spec["label_cols"], spec["sample_weight_col"]
    cols = feats + labels + ([wcol] if wcol else [])
    seed = spec["seed"] if spec["seed"] is not None else 0
    train_src = est.batch_source(spec["train_files"], rank, size, cols, spec["batch_size"], spec["shuffle"],
                                 seed * 1000003 + rank, spec["in_memory"], spec["shuffle_buffer_size"])
    val_src = est.batch_source(spec["val_files"], rank, size, cols, spec["val_batch_size"], False, 0,
                               spec["in_memory"], None) if spec["val_files"] else None
    if spec["verbose"] and rank == 0 and train_src.streamed:
        print("%s: rank 0's shard: %s (more than KOLO_ESTIMATOR_MEMORY_MB, %d MiB)"
              % (spec["who"], train_src.describe(), est.memory_limit() >> 20), flush=True)

    custom = spec["custom_objects"]
    model = model_from_bytes(spec["model"], custom)
    opt = keras.optimizers.deserialize(spec["optimizer"], custom_objects=custom)
    dopt = hvd.DistributedOptimizer(opt, compression=spec["compression"] or hvd.Compression.none,
                                    backward_passes_per_step=spec["backward_passes_per_step"])
    loss = spec["loss"]
    model.compile(optimizer=dopt, loss=loss, loss_weights=spec["loss_weights"] if len(labels) > 1 else None,
                  metrics=spec["metrics"])
    train_ds = _dataset(tf, est, model, train_src, spec, spec["batch_size"], spec["shuffle"], seed * 1000003 + rank)
    val_ds = _dataset(tf, est, model, val_src, spec, spec["val_batch_size"], False, 0) if val_src else None

    store, ck = spec["store"], spec["checkpoint"]

    class Checkpoint(keras.callbacks.Callback):
        """Rank 0 writes the model to the store after every epoch."""

        def on_epoch_end(self, epoch, logs=None):
            if rank == 0 and ck:
                store.write(ck, model_to_bytes(self.model))

    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    callbacks += list(spec["callbacks"] or []) + [Checkpoint()]
    hist = model.fit(train_ds, steps_per_epoch=spec["train_steps"], epochs=spec["epochs"],
                     validation_data=val_ds, validation_steps=spec["val_steps"] if val_ds is not None else None,
                     callbacks=callbacks, shuffle=False,  # the dataset is shuffled already
                     verbose=2 if spec["verbose"] and rank == 0 else 0)
    if rank != 0:
        return None
    history = {k: [float(v) for v in vs] for k, vs in hist.history.items()}
    return {"history": history, "weights": model.get_weights()}


_cache = {}


def predict(model_bytes, custom_objects, arrays):
    """The model's outputs (numpy, rows first) for a batch of feature arrays; the model is loaded
    once per Python worker."""
    key = hash(model_bytes)
    model = _cache.get(key)
    if model is None:
        _cache.clear()
        model = _cache[key] = model_from_bytes(model_bytes, custom_objects)
    ins = model_shapes(model.inputs)
    x = [shaped(a, None, ins[i] if ins else None) for i, a in enumerate(arrays)]
    out = model(_one_or_tuple(x), training=False)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [np.asarray(o) for o in outs]
