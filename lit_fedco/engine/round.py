"""One federated round, written once: the loop, the examples and the tests all call
:func:`federated_round`. Its phases, in the order they run::

    start  = server entries in broadcast_keys ∪ init_client(server, info)        BROADCAST
    state  = start, with the client's own kept (KEEP) rows
    ctx    = round_context(server, info, probe)          probe(fn): fn on every cohort client
    state += the client's row of ctx.per_client                                   ROUND CONTEXT
    for t in range(I):                                                            LOCAL STEPS
        state, logs = client_step(state, batches(t), ctx.broadcast, info.step(t))
        state[STEP entries] ← their mean over the running clients                 (a collective)
    state  = client_end(state, start, ctx.broadcast, steps completed)             END OF ROUND
    sums   = Σ over the clients that finished of w_k · ROUND entries, w_k, the step logs
             and the participant counts                                           (one collective)
    server = server_update(server, means ∪ STEP means, ctx, info with participants)
    server[model] = server optimizer step from the old model, if any               SERVER
    store  ← the kept rows of the clients that finished (each process its own clients' rows)

Every collective goes through a :class:`~lit_fedco.engine.comm.Comm` and sums; a mean is that
sum divided by a count summed in the same buffer. A client completes t_k of the I local steps
(:class:`~lit_fedco.engine.failures.Failures`; t_k = I without failures, 0 when it drops out):
it runs step t while t < t_k, a stopped client's state stops changing, a per-step mean is over
the clients still running and an upload mean over those with t_k ≥ 1, a dropped client's kept
rows are not written back, and a round in which every client drops leaves the server state as
it was (``server_update`` is not called). Without failures every count is m: the same
arithmetic, the same code. Traffic is counted per client from what each one actually sends and
receives (:class:`Traffic`). Where the updater has its own fast form of ``client_step``, the
executor runs that instead, with the same numbers: ``client_step_stacked`` over the vectorized
executor's stacked clients, ``client_step_inplace`` into the sequential executor's rows at a step
every client of the process runs.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_fedco.core.model_stats import (
    captured_stats,
    capturing_stats,
    running_stats,
    updated_stats,
)
from lit_fedco.core.models import draws_randomly
from lit_fedco.core.protocol import LOCAL_STATS, RoundContext, RoundInfo, StepInfo, Sync
from lit_fedco.core.seeding import dropout_seed
from lit_fedco.core.server_opt import ServerOptimizer
from lit_fedco.core.state import State, broadcast, numel, tree_leaves, tree_map
from lit_fedco.engine.comm import Comm
from lit_fedco.engine.executors import Executor
from lit_fedco.engine.failures import Failures
from lit_fedco.engine.store import ClientStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from lit_fedco.updaters.base import CompositionalUpdater

    Batches = Callable[[int], Any]
    """``batches(t)``: step t's minibatches of this process's cohort clients, ``[n, ...]``."""


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
        """The counts of a summed payload (:func:`aggregate`)."""
        return cls(*(float(v) for v in total["counts"].tolist()))


@dataclass
class _Round:
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
        return None if self.done is None else _mask(self.done > t, device)

    def count(self, mask: Tensor | None, device: torch.device) -> Tensor:
        """How many of this process's clients ``mask`` marks (all with None), as a 0-d tensor
        of the summing dtype, to travel in a collective beside what it counts."""
        n = self.n if mask is None else int(mask.sum())
        return torch.tensor(float(n), dtype=self.comm.dtype, device=device)


def _mask(flags: Tensor, device: torch.device) -> Tensor | None:
    """``flags`` (``[n]`` bool) as a row mask on ``device``; None when every row is set: the
    arithmetic of a round in which every client runs."""
    return None if bool(flags.all()) else flags.to(device)


def _where(mask: Tensor | None, new: Any, old: Any) -> Any:
    """Rows of ``new`` where ``mask`` (``[n]`` bool), of ``old`` elsewhere; ``new`` when there is
    no mask. Entries that ``old`` lacks come from ``new`` (a state entry the step creates)."""
    if mask is None:
        return new
    if isinstance(new, dict):
        return {k: _where(mask, v, old[k]) if k in old else v for k, v in new.items()}
    return torch.where(mask.view(-1, *[1] * (new.dim() - 1)), new, old)


def _sum_rows(v: Tensor, mask: Tensor | None, weights: Tensor | None = None) -> Tensor:
    """The sum over the leading (client) dimension of the rows where ``mask`` (all rows with
    None), each row times its weight when ``weights`` (``[n]``) are given."""
    if weights is not None:
        v = weights.view(-1, *[1] * (v.dim() - 1)).to(v.dtype) * v
    if mask is None:
        return v.sum(0)
    return torch.where(mask.view(-1, *[1] * (v.dim() - 1)), v, 0).sum(0)


def _add_logs(log_sum: dict[str, Any], logs: dict[str, Tensor], running: Tensor | None) -> None:
    """Add one step's logs (``[n]`` per key) of the clients marked ``running`` (all with None)
    to the round's sums."""
    for key, v in logs.items():
        log_sum[key] = log_sum.get(key, 0.0) + _sum_rows(v.detach(), running)


