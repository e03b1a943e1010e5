"""Tabular MLP with its fetches and feature engineering in one persistent worker, beside the model's threads."""

import math
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from _bench import StepTimer, parse_args

FETCH_S = 0.002  # latency of one batch's request to the feature store


class EngineeredRows(Dataset):
    """Raw rows turned into 64 features one row at a time: logs, ratios, bucketed values."""

    def __init__(self, count: int = 8192) -> None:
        generator = torch.Generator().manual_seed(0)
        self.raw = torch.rand(count, 16, generator=generator).tolist()

    def __len__(self) -> int:
        return len(self.raw)

    def __getitems__(self, indices: list[int]):
        """A batch's rows are fetched in one request (2 ms) from the feature store, then engineered."""
        time.sleep(FETCH_S)
        return [self[index] for index in indices]

    def __getitem__(self, index: int):
        row = self.raw[index]
        features = []
        for value in row:
            features += [math.log1p(value), value * value, math.sqrt(value), float(int(value * 10))]
        label = int(sum(row) > 8)
        return torch.tensor(features), label


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)
    ).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    loader = DataLoader(EngineeredRows(), batch_size=512, shuffle=True, num_workers=1, persistent_workers=True)
    timer = StepTimer(args)
    while True:
        for rows, labels in loader:
            rows, labels = rows.to(args.device), labels.to(args.device)
            loss = F.cross_entropy(model(rows), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if timer.tick():
                return timer.done()


if __name__ == "__main__":
    main()
