"""What the Spark estimators share (kolo.spark.torch.TorchEstimator, kolo.spark.keras.KerasEstimator):
their parameters, the data they train on, and the Spark ML Model they return.

fit(df), on the driver:
  1. prepare_data: the feature, label and sample-weight columns of df (Spark ML vectors become
     float32 arrays) are split into training and validation rows (`validation`: a fraction, or a
     column that is true on validation rows) and written as Parquet under the store, in
     num_proc * partitions_per_process files; the rows are counted from the files' footers.
  2. the framework's trainer runs as the ranks of one kolo job through the backend (default
     SparkBackend: kolo.spark.run on num_proc Spark tasks). Each rank reads its shard, an equal
     share of the rows, from the files (Shard), keeps it in memory when it is small enough (or
     inmemory_cache_all) or else streams its row groups every epoch (StreamedBatches), and takes the same number
     of steps per epoch as every other rank (rows // (batch_size * ranks) unless given), drawing
     batches from its shard in a new order every epoch; gradients are averaged by kolo. Rank 0
     writes a checkpoint to the store after every epoch and returns the trained weights and the
     history (each epoch's loss and metrics averaged over the ranks).
  3. the intermediate Parquet data is removed; fit returns the framework's Model, a Spark ML
     Transformer whose transform(df) adds the model's outputs as columns (`<label>__output`).
"""

import math
import os
import socket
import uuid

import numpy as np

__all__ = ["add_params", "check_common", "prepare_data", "column_info", "read_shard", "Batches", "np_input"]


def _camel(name):
    return "".join(w[:1].upper() + w[1:] for w in name.split("_"))


def add_params(cls, specs):
    """Gives cls (a pyspark.ml Params class) a Param, a getter and a setter for each (name, doc):
    `batch_size` -> cls.batch_size, getBatchSize(), setBatchSize(v), as Horovod's estimators have."""
    from pyspark.ml.param import Param, Params
    for name, doc in specs:
        p = Param(Params._dummy(), name, doc)
        setattr(cls, name, p)
        camel = _camel(name)

        def getter(self, _n=name):
            return self.getOrDefault(self.getParam(_n))

        def setter(self, value, _n=name):
            return self._set(**{_n: value})

        getter.__name__, setter.__name__ = "get" + camel, "set" + camel
        getter.__doc__ = setter.__doc__ = doc
        for f in (getter, setter):
            if not hasattr(cls, f.__name__):  # a base class's own (ModelBase.getOutputCols) stays
                setattr(cls, f.__name__, f)
    return cls


# (name, doc) of the parameters both estimators have
COMMON_PARAMS = [
    ("num_proc", "ranks of the training job (default: the backend's, spark.default.parallelism)"),
    ("backend", "how the training function runs (default SparkBackend(num_proc))"),
    ("store", "where the intermediate data and the runs go (a kolo.spark.common.store.Store)"),
    ("model", "the model to train"),
    ("optimizer", "the optimizer"),
    ("loss", "the loss function, or one per label column"),
    ("loss_weights", "a weight per label column's loss (default 1 each)"),
    ("metrics", "metrics computed on every batch and averaged over the epoch and the ranks"),
    ("feature_cols", "the DataFrame's feature columns, one model input each"),
    ("label_cols", "the DataFrame's label columns, one model output each"),
    ("sample_weight_col", "a column weighing each row's loss"),
    ("validation", "a fraction of the rows held out for validation, or a column true on validation rows"),
    ("callbacks", "the framework's training callbacks"),
    ("batch_size", "rows per batch on each rank"),
    ("val_batch_size", "rows per validation batch on each rank (default batch_size)"),
    ("epochs", "passes over the training data"),
    ("verbose", "0 quiet; 1 a line per epoch from rank 0 (and kolo.spark's start and end lines)"),
    ("shuffle", "draw each epoch's batches in a new random order (default True)"),
    ("shuffle_buffer_size", "rows a rank shuffles at a time when it streams its shard (default max(4096, 16 "
                            "batches)); a shard held in memory is shuffled whole"),
    ("partitions_per_process", "Parquet files written per rank (default 10)"),
    ("run_id", "the name of this run in the store (default a new one per fit)"),
    ("train_steps_per_epoch", "steps per epoch (default rows // (batch_size * num_proc))"),
    ("validation_steps_per_epoch", "validation steps per epoch (default val rows // (val_batch_size * num_proc))"),
    ("gradient_compression", "kolo's (Horovod's) Compression: Compression.none or Compression.fp16"),
    ("backward_passes_per_step", "batches whose gradients add up before each optimizer step (default 1)"),
    ("random_seed", "seed of the shuffling and of the validation split"),
    ("transformation_fn", "not supported: transform the DataFrame in Spark before fit"),
    ("inmemory_cache_all", "every rank holds its whole shard in memory (default: only shards of at most "
                           "KOLO_ESTIMATOR_MEMORY_MB, 512; larger ones are streamed by row groups)"),
    ("reader_pool_type", "accepted for Horovod's API (no Petastorm reader in kolo)"),
    ("train_reader_num_workers", "accepted for Horovod's API (no Petastorm reader in kolo)"),
    ("val_reader_num_workers", "accepted for Horovod's API (no Petastorm reader in kolo)"),
    ("use_gpu", "refused when True: kolo reduces host memory"),
    ("label_shapes", "the shape of each label column's rows (default as stored)"),
]

