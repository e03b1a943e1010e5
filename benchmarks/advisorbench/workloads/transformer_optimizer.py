"""Transformer encoder training whose AdamW updates one parameter tensor at a time."""

import torch
import torch.nn.functional as F
from torch import nn

from _bench import StepTimer, parse_args


class TinyLM(nn.Module):
    """A 4-layer encoder over 64 tokens with a language-model head."""

    def __init__(self, vocab: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=128, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = TinyLM().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    tokens = torch.randint(0, 1000, (8, 65), device=args.device)
    timer = StepTimer(args)
    while True:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if timer.tick():
            return timer.done()


if __name__ == "__main__":
    main()
