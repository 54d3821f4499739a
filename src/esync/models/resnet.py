"""ResNet-18 v1, ResNet-50 v1 (post-activation) and ResNet-50 v2 (pre-activation).

As MXNet Gluon's model zoo builds them (the original's networks), with one input
channel; fed 28x28 images unresized, as the original did.
"""
from __future__ import annotations

from torch import nn

from esync.models.base import Classifier, conv_bn


class BasicBlockV1(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.residual = nn.Sequential(conv_bn(cin, width, 3, stride, 1),
                                      conv_bn(width, cout, 3, 1, 1, act=None))
        self.shortcut = (conv_bn(cin, cout, 1, stride, act=None)
                         if stride != 1 or cin != cout else nn.Identity())
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.residual(x) + self.shortcut(x))


class BottleneckV1(BasicBlockV1):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__(cin, width, stride)
        cout = width * self.expansion
        self.residual = nn.Sequential(conv_bn(cin, width, 1, stride),
                                      conv_bn(width, width, 3, 1, 1),
                                      conv_bn(width, cout, 1, act=None))


class BottleneckV2(nn.Module):
    """Pre-activation bottleneck: BN-ReLU before every convolution."""
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.preact = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(inplace=True))
        self.residual = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False),
            nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False))
        self.shortcut = (nn.Conv2d(cin, cout, 1, stride, bias=False)
                         if stride != 1 or cin != cout else None)

    def forward(self, x):
        act = self.preact(x)
        shortcut = x if self.shortcut is None else self.shortcut(act)
        return self.residual(act) + shortcut


def _resnet(block, layers: list[int], num_classes: int, preact: bool) -> Classifier:
    stem = [nn.Conv2d(1, 64, 7, 2, 3, bias=False)]
    if preact:  # v2 normalises the raw input and leaves BN-ReLU to the blocks
        stem = [nn.BatchNorm2d(1, affine=False)] + stem
    stem += [nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    stages, cin = [], 64
    for i, count in enumerate(layers):
        width = 64 * 2 ** i
        for j in range(count):
            stages.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
            cin = width * block.expansion
    tail = [nn.BatchNorm2d(cin), nn.ReLU(inplace=True)] if preact else []
    body = nn.Sequential(*stem, *stages, *tail, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(cin, num_classes))
    return Classifier(body, input_size=28)


def resnet18_v1(num_classes: int = 10) -> Classifier:
    return _resnet(BasicBlockV1, [2, 2, 2, 2], num_classes, preact=False)


def resnet50_v1(num_classes: int = 10) -> Classifier:
    return _resnet(BottleneckV1, [3, 4, 6, 3], num_classes, preact=False)


def resnet50_v2(num_classes: int = 10) -> Classifier:
    return _resnet(BottleneckV2, [3, 4, 6, 3], num_classes, preact=True)