def unique_numel(tree: Any) -> int:
    """Elements of the distinct tensors of ``tree`` (one tensor under two keys is sent once)."""
    return sum(t.numel() for t in {id(t): t for t in tree_leaves(tree)}.values())


def _step(upd: CompositionalUpdater, step: StepInfo, s: State, b: Any, c: Any) -> Any:
    return upd.client_step(s, b, c, step)


def _stacked_step(upd: CompositionalUpdater, step: StepInfo, s: State, b: Any, c: Any) -> Any:
    return upd.client_step_stacked(s, b, c, step)


def _inplace_step(upd: CompositionalUpdater, step: StepInfo, s: State, b: Any, c: Any) -> Any:
    logs = upd.client_step_inplace(s, b, c, step)
    if not isinstance(logs, dict):  # e.g. client_step's (state, logs) returned by mistake
        raise TypeError(
            f"{type(upd).__name__}.client_step_inplace must return the step's logs (a dict of "
            f"scalars) after writing the step into state, got {type(logs).__name__}"
        )
    return logs


def _inplace_step_t(upd: CompositionalUpdater, info: RoundInfo, t: int, s: State, b: Any,
                    c: Any) -> Any:  # fmt: skip
    return _inplace_step(upd, info.step(t), s, b, c)


HELD_BATCHES_BYTES = 64 * 2**20
"""The most memory a round holds for all its steps' minibatches at once, so that the sequential
executor can run each client's in-place steps back to back; above it, the clients step
together, one step after another (the same numbers either way)."""


def _held_batches(batches: Batches, first: Any, steps: int) -> list[Any] | None:
    """Every step's minibatches of the round (``first`` is step 0's), or None when they would
    take more than :data:`HELD_BATCHES_BYTES`. Each step's but the last is a copy: the sampler
    writes step t + 1's into the buffers of step t's."""
    leaves = tree_leaves(first)
    size = sum(v.numel() * v.element_size() for v in leaves if isinstance(v, Tensor))
    if size * steps > HELD_BATCHES_BYTES:
        return None

    def copy(v: Any) -> Any:
        return v.clone() if isinstance(v, Tensor) else v

    held = []
    for t in range(steps):
        b = first if t == 0 else batches(t)
        held.append(b if t == steps - 1 else tree_map(copy, b))
    return held


# ---------------------------------------------------------------------- phases
def broadcast_state(r: _Round, server: State, store: ClientStore | None) -> tuple[State, State]:
    """BROADCAST: what every cohort client receives (``start``, unbatched), and the clients'
    states: ``start`` with each one's kept rows from the store (``[n, ...]``)."""
    upd = r.upd
    start = {k: server[k] for k in upd.broadcast_keys if k in server}
    start.update(upd.init_client(server, r.info))
    sync = upd.client_state
    r.down += r.m * unique_numel({k: v for k, v in start.items() if sync.get(k) is not Sync.KEEP})
    states = broadcast(start, r.n)
    if store is not None and store.rows:
        states = {**states, **store.read(r.clients)}
    if upd.local_stats and LOCAL_STATS in states:  # each client's own running statistics
        key = upd.model_key
        states = {**states, key: {**states[key], **states[LOCAL_STATS]}}
    return start, states


