"""One federated round, written once: the loop, the examples and the tests all call
:func:`federated_round`.

::

    state = init_client(server, info)                       # BROADCAST (+ each client's row)
    ctx   = round_context(server, info, probes)              # always; probes if the method asks
    for t in range(I):
        state, logs = executor.map(client_step, state, batches(t), ctx.broadcast, t)
        state[STEP entries] ← cohort mean                      # one collective per step, if any
    server = server_update(server, cohort mean of upload(state) ∪ STEP means, ctx, info)
    store.write_back(state[KEEP entries])                    # m rows, not K

Communication goes through a :class:`Comm`: :class:`FabricComm` (one flat ``all_reduce`` per
collective) in runs, :class:`LocalComm` (one process) in examples and tests. Every collective
sums; a mean over the cohort is that sum divided by m, so 1 and N processes agree up to the
order of summation. Traffic is counted per client from what each one actually sends and
receives (:class:`Traffic`).

Client failures (:class:`~lit_fedco.engine.failures.Failures`): a client completes t_k of the I
local steps (0: it dropped out). A mean is then the sum over the clients still running (a per-step
sync at step t: those with t < t_k; the upload: those with t_k ≥ 1) divided by how many they
are, that count summed in the same collective as the sum — so a round without failures divides
by m exactly as before. A stopped client's state stops changing; a dropped client uploads
nothing and its kept entries are not written back; a round in which every client drops leaves
the server state as it was (``server_update`` is not called).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_fedco.core.protocol import RoundContext, RoundInfo, Sync
from lit_fedco.core.state import State, broadcast, flatten, numel, tree_leaves, tree_map, unflatten
from lit_fedco.engine.executors import Executor
from lit_fedco.engine.failures import Failures

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from lit_fedco.updaters.base import CompositionalUpdater

Batches = Callable[[int], Any]
"""``batches(t)``: step t's minibatches of this process's cohort clients, stacked ``[n, ...]``."""


# ---------------------------------------------------------------------- communication
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

    def cohort_rows(self, local: Any, positions: Tensor, m: int) -> Any:
        """Every cohort client's row, ``[m, ...]`` in cohort order, from this process's rows
        ``local`` (``[n, ...]`` at ``positions`` of the cohort): one collective of m rows."""

        def scatter(v: Tensor) -> Tensor:
            full = v.new_zeros((m, *v.shape[1:]), dtype=self.dtype)
            return full.index_copy(0, positions.to(v.device), v.to(self.dtype))

        return self.sum_tree(tree_map(scatter, local))


class LocalComm(Comm):
    """One process holds the whole cohort: a sum over processes is the identity."""

    def all_sum(self, flat: Tensor) -> Tensor:
        return flat


class FabricComm(Comm):
    """Lightning Fabric's collectives (gloo on CPU, NCCL on GPUs); one ``all_reduce`` each."""

    def __init__(self, fabric: Fabric, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(dtype)
        self.fabric = fabric

    def all_sum(self, flat: Tensor) -> Tensor:
        if self.fabric.world_size == 1:
            return flat
        return self.fabric.all_reduce(flat, reduce_op="sum")  # type: ignore[return-value]


# ---------------------------------------------------------------------- client-held state
class ClientStore:
    """The :attr:`Sync.KEEP` entries of every client, one row per client (K rows), identical on
    every process so that whichever process runs a client finds its state.

    Args:
        initial: one client's initial values of the kept entries (e.g. the initial model).
        num_clients: K.
    """

    def __init__(self, initial: State, num_clients: int) -> None:
        self.rows: State = {key: broadcast(v, num_clients) for key, v in initial.items()}

    def read(self, clients: Tensor) -> State:
        """The kept entries of ``clients``, stacked ``[n, ...]``."""
        return {key: tree_map(lambda v: v[clients.to(v.device)], t) for key, t in self.rows.items()}

    def write_back(
        self,
        states: State,
        positions: Tensor,
        cohort: Tensor,
        comm: Comm,
        finished: Tensor | None = None,
    ) -> None:
        """Store this round's kept entries of the whole cohort: every process contributes its
        own clients' rows (at ``positions`` of the cohort) to one collective of m rows.

        ``finished`` (``[n]`` bool, this process's clients): only those rows are stored (a
        client that dropped out keeps its previous state); the flags travel in the same
        collective. None: every row."""
        if not self.rows:
            return
        rows = {key: states[key] for key in self.rows}
        idx = cohort
        if finished is None:
            new = comm.cohort_rows(rows, positions, len(cohort))
        else:
            flags = finished.to(comm.dtype)
            got = comm.cohort_rows({"rows": rows, "finished": flags}, positions, len(cohort))
            keep = got["finished"] > 0.5
            idx = cohort.to(keep.device)[keep]
            new = tree_map(lambda v: v[keep], got["rows"])
        self.rows = {
            key: tree_map(
                lambda store, v: store.index_copy(0, idx.to(store.device), v.to(store.dtype)),
                self.rows[key],
                new[key],
            )
            for key in self.rows
        }


def make_store(updater: CompositionalUpdater, server: State, num_clients: int) -> ClientStore:
    """A store of the updater's kept entries, every client starting from what
    ``init_client`` gives at ``server`` (e.g. the initial model); empty if it keeps none."""
    keep = [key for key, s in updater.client_state.items() if s is Sync.KEEP]
    if not keep:
        return ClientStore({}, num_clients)
    info = RoundInfo(0, num_clients, torch.arange(num_clients), 1, 0)
    client0 = updater.init_client(server, info)
    return ClientStore({key: client0[key] for key in keep}, num_clients)


# ---------------------------------------------------------------------- the round
@dataclass
class Traffic:
    """Floats one client sends (``up``) and receives (``down``) in a round.

    With failures, the average over the cohort's m clients of what each one actually sent and
    received: a client that stopped sends and receives nothing more (no per-step syncs after
    it stopped, no upload after a drop-out), so the count is fractional. Times m it is the
    round's total."""

    up: float = 0
    down: float = 0


@dataclass
class RoundResult:
    """What a round returns.

    Attributes:
        server: the new server state.
        logs: the cohort means of the clients' step logs, averaged over the local steps, under
            ``train/<name>`` (with failures: the mean over the client-steps that ran; absent
            when none ran); what the round context logs, under ``dro/``; and, when clients can
            fail, ``failures/dropped`` (clients that dropped out), ``failures/partial``
            (clients that stopped before step I) and ``failures/steps_completed_mean`` (the
            cohort's mean of completed steps, a dropped client counting 0).
        traffic: floats communicated per client in this round.
        context: the round context (for callbacks and tests).
    """

    server: State
    logs: dict[str, float]
    traffic: Traffic
    context: RoundContext


def _step(upd: CompositionalUpdater, t: int, s: State, b: Any, c: Any) -> Any:
    return upd.client_step(s, b, c, t)


def unique_numel(tree: Any) -> int:
    """Elements of the distinct tensors of ``tree`` (one tensor under two keys is sent once)."""
    return sum(t.numel() for t in {id(t): t for t in tree_leaves(tree)}.values())


def _rows(flags: Tensor | None, device: torch.device) -> Tensor | None:
    """``flags`` (``[n]`` bool, on the CPU) as a row mask on ``device``; None when every row
    is set (or there are no flags): the arithmetic of a round without failures."""
    if flags is None or bool(flags.all()):
        return None
    return flags.to(device)


def _where(mask: Tensor | None, new: Any, old: Any) -> Any:
    """Rows of ``new`` where ``mask`` (``[n]`` bool), of ``old`` elsewhere; ``new`` when there is
    no mask. Entries that ``old`` lacks come from ``new`` (a state entry the step creates)."""
    if mask is None:
        return new
    if isinstance(new, dict):
        return {k: _where(mask, v, old[k]) if k in old else v for k, v in new.items()}
    return torch.where(mask.view(-1, *[1] * (new.dim() - 1)), new, old)


def _sum_rows(v: Tensor, mask: Tensor | None) -> Tensor:
    """The sum over the leading (client) dimension of the rows where ``mask``; of all rows
    when there is no mask."""
    if mask is None:
        return v.sum(0)
    return torch.where(mask.view(-1, *[1] * (v.dim() - 1)), v, 0).sum(0)


def federated_round(
    updater: CompositionalUpdater,
    server: State,
    info: RoundInfo,
    clients: Tensor,
    batches: Batches,
    comm: Comm,
    executor: Executor,
    store: ClientStore | None = None,
    failures: Failures | None = None,
) -> RoundResult:
    """Run one round of ``updater`` for this process's share ``clients`` of ``info.cohort``.

    Args:
        updater: the algorithm.
        server: the server state before the round (not modified).
        info: the round's index, K, cohort, I and seed.
        clients: the cohort clients this process runs (a subset of ``info.cohort``, sorted).
        batches: ``batches(t)`` gives step t's minibatches of ``clients``; step 0's batches
            also feed the probe.
        comm: sums over processes.
        executor: runs a per-client function over ``clients`` (vmapped or in a loop).
        store: the clients' kept (:attr:`Sync.KEEP`) entries, read at the start and written
            back at the end; needed only when the updater declares such entries.
        failures: simulated client failures (:class:`~lit_fedco.engine.failures.Failures`; the
            module docstring says what a failed client does); None or probabilities 0: none.

    Returns:
        The new server state, the round's logs and the traffic per client.
    """
    upd, ex = updater, executor
    n, m, steps = len(clients), info.cohort_size, info.local_steps
    positions = torch.searchsorted(info.cohort, clients)  # this process's rows of the cohort
    sync = upd.client_state
    traffic = Traffic()
    # t_k, the local steps each of this process's clients completes (0: it dropped out), on the
    # CPU; None: no failures, and the round's arithmetic is that of a round without them.
    done = failures.steps(info, clients) if failures is not None else None
    later_up = later_down = 0  # with failures: the cohort's floats after the probe, in total

    # BROADCAST: every cohort client starts from the server's state; kept entries come from
    # the client's own store instead.
    client0 = upd.init_client(server, info)
    sent = {k: v for k, v in client0.items() if sync.get(k) is not Sync.KEEP}
    traffic.down += unique_numel(sent)
    states = broadcast(client0, n)
    if store is not None and store.rows:
        states = {**states, **store.read(clients)}
    device = tree_leaves(states)[0].device

    # ROUND CONTEXT: from the cohort's probes at the broadcast point, when the method asks.
    # A client that drops out does so after this point: its probe is part of the context.
    first = batches(0)
    probes = None
    if upd.probes:
        local = ex.map(lambda s, b, c: upd.probe(s, b, c), states, first, {}, n)
        probes = comm.cohort_rows(local, positions, m)
        traffic.up += local[0].numel()
    ctx = upd.round_context(server, info, probes)
    traffic.down += numel(ctx.broadcast)
    if ctx.per_client:  # each client receives its own row
        rows = {k: v[positions.to(v.device)] for k, v in ctx.per_client.items()}
        states = {**states, **rows}
        traffic.down += sum(v[0].numel() for v in ctx.per_client.values())

    # LOCAL STEPS: client k runs step t while t < t_k; a stopped client's state stops changing.
    step_keys = [k for k, s in sync.items() if s is Sync.STEP]
    log_sum: dict[str, Tensor] = {}
    step_mean: State = {}
    client_major = ex.client_major and not step_keys and done is None and steps > 0
    if client_major:
        # Clients do not wait on each other: each runs its I steps in turn (a plain loop's
        # order, the same numbers), the cohort's states stacked once. Step t's batches are
        # copied out of the sampler's reused buffers before step t + 1 is gathered.
        copy = partial(tree_map, torch.clone)
        steps_b = [copy(first), *(copy(batches(t)) for t in range(1, steps))]
        states, step_logs = ex.run_clients(partial(_step, upd), states, steps_b,
                                           ctx.broadcast, n)  # fmt: skip
        for logs in step_logs:
            for key, v in logs.items():
                log_sum[key] = log_sum.get(key, 0.0) + _sum_rows(v.detach(), None)
    for t in range(0 if client_major else steps):
        running = None if done is None else _rows(done > t, device)  # None: all of them
        new, logs = ex.map(partial(_step, upd, t), states, first if t == 0 else batches(t),
                           ctx.broadcast, n)  # fmt: skip
        states = _where(running, new, states)
        for key, v in logs.items():
            log_sum[key] = log_sum.get(key, 0.0) + _sum_rows(v.detach(), running)
        if not step_keys:
            continue
        # per-step communication: the mean of the declared entries over the running clients
        part = {key: tree_map(lambda v: _sum_rows(v, running), states[key]) for key in step_keys}
        if done is None:
            step_mean = tree_map(lambda v: v / m, comm.sum_tree(part))
            states = {**states, **broadcast(step_mean, n)}
            traffic.up += numel(step_mean)
            traffic.down += numel(step_mean)
            continue
        here = torch.tensor(float((done > t).sum()), dtype=comm.dtype, device=device)
        total = comm.sum_tree({"sum": part, "running": here})
        count = round(float(total["running"]))
        if count:  # else every client has stopped: the last step's mean stays
            step_mean = tree_map(lambda v: v / count, total["sum"])
            synced = _where(running, broadcast(step_mean, n), {k: states[k] for k in step_keys})
            states = {**states, **synced}
            later_up += count * numel(step_mean)
            later_down += count * numel(step_mean)

    # CLIENT-HELD STATE: this round's cohort rows go back to the store (those that finished).
    finished = None if done is None else _rows(done > 0, device)
    if store is not None:
        flags = None if done is None else (done > 0).to(device)
        store.write_back(states, positions, info.cohort, comm, flags)

    # AGGREGATION: one collective of [sum of uploads, sum of logs (, counts)], then the server
    # update.
    ups = ex.map(lambda s, b, c: upd.upload(s), states, None, ctx.broadcast, n)
    payload = {"up": tree_map(lambda v: _sum_rows(v, finished), ups), "logs": log_sum}
    if done is None:
        mean = tree_map(lambda v: v / m, comm.sum_tree(payload))
        traffic.up += numel(mean["up"])
        new_server = upd.server_update(server, {**step_mean, **mean["up"]}, ctx, info)
        out = {f"train/{k}": float(v) / steps for k, v in mean["logs"].items()}
    else:
        counts = [
            (done > 0).sum(),
            done.sum(),
            (done == 0).sum(),
            ((done > 0) & (done < steps)).sum(),
        ]
        payload["counts"] = torch.stack(counts).to(device, comm.dtype)
        total = comm.sum_tree(payload)
        n_up, n_steps, n_dropped, n_partial = (round(float(c)) for c in total["counts"])
        new_server = server  # every client dropped out: the server state stays
        if n_up:
            mean_up = tree_map(lambda v: v / n_up, total["up"])
            new_server = upd.server_update(server, {**step_mean, **mean_up}, ctx, info)
        later_up += n_up * numel(total["up"])
        traffic.up += later_up / m
        traffic.down += later_down / m
        # step logs: the mean over the client-steps that ran (all ran: as without failures)
        if n_steps == m * steps:
            out = {f"train/{k}": float(v / m) / steps for k, v in total["logs"].items()}
        else:
            out = {f"train/{k}": float(v) / n_steps for k, v in total["logs"].items() if n_steps}
        out["failures/dropped"] = float(n_dropped)
        out["failures/partial"] = float(n_partial)
        out["failures/steps_completed_mean"] = n_steps / m

    if "weights" in ctx.logged:
        w = ctx.logged["weights"]
        out["dro/cohort_weight_max"] = float(w.max())
        out["dro/cohort_weight_entropy"] = float(-(w * w.clamp_min(1e-30).log()).sum())
    return RoundResult(new_server, out, traffic, ctx)
