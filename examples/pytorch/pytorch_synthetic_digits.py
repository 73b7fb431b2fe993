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
import math
import os
import re
import sys
import time

import torch
import torch.nn as nn
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

# ---- the data ----
# Segments a..g of a seven-segment digit, as line segments in a unit box (x right, y down).
SEG = {"a": ((0, 0), (1, 0)), "b": ((1, 0), (1, 1)), "c": ((1, 1), (1, 2)), "d": ((0, 2), (1, 2)),
       "e": ((0, 1), (0, 2)), "f": ((0, 0), (0, 1)), "g": ((0, 1), (1, 1))}
DIGITS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


CHUNK = 500


def make_digits(lo, hi, seed):
    """Samples lo..hi-1 of the data set named by seed. Each chunk of CHUNK samples has its own
    random stream, so a rank generates only its shard and still gets the same images."""
    first = lo // CHUNK
    parts = [_make_chunk(c, seed) for c in range(first, (hi + CHUNK - 1) // CHUNK)]
    x = torch.cat([p[0] for p in parts])
    y = torch.cat([p[1] for p in parts])
    off = lo - first * CHUNK
    return x[off:off + hi - lo], y[off:off + hi - lo]


def _make_chunk(chunk, seed):
    g = torch.Generator().manual_seed(seed * 1000003 + chunk)
    n = CHUNK
    labels = torch.randint(0, 10, (n,), generator=g)
    # 7 segments + 1 stray stroke; each sample turns a subset on
    segs = torch.tensor([[SEG[s][0][0], SEG[s][0][1], SEG[s][1][0], SEG[s][1][1]] for s in "abcdefg"],
                        dtype=torch.float32)
    on = torch.zeros(10, 7)
    for d, s in enumerate(DIGITS):
        for ch in s:
            on[d, "abcdefg".index(ch)] = 1
    yy, xx = torch.meshgrid(torch.arange(28, dtype=torch.float32), torch.arange(28, dtype=torch.float32),
                            indexing="ij")
    out = torch.empty(n, 1, 28, 28)
    for lo in range(0, n, 500):
        hi = min(n, lo + 500)
        m = hi - lo
        scale = 5.0 + 3.0 * torch.rand(m, 1, generator=g)           # glyph width in pixels
        x0 = 4 + (24 - 2 * scale - 4) * torch.rand(m, 1, generator=g) + 0 * scale
        y0 = 2 + (24 - 2 * scale) * torch.rand(m, 1, generator=g)
        slant = 0.35 * (torch.rand(m, 1, generator=g) - 0.5)
        width = 0.9 + 1.1 * torch.rand(m, 1, generator=g)
        # the 7 segments' end points in pixels, per sample: (m, 7)
        ax = x0 + scale * (segs[:, 0] - slant * segs[:, 1])
        ay = y0 + scale * segs[:, 1]
        bx = x0 + scale * (segs[:, 2] - slant * segs[:, 3])
        by = y0 + scale * segs[:, 3]
        mask = on[labels[lo:hi]]
        # a stray stroke anywhere in 30% of the images
        sx, sy = 28 * torch.rand(m, 1, generator=g), 28 * torch.rand(m, 1, generator=g)
        ang = math.pi * torch.rand(m, 1, generator=g)
        ln = 3 + 5 * torch.rand(m, 1, generator=g)
        ax = torch.cat([ax, sx], 1)
        ay = torch.cat([ay, sy], 1)
        bx = torch.cat([bx, sx + ln * torch.cos(ang)], 1)
        by = torch.cat([by, sy + ln * torch.sin(ang)], 1)
        mask = torch.cat([mask, (torch.rand(m, 1, generator=g) < 0.3).float()], 1)
        # distance of every pixel to every segment: (m, 8, 28, 28)
        px, py = xx.view(1, 1, 28, 28), yy.view(1, 1, 28, 28)
        ax_, ay_, bx_, by_ = (t.view(m, 8, 1, 1) for t in (ax, ay, bx, by))
        dx, dy = bx_ - ax_, by_ - ay_
        t = ((px - ax_) * dx + (py - ay_) * dy) / (dx * dx + dy * dy + 1e-6)
        t = t.clamp(0, 1)
        dist = torch.sqrt((ax_ + t * dx - px) ** 2 + (ay_ + t * dy - py) ** 2)
        ink = (1.0 - (dist / width.view(m, 1, 1, 1)).clamp(0, 1) ** 2) * mask.view(m, 8, 1, 1)
        img = ink.amax(1, keepdim=True)
        img = img * (0.6 + 0.4 * torch.rand(m, 1, 1, 1, generator=g))
        img = img + 0.2 * torch.randn(m, 1, 28, 28, generator=g)
        out[lo:hi] = img
    return (out - 0.15) / 0.35, labels


class Net(nn.Module):
    """A LeNet-style CNN (two convolutions, two fully connected layers)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(F.dropout(x, 0.2, self.training))


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
