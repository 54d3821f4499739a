"""The hooks through which an algorithm plugs into the one training loop (esync.runtime.train).

The loop owns batches, forward/backward, timing, logging, evaluation and stopping, and
the optimizer is the user's; an algorithm only says how many local iterations a round
has, what it does around the optimizer's step, and what happens at a round's end
(push/pull, aggregation). Like Flower's `Strategy`: the
runtime calls the algorithm; the algorithm never drives the runtime.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from esync.algorithms.policy import Policy, policy_of
from esync.errors import UserError

if TYPE_CHECKING:
    from esync.options import Options
    from esync.transport.node import Node

Phases = Dict[str, float]


@dataclass(frozen=True)
class Job:
    """What a worker of a distributed job knows once it has joined (the scheduler's
    assignment), handed to its algorithm."""

    node: Optional["Node"]      # None where there is no ps-lite cluster (DDP)
    rank: int
    num_workers: int
    servers: List[str]          # address of server 0, 1, ...
    id: str                     # the job id the scheduler drew
    state_server_patience: float = 0.0  # ESYNC_STATE_SERVER_PATIENCE, where it matters
    store: Any = None           # DDP: torch.distributed's rendezvous store, where the
    #                             ranks agree to stop and rank 0 tells the evaluator its
    #                             address
    host: str = "127.0.0.1"     # the address other processes reach this one at
    rejoin: bool = False        # it takes the place of a dead worker in a running job
    resume: bool = False        # the job continues from a checkpoint (--resume)

    @classmethod
    def from_assignment(cls, node: "Node", assignment: Dict[str, Any],
                        state_server_patience: float = 0.0, resume: bool = False,
                        host: str = "127.0.0.1") -> "Job":
        return cls(node, assignment["rank"], assignment["num_workers"],
                   list(assignment["servers"]), assignment["job"], state_server_patience,
                   host=host, rejoin=assignment.get("rejoin") is True, resume=resume)


class Algorithm:
    """Base class; the defaults are those of one device training alone. The hooks come
    in sections: building (a policy bound to the job), setting up, the round's
    synchronisation, the data the loop draws, telemetry (what the loop times and logs:
    no effect on training) and stopping."""

    #: short name, as in the log and the printed lines
    name = "algorithm"
    #: whether every worker waits for all in each round (a worker leaving early must
    #: then end its round, so that the others learn it and stop)
    synchronous = False
    #: whether a pass of a prepared loader is an epoch of the job (every worker's samples
    #: together, `job_samples`) rather than of this worker's partition, so that workers
    #: of different speeds end their passes, and an epoch loop, after the same round
    job_epochs = False
    #: whether every device takes one local iteration a round, as every other does
    #: (SSGD, DDP, one device alone): the job's steps are then this process's iterations
    lockstep = True
    #: the servers' checkpoint round a resumed job took its model from (None: none)
    resumed_from: Optional[int] = None

    #: the settings these hooks run (esync.algorithms.policy), set by `with_policy`
    policy: Optional["Policy"] = None

    # --- building: a policy bound to a joined job -----------------------------------------
    @classmethod
    def from_options(cls, opts: "Options", job: Optional[Job]) -> "Algorithm":
        """The algorithm as the command line configures it; `job` is None for a
        process training alone."""
        return cls.with_policy(policy_of(opts), opts, job)

    @classmethod
    def with_policy(cls, policy: "Policy", opts: "Options",
                    job: Optional[Job]) -> "Algorithm":
        """The hooks that run `policy` in `job`, the job's other settings from `opts`."""
        hooks = cls.bind(policy, opts, job)
        hooks.policy, hooks._bound = policy, (opts, job)
        return hooks

    @classmethod
    def bind(cls, policy: "Policy", opts: "Options", job: Optional[Job]) -> "Algorithm":
        """Each algorithm's constructor from its policy and the job (`with_policy`)."""
        raise NotImplementedError

    def rebound(self, policy: "Policy") -> "Algorithm":
        """These hooks with `policy`'s settings in place of the flags' (before `setup`):
        the policy given in code (esync.DistributedOptimizer(..., algorithm=)). The job's
        mode (-m) chose the servers' rule and the backend, so another algorithm's policy
        is a UserError."""
        opts, job = self._bound
        if policy.key != self.policy.key:
            raise UserError(f"algorithm={policy!r} does not run in this job: it runs -m "
                            f"{opts.mode} ({self.policy.algorithm.display}); start it with "
                            f"{' '.join(policy.algorithm.flags)}")
        if policy == self.policy:
            return self
        opts = policy.applied(opts)
        policy.check(opts)  # as the flags' were, before the job started
        self.discard()
        return type(self).with_policy(policy, opts, job)

    def discard(self) -> None:
        """Built, then replaced before `setup` (`rebound`): free what `bind` took."""

    @staticmethod
    def learning_rate(opts: "Options") -> float:
        """The learning rate of the built-in loop's SGD under this algorithm (-l)."""
        return opts.learning_rate

    # --- setting up -----------------------------------------------------------------------
    def setup(self, model: nn.Module, device: torch.device) -> None:
        """Called once before the first round, with the model on its device."""

    def continues(self) -> Optional[Tuple[Optional[int], float]]:
        """After `setup`: None for a fresh start; for a process that continues a job
        (rejoining it, or resuming it from a checkpoint), its first round (None: the
        one after its own last logged round) and the job's training clock (seconds)."""
        return None

    def training_module(self, model: nn.Module) -> nn.Module:
        """The module the loop runs forward and backward through (after `setup`): the
        model itself, or a wrapper of it (DDP's DistributedDataParallel)."""
        return model

    # --- a round: the synchronisation hooks -----------------------------------------------
    def begin_round(self, round_: int) -> Tuple[int, Phases]:
        """Number of local iterations of round `round_` (from 1), and timed phases
        spent deciding it (for example asking a state server for a budget)."""
        return 1, {}

    def local_update(self, model: nn.Module, step: Callable[[], Any]) -> Any:
        """Apply this local iteration's gradients (already in `.grad`): `step` is the
        user's optimizer step (it does nothing for a step AMP's GradScaler skips, which
        still counts as a local iteration); returns what `step` returns."""
        return step()

    def round_over(self) -> bool:
        """After each local iteration: whether the round ends now, before its budget
        is used up (ESync's open round: esync.algorithms.esync.worker)."""
        return False

    def end_round(self, round_: int, model: nn.Module) -> Phases:
        """Everything after the round's local iterations; returns its timed phases."""
        return {}

    def checkpointed(self) -> List[int]:
        """The rounds the job's model was checkpointed at since the last call (the
        servers say so with the round's answers): this worker keeps its own state of
        each (its optimizer's and schedulers'), so that a resumed job goes on whole."""
        return []

    # --- data: the batches the loop draws -------------------------------------------------
    def batch_size(self) -> Optional[int]:
        """Samples of the next local iteration's batch; None: the flags' -b."""
        return None

    def loader_prepared(self, batch_size: int) -> None:
        """A prepared data loader's batch size (the first one prepared: the training
        loader's), before its first batch; every worker's loader is prepared alike."""

    def batch_slice(self) -> Optional[Tuple[int, int, int]]:
        """Where this worker's batch lies in a global batch that the workers share, at
        each local iteration: (offset, size, global size), or None where each worker
        draws its own batches from its own partition."""
        return None

    def job_samples(self) -> Optional[int]:
        """The samples every worker together has trained so far, as the last
        synchronisation said (None: this process alone knows only its own)."""
        return None

    # --- telemetry: what the loop times and logs ------------------------------------------
    def iteration_timed(self, computing: float, samples: int) -> None:
        """After each local iteration: its seconds of computing (the simulated slowdown
        included, communication not) and its number of samples, as the loop logs them."""

    def communication_seconds(self) -> float:
        """Seconds the last local iteration spent communicating inside forward and
        backward (DDP's all-reduce): logged as `global aggregate`, not as computing."""
        return 0.0

    def waited_seconds(self) -> float:
        """Seconds of the last round's synchronisation spent waiting for the other
        workers (the round's *wait*; the rest of it is communication). 0 where they
        cannot be told apart: DDP's all-reduce waits inside backward."""
        return 0.0

    def round_record(self) -> Dict[str, Any]:
        """Extra fields for the log record of the round just ended (ESync: its budget)."""
        return {}

    def traffic(self) -> Tuple[int, int]:
        """Bytes sent and received over the network so far (cumulative)."""
        return 0, 0

    def evaluates(self, round_: int) -> bool:
        """Whether this process measures test accuracy after round `round_`."""
        return False

    # --- stopping and leaving -------------------------------------------------------------
    @property
    def decides_stop(self) -> bool:
        """Whether this process's own stop criteria count (with SSGD and ESync only
        worker 0's do): if not, an epoch limit does not cut its rounds short either."""
        return True

    def agree_stop(self, reason: Optional[str], everyone: bool = False) -> Optional[str]:
        """Given this process's own stop decision after a round (None: go on), the
        decision that holds; distributed algorithms agree on it with the others.
        `everyone`: every worker reaches the same decision after its own round of this
        number (--max-rounds), so none needs telling, and none trains a round more."""
        return reason

    def leave(self, reason: str) -> bool:
        """This process's own loop ended before the job's criteria (esync.Session.leave):
        True where the algorithm has taken care of the others itself (DDP: a last step
        with them), False for the session's way (a synchronous job: a last round that
        tells them, with the push)."""
        return False

    def final_model(self, model: nn.Module) -> None:
        """After the job stopped, on the worker that keeps the job's model (rank 0):
        bring `model` to the job's final weights where this worker's may be behind
        (ASGD's worker 0, whose last push came before the others' last)."""

    def finish(self) -> None:
        """Called once after the last round, also when training stops on an error."""
