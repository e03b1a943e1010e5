"""CNN training pinned to one intra-op thread (a launcher's OMP_NUM_THREADS=1, set in code)."""

import torch
import torch.nn.functional as F
from torch import nn

from _bench import StepTimer, parse_args

torch.set_num_threads(1)


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    images = torch.rand(32, 3, 32, 32, device=args.device)
    labels = torch.randint(0, 10, (32,), device=args.device)
    timer = StepTimer(args)
    while True:
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if timer.tick():
            return timer.done()


if __name__ == "__main__":
    main()
