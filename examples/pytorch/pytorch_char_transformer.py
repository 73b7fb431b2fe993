#!/usr/bin/env python3
"""Trains a small GPT-style transformer to write Python, on real text every Debian machine has:
the Python standard library's own sources, read byte by byte. A Horovod-style training script.

The data: the standard library's top-level *.py files (sorted, so every rank reads the same
text), the last 5 % held out for validation. Each rank samples its own windows of the training
text (data parallelism: same model, different batches); validation loss is averaged over ranks.

What it shows, beyond the digits example:
  * a model with many parameter tensors of different shapes (embeddings, attention, layer norms,
    MLPs) and one tensor used twice (the output layer shares the embedding's weight): its
    gradient is averaged once;
  * AdamW with a warm-up and cosine decay, the rate scaled by the number of workers;
  * gradient clipping on the averaged gradients, Horovod's way: optimizer.synchronize(), clip,
    then step() inside optimizer.skip_synchronize();
  * --accumulate N: backward_passes_per_step, N micro-batches per exchange;
  * at the end, a check that every worker holds the same model, and a sample of generated text;
  * --framework horovod runs it under Horovod, the import the only change.

    kolorun -np 2 python3 examples/pytorch/pytorch_char_transformer.py --steps 200
    horovodrun -np 2 -H localhost:2 --gloo python3 examples/pytorch/pytorch_char_transformer.py --framework horovod
"""

import argparse
import glob
import math
import os
import sys
import sysconfig
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="kolo: a byte-level transformer learns to write Python",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
parser.add_argument("--batch-size", type=int, default=32, help="windows per worker and micro-batch")
parser.add_argument("--context", type=int, default=64, help="bytes a window holds")
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--dim", type=int, default=64)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--base-lr", type=float, default=2e-3, help="learning rate of one worker")
parser.add_argument("--warmup-steps", type=int, default=20)
parser.add_argument("--clip", type=float, default=1.0, help="gradient norm clip (0: none)")
parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per gradient exchange")
parser.add_argument("--eval-every", type=int, default=40)
parser.add_argument("--corpus-mb", type=float, default=4.0, help="megabytes of the standard library read")
parser.add_argument("--corpus-dir", default=sysconfig.get_paths()["stdlib"], help="where the *.py files are")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: cores / local workers)")
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--sample", type=int, default=300, help="bytes of text rank 0 writes at the end")
parser.add_argument("--framework", choices=["kolo", "horovod"], default="kolo",
                    help="horovod: the same script under Horovod (horovodrun), its import the only change")
args = parser.parse_args()
for name in ("steps", "batch_size", "context", "layers", "dim", "heads", "accumulate", "eval_every"):
    if getattr(args, name) < 1:
        parser.error("--%s must be at least 1" % name.replace("_", "-"))
if args.dim % args.heads:
    parser.error("--dim (%d) must be a multiple of --heads (%d)" % (args.dim, args.heads))

if args.framework == "horovod":
    import horovod.torch as hvd
else:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import kolo.torch as hvd
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this directory's bytegpt.py
from bytegpt import ByteGPT  # noqa: E402

hvd.init()
torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))


def read_corpus(directory, limit):
    """The top-level *.py files of directory, sorted by name, up to limit bytes."""
    out, size = [], 0
    for path in sorted(glob.glob(os.path.join(directory, "*.py"))):
        with open(path, "rb") as f:
            data = f.read()
        out.append(data)
        size += len(data)
        if size >= limit:
            break
    size = min(size, limit)
    if size * 0.05 < 2 * (args.context + 1):  # the held-out 5 % must hold a window or two
        sys.exit("%s: %d bytes of *.py files taken, too few to learn from with windows of %d bytes (--corpus-dir, "
                 "--corpus-mb)" % (directory, size, args.context))
    return b"".join(out)[:limit]


text = torch.frombuffer(bytearray(read_corpus(args.corpus_dir, int(args.corpus_mb * 2**20))), dtype=torch.uint8)
split = int(len(text) * 0.95)
train_text, val_text = text[:split].long(), text[split:].long()


def windows(source, n, gen):
    start = torch.randint(0, len(source) - args.context - 1, (n,), generator=gen)
    rows = torch.stack([source[s:s + args.context + 1] for s in start.tolist()])
    return rows[:, :-1], rows[:, 1:]


