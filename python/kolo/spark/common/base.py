"""The Spark ML classes under kolo.spark.torch and kolo.spark.keras: EstimatorBase.fit(df) and
ModelBase.transform(df) (estimator.py says how fit runs). A framework gives: its parameters, a
check of them, the trainer the ranks run (a module-level function, imported by name on the
executors), what it is given, and how the returned weights become a model; and for transform,
a function from a batch of feature arrays to the model's outputs."""

from pyspark.ml import Estimator, Model

from kolo.spark.common import estimator as est
from kolo.spark.common.backend import SparkBackend

__all__ = ["EstimatorBase", "ModelBase"]

_PREDICT_BATCH = 256  # rows per model call in transform


class EstimatorBase(Estimator):
    _who = "Estimator"
    _defaults = {}

    def __init__(self, **kwargs):
        super().__init__()
        self._setDefault(**self._defaults)
        self.setParams(**kwargs)

    def setParams(self, **kwargs):
        for k in kwargs:
            if k not in self._defaults:
                raise TypeError("%s got an unexpected keyword argument %r" % (self._who, k))
        return self._set(**kwargs)

    # what a framework gives
    def _check(self):
        """Checks the parameters; returns (feature columns, label columns)."""
        return est.check_common(self, self._who)

    def _trainer(self):
        raise NotImplementedError()

    def _trainer_spec(self):
        """The framework's part of what every rank is given (model, optimizer, loss, ...)."""
        raise NotImplementedError()

    def _make_model(self, result, run_id, info, feats, labels):
        raise NotImplementedError()

    # fit
    def _backend(self):
        backend = self.getOrDefault("backend")
        if backend is not None:
            if self.getOrDefault("num_proc") not in (None, backend.num_processes()):
                raise ValueError("%s: num_proc=%s and a backend of %d processes: give one or the other"
                                 % (self._who, self.getOrDefault("num_proc"), backend.num_processes()))
            return backend
        return SparkBackend(num_proc=self.getOrDefault("num_proc"), verbose=1 if self.getOrDefault("verbose") else 0)

    def _fit(self, df):
        feats, labels = self._check()
        backend = self._backend()
        n = backend.num_processes()
        store = self.getOrDefault("store")
        run_id = self.getOrDefault("run_id") or est.new_run_id()
        weight = self.getOrDefault("sample_weight_col")
        cols = feats + labels + ([weight] if weight else [])
        train_path, val_path, train_rows, val_rows = est.prepare_data(
            self._who, store, df, cols, self.getOrDefault("validation"), n,
            self.getOrDefault("partitions_per_process"), self.getOrDefault("random_seed"), run_id)
        try:
            return self._fit_prepared(backend, n, run_id, train_path, val_path, train_rows, val_rows, feats, labels)
        finally:
            store.remove(train_path)
            if val_path:
                store.remove(val_path)

    def fit_on_parquet(self, train_data_path=None, val_data_path=None):
        """Trains on Parquet data already in the store (the columns as fit would write them),
        by default the store's train (and, where it exists, validation) data path."""
        feats, labels = self._check()
        backend = self._backend()
        store = self.getOrDefault("store")
        train_path = train_data_path or store.get_train_data_path()
        if val_data_path is None and store.is_parquet_dataset(store.get_val_data_path()):
            val_data_path = store.get_val_data_path()
        if not store.is_parquet_dataset(train_path):
            raise ValueError("%s.fit_on_parquet: no Parquet data at %s" % (self._who, train_path))
        train_rows = est.count_rows(store.get_parquet_files(train_path))
        val_rows = est.count_rows(store.get_parquet_files(val_data_path)) if val_data_path else 0
        run_id = self.getOrDefault("run_id") or est.new_run_id()
        return self._fit_prepared(backend, backend.num_processes(), run_id, train_path, val_data_path, train_rows,
                                  val_rows, feats, labels)

    def _fit_prepared(self, backend, n, run_id, train_path, val_path, train_rows, val_rows, feats, labels):
        store = self.getOrDefault("store")
        if train_rows < n:
            raise ValueError("%s: %d training rows for %d ranks: every rank needs at least one row"
                             % (self._who, train_rows, n))
        if val_path and val_rows < n:
            raise ValueError("%s: validation=%r left %d validation rows for %d ranks: every rank needs at least "
                             "one" % (self._who, self.getOrDefault("validation"), val_rows, n))
        weight = self.getOrDefault("sample_weight_col")
        cols = feats + labels + ([weight] if weight else [])
        train_files = store.get_parquet_files(train_path)
        info = est.column_info(train_files, cols)
        bs = self.getOrDefault("batch_size")
        vbs = self.getOrDefault("val_batch_size") or bs
        spec = {
            "who": self._who, "feature_cols": feats, "label_cols": labels, "sample_weight_col": weight,
            "train_files": train_files, "val_files": store.get_parquet_files(val_path) if val_path else [],
            "train_rows": train_rows, "val_rows": val_rows, "batch_size": bs, "val_batch_size": vbs,
            "epochs": self.getOrDefault("epochs"), "verbose": self.getOrDefault("verbose"),
            "shuffle": self.getOrDefault("shuffle"), "seed": self.getOrDefault("random_seed"),
            "in_memory": self.getOrDefault("inmemory_cache_all"),
            "shuffle_buffer_size": self.getOrDefault("shuffle_buffer_size"),
            "train_steps": est.steps(train_rows, bs, n, self.getOrDefault("train_steps_per_epoch")),
            "val_steps": est.steps(val_rows, vbs, n, self.getOrDefault("validation_steps_per_epoch"))
            if val_path else 0,
            "loss_weights": self.getOrDefault("loss_weights") or [1.0] * len(labels),
            "label_shapes": self.getOrDefault("label_shapes"),
            "compression": self.getOrDefault("gradient_compression"),
            "backward_passes_per_step": self.getOrDefault("backward_passes_per_step"),
            "checkpoint": store.get_checkpoint_path(run_id) if store.saving_runs() else None,
            "store": store, "run_id": run_id, "info": info,
        }
        spec.update(self._trainer_spec())
        results = backend.run(self._trainer(), args=(spec,))
        if not results or results[0] is None:
            raise RuntimeError("%s: rank 0 of the training job returned no model" % self._who)
        return self._make_model(results[0], run_id, info, feats, labels)


