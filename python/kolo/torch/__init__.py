"""kolo.torch: Horovod's horovod.torch API on kolo, for PyTorch CPU tensors.

A Horovod PyTorch script runs after changing its import line:

    import kolo.torch as hvd
    hvd.init()
    torch.set_num_threads(max(1, os.cpu_count() // hvd.local_size()))
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

and starts with `kolorun -np N python3 train.py`. libkolo is reached through ctypes: nothing
here is compiled against PyTorch.
"""

from kolo._lib import __version__  # noqa: F401
from kolo.basics import (  # noqa: F401
    init, shutdown, is_initialized, size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built, nccl_built,
    ddl_built, ccl_built, cuda_built, rocm_built, sycl_built, build_info, Average, Sum, Adasum, Min, Max, Product,
    ProcessSet, global_process_set, add_process_set, remove_process_set, start_timeline, stop_timeline,
    engine_stats, engine_params, status, elastic_round)
from kolo.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from kolo.torch.compression import Compression  # noqa: F401
from kolo.torch.mpi_ops import (  # noqa: F401
    allreduce, allreduce_, allreduce_async, allreduce_async_, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, sparse_allreduce_async, allgather, allgather_async,
    grouped_allgather, grouped_allgather_async, broadcast, broadcast_, broadcast_async, broadcast_async_,
    alltoall, alltoall_async, reducescatter, reducescatter_async, grouped_reducescatter,
    grouped_reducescatter_async, join, barrier, poll, synchronize)
from kolo.torch.functions import (  # noqa: F401
    broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object)
from kolo.torch.optimizer import DistributedOptimizer  # noqa: F401
from kolo.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from kolo.torch import elastic  # noqa: F401,E402  (hvd.elastic.run, TorchState, ElasticSampler)