COMMON_DEFAULTS = dict(num_proc=None, backend=None, store=None, model=None, optimizer=None, loss=None,
                       loss_weights=None, metrics=None, feature_cols=None, label_cols=None,
                       sample_weight_col=None, validation=None, callbacks=None, batch_size=32,
                       val_batch_size=None, epochs=1, verbose=1, shuffle=True, shuffle_buffer_size=None,
                       partitions_per_process=10, run_id=None, train_steps_per_epoch=None,
                       validation_steps_per_epoch=None, gradient_compression=None, backward_passes_per_step=1,
                       random_seed=None, transformation_fn=None, inmemory_cache_all=False, reader_pool_type=None,
                       train_reader_num_workers=None, val_reader_num_workers=None, use_gpu=False, label_shapes=None)


def _positive_int(who, name, v, none_ok=True):
    if v is None and none_ok:
        return
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError("%s: %s must be a positive integer, got %r" % (who, name, v))


def _col_list(who, name, v, required=True):
    if v is None:
        if required:
            raise ValueError("%s: %s must be given (a list of the DataFrame's column names)" % (who, name))
        return []
    if isinstance(v, str):
        return [v]
    v = list(v)
    if (required and not v) or not all(isinstance(c, str) and c for c in v):
        raise ValueError("%s: %s must be a list of column names, got %r" % (who, name, v))
    return v


def check_common(est, who):
    """Checks the parameters both estimators share; returns the feature and label columns."""
    g = est.getOrDefault
    if g("store") is None:
        raise ValueError("%s: store must be given, e.g. Store.create('/a/directory/every/executor/shares')" % who)
    if g("model") is None:
        raise ValueError("%s: model must be given" % who)
    feats = _col_list(who, "feature_cols", g("feature_cols"))
    labels = _col_list(who, "label_cols", g("label_cols"))
    _positive_int(who, "num_proc", g("num_proc"))
    _positive_int(who, "batch_size", g("batch_size"), none_ok=False)
    _positive_int(who, "val_batch_size", g("val_batch_size"))
    _positive_int(who, "epochs", g("epochs"), none_ok=False)
    _positive_int(who, "partitions_per_process", g("partitions_per_process"), none_ok=False)
    _positive_int(who, "train_steps_per_epoch", g("train_steps_per_epoch"))
    _positive_int(who, "validation_steps_per_epoch", g("validation_steps_per_epoch"))
    _positive_int(who, "backward_passes_per_step", g("backward_passes_per_step"), none_ok=False)
    v = g("validation")
    if v is not None and not isinstance(v, str) and not (isinstance(v, float) and 0.0 < v < 1.0):
        raise ValueError("%s: validation must be a fraction between 0 and 1 (exclusive) or the name of a column "
                         "true on validation rows, got %r" % (who, v))
    if g("use_gpu"):
        raise ValueError("%s: use_gpu=True: kolo reduces host memory; GPU tensors are not supported yet" % who)
    if g("transformation_fn") is not None:
        raise ValueError("%s: transformation_fn is not supported: kolo's ranks read the Parquet data without "
                         "Petastorm; transform the DataFrame in Spark before fit" % who)
    lw = g("loss_weights")
    if lw is not None and len(lw) != len(labels):
        raise ValueError("%s: loss_weights has %d entries for %d label columns" % (who, len(lw), len(labels)))
    ls = g("label_shapes")
    if ls is not None and len(ls) != len(labels):
        raise ValueError("%s: label_shapes has %d entries for %d label columns" % (who, len(ls), len(labels)))
    return feats, labels


