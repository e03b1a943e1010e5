"""Inference loop that makes each input directly on the device."""

import torch
from torch import nn

from _bench import StepTimer, parse_args


def main() -> None:
    args = parse_args(steps=40)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 16)).to(args.device).eval()
    timer = StepTimer(args)
    with torch.inference_mode():
        while True:
            batch = torch.randn(256, 1024, device=args.device)
            model(batch).argmax(1)
            if timer.tick():
                return timer.done()


if __name__ == "__main__":
    main()
