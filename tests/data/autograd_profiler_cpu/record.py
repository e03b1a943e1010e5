"""Record the quick start's CPU loop with the autograd profiler's API (no ProfilerStep markers).

    .venv/bin/python tests/data/autograd_profiler_cpu/record.py

Six steps of sample_runs/resnet18_cifar's CPU variant (SmallResNet, HandAugment, batch 16, one intra-op
thread, DataLoader without workers, SGD with momentum) under `torch.autograd.profiler.profile`, written
with `export_chrome_trace` and gzipped to `resnet18_cpu_autograd.json.gz` beside this script.
The old API writes no `ProfilerStep#N` ranges: the steps must be found from what repeats (the
DataLoader's `__next__`, `Optimizer.zero_grad`, `Optimizer.step`).
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

HERE = Path(__file__).resolve().parent
TRAIN = HERE.parents[2] / "sample_runs" / "resnet18_cifar" / "train.py"
STEPS = 6


def main() -> None:
    spec = importlib.util.spec_from_file_location("train", TRAIN)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one intra-op thread: steady steps on a shared two-core machine
    loader = DataLoader(train.FakeCIFAR10(size=512, transform=train.HandAugment()), batch_size=16, shuffle=True, num_workers=0)
    model = train.SmallResNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    with torch.autograd.profiler.profile() as prof:
        for step, (images, labels) in enumerate(loader):
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step + 1 >= STEPS:
                break
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        data = Path(raw).read_bytes()
    out = HERE / "resnet18_cpu_autograd.json.gz"
    out.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
