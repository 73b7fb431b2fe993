"""A small GPT-style transformer over bytes (a vocabulary of 256): causal self-attention blocks
with pre-layer-norm, learned positions, and an output layer that shares the embedding's weight.
Shared by pytorch_char_transformer.py (trained on real text) and pytorch_synthetic_benchmark.py
(--model bytegpt, on random bytes)."""

import math

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = (att + mask[:t, :t]).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ByteGPT(nn.Module):
    def __init__(self, context=64, dim=64, heads=4, layers=2):
        super().__init__()
        self.tok = nn.Embedding(256, dim)
        self.pos = nn.Parameter(torch.zeros(context, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 256, bias=False)
        self.head.weight = self.tok.weight  # one tensor, two uses
        # -inf above the diagonal, added to the attention scores: no position sees a later one (a
        # float, not a bool mask: DDP broadcasts buffers, and gloo has no bool)
        self.register_buffer("mask", torch.full((context, context), float("-inf")).triu(1), persistent=False)
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, idx):
        """Logits of the next byte at every position of idx (batch, time)."""
        x = self.tok(idx) + self.pos[:idx.shape[1]]
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.head(self.ln(x))
