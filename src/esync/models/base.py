"""What every network shares: 1-channel input, 10 classes, the input resize it needs."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Classifier(nn.Module):
    """Wraps a feature extractor and a head; resizes inputs to `input_size` first.

    The original ESync resized Fashion-MNIST to 224x224 for AlexNet and 299x299 for
    Inception-v3 in its data pipeline; here the network does it, so every data set
    feeds every network 28x28 images and the resize runs on the training device.
    """

    def __init__(self, body: nn.Module, input_size: int):
        super().__init__()
        self.body = body
        self.input_size = input_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.input_size or x.shape[-2] != self.input_size:
            x = F.interpolate(x, size=(self.input_size, self.input_size), mode="bilinear",
                              align_corners=False)
        return self.body(x)


def conv_bn(cin: int, cout: int, kernel, stride=1, padding=0, groups: int = 1,
            act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    """Convolution, BatchNorm and (optionally) an activation: the unit most nets repeat."""
    layers = [nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)
