"""The phases of :func:`~lit_fedco.engine.round.federated_round` that sum over the cohort or
touch the server: the per-step mean of the STEP entries (:func:`sync_step`), END OF ROUND,
the one collective of the uploads (:func:`aggregate`), SERVER (:func:`server_step`), the
write-back of the kept rows and the round's logs."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_fedco.core.model_stats import running_stats
from lit_fedco.core.protocol import RoundContext, Sync
from lit_fedco.core.server_opt import ServerOptimizer
from lit_fedco.core.state import State, broadcast, numel, tree_leaves, tree_map
from lit_fedco.engine.round_state import Counts, RoundRun, row_mask, sum_rows, where_rows
from lit_fedco.engine.store import ClientStore

if TYPE_CHECKING:
    from lit_fedco.updaters.base import CompositionalUpdater


def sync_step(
    r: RoundRun, states: State, keys: list[str], running: Tensor | None, last: State
) -> tuple[State, State]:
    """The mean of the STEP entries over the running clients (one collective, the count
    inside), given back to them; when every client has stopped, the last mean stays."""
    device = tree_leaves(states)[0].device
    part = {key: tree_map(lambda v: sum_rows(v, running), states[key]) for key in keys}
    total = r.comm.sum_tree({"sum": part, "running": r.count(running, device)})
    count = round(float(total["running"]))
    if not count:
        return states, last
    mean = tree_map(lambda v: v / count, total["sum"])
    synced = where_rows(running, broadcast(mean, r.n), {k: states[k] for k in keys})
    r.up += count * numel(mean)
    r.down += count * numel(mean)
    return {**states, **synced}, mean


def end_of_round(r: RoundRun, states: State, start: State, ctx: RoundContext) -> State:
    """END OF ROUND: the updater's client hook after the last local step (if it has one), told
    how many steps each client completed."""
    if not r.upd.implements("client_end"):
        return states
    ref = tree_leaves(states)[0]
    steps = torch.full((r.n,), float(r.info.local_steps)) if r.done is None else r.done.double()
    steps = steps.to(ref.device, ref.dtype)
    end = r.upd.client_end
    return r.ex.map(lambda s, k, c: end(s, start, c, k), states, steps, ctx.broadcast, r.n)


def client_stats(upd: CompositionalUpdater, states: State) -> State | None:
    """The running statistics of each client's model after its local steps (None: the model
    has none, or the clients do not hold it)."""
    names = running_stats(upd.model)
    model = states.get(upd.model_key)
    if not names or not isinstance(model, dict):
        return None
    return {name: model[name] for name in names}


def aggregate(
    r: RoundRun,
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
    finished = row_mask(took, device)
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
        "up": tree_map(lambda v: sum_rows(v, finished, weights), ups),
        "logs": log_sum,
        "counts": torch.tensor(dataclasses.astuple(counts), dtype=r.comm.dtype, device=device),
    }
    if weights is not None:
        payload["weight"] = sum_rows(weights.to(r.comm.dtype), finished)
    if stats is not None:
        payload["stats"] = tree_map(lambda v: sum_rows(v, finished, weights), stats)
    total = r.comm.sum_tree(payload)
    if stats is not None and r.upd.model_key not in ups:  # sent beside the uploads
        r.up += round(Counts.of(total).participants) * numel(total["stats"])
    return total


def aggregation_weights(r: RoundRun, ctx: RoundContext, device: torch.device) -> Tensor | None:
    """Each of this process's clients' weight in the upload means: the round context's
    (DRFL's λ_k), or by training samples when the updater declares ``aggregation="samples"``;
    None: uniform."""
    if ctx.weights is not None:
        return ctx.weights[r.positions.to(ctx.weights.device)].to(device)
    if r.upd.aggregation == "samples" and r.info.sizes is not None:
        return r.info.sizes[r.positions].to(device)
    return None


def server_step(
    r: RoundRun,
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


def write_back(r: RoundRun, store: ClientStore, states: State) -> None:
    """The kept rows of this process's clients that finished the round go back to its store
    (the process owns them: :func:`~lit_fedco.engine.store.owned_clients`)."""
    rows = {key: states[key] for key in store.rows}
    if r.done is None:
        store.write(r.clients, rows)
        return
    took = r.done > 0
    store.write(r.clients[took], tree_map(lambda v: v[took.to(v.device)], rows))


def round_logs(r: RoundRun, total: dict[str, Any], ctx: RoundContext) -> dict[str, float]:
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
