"""Serve a small MLP on the CPU, batch by batch - an inference loop written the way a user would.

An 8-block MLP (Linear 256->256, LayerNorm, GELU, residual) in eval mode over random inputs
(the same every run), batch 8 by default, a DataLoader without workers, fp32. By default the forward
passes run with grad mode on (autograd records a graph no one uses); `--inference-mode` wraps
the loop in `torch.inference_mode()`. Recorded with

    advisor profile --full --out runs/grad tests/data/cpu_inference_grad/infer.py -- --threads 1
    advisor profile --full --out runs/inference_mode tests/data/cpu_inference_grad/infer.py -- --threads 1 --inference-mode

    advisor profile --full --out runs/batch256 tests/data/cpu_inference_grad/infer.py -- --threads 1 --inference-mode --batch 256
    advisor profile --full --out runs/batch256_bf16 tests/data/cpu_inference_grad/infer.py -- --threads 1 --inference-mode --batch 256 --bf16

    --steps N           batches to run (default 200)
    --batch N           batch size (default 8)
    --threads N         torch.set_num_threads(N) (default: PyTorch's own choice)
    --inference-mode    run the loop under torch.inference_mode()
    --bf16              run the forward under torch.autocast("cpu", dtype=torch.bfloat16)
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

WIDTH, BLOCKS = 256, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + nn.functional.gelu(self.fc(self.norm(x)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--inference-mode", action="store_true")
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    inputs = torch.randn(max(4096, 16 * args.batch), WIDTH)
    loader = DataLoader(TensorDataset(inputs), batch_size=args.batch)
    model = nn.Sequential(*(Block() for _ in range(BLOCKS)), nn.Linear(WIDTH, 10)).eval()
    mode = torch.inference_mode() if args.inference_mode else contextlib.nullcontext()
    precision = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    step = 0
    with mode:
        while step < args.steps:
            for (batch,) in loader:
                with precision:
                    scores = model(batch)
                scores.argmax(dim=1)
                step += 1
                if step >= args.steps:
                    break


if __name__ == "__main__":
    main()
