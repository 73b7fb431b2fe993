"""kolo.spark.keras: Horovod's horovod.spark.keras.KerasEstimator, a Spark ML Estimator that trains
a Keras model (TensorFlow backend) on a DataFrame with kolo, and the KerasModel it returns.

    from kolo.spark.common.store import Store
    from kolo.spark.keras import KerasEstimator

    est = KerasEstimator(num_proc=2, store=Store.create("/shared/kolo"), model=model,
                         optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"],
                         feature_cols=["features"], label_cols=["y"], batch_size=32, epochs=5)
    fitted = est.fit(df)                       # a KerasModel
    predicted = fitted.transform(df)           # df with a "y__output" column

How fit runs: kolo/spark/common/estimator.py. The model travels as the bytes of a .keras file
(custom_objects name its custom layers and functions), the optimizer as its Keras config; each
rank compiles the model with kolo.keras.DistributedOptimizer, fits it on its shard (a tf.data
pipeline over the shard in memory, or over its streamed batches) with kolo.keras's
BroadcastGlobalVariablesCallback and
MetricAverageCallback and the given callbacks, and rank 0 writes the model to the store after
every epoch. A column reaches the model shaped as the model's input (or output, for labels) when
that holds as many values per row, else as stored; label_shapes shape the labels explicitly. The
history (getHistory()) is Keras's, averaged over the ranks.
"""

import functools

from kolo.spark.common import estimator as est
from kolo.spark.common.base import EstimatorBase, ModelBase

__all__ = ["KerasEstimator", "KerasModel"]


class KerasEstimator(EstimatorBase):
    """Trains a keras.Model on a Spark DataFrame with kolo (Horovod's KerasEstimator).

    Parameters (keyword arguments, each with a getX()/setX() pair): num_proc, backend, store, model,
    optimizer, loss (a Keras loss, name or function; a list for several outputs), loss_weights,
    metrics, custom_objects, callbacks (Keras callbacks, run on every rank), feature_cols,
    label_cols, label_shapes, sample_weight_col, validation, batch_size, val_batch_size, epochs,
    verbose, shuffle, partitions_per_process, run_id, train_steps_per_epoch,
    validation_steps_per_epoch, gradient_compression, backward_passes_per_step, random_seed.
    shuffle_buffer_size, inmemory_cache_all. Accepted for Horovod's API without effect: reader_pool_type, train_reader_num_workers, val_reader_num_workers. Refused: use_gpu=True,
    transformation_fn."""

    _who = "KerasEstimator"
    _defaults = dict(est.COMMON_DEFAULTS, custom_objects=None)

    def _check(self):
        import keras
        feats, labels = est.check_common(self, self._who)
        g = self.getOrDefault
        if not isinstance(g("model"), keras.Model):
            raise ValueError("KerasEstimator: model must be a keras.Model, got %s" % type(g("model")).__name__)
        if not isinstance(g("optimizer"), keras.optimizers.Optimizer):
            raise ValueError("KerasEstimator: optimizer must be a keras.optimizers.Optimizer, got %s"
                             % type(g("optimizer")).__name__)
        if g("loss") is None:
            raise ValueError("KerasEstimator: loss must be given")
        loss = g("loss")
        if isinstance(loss, (list, tuple)) and len(loss) != len(labels):
            raise ValueError("KerasEstimator: %d losses for %d label columns" % (len(loss), len(labels)))
        outs = len(g("model").outputs or [])
        if outs and outs != len(labels):
            raise ValueError("KerasEstimator: the model has %d outputs for %d label columns" % (outs, len(labels)))
        ins = len(g("model").inputs or [])
        if ins and ins != len(feats):
            raise ValueError("KerasEstimator: the model has %d inputs for %d feature columns" % (ins, len(feats)))
        return feats, labels

    def _trainer(self):
        from kolo.spark.keras import _remote
        return _remote.train

    def _trainer_spec(self):
        import keras
        from kolo.spark.keras import _remote
        g = self.getOrDefault
        return {
            "model": _remote.model_to_bytes(g("model")), "optimizer": keras.optimizers.serialize(g("optimizer")),
            "loss": g("loss"), "metrics": g("metrics"), "custom_objects": g("custom_objects"),
            "callbacks": g("callbacks"),
        }

    def _make_model(self, result, run_id, info, feats, labels):
        from kolo.spark.keras import _remote
        g = self.getOrDefault
        model = _remote.model_from_bytes(_remote.model_to_bytes(g("model")), g("custom_objects"))
        model.set_weights(result["weights"])
        return KerasModel(history=result["history"], model=model, feature_columns=feats, label_columns=labels,
                          custom_objects=g("custom_objects"), run_id=run_id, metadata=info)


class KerasModel(ModelBase):
    """A trained Keras model (Horovod's KerasModel): transform(df) adds its outputs as columns.
    getModel(), getHistory(), getRunId(), getFeatureColumns(), getLabelColumns(), getOutputCols(),
    setOutputCols(cols), getCustomObjects()."""

    _who = "KerasModel"
    _defaults = dict(history=None, model=None, feature_columns=None, label_columns=None, custom_objects=None,
                     run_id=None, metadata=None, output_cols=None)

    def _predictor(self):
        from kolo.spark.keras import _remote
        return functools.partial(_remote.predict, _remote.model_to_bytes(self.getModel()), self.getCustomObjects())


est.add_params(KerasEstimator, est.COMMON_PARAMS + [
    ("custom_objects", "the model's custom layers, losses and metrics by name, as keras.models.load_model takes"),
])
est.add_params(KerasModel, [
    ("history", "Keras's history, averaged over the ranks"),
    ("model", "the trained keras.Model"),
    ("feature_columns", "the feature columns, one model input each"),
    ("label_columns", "the label columns"),
    ("custom_objects", "the model's custom objects"),
    ("run_id", "the run's name in the store"),
    ("metadata", "the training data's columns: (kind, shape, dtype)"),
    ("output_cols", "the columns transform adds (default <label>__output)"),
])
