#!/usr/bin/env python3
"""Elastic training of the digits CNN with Horovod's elastic API: the job goes on when workers
fail and takes in workers that come (kolorun's elastic mode, docs/kolorun.md).

    kolorun -np 3 --min-np 2 python3 examples/pytorch/pytorch_elastic_digits.py
    kolorun -np 2 --max-np 4 --host-discovery-script ./hosts.sh python3 examples/pytorch/pytorch_elastic_digits.py

What it shows:
  * hvd.elastic.TorchState holding the model, the optimizer, the sampler and the position
    (epoch, batch): committed every --commit-every batches and at the end of each epoch;
  * hvd.elastic.run: a failed collective (a worker died) rolls every worker back to the last
    commit, the job is re-formed without the dead worker, and rank 0's state is broadcast to all;
    at a commit, workers that kolorun added join and get that state;
  * hvd.elastic.ElasticSampler: the samples of an epoch not processed yet are shared out among
    the workers of the current round, so a re-formed job finishes the epoch with none lost or
    repeated;
  * the learning rate follows the number of workers (a reset callback).

--simulate-failure ID:EPOCH:BATCH kills worker ID (KOLO_ELASTIC_ID) on reaching that batch, to
watch the job go on without it.
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kolo.torch as hvd  # noqa: E402  (import horovod.torch as hvd works the same way)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when run by runpy (kolo.spark)
from digits import Net, make_digits  # noqa: E402  (this directory's digits.py)

parser = argparse.ArgumentParser(description="kolo: learn generated digits, elastically",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=64, help="per worker")
parser.add_argument("--base-lr", type=float, default=0.02, help="learning rate of one worker")
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--train-size", type=int, default=6000)
parser.add_argument("--val-size", type=int, default=1000)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--commit-every", type=int, default=10, help="batches between commits")
parser.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: cores / local workers)")
parser.add_argument("--simulate-failure", default="", metavar="ID:EPOCH:BATCH",
                    help="worker ID kills itself on reaching that batch of that epoch")
args = parser.parse_args()

hvd.init()
torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))
fail_at = tuple(int(v) for v in args.simulate_failure.split(":")) if args.simulate_failure else None
worker_id = int(os.environ.get("KOLO_ELASTIC_ID", "-1"))


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


# Every worker holds the whole data set: which samples a worker trains on changes with the job.
train_x, train_y = make_digits(0, args.train_size, args.seed)
val_x, val_y = make_digits(0, args.val_size, args.seed + 1)
dataset = torch.utils.data.TensorDataset(train_x, train_y)
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=args.seed)

torch.manual_seed(args.seed)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * hvd.size(), momentum=args.momentum)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, batch=0,
                               samples=0)


def on_reset():
    """After the job was re-formed: the rate follows the number of workers."""
    for group in optimizer.param_groups:
        group["lr"] = args.base_lr * hvd.size()
    log("round %d: %d workers, from epoch %d batch %d" % (hvd.elastic_round(), hvd.size(), state.epoch + 1,
                                                          state.batch))


state.register_reset_callbacks([on_reset])


def validate():
    """Accuracy on the validation set, each worker scoring every size()-th image."""
    model.eval()
    with torch.no_grad():
        x, y = val_x[hvd.rank()::hvd.size()], val_y[hvd.rank()::hvd.size()]
        out = model(x)
        t = torch.tensor([(out.argmax(1) == y).sum().item(), len(y),
                          F.cross_entropy(out, y, reduction="sum").item()], dtype=torch.float64)
    t = hvd.allreduce(t, op=hvd.Sum, name="val")
    return t[0].item() / t[1].item(), t[2].item() / t[1].item()


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        model.train()
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
        t0 = time.time()
        for b, (data, target) in enumerate(loader):
            if fail_at == (worker_id, state.epoch, state.batch):
                print("worker %d: simulated failure at epoch %d batch %d" % (worker_id, state.epoch + 1, state.batch),
                      file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            sampler.record_batch(b, args.batch_size)
            state.batch += 1
            state.samples += len(data) * hvd.size()
            if state.batch % args.commit_every == 0:
                state.commit()
        val_acc, val_loss = validate()
        log("epoch %d/%d  val-loss %.4f  val-acc %.3f  %d workers  %.1f s" % (state.epoch + 1, args.epochs, val_loss,
                                                                              val_acc, hvd.size(), time.time() - t0))
        state.epoch += 1
        state.batch = 0
        sampler.set_epoch(state.epoch)
        state.commit()
    return val_acc


t_start = time.time()
acc = train(state)
log("RESULT workers=%d val_acc=%.4f samples=%d img_per_sec=%.1f" % (hvd.size(), acc, state.samples,
                                                                    state.samples / (time.time() - t_start)))
hvd.shutdown()
