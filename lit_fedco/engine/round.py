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

The round's bookkeeping (:class:`~lit_fedco.engine.round_state.RoundRun`, what it returns, its
counts) lives in :mod:`lit_fedco.engine.round_state`; the phases from the per-step sync on
(aggregation, the server step, the write-back, the logs) in :mod:`lit_fedco.engine.round_phases`.
"""

from __future__ import annotations

import weakref
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
from lit_fedco.core.state import State, broadcast, numel, tree_leaves
from lit_fedco.engine.comm import Comm
from lit_fedco.engine.executors import Executor
from lit_fedco.engine.failures import Failures
from lit_fedco.engine.round_phases import (
    aggregate,
    client_stats,
    end_of_round,
    round_logs,
    server_step,
    sync_step,
    write_back,
)
from lit_fedco.engine.round_state import (
    Counts,
    RoundResult,
    RoundRun,
    Traffic,
    add_logs,
    unique_numel,
    where_rows,
)
from lit_fedco.engine.store import ClientStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from lit_fedco.updaters.base import CompositionalUpdater

    Batches = Callable[[int], Any]
    """``batches(t)``: step t's minibatches of this process's cohort clients, ``[n, ...]``."""


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


# ---------------------------------------------------------------------- phases
def broadcast_state(r: RoundRun, server: State, store: ClientStore | None) -> tuple[State, State]:
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
    r: RoundRun, server: State, states: State, first: Any
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
    r: RoundRun, states: State, batches: Batches, first: Any, ctx: RoundContext
) -> tuple[State, dict[str, Any], State]:
    """LOCAL STEPS: the one loop over t; client k runs step t while t < t_k. Returns the final
    states, the sums of the step logs over the client-steps that ran, and the last per-step
    means of the STEP entries. A step runs in place (the updater's ``client_step_inplace``,
    writing into the clients' rows) where every client of the process steps, else out of
    place through ``client_step`` (or its stacked form)."""
    step_keys = [k for k, s in r.upd.client_state.items() if s is Sync.STEP]
    device = tree_leaves(states)[0].device
    log_sum: dict[str, Any] = {}
    step_mean: State = {}
    stats = running_stats(r.upd.model)  # batch norms' running statistics, updated per step
    draws = draws_randomly(r.upd.model)  # dropout: seeded per client and step
    fast = r.ex.fast_steps and not draws  # the updater's own fast forms of its step
    stacked = fast and r.ex.stacks and r.upd.stacked()  # over the stacked clients
    inplace = fast and r.ex.in_place and r.upd.inplace()  # into the clients' rows
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
            states = where_rows(running, new, states)
        add_logs(log_sum, logs, running)
        if step_keys:
            states, step_mean = sync_step(r, states, step_keys, running, step_mean)
    return states, log_sum, step_mean


def _model_step(
    r: RoundRun, states: State, b: Any, t: int, stacked: bool, stats: bool, draws: bool
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


def _updated_stats(r: RoundRun, states: State, b: Any, t: int | None) -> State | None:
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
    r = RoundRun(updater, info, clients, positions, comm, executor, done)
    start, states = broadcast_state(r, server, store)
    first = batches(0)
    ctx, states = round_context(r, server, states, first)
    states, log_sum, step_mean = local_steps(r, states, batches, first, ctx)
    stats = client_stats(updater, states)  # before the end hook: it may drop the model
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
