"""Train a small self-attention model on the CPU, its attention written out by hand or through SDPA.

Two blocks of single-layer multi-head self-attention (width 128, 4 heads, sequence 256,
batch 4) and a linear head, fp32, AdamW, random inputs (the same every run). By default the
attention is the eager `softmax(q @ k.transpose(-2, -1) / sqrt(d)) @ v`; `--sdpa` calls
`torch.nn.functional.scaled_dot_product_attention` instead (its fused CPU kernel). Recorded
from this folder with

    advisor profile --full --out runs/eager attend.py -- --threads 1
    advisor profile --full --out runs/sdpa attend.py -- --threads 1 --sdpa

    --steps N     training steps (default 40)
    --threads N   torch.set_num_threads(N) (default: PyTorch's own choice)
    --sdpa        use F.scaled_dot_product_attention
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, HEADS, SEQ, BATCH, BLOCKS = 128, 4, 256, 4, 2


class Attention(nn.Module):
    def __init__(self, sdpa: bool):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)
        self.sdpa = sdpa

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            y = torch.softmax(scores, dim=-1) @ v
        return x + self.out(y.transpose(1, 2).reshape(b, s, WIDTH))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--sdpa", action="store_true")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = nn.Sequential(*(Attention(args.sdpa) for _ in range(BLOCKS)), nn.Linear(WIDTH, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, SEQ, WIDTH)
    y = torch.randint(0, 10, (BATCH, SEQ))
    for _ in range(args.steps):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
