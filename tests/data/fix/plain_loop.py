"""A plain PyTorch training loop, written the way many are: every setting the advisor's safe
fixes change is at its slow value (no workers, pageable copies, per-tensor optimizer, zeroed
gradients, the cache emptied every step)."""

import argparse

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    """Random images with some per-sample work, so that loading is a real part of the step."""

    def __init__(self, size=2048):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        rng = np.random.default_rng(index)
        image = rng.standard_normal((3, 64, 64)).astype(np.float32)
        for _ in range(4):  # a hand-made blur
            image = (image + np.roll(image, 1, axis=1) + np.roll(image, 1, axis=2)) / 3
        return torch.from_numpy(image[:, ::2, ::2].copy()), index % 10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),  # conv layers: cudnn picks their algorithms
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
    criterion = nn.CrossEntropyLoss()
    loader = DataLoader(Noisy(), batch_size=32, shuffle=True)  # the input pipeline

    step = 0
    while step < args.steps:
        for x, y in loader:
            x = x.to(device)
            y = y.to(device)
            out = model(x)
            loss = criterion(out, y)
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            optimizer.step()
            torch.cuda.empty_cache()  # "to keep memory low"
            step += 1
            if step >= args.steps:
                break
    print(f"done: {step} steps, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
