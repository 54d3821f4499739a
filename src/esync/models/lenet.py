"""LeNet-5 for 28x28 images, with BatchNorm: the small, fast network of CI and quick runs.

BatchNorm makes it converge in a few dozen SGD steps on `digits`, and gives the CI
model running statistics (buffers), which the distributed modes must average too.
"""
from torch import nn

from esync.models.base import Classifier


def lenet(num_classes: int = 10) -> Classifier:
    body = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.BatchNorm1d(120), nn.ReLU(inplace=True),
        nn.Linear(120, 84), nn.BatchNorm1d(84), nn.ReLU(inplace=True),
        nn.Linear(84, num_classes),
    )
    return Classifier(body, input_size=28)