# ---- the data ----

def _column_expr(df, name, who):
    """The expression that stores column `name` of df: as it is when numeric (or boolean, or an
    array of numbers), decimals as doubles, a Spark ML vector as a float32 array."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BooleanType, DecimalType, NumericType
    if name not in df.columns:
        raise ValueError("%s: the DataFrame has no column %r (its columns: %s)" % (who, name, ", ".join(df.columns)))
    t = df.schema[name].dataType
    if isinstance(t, VectorUDT):
        return vector_to_array(F.col(name), "float32").alias(name)
    if isinstance(t, DecimalType):  # a SQL literal's type (0.5); Parquet keeps decimals as such
        return F.col(name).cast("double").alias(name)
    if isinstance(t, ArrayType) and isinstance(t.elementType, DecimalType):
        return F.col(name).cast("array<double>").alias(name)
    if isinstance(t, (NumericType, BooleanType)):
        return F.col(name)
    if isinstance(t, ArrayType) and isinstance(t.elementType, (NumericType, BooleanType)):
        return F.col(name)
    raise ValueError("%s: column %r is %s; a feature, label or weight column must be numeric, boolean, an "
                     "array of numbers or a Spark ML vector" % (who, name, t.simpleString()))


def count_rows(files):
    import pyarrow.parquet as pq
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def prepare_data(who, store, df, columns, validation, num_proc, partitions_per_process, seed, idx):
    """Writes df's `columns` under the store as Parquet, split by `validation` (see the top).
    Returns (train_path, val_path or None, train_rows, val_rows)."""
    from pyspark.sql import functions as F
    cols = list(dict.fromkeys(columns))
    exprs = [_column_expr(df, c, who) for c in cols]
    if isinstance(validation, str):
        if validation not in df.columns:
            raise ValueError("%s: validation column %r is not in the DataFrame (its columns: %s)"
                             % (who, validation, ", ".join(df.columns)))
        if validation in cols:
            raise ValueError("%s: validation column %r is also a feature, label or weight column" % (who, validation))
        marked = df.select(*exprs, F.col(validation).cast("boolean").alias("__kolo_val"))
        train = marked.filter(~F.coalesce(F.col("__kolo_val"), F.lit(False))).drop("__kolo_val")
        val = marked.filter(F.coalesce(F.col("__kolo_val"), F.lit(False))).drop("__kolo_val")
        selected = None
    else:
        selected = df.select(*exprs)
        if validation:
            # cached, so that the two halves come from one evaluation of df and share no row
            selected = selected.cache()
            train, val = selected.randomSplit([1.0 - validation, validation], seed=seed)
        else:
            train, val = selected, None
    parts = num_proc * partitions_per_process
    train_path = store.get_train_data_path(idx)
    val_path = store.get_val_data_path(idx) if val is not None else None
    try:
        train.repartition(parts).write.mode("overwrite").parquet(store.get_full_path(train_path))
        if val is not None:
            val.repartition(parts).write.mode("overwrite").parquet(store.get_full_path(val_path))
    finally:
        if selected is not None and validation and not isinstance(validation, str):
            selected.unpersist()
    train_rows = count_rows(store.get_parquet_files(train_path))
    val_rows = count_rows(store.get_parquet_files(val_path)) if val_path else 0
    return train_path, val_path, train_rows, val_rows


def column_info(files, columns):
    """{column: (kind, shape, numpy dtype)} from the Parquet files' schema and first rows: kind
    "scalar" (shape ()) or "array" (shape (length,)). Raises ValueError for other types."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if not files:
        raise ValueError("no Parquet files")
    schema = pq.ParquetFile(files[0]).schema_arrow
    info = {}
    for c in columns:
        if c not in schema.names:
            raise ValueError("the Parquet data has no column %r (its columns: %s)" % (c, ", ".join(schema.names)))
        t = schema.field(c).type
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            length = None
            for f in files:
                pf = pq.ParquetFile(f)
                if pf.metadata.num_rows:
                    first = pf.read_row_group(0, columns=[c]).column(c)[0].as_py()
                    length = len(first) if first is not None else None
                    break
            info[c] = ("array", (length,) if length is not None else (0,), t.value_type.to_pandas_dtype())
        elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            info[c] = ("scalar", (), t.to_pandas_dtype())
        else:
            raise ValueError("column %r is %s in the Parquet data; it must be numeric or a list of numbers" % (c, t))
    return info


