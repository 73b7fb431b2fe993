#!/usr/bin/env python3
"""Synthetic-data training benchmark with a real CNN, as Horovod's pytorch_synthetic_benchmark.py:
images/sec per worker and in total.

    kolorun -np 2 python3 examples/pytorch/pytorch_synthetic_benchmark.py            # kolo
    horovodrun -np 2 -H localhost:2 --gloo \\
        python3 examples/pytorch/pytorch_synthetic_benchmark.py --framework horovod   # Horovod, gloo
    kolorun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29511 \\
        python3 examples/pytorch/pytorch_synthetic_benchmark.py --framework ddp       # PyTorch DDP, gloo
    kolorun -np 2 python3 examples/pytorch/pytorch_synthetic_benchmark.py --framework alone

kolo and Horovod run the very same code: only the import differs (`import kolo.torch as hvd` or
`import horovod.torch as hvd`). DDP wraps the model instead of the optimizer. `alone` is the
ceiling the others are measured against: every worker trains a model of its own and exchanges
nothing, so the images/sec of N workers alone are what the machine gives N copies of this compute
without any communication (every worker prints its own RESULT line; bench/train_compare.py adds
them up).

The model is defined here (no torchvision needed): a ResNet for small images, resnet18
(11 M parameters, 45 MB of gradients per step) or resnet20 (0.27 M); or bytegpt, the byte-level
transformer of pytorch_char_transformer.py (bytegpt.py: 0.12 M parameters in 28 tensors, many of
them small, one used twice), where a sample ("img") is a window of --context random bytes. Each worker uses
cpu_count / local_size threads unless --threads says otherwise. bench/train_compare.py runs all three
side by side.
"""

import argparse
import os
import sys
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--model", default="resnet18", choices=["resnet18", "resnet20", "bytegpt"],
                    help="bytegpt: bytegpt.py's transformer (0.12 M parameters in 28 tensors, one tied) on "
                         "random bytes; a sample is a window of --context bytes")
parser.add_argument("--context", type=int, default=64, help="bytegpt: bytes a sample holds")
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--batch-size", type=int, default=32, help="input batch size per worker")
parser.add_argument("--num-warmup-batches", type=int, default=3, help="batches before timing")
parser.add_argument("--num-batches-per-iter", type=int, default=5, help="batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=5, help="benchmark iterations")
parser.add_argument("--fp16-allreduce", action="store_true",
                    help="kolo and Horovod: send gradients as float16")
parser.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: cpus / local size)")
parser.add_argument("--framework", choices=["kolo", "horovod", "ddp", "alone"], default="kolo",
                    help="kolo.torch, horovod.torch (same code, other import), torch DistributedDataParallel "
                         "(gloo), or alone: no communication, each worker on its own (the ceiling)")
parser.add_argument("--ddp", action="store_true", help="the same as --framework ddp")
args = parser.parse_args()
if args.ddp:
    if args.framework not in ("kolo", "ddp"):  # kolo is the default, so it may not have been given
        parser.error("--ddp contradicts --framework %s" % args.framework)
    args.framework = "ddp"


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, widths, blocks, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        layers, cin = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                layers.append(BasicBlock(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def make_model(name):
    if name == "bytegpt":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this directory's bytegpt.py
        from bytegpt import ByteGPT
        return ByteGPT(context=args.context)
    if name == "resnet18":
        return ResNet([64, 128, 256, 512], [2, 2, 2, 2])
    return ResNet([16, 32, 64], [3, 3, 3])


if args.framework == "ddp":
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    framework = "PyTorch DDP (gloo)"
elif args.framework == "alone":
    # Started by kolorun (or torchrun) for its placement and output only: nothing is exchanged.
    rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    framework = "alone (no communication)"
else:
    # The one line that differs between kolo and Horovod; everything below uses hvd alike.
    if args.framework == "horovod":
        import horovod.torch as hvd
    else:
        import kolo.torch as hvd
    hvd.init()
    rank, size, local_size = hvd.rank(), hvd.size(), hvd.local_size()
    if args.framework == "horovod":
        import horovod
        framework = "Horovod %s (%s)" % (horovod.__version__, "gloo" if hvd.gloo_enabled() else "mpi")
    else:
        framework = "kolo"

torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local_size))
torch.manual_seed(1234)

model = make_model(args.model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size, momentum=0.9)
if args.framework == "ddp":
    model = nn.parallel.DistributedDataParallel(model)
elif args.framework == "alone":
    pass
else:
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

if args.model == "bytegpt":
    data = torch.randint(0, 256, (args.batch_size, args.context))
    target = torch.randint(0, 256, (args.batch_size * args.context,))
else:
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 10, (args.batch_size,))


def benchmark_step():
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data).flatten(0, -2), target)
    loss.backward()
    optimizer.step()


def log(s):
    if rank == 0:
        print(s, flush=True)


nparams = sum(p.numel() for p in model.parameters())
log("Framework: %s" % framework)
log("Model: %s (%.2f M parameters)" % (args.model, nparams / 1e6))
log("Batch size: %d, %s" % (args.batch_size, "windows of %d bytes" % args.context if args.model == "bytegpt"
                                       else "image size %d" % args.image_size))
log("Number of CPU workers: %d, torch threads each: %d" % (size, torch.get_num_threads()))

log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)

log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / t
    log("Iter #%d: %.1f img/sec per worker" % (x, img_sec))
    img_secs.append(img_sec)

img_sec_mean = float(np.mean(img_secs))
img_sec_conf = float(1.96 * np.std(img_secs))
log("Img/sec per worker: %.1f +-%.1f" % (img_sec_mean, img_sec_conf))
if args.framework != "alone":
    log("Total img/sec on %d worker(s): %.1f +-%.1f" % (size, size * img_sec_mean, size * img_sec_conf))
if args.framework == "alone":
    # Each worker's own figure: the workers do not talk, so none can add the others' up.
    print("RESULT framework=alone workers=%d rank=%d img_per_sec=%.2f" % (size, rank, img_sec_mean), flush=True)
else:
    log("RESULT framework=%s workers=%d img_per_sec=%.2f" % (args.framework, size, size * img_sec_mean))

if args.framework == "ddp":
    dist.destroy_process_group()
elif args.framework != "alone":
    hvd.shutdown()
