"""CNN training on short epochs with one DataLoader whose worker persists across epochs."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _bench import StepTimer, parse_args


def main() -> None:
    args = parse_args(steps=36)
    torch.manual_seed(0)
    images = torch.rand(96, 3, 32, 32)
    labels = torch.randint(0, 10, (96,))
    dataset = TensorDataset(images, labels)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, 10),
    ).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    timer = StepTimer(args)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=1, persistent_workers=True)
    while True:
        for batch, target in loader:
            batch, target = batch.to(args.device), target.to(args.device)
            loss = F.cross_entropy(model(batch), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if timer.tick():
                return timer.done()


if __name__ == "__main__":
    main()