def round_context(
    r: _Round, server: State, states: State, first: Any
) -> tuple[RoundContext, State]:
    """ROUND CONTEXT: the updater's decisions for the round, from the cohort's probes when it
    asks for them; each client gets its own row of ``per_client``. A client that drops out does
    so after this point: its probe is part of the context."""

    def probe(fn: Callable[[State, Any], Any]) -> Tensor:
        local = r.ex.map(lambda s, b, c: fn(s, b), states, first, {}, r.n)
        rows = r.comm.cohort_rows(local, r.positions, r.m)
        r.up += r.m * rows[0].numel()
        return rows

    ctx = r.upd.round_context(server, r.info, probe)
    r.down += r.m * numel(ctx.broadcast)
    if ctx.per_client:  # each client receives its own row
        own = {k: v[r.positions.to(v.device)] for k, v in ctx.per_client.items()}
        states = {**states, **own}
        r.down += r.m * sum(v[0].numel() for v in ctx.per_client.values())
    return ctx, states


def local_steps(
    r: _Round, states: State, batches: Batches, first: Any, ctx: RoundContext
) -> tuple[State, dict[str, Any], State]:
    """LOCAL STEPS: the one loop over t; client k runs step t while t < t_k. Returns the final
    states, the sums of the step logs over the client-steps that ran, and the last per-step
    means of the STEP entries. An in-place step that every client runs I times and that syncs
    nothing per step runs client by client instead, each client's steps back to back
    (:meth:`~lit_fedco.engine.executors.SequentialExecutor.map_steps`): the same steps, the
    same sums of the logs."""
    step_keys = [k for k, s in r.upd.client_state.items() if s is Sync.STEP]
    device = tree_leaves(states)[0].device
    log_sum: dict[str, Any] = {}
    step_mean: State = {}
    stats = running_stats(r.upd.model)  # batch norms' running statistics, updated per step
    draws = draws_randomly(r.upd.model)  # dropout: seeded per client and step
    fast = r.ex.fast_steps and not draws  # the updater's own fast forms of its step
    stacked = fast and r.ex.stacks and r.upd.stacked()  # over the stacked clients
    inplace = fast and r.ex.in_place and r.upd.inplace()  # into the clients' rows
    held = (
        _held_batches(batches, first, r.info.local_steps)
        if inplace and r.done is None and not step_keys and r.n
        else None
    )
    if held is not None:  # each client's steps back to back (the same steps, client-major)
        step = partial(_inplace_step_t, r.upd, r.info)
        if stats:
            step = partial(_inplace_own_stats, r.upd, step)
        for logs in r.ex.map_steps(step, states, held, ctx.broadcast, r.n):
            _add_logs(log_sum, logs, None)
        return states, log_sum, step_mean
    for t in range(r.info.local_steps):
        running = r.running(t, device)
        b = first if t == 0 else batches(t)
        info = r.info.step(t)
        if inplace and running is None and r.n:  # every client of the process steps
            step = partial(_inplace_step, r.upd, info)
            if stats:
                step = partial(_inplace_own_stats, r.upd, step)
            logs = r.ex.map(step, states, b, ctx.broadcast, r.n)
        else:
            step, b, fresh = _model_step(r, states, b, t, stacked, bool(stats), draws)
            new, logs = r.ex.map(step, states, b, ctx.broadcast, r.n, stacked)
            if fresh is not None:
                new = {**new, **{k: {**new[k], **v} for k, v in fresh.items()}}
            states = _where(running, new, states)
        _add_logs(log_sum, logs, running)
        if step_keys:
            states, step_mean = sync_step(r, states, step_keys, running, step_mean)
    return states, log_sum, step_mean


