#!/usr/bin/env python3
"""Trains a small CNN to read digits, on data it generates: a Horovod-style training script.

The data: 28x28 grey images of the ten digits drawn as seven-segment glyphs with random
position, size, slant and stroke width, a stray stroke now and then, and pixel noise: a task a
linear model cannot solve and a CNN learns in a few epochs. Every rank generates the same
data from the seed and trains on its own shard; validation is averaged over the ranks.

What it shows (the five lines Horovod asks for):
  * hvd.init(); torch threads = cores / local workers;
  * the learning rate scaled by the number of workers, reached by a linear warm-up over the
    first epoch (Goyal et al., "Accurate, Large Minibatch SGD", as Horovod's examples do);
  * hvd.DistributedOptimizer with the model's named parameters (--use-adasum: op=hvd.Adasum,
    the workers' updates combined by Adasum, the learning rate left unscaled);
  * hvd.broadcast_parameters / broadcast_optimizer_state from rank 0 (also after a resume);
  * checkpoints written by rank 0 only, and resumption from the latest one.

    kolorun -np 2 python3 examples/pytorch/pytorch_synthetic_digits.py --epochs 4
"""

import argparse
import glob
import os
import re
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kolo.torch as hvd  # noqa: E402  (import horovod.torch as hvd works the same way)

parser = argparse.ArgumentParser(description="kolo: learn generated digits",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--batch-size", type=int, default=64, help="per worker")
parser.add_argument("--base-lr", type=float, default=0.02, help="learning rate of one worker")
parser.add_argument("--warmup-epochs", type=float, default=1.0)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--train-size", type=int, default=12000)
parser.add_argument("--val-size", type=int, default=2000)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: cores / local workers)")
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--use-adasum", action="store_true",
                    help="combine the workers' updates with Adasum instead of averaging the gradients "
                         "(the learning rate is then not scaled by the number of workers)")
parser.add_argument("--checkpoint-dir", default="./checkpoints", help="'' disables checkpoints")
parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
args = parser.parse_args()

hvd.init()
torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when run by runpy (kolo.spark)
from digits import Net, make_digits  # noqa: E402  (this directory's digits.py)


t_data = time.time()
# This rank's shard (every rank gets the same number of samples: the tail is dropped).
per_rank = args.train_size // hvd.size()
train_x, train_y = make_digits(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank, args.seed)
val_per_rank = args.val_size // hvd.size()
val_x, val_y = make_digits(hvd.rank() * val_per_rank, (hvd.rank() + 1) * val_per_rank, args.seed + 1)
t_data = time.time() - t_data

torch.manual_seed(args.seed)
model = Net()
# Average: the effective batch grows with the workers, and so does the rate. Adasum sizes the
# combined step by how much the workers' updates agree, so the single-worker rate stays.
lr_scaler = 1 if args.use_adasum else hvd.size()
optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * lr_scaler, momentum=args.momentum)
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(),
    compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
    op=hvd.Adasum if args.use_adasum else hvd.Average)

# Resume: rank 0 finds the latest checkpoint and tells the others which epoch that is.
start_epoch = 0
if args.resume and args.checkpoint_dir and hvd.rank() == 0:
    found = sorted(glob.glob(os.path.join(args.checkpoint_dir, "checkpoint-*.pt")),
                   key=lambda f: int(re.findall(r"(\d+)\.pt$", f)[0]))
    if found:
        state = torch.load(found[-1])
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"]
start_epoch = hvd.broadcast_object(start_epoch, root_rank=0, name="start_epoch")
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

batches = per_rank // args.batch_size
warmup_steps = int(args.warmup_epochs * batches)


def adjust_lr(epoch, batch):
    """Linear warm-up from the single-worker rate to size x that rate, then constant with
    a x0.1 drop for the last epoch of a long run."""
    step = epoch * batches + batch
    if step < warmup_steps:
        lr = args.base_lr * (1 + (lr_scaler - 1) * step / warmup_steps)
    else:
        lr = args.base_lr * lr_scaler
    if args.epochs >= 6 and epoch == args.epochs - 1:
        lr *= 0.1
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(float(value)), name=name).item()


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


log("kolo %s: %d worker(s), %d torch thread(s) each; %d training images (%d per worker), batch %d per "
    "worker, lr %.3f x %d with %.1f warm-up epoch(s); data generated in %.1f s"
    % (hvd.__version__, hvd.size(), torch.get_num_threads(), args.train_size, per_rank, args.batch_size,
       args.base_lr, lr_scaler, args.warmup_epochs, t_data))

gen = torch.Generator().manual_seed(args.seed + 100 + hvd.rank())
train_time, train_samples = 0.0, 0
for epoch in range(start_epoch, args.epochs):
    model.train()
    perm = torch.randperm(per_rank, generator=gen)
    t0 = time.time()
    tot_loss, correct = 0.0, 0
    for b in range(batches):
        lr = adjust_lr(epoch, b)
        idx = perm[b * args.batch_size:(b + 1) * args.batch_size]
        data, target = train_x[idx], train_y[idx]
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()
        tot_loss += loss.item()
        correct += (output.argmax(1) == target).sum().item()
    dt = time.time() - t0
    if epoch > start_epoch or args.epochs - start_epoch == 1:  # the first epoch warms caches up
        train_time += dt
        train_samples += batches * args.batch_size * hvd.size()
    train_loss = metric_average(tot_loss / batches, "train_loss")
    train_acc = metric_average(correct / (batches * args.batch_size), "train_acc")

    model.eval()
    with torch.no_grad():
        out = model(val_x)
        val_loss = metric_average(F.cross_entropy(out, val_y).item(), "val_loss")
        val_acc = metric_average((out.argmax(1) == val_y).float().mean().item(), "val_acc")
    log("epoch %d/%d  loss %.4f  train-acc %.3f  val-loss %.4f  val-acc %.3f  lr %.4f  %.1f s  %.0f img/s"
        % (epoch + 1, args.epochs, train_loss, train_acc, val_loss, val_acc, lr, dt,
           batches * args.batch_size * hvd.size() / dt))

    if args.checkpoint_dir and hvd.rank() == 0:  # one writer: every rank holds the same model
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        path = os.path.join(args.checkpoint_dir, "checkpoint-%d.pt" % (epoch + 1))
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1}, path)

if train_time > 0:
    log("RESULT workers=%d img_per_sec=%.2f val_acc=%.4f" % (hvd.size(), train_samples / train_time, val_acc))
hvd.shutdown()
