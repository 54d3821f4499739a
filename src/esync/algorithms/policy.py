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
from esync.errors import UserError


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
        user spelt them: another mode refuses them (check_aggregation).
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


def check_aggregation(opts: Any, num_servers: Optional[int] = None) -> None:
    """The flags against the algorithm they select, before anything starts: its own
    policy's checks (esync.algorithms: each algorithm's `check`), the flags of other
    algorithms refused, --backend and --compress against what it runs on and (if known)
    the job's DMLC_NUM_SERVER; UserError names the flag. Torch-free: the launchers call
    it on the flags they pass."""
    algorithm = opts.algorithm
    own = flag_spellings(opts, algorithm)  # flags several algorithms share (-gl) pass
    for other in registry.ALGORITHMS.values():
        given = [] if other is algorithm else [
            g for g in other.policy_class().flags_given(opts) if g.split()[0] not in own]
        if given:
            flag = given[0].split()[0]
            takers = [a.mode for a in registry.ALGORITHMS.values()
                      if flag in flag_spellings(opts, a)]
            raise UserError(f"{given[0]} applies to -m {' or '.join(takers or [other.mode])} "
                            f"only, not -m {opts.mode}")
    algorithm.policy_class().from_options(opts).check(opts)
    if opts.compress != "none" and not algorithm.parameter_server:
        raise UserError(f"--compress applies to the parameter-server modes, not -m {opts.mode}")
    if opts.compress.startswith("partial") and not algorithm.synchronous:
        raise UserError(f"--compress {opts.compress} synchronises slices in rounds all "
                        f"workers share: -m sync or esync, not -m {opts.mode}")
    able = [a.mode for a in registry.ALGORITHMS.values() if a.all_reduce]
    if opts.backend == "ps":
        if num_servers == 0:
            raise UserError(f"DMLC_NUM_SERVER=0: a job without servers aggregates by "
                            f"all-reduce: pass --backend allreduce (-m {' or '.join(able)})")
        return
    if not algorithm.all_reduce:
        raise UserError(f"--backend allreduce: -m {opts.mode} runs on the parameter "
                        f"servers only (all-reduce: -m {' or '.join(able)})")
    if opts.checkpoint_dir or opts.resume:
        raise UserError("--checkpoint-dir and --resume need the servers' shards: use "
                        "--backend ps")
    if num_servers:
        raise UserError(f"--backend allreduce: DMLC_NUM_SERVER={num_servers}, but the "
                        f"all-reduce needs no servers: set DMLC_NUM_SERVER=0")


def flag_spellings(opts: Any, algorithm: registry.Algorithm) -> set:
    """The command-line spellings of the flags `algorithm`'s policy takes its settings
    from (the parser's fields' own)."""
    names = set(algorithm.policy_class().FLAGS.values())
    return {spelling for f in dataclasses.fields(opts) if f.name in names
            for spelling in f.metadata.get("args", ())}
