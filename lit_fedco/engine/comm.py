"""Communication: the only place a round talks to other processes.

Every collective sums one flat buffer (:func:`~lit_fedco.core.state.flatten`); a mean over the
cohort is that sum divided by a count summed in the same buffer, so 1 and N processes agree up
to the order of summation. :class:`FabricComm` runs Lightning Fabric's ``all_reduce`` (gloo on
CPU, NCCL on GPUs); :class:`LocalComm` is one process, where a sum over processes is the
identity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_fedco.core.state import flatten, tree_map, unflatten

if TYPE_CHECKING:
    from lightning.fabric import Fabric


class Comm:
    """Sums over processes; the only place a round communicates.

    Args:
        dtype: the dtype buffers are summed in (the run's parameter dtype).
    """

    def __init__(self, dtype: torch.dtype = torch.float64) -> None:
        self.dtype = dtype
        self._carry: Tensor | None = None
        self.carried: Tensor | None = None
        """The sums of the values last given to :meth:`carry`, once a collective took them."""

    def all_sum(self, flat: Tensor) -> Tensor:
        """The element-wise sum of ``flat`` over all processes (one collective)."""
        raise NotImplementedError

    def gather_to_first(self, buf: Tensor) -> Tensor | None:
        """Every process's ``buf`` (the same shape on all), stacked in process order
        (``[N, *buf.shape]``), on process 0; None on the others, which send theirs and receive
        nothing. Every process must call it."""
        raise NotImplementedError

    def carry(self, values: Tensor) -> None:
        """Sum ``values`` (1-D) over processes in the next collective, appended to its buffer
        instead of a collective of their own; their sums are then in :attr:`carried` (None
        until then). Every process must call it at the same point (e.g. once per round), as
        for any collective. The run's stop request travels this way in the aggregation."""
        self._carry, self.carried = values.reshape(-1), None

    def sum_tree(self, tree: Any) -> Any:
        """:meth:`all_sum` of a pytree, flattened into one buffer first (with the values
        given to :meth:`carry`, if any)."""
        flat, meta, spec = flatten(tree)
        flat = flat.to(self.dtype)
        if self._carry is None:
            return unflatten(self.all_sum(flat), meta, spec)
        size = flat.numel()
        extra = self._carry.to(flat.device, self.dtype)
        total = self.all_sum(torch.cat([flat, extra]))
        self._carry, self.carried = None, total[size:]
        return unflatten(total[:size], meta, spec)

    def scatter_rows(self, local: Any, positions: Tensor, m: int) -> Any:
        """This process's rows ``local`` (``[n, ...]``, at ``positions`` of the cohort) placed
        in zero-filled ``[m, ...]`` buffers of the summing dtype: summed over processes (in a
        collective of their own, or inside a larger one) they give every cohort client's row."""

        def scatter(v: Tensor) -> Tensor:
            full = v.new_zeros((m, *v.shape[1:]), dtype=self.dtype)
            return full.index_copy(0, positions.to(v.device), v.to(self.dtype))

        return tree_map(scatter, local)

    def cohort_rows(self, local: Any, positions: Tensor, m: int) -> Any:
        """Every cohort client's row, ``[m, ...]`` in cohort order, from this process's rows
        ``local`` (``[n, ...]`` at ``positions`` of the cohort): one collective of m rows."""
        return self.sum_tree(self.scatter_rows(local, positions, m))


class LocalComm(Comm):
    """One process holds the whole cohort: a sum over processes is the identity."""

    def all_sum(self, flat: Tensor) -> Tensor:
        return flat

    def gather_to_first(self, buf: Tensor) -> Tensor | None:
        return buf.unsqueeze(0)


class FabricComm(Comm):
    """Lightning Fabric's collectives (gloo on CPU, NCCL on GPUs); one ``all_reduce`` each."""

    def __init__(self, fabric: Fabric, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(dtype)
        self.fabric = fabric

    def all_sum(self, flat: Tensor) -> Tensor:
        if self.fabric.world_size == 1:
            return flat
        return self.fabric.all_reduce(flat, reduce_op="sum")  # type: ignore[return-value]

    def gather_to_first(self, buf: Tensor) -> Tensor | None:
        world = self.fabric.world_size
        if world == 1:
            return buf.unsqueeze(0)
        import torch.distributed as dist  # Fabric's process group (it has no gather of its own)

        if self.fabric.global_rank != 0:
            dist.send(buf.contiguous(), dst=0)
            return None
        # received row block by row block straight into the result: gloo's gather would stage
        # all N blocks in a buffer of its own first, doubling process 0's memory for them
        out = buf.new_empty(world, *buf.shape)
        out[0].copy_(buf)
        for rank in range(1, world):
            dist.recv(out[rank], src=rank)
        return out
