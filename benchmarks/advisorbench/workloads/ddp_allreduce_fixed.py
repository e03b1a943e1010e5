"""Two-process data-parallel MLP training over gloo under DistributedDataParallel (bucketed all-reduce).

Run plainly, the script spawns its two ranks itself (127.0.0.1, world size 2); under
torchrun (RANK set) it is one rank. Rank 0 prints the step times.
"""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from _bench import StepTimer, parse_args


def build() -> nn.Module:
    layers = []
    for _ in range(16):
        layers += [nn.Linear(128, 128), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(128, 10))


def train(rank: int, world_size: int, args) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(build())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    torch.manual_seed(rank)
    inputs, labels = torch.randn(128, 128), torch.randint(0, 10, (128,))
    timer = StepTimer(args)
    while True:
        loss = F.cross_entropy(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if timer.tick():
            break
    if rank == 0:
        timer.done()
    dist.destroy_process_group()


def main() -> None:
    args = parse_args()
    if "RANK" in os.environ:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    else:
        with socket.socket() as probe:  # a free port for the ranks' rendezvous
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        mp.spawn(train, args=(2, args), nprocs=2)


if __name__ == "__main__":
    main()
