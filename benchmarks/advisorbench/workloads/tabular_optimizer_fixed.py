"""Tabular residual MLP trained with the fused SGD update."""

import torch
import torch.nn.functional as F
from torch import nn

from _bench import StepTimer, parse_args


class ResidualMLP(nn.Module):
    def __init__(self, features: int = 64, width: int = 128, blocks: int = 12) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)
        )
        self.out = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.out(x)


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = ResidualMLP().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4, fused=True)
    rows = torch.randn(256, 64, device=args.device)
    target = (rows[:, 0] > 0).long()
    timer = StepTimer(args)
    while True:
        loss = F.cross_entropy(model(rows), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if timer.tick():
            return timer.done()


if __name__ == "__main__":
    main()
