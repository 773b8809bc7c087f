"""The vocabulary of one federated round, shared by the round, the updaters and the objectives.

Four small types, no behaviour:

- :class:`Sync` — how a client-state entry travels (docs/explanation/round.md).
- :class:`RoundInfo` — what every party knows about the round: before it starts, and (the
  participants) by the time the server updates.
- :class:`StepInfo` — where a local step is in its round (what ``client_step`` receives).
- :class:`RoundContext` — what the server decides at the start of a round, split by where it
  goes: to every client, to each client its own row, kept on the server, only logged, and how
  the clients' uploads are weighted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from torch import Tensor

Probe = Callable[[Callable[[Any, Any], Any]], Tensor]
"""``probe(fn)``, given to an updater's ``round_context``: ``fn(state, batches)`` on every cohort
client at the broadcast point, on its first local step's minibatches, gathered ``[m, ...]`` in
cohort order (one collective, counted as upload traffic)."""


class Sync(str, Enum):
    """How a client-state entry is communicated (declared per entry by an updater).

    Attributes:
        ROUND: uploaded at the end of the round and averaged over the clients that finished
            it (FedAvg's x).
        STEP: averaged over the running clients after every local step (FedDRO's ȳ); the
            server reads the last step's mean, so it is not uploaded again.
        KEEP: stays with the client across rounds and is never sent (Ditto's personal model,
            SCAFFOLD's control variate c_i). A client's first round starts it from what
            ``init_client`` gives, or, where that gives nothing, from zeros shaped like the
            model.
        LOCAL: rebuilt every round, never sent (an anchor, a momentum buffer).
    """

    ROUND = "round"
    STEP = "step"
    KEEP = "keep"
    LOCAL = "local"


@dataclass(frozen=True)
class RoundInfo:
    """What every process and the updater know about round ``round``.

    Attributes:
        round: r, the 0-based index of the round.
        num_clients: K, the number of clients in the federation.
        cohort: the sorted ids of the round's m sampled clients (the same on every process).
        local_steps: I, the local steps of this round.
        seed: the run's seed (cohorts, minibatches and conditional samples derive from it).
        sizes: n_k, the training samples of each cohort client (``[m]``, cohort order);
            None where the round does not know them (every client then counts as 1).
        participants: the clients whose upload reached the server: m, or fewer when clients
            fail (``failures.*``). Known once the uploads are summed: ``server_update``
            receives it; None before.
        participant_samples: the training samples of those clients, Σ n_k (None before the
            uploads are summed, or without ``sizes``).
    """

    round: int
    num_clients: int
    cohort: Tensor
    local_steps: int
    seed: int
    sizes: Tensor | None = None
    participants: int | None = None
    participant_samples: float | None = None

    @property
    def cohort_size(self) -> int:
        """m, the number of clients in the round."""
        return len(self.cohort)

    def step(self, t: int) -> StepInfo:
        """The :class:`StepInfo` of local step ``t`` of this round."""
        return StepInfo(t, self.local_steps, self.round, self.num_clients)


@dataclass(frozen=True)
class StepInfo:
    """Where a local step is: what an updater's ``client_step`` knows besides its state.

    Plain Python numbers, so that an updater may branch on them inside ``vmap``.

    Attributes:
        t: the step's index in its round, 0 ≤ t < I.
        local_steps: I, the local steps of the round.
        round: r, the round's index.
        num_clients: K.
    """

    t: int
    local_steps: int
    round: int
    num_clients: int

    @property
    def first(self) -> bool:
        """Whether this is the round's first local step (t = 0: the client is at the
        broadcast point)."""
        return self.t == 0

    @property
    def last(self) -> bool:
        """Whether this is the round's last local step (t = I − 1)."""
        return self.t == self.local_steps - 1


@dataclass(frozen=True)
class RoundContext:
    """The server's decisions at the start of a round (an updater's ``round_context``).

    Attributes:
        broadcast: sent to every cohort client; it is the ``ctx`` of every ``client_step``
            (e.g. the DRO shift and normaliser, FedDRO's starting ȳ).
        per_client: one row per cohort client, ``[m, ...]`` in the order of the cohort; client
            i finds its row in its state under the same key. Each client receives only its own
            row.
        server: kept on the server for ``server_update``; by default merged into the server
            state (FedDRO's units of the carried inner estimate).
        cohort_weights: the implied DRO weights of the cohort (``[m]``, cohort order), only
            logged: ``dro/cohort_weight_max`` and ``dro/cohort_weight_entropy``. None: none.
        logged: scalars only logged, each as ``round/<key>``.
        weights: the weight of each cohort client's upload (``[m]``, cohort order) in the
            server's means of the ``ROUND`` entries, ``Σ_k w_k u_k / Σ_k w_k`` (DRFL's λ_k):
            the server applies them, so nothing is sent for them. None: the updater's
            ``aggregation`` declaration (uniform, or by client sample count).
    """

    broadcast: dict[str, Any] = field(default_factory=dict)
    per_client: dict[str, Tensor] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    cohort_weights: Tensor | None = None
    logged: dict[str, Tensor] = field(default_factory=dict)
    weights: Tensor | None = None


LOCAL_STATS = "running_stats"
"""The kept client-state entry of ``model.buffers=local``: each client's running statistics of
its model's batch norms (``CompositionalUpdater.keep_running_stats_local``)."""
