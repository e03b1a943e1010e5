"""Control: transformer serving loop under inference_mode, default threads: nothing seeded."""

import torch
from torch import nn

from _bench import StepTimer, parse_args


def main() -> None:
    args = parse_args(steps=40)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(128, nhead=4, dim_feedforward=256, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    model = nn.Sequential(nn.Embedding(2000, 128), encoder, nn.Linear(128, 2)).to(args.device).eval()
    tokens = torch.randint(0, 2000, (4, 32), device=args.device)
    timer = StepTimer(args)
    scores = []
    with torch.inference_mode():
        while True:
            scores.append(model(tokens)[:, 0].softmax(-1))
            if timer.tick():
                return timer.done()


if __name__ == "__main__":
    main()