def _model_step(
    r: _Round, states: State, b: Any, t: int, stacked: bool, stats: bool, draws: bool
) -> tuple[Any, Any, State | None]:
    """Step t's per-client function and batches, and the running statistics to write over
    the step's (None: none, or the function writes them itself). Clients run one by one
    outside ``torch.func`` (the sequential executor) take the statistics from the step's own
    forward (:func:`_own_stats`); vmapped ones from a forward of their own
    (:func:`_updated_stats`). A model that draws randomly is seeded per client and step."""
    step = partial(_stacked_step if stacked else _step, r.upd, r.info.step(t))
    own = stats and r.ex.in_place
    if own:
        step = partial(_own_stats, r.upd, step)
    if draws:  # each client's forwards seeded by (seed, client, round, step)
        b = {**b, _CLIENT: r.clients}
        step = partial(_seeded, step, r.info, t)
    fresh = _updated_stats(r, states, b, t if draws else None) if stats and not own else None
    return step, b, fresh


def _own_stats(upd: CompositionalUpdater, step: Any, s: State, b: Any, c: Any) -> Any:
    """One client's out-of-place ``step``, its model entries' running statistics those its own
    first forward left where that forward was on the step's first minibatch at the step's
    starting point (:func:`~lit_fedco.core.model_stats.captured_stats`), else from a forward of
    their own (:func:`~lit_fedco.core.model_stats.updated_stats`): the same numbers, one forward
    less."""
    model = upd.model
    with capturing_stats(model) as slot:
        new, logs = step(s, b, c)
    x = _stats_inputs(upd, b)
    if x is None:
        return new, logs
    fresh: State = {}
    for i, key in enumerate(k for k in (upd.model_key, upd.personal_key) if k and k in s):
        got = captured_stats(slot, model, s[key], x) if i == 0 else None
        fresh[key] = {**new[key], **(got if got is not None else updated_stats(model, s[key], x))}
    return {**new, **fresh}, logs


_CAPTURES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
"""Per updater: whether its in-place step's first forward was found to be the one the running
statistics are updated by (then no copy of the starting point is kept for a fallback)."""


def _inplace_own_stats(upd: CompositionalUpdater, step: Any, *args: Any) -> Any:
    """One client's in-place ``step`` (its last three arguments: state, batches, context), then
    the running statistics written into the model entry's rows: those its own first forward
    left where that forward was on the step's first minibatch at the step's starting point
    (FedAvg's and SCAFFOLD's on a classification problem), else from a forward of their own at
    a copy of the starting point, kept while the updater's steps are not known to capture them.

    Raises:
        RuntimeError: a step whose forward captured them before did not.
    """
    s, b = args[-3], args[-2]
    key = upd.model_key
    x = _stats_inputs(upd, b)
    known = _CAPTURES.get(upd)
    start = None if known or x is None else {n: v.clone() for n, v in s[key].items()}
    with capturing_stats(upd.model) as slot:
        logs = step(*args)
    if x is None:
        return logs
    got = captured_stats(slot, upd.model, s[key], x)
    if got is None and start is None:
        raise RuntimeError(
            f"{type(upd).__name__}.client_step_inplace took its first forward elsewhere than on "
            "the step's first minibatch at the step's starting point, unlike its earlier steps"
        )
    _CAPTURES[upd] = got is not None and known is not False
    if got is None:
        assert start is not None
        got = updated_stats(upd.model, start, x)
    for name, value in got.items():
        s[key][name].copy_(value)
    return logs


def _stats_inputs(upd: CompositionalUpdater, b: Any) -> Any:
    """The inputs of a step's first minibatch (its first role's ``x``), on which the running
    statistics are updated; None when the step's batches carry no such rows."""
    for role in upd.batch_roles:
        batch = b.get(role) if isinstance(b, dict) else None
        if isinstance(batch, dict) and isinstance(batch.get(_INPUTS), Tensor):
            return batch[_INPUTS]
    return None