def np_input(a):
    """How a column's values reach a model, in training and in transform alike: floating point and
    booleans as float32, integers as int64."""
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        return a.astype(np.int64, copy=False)
    return a.astype(np.float32, copy=False)


def _to_numpy(chunked, name):
    import pyarrow as pa
    arr = chunked.combine_chunks() if isinstance(chunked, pa.ChunkedArray) else chunked
    if arr.null_count:
        raise ValueError("column %r has %d null values; fill or drop them before fit" % (name, arr.null_count))
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        n = len(arr)
        flat = arr.flatten()
        if flat.null_count:
            raise ValueError("column %r has null elements in its arrays" % name)
        values = np.asarray(flat.to_numpy(zero_copy_only=False))
        if n == 0:
            return values.reshape(0, 0)
        if not pa.types.is_fixed_size_list(t):
            offs = np.asarray(arr.offsets.to_numpy(zero_copy_only=False))
            lengths = np.diff(offs)
            if lengths.min() != lengths.max():
                raise ValueError("column %r has rows of different lengths (%d to %d); every row of an array or "
                                 "vector column must have the same length" % (name, lengths.min(), lengths.max()))
        return values.reshape(n, -1)
    return np.asarray(arr.to_numpy(zero_copy_only=False))


class Shard:
    """This rank's share of the rows of the Parquet files: rows [rank * N / size, (rank + 1) * N /
    size) of the N rows in file and row-group order, as slices of the row groups that hold them,
    read on demand (read(i)) or all at once (read_all())."""

    def __init__(self, files, rank, size, columns):
        import pyarrow.parquet as pq
        self.columns = list(columns)
        groups, total = [], 0
        for f in files:
            if not os.path.exists(f):
                raise FileNotFoundError("%s: no such file on %s: the store's directory must be one that the driver "
                                        "and every executor share (a LocalStore on a cluster needs a shared file "
                                        "system)" % (f, socket.gethostname()))
            md = pq.ParquetFile(f).metadata
            for i in range(md.num_row_groups):
                rg = md.row_group(i)
                groups.append((f, i, total, rg.num_rows, rg.total_byte_size))
                total += rg.num_rows
        lo, hi = rank * total // size, (rank + 1) * total // size
        self.total, self.rows, self.nbytes = total, hi - lo, 0
        self.slices = []  # (file, row group, first row in it, rows)
        for f, i, start, n, nb in groups:
            if start + n <= lo or start >= hi or n == 0:
                continue
            a = max(lo, start)
            self.slices.append((f, i, a - start, min(hi, start + n) - a))
            self.nbytes += nb * (min(hi, start + n) - a) // n

    def read(self, k):
        """Slice k: {column: numpy array, rows first}."""
        import pyarrow.parquet as pq
        f, i, off, n = self.slices[k]
        t = pq.ParquetFile(f).read_row_group(i, columns=self.columns).slice(off, n)
        return {c: _to_numpy(t.column(c), c) for c in self.columns}

    def read_all(self):
        if not self.slices:
            return {c: np.zeros((0,)) for c in self.columns}
        parts = [self.read(k) for k in range(len(self.slices))]
        return {c: np.concatenate([p[c] for p in parts]) if len(parts) > 1 else parts[0][c] for c in self.columns}


def read_shard(files, rank, size, columns):
    """This rank's share of the rows (Shard), read whole: ({column: numpy array}, N)."""
    shard = Shard(files, rank, size, columns)
    return shard.read_all(), shard.total


# A rank keeps its shard in memory when inmemory_cache_all is set or the shard is at most this many
# MiB (Parquet's uncompressed size); above, it streams the shard's row groups every epoch.
MEMORY_MB_DEFAULT = 512


def memory_limit():
    v = os.environ.get("KOLO_ESTIMATOR_MEMORY_MB", "")
    try:
        return int(v) << 20 if v else MEMORY_MB_DEFAULT << 20
    except ValueError:
        raise ValueError("KOLO_ESTIMATOR_MEMORY_MB=%r is not a whole number of MiB" % v) from None