torch.manual_seed(args.seed)
model = ByteGPT(args.context, args.dim, args.heads, args.layers)
# weight decay on matrices only, as GPT-2's recipe
decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n != "pos"]
rest = [p for n, p in model.named_parameters() if p.dim() < 2 or n == "pos"]
lr = args.base_lr * hvd.size()  # the effective batch grows with the workers (warm-up below)
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                              lr=lr, betas=(0.9, 0.95))
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=args.accumulate,
    compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def rate(step):
    """Linear warm-up from the single-worker rate, then a cosine decay to a tenth."""
    if step < args.warmup_steps:
        return args.base_lr + (lr - args.base_lr) * step / args.warmup_steps
    done = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def average(value, name):
    return hvd.allreduce(torch.tensor(float(value)), name=name).item()


def evaluate():
    model.eval()
    gen = torch.Generator().manual_seed(args.seed + 7 + hvd.rank())  # the same windows at every evaluation
    with torch.no_grad():
        x, y = windows(val_text, 32, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    model.train()
    return average(loss, "val_loss")


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


n_params = sum(p.numel() for p in model.parameters())
log("%s %s: %d worker(s), %d torch thread(s) each; %s: %.1f MB of Python (%.2f MB held out); %d parameters "
    "in %d tensors; %d x %d bytes per worker and micro-batch, %d micro-batch(es) per step; lr %.4f x %d"
    % (args.framework, __import__(args.framework).__version__, hvd.size(), torch.get_num_threads(), args.corpus_dir, len(text) / 2**20,
       len(val_text) / 2**20, n_params, len(list(model.parameters())), args.batch_size, args.context,
       args.accumulate, args.base_lr, hvd.size()))
val_loss = evaluate()
log("step 0  val-loss %.3f (%.2f bits per byte)" % (val_loss, val_loss / math.log(2)))

gen = torch.Generator().manual_seed(args.seed + 100 + hvd.rank())
t0, tokens, run_loss, run_steps = time.time(), 0, 0.0, 0
for step in range(args.steps):
    for group in optimizer.param_groups:
        group["lr"] = rate(step)
    optimizer.zero_grad()
    for _ in range(args.accumulate):
        x, y = windows(train_text, args.batch_size, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / args.accumulate
        loss.backward()
        run_loss += loss.item()
    run_steps += 1
    if args.clip > 0:
        optimizer.synchronize()  # the gradients are averaged now: clip what every worker applies
        nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        with optimizer.skip_synchronize():
            optimizer.step()
    else:
        optimizer.step()
    tokens += args.accumulate * args.batch_size * args.context * hvd.size()
    if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
        dt = time.time() - t0
        val_loss = evaluate()
        log("step %d/%d  loss %.3f  val-loss %.3f (%.2f bits per byte)  lr %.5f  %.0f tokens/s"
            % (step + 1, args.steps, average(run_loss / run_steps, "train_loss"), val_loss,
               val_loss / math.log(2), rate(step), tokens / dt))
        run_loss, run_steps = 0.0, 0
train_time = time.time() - t0

# Data parallelism keeps every worker's model the same: compare them, bit for bit.
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
everyone = hvd.allgather(flat.unsqueeze(0), name="models")
same = all(torch.equal(everyone[0], everyone[r]) for r in range(hvd.size()))
log("models identical on all %d workers: %s" % (hvd.size(), "yes" if same else "NO"))

if hvd.rank() == 0 and args.sample > 0:
    model.eval()
    out = torch.tensor([list(b"def ")])
    g = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for _ in range(args.sample):
            logits = model(out[:, -args.context:])[0, -1] / 0.8
            out = torch.cat([out, torch.multinomial(logits.softmax(-1), 1, generator=g).view(1, 1)], dim=1)
    print("sample (temperature 0.8):\n" + bytes(out[0].tolist()).decode("utf-8", "replace"), flush=True)

log("RESULT workers=%d tokens_per_sec=%.0f val_loss=%.4f" % (hvd.size(), tokens / train_time, val_loss))
hvd.shutdown()
if not same:
    sys.exit(1)
