"""Elastic training with PyTorch (Horovod's horovod.torch.elastic): run, TorchState for a model, an
optimizer and any picklable attributes, and ElasticSampler, which shares out the samples of an
epoch that no worker has processed yet among the workers of the current round.

    import kolo.torch as hvd
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for i, (x, y) in enumerate(loader):
                ...  # forward, backward, optimizer.step()
                sampler.record_batch(i, 32)
                state.commit()
            sampler.set_epoch(state.epoch + 1)
    train(state)

kolo.elastic has the loop's steps and the generic states.
"""

import copy
import math

import torch

from kolo.basics import is_initialized, rank, size
from kolo.elastic import ObjectState, run  # noqa: F401  (run: the generic loop serves PyTorch as it is)
from kolo.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                  broadcast_parameters)


class ElasticSampler(torch.utils.data.Sampler):
    """Shares out the samples of an epoch among the current round's workers, leaving out those
    already processed this epoch, so that a job re-formed in the middle of an epoch finishes it
    without losing or repeating samples (Horovod's ElasticSampler).

    The epoch's order is a permutation of the dataset's indices (seeded by seed + epoch when
    shuffle, else 0, 1, ...); the indices not yet processed are padded (by repeating from their
    start) to a multiple of size(), and rank r takes every size()-th from the r-th. set_epoch(e)
    starts epoch e with nothing processed. record_batch(i, batch_size) records batch i as
    processed on every rank (every rank's batch i, so the record is the same everywhere);
    record_indices(indices) records indices of this rank only. reset() shares out again with the
    current size() and rank(): TorchState calls it after every reset of the job."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def reset(self):
        self.num_replicas = size()
        self.rank = rank()
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = range(n)
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:
            padded += padded[:self.total_size - len(padded)]
        self._padded = padded
        self.indices = padded[self.rank::self.num_replicas]

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of batch batch_idx."""
        return self.indices[batch_idx * batch_size:(batch_idx + 1) * batch_size]

    def record_batch(self, batch_idx, batch_size):
        """Records batch batch_idx of every rank as processed: rank r's j-th index is the
        (r + j * size())-th of the padded order, so batch i of all ranks is one slice of it."""
        n = self.num_replicas
        end = min((batch_idx + 1) * batch_size, self.num_samples)
        self.record_indices(self._padded[batch_idx * batch_size * n:end * n])

    def record_indices(self, indices):
        self.processed_indices.update(int(i) for i in indices)

    def state_dict(self):
        return dict(epoch=self.epoch, processed_indices=set(self.processed_indices))

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples


# ---- what TorchState does with each kind of value ----

class _ModelHandler:
    def __init__(self, value):
        self.value = value
        self.save()

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)

    def reset(self):
        pass


class _OptimizerHandler(_ModelHandler):
    def restore(self):
        # PyTorch 2's load_state_dict may keep the given tensors as the state (no copy): the next
        # step would change the saved copy too
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_ModelHandler):
    def restore(self):
        # run() restores between shutdown() and init(): the sampler shares out again at reset()
        self.value.epoch = self.saved["epoch"]
        self.value.processed_indices = set(self.saved["processed_indices"])
        if is_initialized():
            self.value.reset()

    def sync(self):
        # Each rank may have recorded indices of its own (record_indices): take them all, and the
        # epoch of rank 0.
        processed = set().union(*allgather_object(self.value.processed_indices, name="elastic.sampler"))
        sd = self.value.state_dict()
        sd["processed_indices"] = processed
        self.value.load_state_dict(broadcast_object(sd, root_rank=0, name="elastic.sampler"))

    def reset(self):
        self.value.reset()


# Optimizers first: a fresh optimizer's state is made by a step on zero gradients, which may move
# the parameters (weight decay) before the model's broadcast puts rank 0's in place.
_HANDLERS = [(torch.optim.Optimizer, _OptimizerHandler), (torch.nn.Module, _ModelHandler),
             (ElasticSampler, _SamplerHandler)]


def _handler_for(value):
    for i, (cls, handler) in enumerate(_HANDLERS):
        if isinstance(value, cls):
            return i, handler(value)
    return None, None


class TorchState(ObjectState):
    """A model's and an optimizer's state, any ElasticSampler given as a keyword argument, and any
    other picklable keyword attributes (Horovod's TorchState). save() keeps deep copies of the
    model's and optimizer's state_dict() and of the samplers' and attributes' states; restore()
    loads them back; sync() broadcasts rank 0's parameters, optimizer state, sampler positions
    and attributes; reset() shares out the samplers' remaining samples anew. Models, optimizers
    and samplers can be replaced by assignment (state.model = other)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, rest = [], {}
        for name, value in kwargs.items():
            order, handler = _handler_for(value)
            if handler is None:
                rest[name] = value
            else:
                handlers.append((order, name, handler))
        self._handlers = {name: h for _, name, h in sorted(handlers, key=lambda t: t[:2])}
        for name, h in self._handlers.items():
            setattr(self, name, h.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **rest)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers and name in handlers:
            handlers[name].value = value
        super().__setattr__(name, value)

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self):
        for h in self._handlers.values():
            h.sync()
        super().sync()
        for h in self._handlers.values():
            h.save()

    def reset(self):
        for h in self._handlers.values():
            h.reset()


__all__ = ["run", "TorchState", "ElasticSampler", "ObjectState"]