_INPUTS = "x"
"""A minibatch's inputs (:data:`lit_fedco.objectives.base.Batch`: ``{"x": ..., "y": ...}``)."""
_CLIENT = "__client__"
"""The key under which a step's batches carry each client's id when the model draws randomly."""


def _seeded(step: Any, info: RoundInfo, t: int, s: State, b: Any, c: Any) -> Any:
    """``step`` for one client, the global generator seeded by (seed, client, round, t) for it
    (:func:`~lit_fedco.core.seeding.dropout_seed`) and restored after."""
    b = dict(b)
    client = int(b.pop(_CLIENT))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(dropout_seed(info.seed, client, info.round, t))
        return step(s, b, c)


def _updated_stats(r: _Round, states: State, b: Any, t: int | None) -> State | None:
    """The running statistics of each client's model entries (the updater's ``model_key`` and
    ``personal_key``) after a training forward on the step's first minibatch at the step's
    starting point (:func:`~lit_fedco.core.model_stats.updated_stats`): what a plain loop's forward
    leaves in the batch norms, written over what the step itself made of them. With ``t``
    (a model that draws randomly), each client's forward is seeded as its step's is."""
    x = _stats_inputs(r.upd, b)
    if x is None:
        return None
    keys = [k for k in (r.upd.model_key, r.upd.personal_key) if k and k in states]
    model = r.upd.model

    def fresh(s: State, inputs: Any, c: Any) -> State:
        return {k: updated_stats(model, s[k], inputs) for k in keys}

    inputs: Any = x
    fn: Any = fresh
    if t is not None:
        inputs = {_INPUTS: x, _CLIENT: b[_CLIENT]}
        fn = partial(_seeded, lambda s, bb, c: fresh(s, bb[_INPUTS], c), r.info, t)
    out: State = r.ex.map(fn, {k: states[k] for k in keys}, inputs, {}, r.n)
    return out


def sync_step(
    r: _Round, states: State, keys: list[str], running: Tensor | None, last: State
) -> tuple[State, State]:
    """The mean of the STEP entries over the running clients (one collective, the count
    inside), given back to them; when every client has stopped, the last mean stays."""
    device = tree_leaves(states)[0].device
    part = {key: tree_map(lambda v: _sum_rows(v, running), states[key]) for key in keys}
    total = r.comm.sum_tree({"sum": part, "running": r.count(running, device)})
    count = round(float(total["running"]))
    if not count:
        return states, last
    mean = tree_map(lambda v: v / count, total["sum"])
    synced = _where(running, broadcast(mean, r.n), {k: states[k] for k in keys})
    r.up += count * numel(mean)
    r.down += count * numel(mean)
    return {**states, **synced}, mean


def end_of_round(r: _Round, states: State, start: State, ctx: RoundContext) -> State:
    """END OF ROUND: the updater's client hook after the last local step (if it has one), told
    how many steps each client completed."""
    if not r.upd.implements("client_end"):
        return states
    ref = tree_leaves(states)[0]
    steps = torch.full((r.n,), float(r.info.local_steps)) if r.done is None else r.done.double()
    steps = steps.to(ref.device, ref.dtype)
    end = r.upd.client_end
    return r.ex.map(lambda s, k, c: end(s, start, c, k), states, steps, ctx.broadcast, r.n)


def _client_stats(upd: CompositionalUpdater, states: State) -> State | None:
    """The running statistics of each client's model after its local steps (None: the model
    has none, or the clients do not hold it)."""
    names = running_stats(upd.model)
    model = states.get(upd.model_key)
    if not names or not isinstance(model, dict):
        return None
    return {name: model[name] for name in names}


