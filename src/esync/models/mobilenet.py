"""MobileNet v1 and v2 (width multiplier 1.0), one input channel, fed 28x28 unresized."""
from __future__ import annotations

from torch import nn

from esync.models.base import Classifier, conv_bn


def _head(cin: int, num_classes: int) -> list[nn.Module]:
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]


def mobilenet_v1(num_classes: int = 10) -> Classifier:
    # (output channels, stride) of each depthwise-separable block
    plan = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 \
        + [(1024, 2), (1024, 1)]
    layers, cin = [conv_bn(1, 32, 3, 2, 1)], 32
    for cout, stride in plan:
        layers += [conv_bn(cin, cin, 3, stride, 1, groups=cin), conv_bn(cin, cout, 1)]
        cin = cout
    return Classifier(nn.Sequential(*layers, *_head(cin, num_classes)), input_size=28)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn(cin, hidden, 1, act=nn.ReLU6)] if expand != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, 1, groups=hidden, act=nn.ReLU6),
                   conv_bn(hidden, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        out = self.block(x)
        return x + out if self.residual else out


def mobilenet_v2(num_classes: int = 10) -> Classifier:
    # (expansion t, output channels c, repeats n, first stride s), as in the paper
    plan = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1)]
    layers, cin = [conv_bn(1, 32, 3, 2, 1, act=nn.ReLU6)], 32
    for t, c, n, s in plan:
        for i in range(n):
            layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
            cin = c
    layers.append(conv_bn(cin, 1280, 1, act=nn.ReLU6))
    return Classifier(nn.Sequential(*layers, *_head(1280, num_classes)), input_size=28)