class ModelBase(Model):
    """A trained model as a Spark ML Transformer: transform(df) adds one column per model output
    (output_cols, default `<label>__output`): a double where the output has one value per row, a
    Spark ML DenseVector otherwise."""
    _who = "Model"
    _defaults = {}

    def __init__(self, **kwargs):
        super().__init__()
        self._setDefault(**self._defaults)
        self._set(**kwargs)

    def getOutputCols(self):
        cols = self.getOrDefault("output_cols")
        return list(cols) if cols else [c + "__output" for c in self.getOrDefault("label_columns")]

    def _predictor(self):
        """A picklable function: [feature arrays, rows first] -> [output arrays, rows first]."""
        raise NotImplementedError()

    def _transform(self, df):
        import numpy as np
        from pyspark.ml.linalg import DenseVector, VectorUDT
        from pyspark.sql.types import DoubleType, StructField, StructType
        feats = self.getOrDefault("feature_columns")
        outs = self.getOutputCols()
        missing = [c for c in feats if c not in df.columns]
        if missing:
            raise ValueError("%s.transform: the DataFrame has no column %s (its columns: %s)"
                             % (self._who, ", ".join(map(repr, missing)), ", ".join(df.columns)))
        clash = [c for c in outs if c in df.columns]
        if clash:
            raise ValueError("%s.transform: the DataFrame already has output column %s; setOutputCols([...]) to "
                             "name others" % (self._who, ", ".join(map(repr, clash))))
        predict = self._predictor()
        who = self._who  # the closures below go to the executors: no self in them

        def arrays(rows):
            res = []
            for c in feats:
                vals = [r[c] for r in rows]
                vals = [v.toArray() if hasattr(v, "toArray") else v for v in vals]
                res.append(est.np_input(np.asarray(vals)))
            return res

        def outputs(rows):
            res = predict(arrays(rows))
            if len(res) != len(outs):
                raise ValueError("%s.transform: the model has %d outputs for %d output columns (%s)"
                                 % (who, len(res), len(outs), ", ".join(outs)))
            return [np.asarray(o).reshape(len(rows), -1) for o in res]

        # the output columns' types, from the model's outputs for the first row
        first = df.select(*feats).head(1)
        widths = [o.shape[1] for o in outputs(first)] if first else [1] * len(outs)
        fields = [StructField(c, DoubleType() if w == 1 else VectorUDT(), True) for c, w in zip(outs, widths)]

        def part(rows):
            batch = []
            for row in rows:
                batch.append(row)
                if len(batch) == _PREDICT_BATCH:
                    yield from emit(batch)
                    batch = []
            if batch:
                yield from emit(batch)

        def emit(batch):
            res = outputs(batch)
            for i, row in enumerate(batch):
                yield tuple(row) + tuple(float(o[i, 0]) if o.shape[1] == 1 else DenseVector(o[i]) for o in res)

        schema = StructType(df.schema.fields + fields)
        return df.sparkSession.createDataFrame(df.rdd.mapPartitions(part), schema)