def batch_source(files, rank, size, columns, batch_size, shuffle, seed, in_memory, buffer_rows):
    """Where a rank's batches come from: its shard in memory (in_memory, or small enough), else
    streamed (StreamedBatches). Either way next() gives {column: array of batch_size rows}."""
    shard = Shard(files, rank, size, columns)
    if in_memory or shard.nbytes <= memory_limit():
        return MemoryBatches(shard.read_all(), shard.rows, batch_size, shuffle, seed)
    return StreamedBatches(shard, batch_size, shuffle, seed, buffer_rows or max(4096, 16 * batch_size))


class Batches:
    """Index batches over a shard of `rows` rows: each pass over the shard in a new random order
    (or in order), passes following each other without a gap, so a rank can take any number of
    full batches from a shard of any size."""

    def __init__(self, rows, batch_size, shuffle, seed):
        self.rows, self.batch_size, self.shuffle = rows, batch_size, shuffle
        self.rng = np.random.default_rng(seed)
        self.order, self.pos = self._pass(), 0

    def _pass(self):
        return self.rng.permutation(self.rows) if self.shuffle else np.arange(self.rows)

    def next(self):
        out = []
        need = self.batch_size
        while need:
            if self.pos == self.rows:
                self.order, self.pos = self._pass(), 0
            take = min(need, self.rows - self.pos)
            out.append(self.order[self.pos:self.pos + take])
            self.pos += take
            need -= take
        return np.concatenate(out) if len(out) > 1 else out[0]


class MemoryBatches:
    """Batches from a shard held in memory: {column: array} of batch_size rows each."""

    streamed = False

    def __init__(self, data, rows, batch_size, shuffle, seed):
        self.data, self.rows, self.args = data, rows, (rows, batch_size, shuffle, seed)
        self.reset()

    def reset(self):
        """Back to the first batch (of a pass in order; validation's)."""
        self.idx = Batches(*self.args)

    def next(self):
        i = self.idx.next()
        return {c: a[i] for c, a in self.data.items()}


class StreamedBatches:
    """Batches streamed from a shard too large to hold: each pass reads its row-group slices in a
    new random order (in order without shuffle) into a buffer of at least buffer_rows rows, whose
    rows are drawn in random order; passes follow each other without a gap, as with Batches."""

    streamed = True

    def __init__(self, shard, batch_size, shuffle, seed, buffer_rows):
        self.shard, self.batch_size, self.shuffle = shard, batch_size, shuffle
        self.buffer_rows = max(buffer_rows or 0, batch_size)
        self.seed = seed
        self.reset()

    def describe(self):
        return ("%d rows (%.1f MiB in Parquet) streamed by row groups, shuffled %d rows at a time"
                % (self.shard.rows, self.shard.nbytes / 2.0 ** 20, self.buffer_rows))

    def reset(self):
        """Back to the first batch (of a pass in order; validation's)."""
        self.rng = np.random.default_rng(self.seed)
        self.queue, self.buf = [], None  # slices still to read this pass; rows read, not yet taken

    def _fill(self):
        parts = [self.buf] if self.buf is not None and len(self.buf[self.shard.columns[0]]) else []
        have = len(parts[0][self.shard.columns[0]]) if parts else 0
        while have < self.buffer_rows:
            if not self.queue:
                n = len(self.shard.slices)
                self.queue = list(self.rng.permutation(n)) if self.shuffle else list(range(n))
            part = self.shard.read(int(self.queue.pop(0)))
            parts.append(part)
            have += len(part[self.shard.columns[0]])
        buf = {c: np.concatenate([p[c] for p in parts]) for c in self.shard.columns}
        if self.shuffle:
            order = self.rng.permutation(have)
            buf = {c: a[order] for c, a in buf.items()}
        self.buf = buf

    def next(self):
        if self.buf is None or len(self.buf[self.shard.columns[0]]) < self.batch_size:
            self._fill()
        out = {c: a[:self.batch_size] for c, a in self.buf.items()}
        self.buf = {c: a[self.batch_size:] for c, a in self.buf.items()}
        return out


def steps(rows, batch_size, size, given):
    """Steps per epoch, the same on every rank: given, or every rank's share of rows in full batches
    (at least 1)."""
    if given:
        return given
    return max(1, int(math.floor(rows / float(batch_size) / size)))


def new_run_id():
    return "kolo_%s" % uuid.uuid4().hex[:12]
