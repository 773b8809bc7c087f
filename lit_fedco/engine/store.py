"""Client-held state: the :attr:`~lit_fedco.core.protocol.Sync.KEEP` entries of every client.

A client keeps such an entry across rounds and never sends it (Ditto's personal model,
SCAFFOLD's control variate, Acc-FCSG-M's previous iterate). Each client's rows live on one
process only, its *owner* (client k on process ``k mod N`` of N, the process that also
evaluates it), so that N processes hold K/N rows each instead of K. A round of an updater that
keeps state runs every cohort client on its owner (:func:`owned_clients`); the round reads the
rows of the process's cohort clients at the start and writes back, in place, the rows of those
that finished it at the end. A checkpoint gathers every client's rows on process 0, which
writes it (:meth:`ClientStore.gather`; the other processes never hold more
than their own rows), and a resumed process takes back its own (:meth:`ClientStore.load`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from lit_fedco.core.protocol import LOCAL_STATS, RoundInfo, Sync
from lit_fedco.core.state import State, broadcast, tree_leaves, tree_map

if TYPE_CHECKING:
    from lit_fedco.engine.comm import Comm
    from lit_fedco.updaters.base import CompositionalUpdater


def owned_by(rank: int, world: int, num_clients: int) -> Tensor:
    """The clients process ``rank`` of ``world`` owns, of K = ``num_clients``: ``rank, rank +
    world, ...`` (k mod world = rank). It holds their kept state and evaluates them."""
    return torch.arange(rank, num_clients, world)


def owned_clients(clients: Tensor, rank: int, world: int) -> Tensor:
    """The entries of ``clients`` that process ``rank`` of ``world`` owns (k mod world = rank),
    in their order."""
    return clients if world == 1 else clients[clients % world == rank].contiguous()


class ClientStore:
    """The kept entries of the clients this process owns, one row per owned client.

    Args:
        initial: one client's initial values of the kept entries (e.g. the initial model).
        num_clients: K.
        rank, world: this process and the number of processes; process ``rank`` owns clients
            ``rank, rank + world, ...`` (all K with one process).
    """

    def __init__(self, initial: State, num_clients: int, rank: int = 0, world: int = 1) -> None:
        self.num_clients, self.rank, self.world = num_clients, rank, world
        self.owned = owned_by(rank, world, num_clients)
        self.rows: State = {key: broadcast(v, len(self.owned)) for key, v in initial.items()}

    def _local(self, clients: Tensor) -> Tensor:
        """The rows of ``clients`` in :attr:`rows`; a client of another process is refused."""
        if self.world == 1:
            return clients
        if bool((clients % self.world != self.rank).any()):
            raise ValueError(
                f"process {self.rank} of {self.world} does not hold the kept state of clients "
                f"{clients[clients % self.world != self.rank].tolist()} (client k lives on "
                f"process k mod {self.world})"
            )
        return torch.div(clients, self.world, rounding_mode="floor")

    def read(self, clients: Tensor) -> State:
        """The kept entries of ``clients`` (owned by this process), stacked ``[n, ...]``."""
        local = self._local(clients)
        return {key: tree_map(lambda v: v[local.to(v.device)], t) for key, t in self.rows.items()}

    def write(self, clients: Tensor, rows: State) -> None:
        """Store ``rows`` (``[len(clients), ...]`` per kept entry) as the rows of ``clients``
        (owned by this process), in place."""
        local = self._local(clients)
        for key in self.rows:
            tree_map(
                lambda store, v: store.index_copy_(0, local.to(store.device), v.to(store.dtype)),
                self.rows[key],
                rows[key],
            )

    def nbytes(self) -> int:
        """Bytes of the rows this process holds."""
        return sum(t.numel() * t.element_size() for t in tree_leaves(self.rows))

    def gather(self, comm: Comm) -> State | None:
        """Every client's rows (``[K, ...]``, in client order, in the summing dtype of ``comm``)
        on process 0, the one that writes checkpoints; None on the other processes. Each
        process sends its rows as one ``[ceil(K/N), R]`` block (R floats per client, padded with
        rows of zeros); only process 0 holds all K rows, once: received into place
        (:meth:`~lit_fedco.engine.comm.Comm.gather_to_first`) and put in client order in place,
        the leaves returned are views of them. Every process must call it."""
        if self.world == 1 or not self.rows:
            return self.rows
        leaves, spec = pytree.tree_flatten(self.rows)
        n, cap = len(self.owned), -(-self.num_clients // self.world)
        width = [math.prod(v.shape[1:]) for v in leaves]
        buf = torch.zeros(cap, sum(width), dtype=comm.dtype, device=leaves[0].device)
        at = 0
        for v, w in zip(leaves, width, strict=True):
            buf[:n, at : at + w] = v.reshape(n, w)
            at += w
        got = comm.gather_to_first(buf)  # [N, cap, R] on process 0
        del buf
        if got is None:
            return None
        full = _to_client_order(got)[: self.num_clients]
        cols = full.split(width, 1)
        out = [c.reshape(self.num_clients, *v.shape[1:]) for c, v in zip(cols, leaves, strict=True)]
        return pytree.tree_unflatten(out, spec)  # views of the gathered rows: no second copy

    def load(self, rows: State) -> None:
        """Take this process's rows from every client's ``rows`` (``[K, ...]``, a checkpoint's)."""
        owned = self.owned

        def mine(v: Any) -> Any:  # (a checkpoint of N processes holds views: contiguous here)
            return v.contiguous() if self.world == 1 else v[owned.to(v.device)].clone()

        self.rows = {key: tree_map(mine, t) for key, t in rows.items()}


def _to_client_order(got: Tensor) -> Tensor:
    """The rows of a gather, ``[N, cap, R]`` (process r's j-th row is client ``j·N + r``), as
    ``[cap·N, R]`` in client order, in place: the transposition of an N × cap grid of rows,
    cycle by cycle with one row aside, so that a checkpoint holds the clients' rows once (a
    reordering copy would hold them twice). Rows past K are the padding."""
    world, cap, _ = got.shape
    flat = got.view(world * cap, -1)
    size = world * cap
    done = bytearray(size)
    for start in range(size):
        if done[start]:
            continue
        done[start] = 1
        # position p (client p) takes the row that stood at q = (p mod N)·cap + p div N
        src = (start % world) * cap + start // world
        if src == start:
            continue
        aside = flat[start].clone()
        p = start
        while src != start:
            flat[p].copy_(flat[src])
            done[src] = 1
            p, src = src, (src % world) * cap + src // world
        flat[p].copy_(aside)
    return flat


def kept_keys(updater: CompositionalUpdater) -> list[str]:
    """The entries ``updater`` declares :attr:`~lit_fedco.core.protocol.Sync.KEEP`."""
    return [key for key, s in updater.client_state.items() if s is Sync.KEEP]


def make_store(
    updater: CompositionalUpdater, server: State, num_clients: int, rank: int = 0, world: int = 1
) -> ClientStore:
    """A store of the updater's kept entries for the clients process ``rank`` of ``world`` owns,
    every client starting from what ``init_client`` gives for them at ``server`` (e.g. the
    initial model), or from zeros shaped like the model for an entry it does not give (a
    control variate); empty if the updater keeps nothing."""
    keep = kept_keys(updater)
    if not keep:
        return ClientStore({}, num_clients, rank, world)
    info = RoundInfo(0, num_clients, torch.arange(num_clients), 1, 0)
    given = updater.init_client(server, info)
    model = server[updater.model_key]
    zeros = tree_map(torch.zeros_like, model)
    own_stats = {name: model[name] for name in getattr(updater, "local_stats", ())}
    initial = {key: own_stats if key == LOCAL_STATS else given.get(key, zeros) for key in keep}
    return ClientStore(initial, num_clients, rank, world)
