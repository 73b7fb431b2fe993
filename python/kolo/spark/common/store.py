"""Where the Spark estimators keep their data and runs: Horovod's horovod.spark.common.store.

    from kolo.spark.common.store import Store, LocalStore
    store = Store.create("/shared/kolo")          # a LocalStore: a directory every executor sees

An estimator's fit() writes the DataFrame it trains on as Parquet under the store
(`intermediate_train_data.<idx>`, `intermediate_val_data.<idx>`), the ranks read their shards from
there, and rank 0 writes each epoch's checkpoint under `runs/<run_id>/`. A LocalStore's directory
must be the same directory on the driver and on every executor: any directory on local Spark, a
shared file system (NFS) on a cluster.
"""

import os
import shutil

__all__ = ["Store", "LocalStore", "FilesystemStore"]


class Store:
    """The paths an estimator uses (Horovod's Store interface). Store.create(prefix_path) makes the
    store for a path; kolo has LocalStore (local paths and file:// URLs)."""

    def __init__(self):
        pass

    @staticmethod
    def create(prefix_path, *args, **kwargs):
        if not isinstance(prefix_path, str) or not prefix_path:
            raise ValueError("Store.create: prefix_path must be a non-empty path, got %r" % (prefix_path,))
        scheme = prefix_path.split("://", 1)[0] if "://" in prefix_path else ""
        if scheme in ("", "file"):
            return LocalStore(prefix_path, *args, **kwargs)
        raise ValueError("Store.create(%r): kolo's estimators have a LocalStore only (a local path or file:// "
                         "URL that the driver and every executor share, e.g. on NFS); %s:// stores (Horovod's "
                         "HDFSStore, DBFSLocalStore) are not there yet" % (prefix_path, scheme))

    # what every store answers
    def is_parquet_dataset(self, path):
        raise NotImplementedError()

    def get_train_data_path(self, idx=None):
        raise NotImplementedError()

    def get_val_data_path(self, idx=None):
        raise NotImplementedError()

    def get_test_data_path(self, idx=None):
        raise NotImplementedError()

    def saving_runs(self):
        raise NotImplementedError()

    def get_runs_path(self):
        raise NotImplementedError()

    def get_run_path(self, run_id):
        raise NotImplementedError()

    def get_checkpoint_path(self, run_id):
        raise NotImplementedError()

    def get_logs_path(self, run_id):
        raise NotImplementedError()

    def get_checkpoint_filename(self):
        raise NotImplementedError()

    def get_logs_subdir(self):
        raise NotImplementedError()

    def exists(self, path):
        raise NotImplementedError()

    def read(self, path):
        raise NotImplementedError()


class FilesystemStore(Store):
    """A store under one directory prefix; paths are local file system paths."""

    def __init__(self, prefix_path, train_path=None, val_path=None, test_path=None, runs_path=None,
                 save_runs=True):
        super().__init__()
        self.prefix_path = self._local(prefix_path)
        self._train_path = self._local(train_path) if train_path else os.path.join(
            self.prefix_path, "intermediate_train_data")
        self._val_path = self._local(val_path) if val_path else os.path.join(self.prefix_path, "intermediate_val_data")
        self._test_path = self._local(test_path) if test_path else os.path.join(
            self.prefix_path, "intermediate_test_data")
        self._runs_path = self._local(runs_path) if runs_path else os.path.join(self.prefix_path, "runs")
        self._save_runs = save_runs

    @staticmethod
    def _local(path):
        if path.startswith("file://"):
            path = path[len("file://"):]
        return os.path.abspath(os.path.expanduser(path))

    @staticmethod
    def _indexed(path, idx):
        return path if idx is None else "%s.%s" % (path, idx)

    def get_full_path(self, path):
        """The URL Spark reads and writes this path by."""
        return "file://" + self._local(path)

    def is_parquet_dataset(self, path):
        path = self._local(path)
        if os.path.isfile(path):
            return path.endswith(".parquet")
        return os.path.isdir(path) and any(f.endswith(".parquet") for f in os.listdir(path))

    def get_parquet_files(self, path):
        """The dataset's Parquet files, in name order (Spark's part-00000-... order)."""
        path = self._local(path)
        if os.path.isfile(path):
            return [path]
        if not os.path.isdir(path):
            raise FileNotFoundError("no Parquet dataset at %s" % path)
        return sorted(os.path.join(path, f) for f in os.listdir(path)
                      if f.endswith(".parquet") and not f.startswith((".", "_")))

    def get_train_data_path(self, idx=None):
        return self._indexed(self._train_path, idx)

    def get_val_data_path(self, idx=None):
        return self._indexed(self._val_path, idx)

    def get_test_data_path(self, idx=None):
        return self._indexed(self._test_path, idx)

    def saving_runs(self):
        return self._save_runs

    def get_runs_path(self):
        return self._runs_path

    def get_run_path(self, run_id):
        return os.path.join(self._runs_path, run_id)

    def get_checkpoint_path(self, run_id):
        return os.path.join(self.get_run_path(run_id), self.get_checkpoint_filename())

    def get_logs_path(self, run_id):
        return os.path.join(self.get_run_path(run_id), self.get_logs_subdir())

    def get_checkpoint_filename(self):
        return "checkpoint"

    def get_logs_subdir(self):
        return "logs"

    def exists(self, path):
        return os.path.exists(self._local(path))

    def read(self, path):
        with open(self._local(path), "rb") as f:
            return f.read()

    def write(self, path, data):
        """Writes bytes to path whole or not at all (a reader never sees half a checkpoint)."""
        path = self._local(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = "%s.tmp.%d" % (path, os.getpid())
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def remove(self, path):
        path = self._local(path)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)

    def __repr__(self):
        return "%s(%r)" % (type(self).__name__, self.prefix_path)


class LocalStore(FilesystemStore):
    """A store in a directory of the local file system that the driver and every executor share
    (any directory on local Spark; NFS or the like on a cluster). Horovod's LocalStore."""
