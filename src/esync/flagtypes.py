"""How a setting is a command-line flag: the field that declares one (`flag`) and the
value types its parser checks, with a message naming what was expected.

A leaf (standard library only): main.py's parser (esync.options) and the algorithms'
policies (esync.algorithms), which declare their own flags, both build on it.
"""
import argparse
import math
from dataclasses import field
from typing import Sequence


def switch(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected 1/0, true/false or yes/no, got {text!r}")


def number(kind, name: str, low=None, high=None, low_open=False):
    """An argparse type converting to `kind` and checking low <= value <= high."""

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}") from None
        if not math.isfinite(value) or (low is not None and (value < low or (low_open and value == low))) \
                or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}")
        return value

    convert.__name__ = name
    return convert


positive_int = number(int, "a positive integer", low=1)
non_negative_int = number(int, "an integer >= 0", low=0)
positive_float = number(float, "a positive number", low=0.0, low_open=True)
non_negative_float = number(float, "a number >= 0", low=0.0)
fraction = number(float, "a number in (0, 1]", low=0.0, high=1.0, low_open=True)
momentum = share = number(float, "a number in [0, 1)", low=0.0, high=0.999999)
slowdown = number(float, "a number >= 1", low=1.0)
cache_fraction = speed_share = number(float, "a number in [0, 1]", low=0.0, high=1.0)
port = number(int, "a port number in 1..65535", low=1, high=65535)


def flag(flags: Sequence[str], default, help: str, **metadata):
    """A dataclass field that is a command-line flag, as argparse-dataclass reads it:
    its spellings, default and help (the default shown), and `type=` its converter."""
    shown = {None: "none", "": "empty"}.get(default, default)
    metadata.update(args=list(flags), help=f"{help} (default: {shown})")
    return field(default=default, metadata=metadata)
