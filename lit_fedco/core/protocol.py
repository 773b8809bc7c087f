"""The vocabulary of one federated round, shared by the round, the updaters and the objectives.

Three small types, no behaviour:

- :class:`Sync` — how a client-state entry travels (``DESIGN.md``, "One round, written once").
- :class:`RoundInfo` — what every party knows about the round before it starts.
- :class:`RoundContext` — what the server decides at the start of a round, split by where it
  goes: to every client, to each client its own row, kept on the server, or only logged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from torch import Tensor


class Sync(str, Enum):
    """How a client-state entry is communicated (declared per entry by an updater).

    Attributes:
        ROUND: uploaded at the end of the round and averaged over the cohort (FedAvg's x).
        STEP: averaged over the cohort after every local step (FedDRO's ȳ); the server reads
            the last step's mean, so it is not uploaded again.
        KEEP: stays with the client across rounds and is never sent (Ditto's personal model).
        LOCAL: rebuilt every round, never sent (an anchor, a momentum buffer).
    """

    ROUND = "round"
    STEP = "step"
    KEEP = "keep"
    LOCAL = "local"


@dataclass(frozen=True)
class RoundInfo:
    """What every process and the updater know about round ``round`` before it starts.

    Attributes:
        round: r, the 0-based index of the round.
        num_clients: K, the number of clients in the federation.
        cohort: the sorted ids of the round's m sampled clients (the same on every process).
        local_steps: I, the local steps of this round.
        seed: the run's seed (cohorts, minibatches and conditional samples derive from it).
    """

    round: int
    num_clients: int
    cohort: Tensor
    local_steps: int
    seed: int

    @property
    def cohort_size(self) -> int:
        """m, the number of clients in the round."""
        return len(self.cohort)


@dataclass(frozen=True)
class RoundContext:
    """The server's decisions at the start of a round (:meth:`round_context` of an updater).

    Attributes:
        broadcast: sent to every cohort client; it is the ``ctx`` of every ``client_step``
            (e.g. the DRO shift and normaliser, FedDRO's starting ȳ).
        per_client: one row per cohort client, ``[m, ...]`` in the order of the cohort; client
            i finds its row in its state under the same key (DRFL's λ_k). Each client
            receives only its own row.
        server: kept on the server for ``server_update``; by default merged into the server
            state (FedDRO's units of the carried inner estimate).
        logged: only logged (the implied DRO weights of the cohort).
    """

    broadcast: dict[str, Any] = field(default_factory=dict)
    per_client: dict[str, Tensor] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    logged: dict[str, Tensor] = field(default_factory=dict)
