"""MLP training with its elementwise chains fused by torch.compile (the C++ backend on a CPU)."""

import torch
import torch.nn.functional as F
from torch import nn

from _bench import StepTimer, parse_args


class GatedBlock(nn.Module):
    """Linear, then an RMS norm and a gated tanh-GELU written out op by op, then a residual."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 2 * width)
        self.scale = nn.Parameter(torch.ones(2 * width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale
        gate, value = h.chunk(2, dim=-1)
        gelu = 0.5 * gate * (1 + torch.tanh(0.7978845608 * (gate + 0.044715 * gate.pow(3))))
        return x + gelu * value


def build(device: str) -> nn.Module:
    return nn.Sequential(*(GatedBlock(256) for _ in range(4)), nn.Linear(256, 10)).to(device)


def main() -> None:
    args = parse_args(warmup=4)
    torch.manual_seed(0)
    model = torch.compile(build(args.device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    inputs = torch.randn(1024, 256, device=args.device)
    labels = torch.randint(0, 10, (1024,), device=args.device)
    timer = StepTimer(args)
    while True:
        loss = F.cross_entropy(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if timer.tick():
            return timer.done()


if __name__ == "__main__":
    main()
