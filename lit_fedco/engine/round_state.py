"""A round's bookkeeping (:func:`~lit_fedco.engine.round.federated_round`): who runs here, how far
each client gets and what was sent (:class:`RoundRun`), what the round returns, its summed counts,
and the row-wise helpers that mask, sum and log over this process's clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_fedco.core.protocol import RoundContext, RoundInfo
from lit_fedco.core.state import State, tree_leaves
from lit_fedco.engine.comm import Comm
from lit_fedco.engine.executors import Executor

if TYPE_CHECKING:
    from lit_fedco.updaters.base import CompositionalUpdater


@dataclass
class Traffic:
    """Floats one client sends (``up``) and receives (``down``) in a round: the average over the
    cohort's m clients of what each one actually sent and received (fractional when clients
    fail: a client that stopped sends and receives nothing more)."""

    up: float = 0
    down: float = 0


@dataclass
class RoundResult:
    """What a round returns.

    Attributes:
        server: the new server state.
        logs: the means of the clients' step logs over the client-steps that ran, under
            ``train/<name>`` (absent when none ran); what the round context logs, under
            ``dro/``; and, when clients can fail, ``failures/dropped``, ``failures/partial``
            (clients that stopped before step I) and ``failures/steps_completed_mean`` (a
            dropped client counting 0).
        traffic: floats communicated per client in this round.
        context: the round context (for callbacks and tests).
    """

    server: State
    logs: dict[str, float]
    traffic: Traffic
    context: RoundContext


@dataclass(frozen=True)
class Counts:
    """The round's counts, summed over the processes in the round's one collective (as one
    tensor, in this order).

    Attributes:
        participants: clients that completed at least one local step (their uploads count).
        client_steps: local steps run, over all clients.
        dropped: clients that completed no step.
        partial: clients that stopped before step I.
        samples: the participants' training samples.
    """

    participants: float
    client_steps: float
    dropped: float
    partial: float
    samples: float

    @classmethod
    def of(cls, total: dict[str, Any]) -> Counts:
        """The counts of a summed payload (:func:`~lit_fedco.engine.round_phases.aggregate`)."""
        return cls(*(float(v) for v in total["counts"].tolist()))


@dataclass
class RoundRun:
    """One round's bookkeeping: who runs here, how far each client gets, what was sent."""

    upd: CompositionalUpdater
    info: RoundInfo
    clients: Tensor  # this process's cohort clients (sorted)
    positions: Tensor  # their places in the cohort
    comm: Comm
    ex: Executor
    done: Tensor | None  # t_k per client of this process (CPU); None: every client runs I steps
    up: float = 0.0  # floats sent by the whole cohort
    down: float = 0.0  # floats received by the whole cohort

    @property
    def n(self) -> int:
        return len(self.clients)

    @property
    def m(self) -> int:
        return self.info.cohort_size

    def running(self, t: int, device: torch.device) -> Tensor | None:
        """The clients of this process still running at step t, as a row mask (None: all)."""
        return None if self.done is None else row_mask(self.done > t, device)

    def count(self, mask: Tensor | None, device: torch.device) -> Tensor:
        """How many of this process's clients ``mask`` marks (all with None), as a 0-d tensor
        of the summing dtype, to travel in a collective beside what it counts."""
        n = self.n if mask is None else int(mask.sum())
        return torch.tensor(float(n), dtype=self.comm.dtype, device=device)


def row_mask(flags: Tensor, device: torch.device) -> Tensor | None:
    """``flags`` (``[n]`` bool) as a row mask on ``device``; None when every row is set: the
    arithmetic of a round in which every client runs."""
    return None if bool(flags.all()) else flags.to(device)


def where_rows(mask: Tensor | None, new: Any, old: Any) -> Any:
    """Rows of ``new`` where ``mask`` (``[n]`` bool), of ``old`` elsewhere; ``new`` when there is
    no mask. Entries that ``old`` lacks come from ``new`` (a state entry the step creates)."""
    if mask is None:
        return new
    if isinstance(new, dict):
        return {k: where_rows(mask, v, old[k]) if k in old else v for k, v in new.items()}
    return torch.where(mask.view(-1, *[1] * (new.dim() - 1)), new, old)


def sum_rows(v: Tensor, mask: Tensor | None, weights: Tensor | None = None) -> Tensor:
    """The sum over the leading (client) dimension of the rows where ``mask`` (all rows with
    None), each row times its weight when ``weights`` (``[n]``) are given."""
    if weights is not None:
        v = weights.view(-1, *[1] * (v.dim() - 1)).to(v.dtype) * v
    if mask is None:
        return v.sum(0)
    return torch.where(mask.view(-1, *[1] * (v.dim() - 1)), v, 0).sum(0)


def add_logs(log_sum: dict[str, Any], logs: dict[str, Tensor], running: Tensor | None) -> None:
    """Add one step's logs (``[n]`` per key) of the clients marked ``running`` (all with None)
    to the round's sums."""
    for key, v in logs.items():
        log_sum[key] = log_sum.get(key, 0.0) + sum_rows(v.detach(), running)


def unique_numel(tree: Any) -> int:
    """Elements of the distinct tensors of ``tree`` (one tensor under two keys is sent once)."""
    return sum(t.numel() for t in {id(t): t for t in tree_leaves(tree)}.values())
