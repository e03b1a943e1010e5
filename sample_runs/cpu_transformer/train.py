"""Train a small transformer language model on the CPU - the CPU scenario, written the way a user would.

Random token sequences (the same every run) of length 64 from a vocabulary of 1,000, a
2-layer `nn.TransformerEncoder` (d_model 128, 4 heads) with a causal mask and a linear head,
AdamW, batch 16, a DataLoader without workers, fp32 eager. Cheap enough to profile in
seconds on a laptop:

    advisor profile sample_runs/cpu_transformer/train.py

    --steps N        steps to run (default 40)
    --threads N      torch.set_num_threads(N) before training (default: PyTorch's own choice)
    --inference      run the model forward only, under torch.inference_mode()
    --bf16           run the forward pass and the loss under torch.autocast("cpu", dtype=torch.bfloat16)
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, SEQ, D_MODEL = 1000, 64, 128


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, nhead=4, dim_feedforward=4 * D_MODEL, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens), mask=self.mask, is_causal=True))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--inference", action="store_true")
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    precision = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.bf16 else contextlib.nullcontext
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (2048, SEQ + 1))
    loader = DataLoader(TensorDataset(tokens), batch_size=16, shuffle=True)
    model = TinyLM()
    if args.inference:
        model.eval()
        step = 0
        with torch.inference_mode():
            while step < args.steps:
                for (batch,) in loader:
                    with precision():
                        model(batch[:, :-1])
                    step += 1
                    if step >= args.steps:
                        break
        return
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    criterion = nn.CrossEntropyLoss()
    model.train()
    step = 0
    while step < args.steps:
        for (batch,) in loader:
            with precision():
                logits = model(batch[:, :-1])
                loss = criterion(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 10 == 0:
                print(f"step {step}: loss {loss.item():.3f}")
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
