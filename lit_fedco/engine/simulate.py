"""Full-participation rounds in one process on fixed batches — the round of the loop
(:func:`lit_fedco.engine.round.federated_round`) for examples and tests: deterministic problems with
a known answer (``examples.theorem41``, the updaters' convergence tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from lit_fedco.core.protocol import RoundInfo
from lit_fedco.core.server_opt import ServerOptimizer
from lit_fedco.core.state import State, tree_leaves
from lit_fedco.engine.comm import LocalComm
from lit_fedco.engine.executors import Executor, SequentialExecutor
from lit_fedco.engine.round import federated_round
from lit_fedco.engine.store import ClientStore, make_store

if TYPE_CHECKING:
    from lit_fedco.updaters.base import CompositionalUpdater


def run_rounds(
    updater: CompositionalUpdater,
    batches: Any,
    rounds: int,
    local_steps: int,
    server: State | None = None,
    executor: Executor | None = None,
    dtype: torch.dtype = torch.float64,
    store: ClientStore | None = None,
    server_opt: ServerOptimizer | None = None,
) -> list[State]:
    """Full-participation rounds in one process on fixed per-client batches (examples, tests).

    Args:
        updater: the algorithm.
        batches: one batch per role, stacked over the K clients (``[K, b, ...]``), used at
            every step of every round (deterministic problems); or ``batches(t)`` giving
            step t's batches.
        rounds: S. local_steps: I.
        server: the server state to start from (default: ``updater.init_server``).
        executor: how clients run (default: sequential).
        dtype: the dtype of the means.
        store: the clients' kept entries (default: a new store, when the updater keeps any);
            pass one to read them afterwards.
        server_opt: a server optimizer (default: the updater's own, if it has one).

    Returns:
        The server state before the first round and after each round.
    """
    step_batches = batches if callable(batches) else lambda t: batches
    k = len(tree_leaves(step_batches(0))[0])
    cohort = torch.arange(k)
    server = server if server is not None else updater.init_server(updater.params(), k)
    comm, ex = LocalComm(dtype), executor or SequentialExecutor()
    store = store or make_store(updater, server, k)
    own = updater.server_opt_config()
    server_opt = server_opt or (ServerOptimizer(own) if own is not None else None)
    history = [server]
    for r in range(rounds):
        info = RoundInfo(r, k, cohort, local_steps, 0)
        res = federated_round(
            updater, server, info, cohort, step_batches, comm, ex, store, server_opt=server_opt
        )
        server = res.server
        history.append(server)
    return history
