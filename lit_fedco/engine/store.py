"""Client-held state: the :attr:`~lit_fedco.core.protocol.Sync.KEEP` entries of every client.

A client keeps such an entry across rounds and never sends it (Ditto's personal model,
SCAFFOLD's control variate, Acc-FCSG-M's previous iterate). The store holds one row per client
(K rows); the round reads the rows of its cohort at the start and writes back the rows of the
clients that finished it at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lit_fedco.core.protocol import RoundInfo, Sync
from lit_fedco.core.state import State, broadcast, tree_map

if TYPE_CHECKING:
    from lit_fedco.updaters.base import CompositionalUpdater


class ClientStore:
    """The kept entries of every client, one row per client (K rows), identical on every process
    so that whichever process runs a client finds its state.

    Args:
        initial: one client's initial values of the kept entries (e.g. the initial model).
        num_clients: K.
    """

    def __init__(self, initial: State, num_clients: int) -> None:
        self.rows: State = {key: broadcast(v, num_clients) for key, v in initial.items()}

    def read(self, clients: Tensor) -> State:
        """The kept entries of ``clients``, stacked ``[n, ...]``."""
        return {key: tree_map(lambda v: v[clients.to(v.device)], t) for key, t in self.rows.items()}

    def write(self, clients: Tensor, rows: State) -> None:
        """Store ``rows`` (``[len(clients), ...]`` per kept entry) as the rows of ``clients``."""
        self.rows = {
            key: tree_map(
                lambda store, v: store.index_copy(0, clients.to(store.device), v.to(store.dtype)),
                self.rows[key],
                rows[key],
            )
            for key in self.rows
        }


def kept_keys(updater: CompositionalUpdater) -> list[str]:
    """The entries ``updater`` declares :attr:`~lit_fedco.core.protocol.Sync.KEEP`."""
    return [key for key, s in updater.client_state.items() if s is Sync.KEEP]


def make_store(updater: CompositionalUpdater, server: State, num_clients: int) -> ClientStore:
    """A store of the updater's kept entries, every client starting from what ``init_client``
    gives for them at ``server`` (e.g. the initial model), or from zeros shaped like the model
    for an entry it does not give (a control variate); empty if the updater keeps nothing."""
    keep = kept_keys(updater)
    if not keep:
        return ClientStore({}, num_clients)
    info = RoundInfo(0, num_clients, torch.arange(num_clients), 1, 0)
    given = updater.init_client(server, info)
    model = server[updater.model_key]
    zeros = tree_map(torch.zeros_like, model)
    return ClientStore({key: given.get(key, zeros) for key in keep}, num_clients)
