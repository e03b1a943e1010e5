"""CNN training with its reads and augmentation in one persistent worker, beside the model's threads."""

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from _bench import StepTimer, parse_args

READ_S = 0.0002  # latency of one sample's read from storage


class AugmentedImages(Dataset):
    """Synthetic 3x32x32 images, each read from storage (0.2 ms a file), with a random crop, flip,
    blur and normalisation per sample."""

    def __init__(self, count: int = 2048) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.rand(count, 3, 36, 36, generator=generator)
        self.labels = torch.randint(0, 10, (count,), generator=generator)
        self.blur = torch.full((3, 1, 3, 3), 1 / 9)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        time.sleep(READ_S)  # the image file's read: a small file on a network filesystem
        image = self.images[index]
        top, left = torch.randint(0, 4, (2,)).tolist()
        image = image[:, top : top + 32, left : left + 32]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        for _ in range(3):
            image = F.conv2d(image[None], self.blur, padding=1, groups=3)[0]
        image = (image - image.mean()) / (image.std() + 1e-6)
        return image, self.labels[index]


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    ).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(AugmentedImages(), batch_size=16, shuffle=True, num_workers=1, persistent_workers=True)
    timer = StepTimer(args)
    while True:
        for images, labels in loader:
            images, labels = images.to(args.device), labels.to(args.device)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if timer.tick():
                return timer.done()


if __name__ == "__main__":
    main()
