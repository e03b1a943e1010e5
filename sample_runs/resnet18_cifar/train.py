"""Train ResNet-18 on a fake CIFAR-10 - the reference scenario, written the way a user would.

Baseline (what the published walk-through starts from): 10,000 random 32x32x3 uint8 images,
each made a PIL image and transformed in the DataLoader (batch 32, shuffled, no workers),
fp32 eager ResNet-18, SGD with momentum, the batch moved to the device inside the step.

Each published change has a switch, so the same file shows every step of the sequence:

    --workers 8            DataLoader worker processes
    --pin-memory           pinned host memory and non-blocking copies
    --batch-size 512       a bigger batch
    --uint8-to-device      ship uint8 images, convert and normalise on the device
    --set-to-none          optimizer.zero_grad(set_to_none=True)
    --amp                  autocast: bfloat16 where the device has it (Ampere and newer, CPU),
                           else float16 with a GradScaler
    --compile [MODE]       torch.compile(model), mode "default" or e.g. "reduce-overhead" (CUDA graphs)

With torchvision installed it uses T.Resize(224)/ToTensor/Normalize and torchvision's
resnet18. Without it, or with --cpu-variant, it uses a small ResNet defined below on 32x32
inputs and does the augmentation by hand with PIL and numpy - cheap enough to run on a laptop
CPU in seconds, and just as starved by its input pipeline when --workers is 0.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image, ImageFilter
from torch.utils.data import DataLoader, Dataset

try:
    import torchvision
    import torchvision.transforms as T
except ImportError:
    torchvision = None

MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)


class FakeCIFAR10(Dataset):
    """10,000 random uint8 images of 32x32x3 with labels 0-9, the same every run."""

    def __init__(self, size=10_000, transform=None, seed=0):
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, size=(size, 32, 32, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 10, size=size).astype(np.int64)
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        image = Image.fromarray(self.images[index])
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])


class HandAugment:
    """The CPU variant's transform: up to 224 like T.Resize(224), blur, back to 32, flip, normalise.

    Written per image with PIL and numpy like many hand-made pipelines. The round trip through
    224x224 costs about 1.5 ms per image on one core, which is what makes the input pipeline
    the bottleneck when the DataLoader has no workers.
    """

    def __init__(self, size=32, work_size=224, to_float=True, seed=0):
        self.size = size
        self.work_size = work_size
        self.to_float = to_float
        self.rng = np.random.default_rng(seed)

    def __call__(self, image):
        big = image.resize((self.work_size, self.work_size), Image.BICUBIC)
        big = big.filter(ImageFilter.GaussianBlur(radius=2))
        array = np.asarray(big.resize((self.size, self.size), Image.LANCZOS))
        if self.rng.random() < 0.5:
            array = array[:, ::-1]  # horizontal flip
        if not self.to_float:
            return torch.from_numpy(array.transpose(2, 0, 1).copy())  # uint8, CHW
        array = array.astype(np.float32) * self.rng.uniform(0.9, 1.1)  # brightness jitter
        array = (np.clip(array, 0, 255) / 255.0 - 0.5) / 0.5
        return torch.from_numpy(array.transpose(2, 0, 1).astype(np.float32))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """ResNet-18's layout (2-2-2-2 basic blocks) at a quarter of the width, for 32x32 inputs."""

    def __init__(self, num_classes=10, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, cin = [], width
        for i, cout in enumerate((width, width * 2, width * 4, width * 8)):
            for j in range(2):
                layers.append(BasicBlock(cin, cout, stride=2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--pin-memory", action="store_true", help="pin_memory=True and non_blocking copies")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--uint8-to-device", action="store_true", help="convert and normalise on the device")
    p.add_argument("--set-to-none", action="store_true", help="zero_grad(set_to_none=True)")
    p.add_argument("--amp", action="store_true", help="autocast (bfloat16 where supported, else float16 with a GradScaler)")
    p.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODE",
                   help="torch.compile(model); MODE e.g. reduce-overhead for CUDA graphs (default: default)")
    p.add_argument("--steps", type=int, default=100, help="stop after this many steps")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--cpu-variant", action="store_true", help="small ResNet, 32x32, hand-made transforms")
    p.add_argument("--lr", type=float, default=0.1)
    return p.parse_args()


def main():
    args = parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    cpu_variant = args.cpu_variant or torchvision is None
    torch.manual_seed(0)

    if cpu_variant:
        transform = HandAugment(to_float=not args.uint8_to_device)
        model = SmallResNet()
    elif args.uint8_to_device:
        transform = T.Compose([T.Resize(224), T.PILToTensor()])
        model = torchvision.models.resnet18(num_classes=10)
    else:
        transform = T.Compose([T.Resize(224), T.ToTensor(), T.Normalize(MEAN, STD)])
        model = torchvision.models.resnet18(num_classes=10)

    train_set = FakeCIFAR10(transform=transform)
    loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=args.pin_memory,
    )

    model = model.to(device)
    if args.compile:
        model = torch.compile(model, mode=None if args.compile == "default" else args.compile)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # bf16 has fp32's range: no loss scaling, so no per-step inf check that waits for the GPU.
    bf16 = device.type == "cpu" or torch.cuda.is_bf16_supported()
    amp_dtype = torch.bfloat16 if bf16 else torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and amp_dtype == torch.float16)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    model.train()
    step, seen, start = 0, 0, time.perf_counter()
    while step < args.steps:
        for images, labels in loader:
            images = images.to(device, non_blocking=args.pin_memory)
            labels = labels.to(device, non_blocking=args.pin_memory)
            if args.uint8_to_device:
                images = (images.float() / 255.0 - mean) / std

            if args.compile == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()  # a new iteration: the last one's graph outputs may be reused
            with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
                outputs = model(images)
                loss = criterion(outputs, labels)

            optimizer.zero_grad(set_to_none=args.set_to_none)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

            step += 1
            seen += images.shape[0]
            if step % 20 == 0:
                print(f"step {step}: loss {loss.item():.3f}")
            if step >= args.steps:
                break

    elapsed = time.perf_counter() - start
    print(f"{step} steps in {elapsed:.1f} s, {seen / elapsed:.0f} samples/s")


if __name__ == "__main__":
    main()
