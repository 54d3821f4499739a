"""An algorithm as the user builds it (`esync.ESync(max_local_steps=64)`): its *policy*,
a small typed, picklable value of its settings, apart from the runtime hooks that run it
in a joined job (esync.algorithms.base.Algorithm), as PyTorch's
`PeriodicModelAverager(period, warmup_steps)` is apart from the optimizer it drives.

Each algorithm's unit declares its policy: its fields, which of main.py's flags each
one is (`FLAGS`, policy field -> esync.options.Options field), the flags of its own
that other modes refuse, and its checks. Defaults are the flags' own (the esync.config
constants esync.options reads), so that the flags and a policy built in code with no
arguments are one algorithm. Torch-free: the launchers check flags with these before
anything starts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional

from esync import registry


@dataclass(frozen=True)
class Policy:
    """Base of the algorithm objects; one without settings is its algorithm as it is."""

    #: the registry key of the algorithm (esync.registry.ALGORITHMS)
    key: ClassVar[str] = ""
    #: policy field -> the esync.options.Options field of its flag
    FLAGS: ClassVar[Dict[str, str]] = {}

    @classmethod
    def from_options(cls, opts: Any) -> "Policy":
        """The policy the flags give."""
        return cls(**{name: getattr(opts, flag) for name, flag in cls.FLAGS.items()})

    @classmethod
    def flags_given(cls, opts: Any) -> List[str]:
        """This algorithm's own flags that `opts` sets away from their defaults, as the
        user spelt them: another mode refuses them (esync.registry.check_aggregation).
        By default the flags its fields declare (esync.flagtypes.flag)."""
        return [f.metadata["args"][0] for f in dataclasses.fields(cls) if "args" in f.metadata
                and getattr(opts, cls.FLAGS.get(f.name, f.name)) != f.default]

    def check(self, opts: Any) -> None:
        """What cannot work with this policy in a job run with `opts`: UserError, one
        line naming the flag."""

    def applied(self, opts: Any) -> Any:
        """`opts` with this policy's settings in place of its flags' values."""
        return dataclasses.replace(opts, **{flag: getattr(self, name)
                                            for name, flag in self.FLAGS.items()})

    @property
    def algorithm(self) -> registry.Algorithm:
        """The registry's row of this algorithm."""
        return registry.ALGORITHMS[self.key]


def policy_of(opts: Any) -> Policy:
    """The policy the flags select and configure."""
    return opts.algorithm.policy_class().from_options(opts)


def number_in(policy: Policy, name: str, low: float, high: Optional[float] = None,
              low_open: bool = False, high_open: bool = False) -> None:
    """A policy's field `name` is a number in its range, else a one-line ValueError
    naming the policy and the field (the flags' parser checks the same ranges)."""
    value = getattr(policy, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
        (value > low if low_open else value >= low) and \
        (high is None or (value < high if high_open else value <= high))
    if not ok:
        span = f"{'(' if low_open else '['}{low:g}, {'inf' if high is None else f'{high:g}'}" \
               f"{')' if high_open or high is None else ']'}"
        raise ValueError(f"{type(policy).__name__}({name}={value!r}): expected a number "
                         f"in {span}")
