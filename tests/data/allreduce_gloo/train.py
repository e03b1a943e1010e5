"""Data-parallel training on two CPU ranks (gloo), the recording behind the allreduce tests.

`--manual` averages gradients with one all_reduce per parameter after backward (the
hand-written loop the unbucketed-allreduce rule detects); without it the model is wrapped in
DistributedDataParallel, which all-reduces buckets of gradients during backward.

    advisor profile --nproc-per-node 2 --wait 1 --warmup 1 --active 3 --no-stack \
        --out runs/manual train.py -- --manual
    advisor profile --nproc-per-node 2 --wait 1 --warmup 1 --active 3 --no-stack \
        --out runs/ddp train.py
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--manual", action="store_true", help="one all_reduce per gradient after backward")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers = []
    for _ in range(24):
        layers += [torch.nn.Linear(128, 128), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(128, 10))
    if not args.manual:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    world = dist.get_world_size()
    for _ in range(args.steps):
        x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.manual:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
