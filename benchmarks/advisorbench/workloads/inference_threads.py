"""CNN inference loop on one thread that also leaves autograd on (two defects)."""

import torch
from torch import nn

from _bench import StepTimer, parse_args

torch.set_num_threads(1)


def main() -> None:
    args = parse_args(steps=40)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ).to(args.device).eval()
    images = torch.rand(8, 3, 32, 32, device=args.device)
    timer = StepTimer(args)
    predictions = []
    while True:
        logits = model(images)
        predictions.append(logits.argmax(1))
        if timer.tick():
            return timer.done()


if __name__ == "__main__":
    main()
