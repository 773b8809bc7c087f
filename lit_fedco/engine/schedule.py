"""The schedule of a run: how many rounds, local steps, clients and rows, and when to
evaluate, in the papers' symbols (S rounds, I local steps, m clients a round, b rows, E)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.ranges import check_cohort
from lit_fedco.core.server_opt import ServerOptConfig
from lit_fedco.engine.failures import Failures

DTYPES = {"float32": torch.float32, "float64": torch.float64}
"""``dtype``: the run's parameter and data types."""
ACCELERATORS = ("cpu", "cuda", "gpu", "mps", "auto")
"""``accelerator``: what Lightning Fabric is asked for."""
STRATEGIES = ("auto", "ddp")
"""The strategies the loop runs on: it shards clients over processes itself and never wraps the
model, so only plain processes with a process group (``ddp``; ``auto``: ``ddp`` for more than
one process) make sense."""
STRATEGY_NOTE = " (the loop shards the clients over processes itself; the model is never wrapped)"
"""Why ``strategy`` takes no other value, as its refusal says it."""


@dataclass(frozen=True)
class LoopConfig:
    """The schedule of a run (S, I, m, b, E as in the papers).

    Attributes:
        rounds: S, the number of communication rounds.
        local_steps: I (τ), local steps per round.
        cohort: m, clients sampled per round (m = K: full participation).
        batch_size: b, minibatch size per client, per role, per step.
        eval_every: E, evaluate every E rounds (and after the last round).
        seed: seeds the cohort and minibatch generators.
        eval_batch: rows per forward pass at evaluation.
        progress: show a progress bar (rank 0; drawn by the runner).
        failures: simulated client failures (drop-outs, partial work); none by default.
        server_opt: the run's server optimizer, for updaters without one of their own; none
            by default.
    """

    rounds: int = 100
    local_steps: int = 5
    cohort: int = 10
    batch_size: int = 16
    eval_every: int = 10
    seed: int = 0
    eval_batch: int = 4096
    progress: bool = True
    failures: Failures = field(default_factory=Failures)
    server_opt: ServerOptConfig = field(default_factory=ServerOptConfig)

    def validate(self, num_clients: int, world_size: int = 1) -> None:
        """Range checks against K clients and the number of processes."""
        k = num_clients
        check_cohort(self.cohort, k)
        if self.cohort < world_size:
            raise ConfigError.bad_value(
                "cohort", self.cohort, f"at least the number of processes ({world_size})", str(k)
            )
        for key in ("rounds", "local_steps", "batch_size", "eval_every", "eval_batch"):
            if getattr(self, key) < 1:
                raise ConfigError.bad_value(key, getattr(self, key), "an int >= 1", "5")
        self.server_opt.validate()