def aggregate(
    r: _Round,
    states: State,
    ctx: RoundContext,
    log_sum: dict[str, Any],
    stats: State | None = None,
) -> dict[str, Any]:
    """One collective of the round's sums over the clients that finished: their (weighted)
    ``ROUND`` entries and weights, the step logs, the participant counts, and the running
    statistics of their models (weighted as the uploads are), which the server's model then
    takes as they are (:func:`server_step`)."""
    device = tree_leaves(states)[0].device
    done, steps = r.done, r.info.local_steps
    took = torch.ones(r.n, dtype=torch.bool) if done is None else done > 0
    finished = _mask(took, device)
    weights = aggregation_weights(r, ctx, device)
    sync = r.upd.client_state
    ups = {k: states[k] for k, s in sync.items() if s is Sync.ROUND and k in states}
    sizes = r.info.sizes[r.positions][took] if r.info.sizes is not None else torch.zeros(0)
    counts = Counts(
        participants=float(took.sum()),
        client_steps=float(r.n * steps if done is None else done.sum()),
        dropped=0.0 if done is None else float((done == 0).sum()),
        partial=0.0 if done is None else float(((done > 0) & (done < steps)).sum()),
        samples=float(sizes.sum()),
    )
    payload: dict[str, Any] = {
        "up": tree_map(lambda v: _sum_rows(v, finished, weights), ups),
        "logs": log_sum,
        "counts": torch.tensor(dataclasses.astuple(counts), dtype=r.comm.dtype, device=device),
    }
    if weights is not None:
        payload["weight"] = _sum_rows(weights.to(r.comm.dtype), finished)
    if stats is not None:
        payload["stats"] = tree_map(lambda v: _sum_rows(v, finished, weights), stats)
    total = r.comm.sum_tree(payload)
    if stats is not None and r.upd.model_key not in ups:  # sent beside the uploads
        r.up += round(Counts.of(total).participants) * numel(total["stats"])
    return total


def aggregation_weights(r: _Round, ctx: RoundContext, device: torch.device) -> Tensor | None:
    """Each of this process's clients' weight in the upload means: the round context's
    (DRFL's λ_k), or by training samples when the updater declares ``aggregation="samples"``;
    None: uniform."""
    if ctx.weights is not None:
        return ctx.weights[r.positions.to(ctx.weights.device)].to(device)
    if r.upd.aggregation == "samples" and r.info.sizes is not None:
        return r.info.sizes[r.positions].to(device)
    return None


def server_step(
    r: _Round,
    server: State,
    total: dict[str, Any],
    step_mean: State,
    ctx: RoundContext,
    server_opt: ServerOptimizer | None,
) -> State:
    """SERVER: the means of the uploads, ``server_update``, then the server optimizer on the
    model (the change the update proposes is its pseudo-gradient). Nothing when every client
    dropped out."""
    upd = r.upd
    counts = Counts.of(total)
    n_up, samples = round(counts.participants), counts.samples
    if not n_up:
        return server
    mean = tree_map(lambda v: v / n_up, total["up"])
    stats = tree_map(lambda v: v / n_up, total.get("stats", {}))
    if "weight" in total:  # Σ w u / Σ w, as a ratio of means over the participants
        w = total["weight"] / n_up
        mean = tree_map(lambda v: v / w, mean) if float(w) != 0 else {}
        stats = tree_map(lambda v: v / w, stats) if float(w) != 0 else {}
    info = dataclasses.replace(
        r.info, participants=n_up, participant_samples=samples if r.info.sizes is not None else None
    )
    new = upd.server_update(server, {**step_mean, **mean}, ctx, info)
    key = upd.model_key
    if server_opt is not None:
        new = {**new, key: _server_opt_step(server_opt, upd, server[key], new[key])}
    if stats:  # the clients' statistics, whatever the update made of the model's entries
        new = {**new, key: {**new[key], **stats}}
    return new


