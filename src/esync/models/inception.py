"""Inception-v3 (Szegedy et al. 2016), one input channel, fed 299x299 as the original."""
from __future__ import annotations

import torch
from torch import nn

from esync.models.base import Classifier, conv_bn


class Concat(nn.Module):
    """Runs branches side by side on one input and joins them along channels."""

    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([branch(x) for branch in self.branches], dim=1)


def _seq(*layers: nn.Module) -> nn.Sequential:
    return nn.Sequential(*layers)


def _avg_pool_proj(cin: int, cout: int) -> nn.Sequential:
    return _seq(nn.AvgPool2d(3, 1, 1), conv_bn(cin, cout, 1))


def block_a(cin: int, pool: int) -> Concat:  # 35x35, out 224 + pool
    return Concat(conv_bn(cin, 64, 1),
                  _seq(conv_bn(cin, 48, 1), conv_bn(48, 64, 5, padding=2)),
                  _seq(conv_bn(cin, 64, 1), conv_bn(64, 96, 3, padding=1),
                       conv_bn(96, 96, 3, padding=1)),
                  _avg_pool_proj(cin, pool))


def block_b(cin: int) -> Concat:  # 35x35 -> 17x17, out 480 + cin
    return Concat(conv_bn(cin, 384, 3, stride=2),
                  _seq(conv_bn(cin, 64, 1), conv_bn(64, 96, 3, padding=1),
                       conv_bn(96, 96, 3, stride=2)),
                  nn.MaxPool2d(3, 2))


def block_c(cin: int, c7: int) -> Concat:  # 17x17, out 768
    def one_by_seven(a, b):
        return conv_bn(a, b, (1, 7), padding=(0, 3))

    def seven_by_one(a, b):
        return conv_bn(a, b, (7, 1), padding=(3, 0))

    return Concat(conv_bn(cin, 192, 1),
                  _seq(conv_bn(cin, c7, 1), one_by_seven(c7, c7), seven_by_one(c7, 192)),
                  _seq(conv_bn(cin, c7, 1), seven_by_one(c7, c7), one_by_seven(c7, c7),
                       seven_by_one(c7, c7), one_by_seven(c7, 192)),
                  _avg_pool_proj(cin, 192))


def block_d(cin: int) -> Concat:  # 17x17 -> 8x8, out 512 + cin
    return Concat(_seq(conv_bn(cin, 192, 1), conv_bn(192, 320, 3, stride=2)),
                  _seq(conv_bn(cin, 192, 1), conv_bn(192, 192, (1, 7), padding=(0, 3)),
                       conv_bn(192, 192, (7, 1), padding=(3, 0)),
                       conv_bn(192, 192, 3, stride=2)),
                  nn.MaxPool2d(3, 2))


def block_e(cin: int) -> Concat:  # 8x8, out 2048
    def split(c):
        return Concat(conv_bn(c, 384, (1, 3), padding=(0, 1)),
                      conv_bn(c, 384, (3, 1), padding=(1, 0)))

    return Concat(conv_bn(cin, 320, 1),
                  _seq(conv_bn(cin, 384, 1), split(384)),
                  _seq(conv_bn(cin, 448, 1), conv_bn(448, 384, 3, padding=1), split(384)),
                  _avg_pool_proj(cin, 192))


def inception_v3(num_classes: int = 10) -> Classifier:
    body = _seq(
        conv_bn(1, 32, 3, stride=2), conv_bn(32, 32, 3), conv_bn(32, 64, 3, padding=1),
        nn.MaxPool2d(3, 2), conv_bn(64, 80, 1), conv_bn(80, 192, 3), nn.MaxPool2d(3, 2),
        block_a(192, 32), block_a(256, 64), block_a(288, 64),
        block_b(288),
        block_c(768, 128), block_c(768, 160), block_c(768, 160), block_c(768, 192),
        block_d(768),
        block_e(1280), block_e(2048),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.5), nn.Linear(2048, num_classes))
    return Classifier(body, input_size=299)
