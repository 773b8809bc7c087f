"""Simulated client failures (config node ``failures``): drop-outs and partial work.

Each cohort client's fate in a round is drawn from its own stream, named by (seed, client,
round, 0xFA11) (:func:`lit_fedco.core.seeding.failure_generator`), so every process draws the same
fate for a client whichever process runs it, and a resumed run the same fates it would have
drawn. Three uniform numbers ``u₀, u₁, u₂`` per client and round decide it:

- **drop** (``u₀ < drop``): the client received the broadcast and, if the method probes, sent
  its probe — the round context is the one it would be without the failure — and then fails
  before its first local step: it takes part in no per-step sync and uploads nothing, and its
  kept state (:attr:`~lit_fedco.core.protocol.Sync.KEEP`) stays as it was. It completes 0 steps.
- **partial** (otherwise, ``u₁ < partial``): the client stops after ``t = 1 + ⌊u₂ I⌋`` of its I
  local steps, uniform on {1, …, I} (t = I: it failed after its last step, so nothing is lost).
  Its state stops changing at step t, it leaves the per-step syncs, and it uploads, and keeps,
  its state after those t steps. A client that completed 0 steps would be a drop, so t ≥ 1.

A round in which every client drops leaves the server state as it was: ``server_update`` is
not called, so server-side work tied to that round's index (CODA+'s end-of-stage anchor move and
step-size decay) does not happen in it.

The draws do not depend on the probabilities, so fates are coupled across them: a client that
drops at ``drop=0.1`` also drops at ``drop=0.2``. With both probabilities 0 nothing is drawn and
the round is the one without failures, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_fedco.core.protocol import RoundInfo
from lit_fedco.core.ranges import check_fraction
from lit_fedco.core.seeding import failure_generator


@dataclass(frozen=True)
class Failures:
    """Probabilities of simulated client failures (config node ``failures``).

    Attributes:
        drop: the probability that a cohort client drops out of a round: it uploads nothing,
            and the round's means are over the clients that finished.
        partial: the probability that a client that did not drop completes only t of its I
            local steps, t uniform on {1, …, I}, and uploads its state after them.
    """

    drop: float = 0.0
    partial: float = 0.0

    def __post_init__(self) -> None:
        for key in ("drop", "partial"):
            check_fraction(f"failures.{key}", getattr(self, key))

    @property
    def enabled(self) -> bool:
        """Whether any client can fail (else the round draws nothing)."""
        return self.drop > 0 or self.partial > 0

    def client_steps(self, seed: int, client: int, round_idx: int, local_steps: int) -> int:
        """The local steps client ``client`` completes in round ``round_idx``: 0 (it drops),
        t in {1, …, I} (it stops early; t = I: it completes the round)."""
        u = torch.rand(3, generator=failure_generator(seed, client, round_idx), dtype=torch.float64)
        if float(u[0]) < self.drop:
            return 0
        if float(u[1]) < self.partial:
            return 1 + min(int(float(u[2]) * local_steps), local_steps - 1)
        return local_steps

    def steps(self, info: RoundInfo, clients: Tensor) -> Tensor | None:
        """The local steps each of ``clients`` (this process's share of the cohort) completes
        in round ``info.round`` (``[n]``, int64, on the CPU); None when no client can fail."""
        if not self.enabled:
            return None
        return torch.tensor(
            [self.client_steps(info.seed, int(c), info.round, info.local_steps) for c in clients],
            dtype=torch.int64,
        )