def _server_opt_step(
    opt: ServerOptimizer, upd: CompositionalUpdater, old: State, proposed: State
) -> State:
    """The server optimizer's step on the model's parameters; running statistics are no
    parameters (a momentum or Adam step on a variance could turn it negative): they are the
    clients' mean (:func:`server_step`)."""
    stats = running_stats(upd.model)
    if not stats:
        return opt.step(old, proposed)
    stepped = opt.step(
        {k: v for k, v in old.items() if k not in stats},
        {k: v for k, v in proposed.items() if k not in stats},
    )
    return {k: stepped[k] if k in stepped else proposed[k] for k in proposed}


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
    server_opt: ServerOptimizer | None = None,
) -> RoundResult:
    """Run one round of ``updater`` for this process's share ``clients`` of ``info.cohort``.

    Args:
        updater: the algorithm.
        server: the server state before the round (not modified).
        info: the round's index, K, cohort, I, seed (and the cohort's sizes, if known).
        clients: the cohort clients this process runs (a subset of ``info.cohort``, sorted).
        batches: ``batches(t)`` gives step t's minibatches of ``clients``; step 0's batches
            also feed the probes.
        comm: sums over processes.
        executor: runs a per-client function over ``clients`` (vmapped or in a loop).
        store: the clients' kept (``Sync.KEEP``) entries, read at the start and written back
            at the end; needed only when the updater declares such entries.
        failures: simulated client failures; None or probabilities 0: none.
        server_opt: the server optimizer applied to the model's change; None: none.

    Returns:
        The new server state, the round's logs, the traffic per client and the context.
    """
    done = failures.steps(info, clients) if failures is not None else None
    positions = torch.searchsorted(info.cohort, clients)  # this process's rows of the cohort
    r = _Round(updater, info, clients, positions, comm, executor, done)
    start, states = broadcast_state(r, server, store)
    first = batches(0)
    ctx, states = round_context(r, server, states, first)
    states, log_sum, step_mean = local_steps(r, states, batches, first, ctx)
    stats = _client_stats(updater, states)  # before the end hook: it may drop the model
    states = end_of_round(r, states, start, ctx)
    if updater.local_stats and stats is not None:  # kept for the next round (buffers=local)
        states = {**states, LOCAL_STATS: stats}
    total = aggregate(r, states, ctx, log_sum, stats)
    new_server = server_step(r, server, total, step_mean, ctx, server_opt)
    if store is not None and store.rows:
        write_back(r, store, states)
    r.up += round(Counts.of(total).participants) * numel(total["up"])
    traffic = Traffic(r.up / r.m, r.down / r.m)
    return RoundResult(new_server, round_logs(r, total, ctx), traffic, ctx)


def write_back(r: _Round, store: ClientStore, states: State) -> None:
    """The kept rows of this process's clients that finished the round go back to its store
    (the process owns them: :func:`~lit_fedco.engine.store.owned_clients`)."""
    rows = {key: states[key] for key in store.rows}
    if r.done is None:
        store.write(r.clients, rows)
        return
    took = r.done > 0
    store.write(r.clients[took], tree_map(lambda v: v[took.to(v.device)], rows))


def round_logs(r: _Round, total: dict[str, Any], ctx: RoundContext) -> dict[str, float]:
    """The round's logs: the step logs' means over the client-steps that ran, the failures'
    counts (when clients can fail) and the round context's weights."""
    m, steps = r.m, r.info.local_steps
    counts = Counts.of(total)
    n_steps, n_dropped, n_partial = (
        round(c) for c in (counts.client_steps, counts.dropped, counts.partial)
    )
    if n_steps == m * steps:  # every client ran every step
        out = {f"train/{k}": float(v / m) / steps for k, v in total["logs"].items()}
    else:
        out = {f"train/{k}": float(v) / n_steps for k, v in total["logs"].items() if n_steps}
    if r.done is not None:
        out["failures/dropped"] = float(n_dropped)
        out["failures/partial"] = float(n_partial)
        out["failures/steps_completed_mean"] = n_steps / m
    w = ctx.cohort_weights
    if w is not None:
        out["dro/cohort_weight_max"] = float(w.max())
        out["dro/cohort_weight_entropy"] = float(-(w * w.clamp_min(1e-30).log()).sum())
    out.update({f"round/{k}": float(v) for k, v in ctx.logged.items()})
    return out
