"""The digits the examples learn, generated: 28x28 grey images of the ten digits drawn as
seven-segment glyphs with random position, size, slant and stroke width, a stray stroke now and
then, and pixel noise (a task a linear model cannot solve and a CNN learns in a few epochs), and
the CNN that learns them. Shared by pytorch_synthetic_digits.py and pytorch_elastic_digits.py."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

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
