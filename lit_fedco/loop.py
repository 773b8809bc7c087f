"""The federated loop on Lightning Fabric.

One code path for 1 or N processes: every rank samples the same cohort (seeded by seed and
round), runs its share of the cohort clients (``cohort[rank::world]``, balanced), and takes
part in every collective. The communication schedule depends only on step counters, never on
data, so no rank can skip a collective. The model is not DDP-wrapped: local steps do not
communicate; every collective is one ``fabric.all_reduce`` of one flat buffer.

Randomness: the cohort of round r comes from a generator seeded by (seed, r); client k's
minibatches in round r from one seeded by (seed, k, r) (:class:`~lit_fedco.data.BatchSampler`).
A run is therefore reproducible from its round counter and server state alone, and the same on
1 and N processes up to the order of floating-point summation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric import Fabric
from lightning.fabric.loggers import Logger
from torch import Tensor
from tqdm.auto import tqdm

from lit_fedco.data import BatchSampler, FederatedData
from lit_fedco.errors import ConfigError
from lit_fedco.executors import Executor
from lit_fedco.metrics import PerClientClassification
from lit_fedco.state import State, broadcast, flatten, numel, tree_leaves, tree_map, unflatten
from lit_fedco.updaters.base import CompositionalUpdater


@dataclass(frozen=True)
class LoopConfig:
    """The schedule of a run (``ALGORITHMS.md``, "Notation").

    Attributes:
        rounds: S, the number of communication rounds.
        local_steps: I (τ), local steps per round.
        cohort: m, clients sampled per round (m = K: full participation).
        batch_size: b, minibatch size per client, per role, per step.
        eval_every: E, evaluate every E rounds (and after the last round).
        seed: seeds the cohort and minibatch generators.
        eval_batch: rows per forward pass at evaluation.
        progress: show a progress bar (rank 0).
    """

    rounds: int = 100
    local_steps: int = 5
    cohort: int = 10
    batch_size: int = 16
    eval_every: int = 10
    seed: int = 0
    eval_batch: int = 4096
    progress: bool = True

    def validate(self, num_clients: int, world_size: int = 1) -> None:
        """Range checks against K clients and the number of processes."""
        k = num_clients
        if not 1 <= self.cohort <= k:
            raise ConfigError.bad_value(
                "cohort", self.cohort, f"an int in [1, {k}] (K = {k})", str(k)
            )
        if self.cohort < world_size:
            raise ConfigError.bad_value(
                "cohort", self.cohort, f"at least the number of processes ({world_size})", str(k)
            )
        for key in ("rounds", "local_steps", "batch_size", "eval_every", "eval_batch"):
            if getattr(self, key) < 1:
                raise ConfigError.bad_value(key, getattr(self, key), "an int >= 1", "5")


def sample_cohort(seed: int, round_idx: int, num_clients: int, m: int) -> Tensor:
    """The sorted ids of the m clients of round ``round_idx``; identical on every rank."""
    if m >= num_clients:
        return torch.arange(num_clients)
    state = np.random.SeedSequence([seed, round_idx, 0xC0407]).generate_state(2)
    g = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    return torch.randperm(num_clients, generator=g)[:m].sort().values


def _client_step(upd: CompositionalUpdater, t: int, s: State, b: Any, c: Any) -> Any:
    return upd.client_step(s, b, c, t)


class Diverged(FloatingPointError):
    """The training loss became NaN or infinite (the same round on every process)."""

    def __init__(self, round_idx: int, message: str) -> None:
        super().__init__(message)
        self.round = round_idx


def client_generator(seed: int, client: int, round_idx: int) -> torch.Generator:
    """A generator for client ``client``'s conditional samples in round ``round_idx``."""
    state = np.random.SeedSequence([seed, client, round_idx, 0xA06]).generate_state(2)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class FederatedLoop:
    """Rounds of cohort sampling, local steps, aggregation and evaluation.

    Args:
        fabric: a launched :class:`lightning.fabric.Fabric`.
        updater: the algorithm.
        data: all clients' data (moved to ``fabric.device``).
        cfg: the schedule.
        executor: vectorized or sequential client execution.
        dtype: floating dtype of parameters and data.
        loggers: Fabric loggers (W&B, CSV) that rank 0 writes the round logs to.
    """

    def __init__(
        self,
        fabric: Fabric,
        updater: CompositionalUpdater,
        data: FederatedData,
        cfg: LoopConfig,
        executor: Executor,
        dtype: torch.dtype = torch.float32,
        loggers: list[Logger] | None = None,
    ) -> None:
        self.fabric = fabric
        self.updater = updater
        self.cfg = cfg
        self.executor = executor
        self.dtype = dtype
        self.rank, self.world = fabric.global_rank, fabric.world_size
        k = data.num_clients
        cfg.validate(k, self.world)
        self.data = data.to(fabric.device, dtype)
        # The objective may bring its own sampler (FCSG's tasks, or positives in every batch).
        self.sampler: BatchSampler = updater.objective.make_sampler(self.data, cfg.seed)
        updater.num_clients = k  # before init_server: some keep a value per client (DRFL's λ)
        self.server: State = tree_map(
            lambda t: t.to(fabric.device, dtype), updater.init_server(updater.params())
        )
        self.round = 0
        self.comm_total = 0.0
        # State that clients keep across rounds, one row per client, replicated on every rank
        # so that whichever rank runs a client finds it (and the checkpoint holds it).
        client0 = updater.init_client(self.server)
        self.clients: State = {key: broadcast(client0[key], k) for key in updater.persistent_keys}
        # Clients this rank evaluates (all K, sharded like the cohort) and their rows.
        self.eval_clients = torch.arange(self.rank, k, self.world)
        self._eval_rows = {
            split: self._rows_of(self.eval_clients, split) for split in ("train", "val")
        }
        # Personalised FL: each client adapts on a fixed support batch of its own training rows.
        self._eval_support = (
            self._support_rows(updater.objective.eval_support or cfg.batch_size)
            if updater.personalizes
            else None
        )
        self.metrics = {
            split: PerClientClassification(k, updater.objective.eval_classes(data.num_classes)).to(
                fabric.device
            )
            for split in ("train", "val")
        }
        self.extra_metrics = {  # e.g. average precision over all rows of the split
            split: {
                name: m.to(fabric.device) for name, m in updater.objective.eval_metrics().items()
            }
            for split in ("train", "val")
        }
        self.history: list[dict[str, float]] = []
        self.loggers = loggers or []

    # ------------------------------------------------------------------ one round
    def run_round(self) -> dict[str, float]:
        """Run round ``self.round``: broadcast, I local steps, aggregate; returns its logs."""
        cfg, upd, ex = self.cfg, self.updater, self.executor
        cohort = sample_cohort(cfg.seed, self.round, self.data.num_clients, cfg.cohort)
        mine = cohort[self.rank :: self.world]
        n, m = len(mine), len(cohort)
        roles = upd.batch_roles
        idx = self.sampler.sample_round(mine, self.round, cfg.local_steps, roles, cfg.batch_size)
        self.fabric.call("on_round_start", loop=self, cohort=cohort)

        # BROADCAST: every cohort client starts from the server's state.
        client0 = upd.init_client(self.server)
        states = broadcast(client0, n)
        sent = tree_leaves({k: v for k, v in client0.items() if k not in upd.persistent_keys})
        floats_down = sum(t.numel() for t in {id(t): t for t in sent}.values())  # a copy: once
        if upd.persistent_keys:  # client-held state (e.g. Ditto's personal model) comes back
            rows = mine.to(self.fabric.device)
            kept = {key: tree_map(lambda v: v[rows], self.clients[key]) for key in self.clients}
            states = {**states, **kept}
        if upd.client_id_key:  # each client knows its own id (not communication)
            states = {**states, upd.client_id_key: mine.to(self.fabric.device)}
        floats_up = 0

        # ROUND CONTEXT: a scalar probe per client at the broadcast point (one all-reduce).
        ctx: dict[str, Tensor] = {}
        gens = (
            [client_generator(cfg.seed, int(k), self.round) for k in mine]
            if upd.objective.has_augment
            else []
        )
        first = self._batches(idx, 0, roles, gens)
        if upd.uses_probe:
            batches = first
            probes = ex.map(lambda s, b, c: upd.probe(s, b, c), states, batches, {}, n)
            full = probes.new_zeros((self.data.num_clients, *probes.shape[1:]), dtype=self.dtype)
            full[mine.to(full.device)] = probes.to(self.dtype)
            full = self._all_reduce(full)  # client k's probe lands in row k, on every rank
            ctx = upd.round_context(self.server, full[cohort.to(full.device)], cohort)
            floats_up += probes[0].numel()
            floats_down += sum(
                v.numel() for key, v in ctx.items() if key != "weights" and key[0] != "_"
            )

        # LOCAL STEPS
        log_sum: dict[str, Tensor] = {}
        for t in range(cfg.local_steps):
            batches = first if t == 0 else self._batches(idx, t, roles, gens)
            step_fn = partial(_client_step, upd, t)
            states, logs = ex.map(step_fn, states, batches, ctx, n)
            for key, v in logs.items():
                log_sum[key] = log_sum.get(key, 0.0) + v.detach().sum()
            if upd.step_keys:  # per-step communication: cohort mean of the declared entries
                part = {key: tree_map(lambda v: v.sum(0), states[key]) for key in upd.step_keys}
                mean = self._mean(part, m)
                states = {**states, **{key: broadcast(mean[key], n) for key in upd.step_keys}}
                floats_up += numel(mean)
                floats_down += numel(mean)

        if upd.persistent_keys:  # write back: one all-reduce of this round's cohort rows
            rows = mine.to(self.fabric.device)
            part = {
                key: tree_map(
                    lambda store, v: store.new_zeros(store.shape).index_copy_(0, rows, v),
                    self.clients[key],
                    states[key],
                )
                for key in upd.persistent_keys
            }
            summed = self._mean(part, 1)
            cohort_rows = cohort.to(self.fabric.device)
            self.clients = {
                key: tree_map(
                    lambda store, new: store.index_copy(0, cohort_rows, new[cohort_rows]),
                    self.clients[key],
                    summed[key],
                )
                for key in upd.persistent_keys
            }

        # AGGREGATION: one all-reduce of [sum of uploads, sum of logs], then the server update.
        ups = ex.map(lambda s, b, c: upd.upload(s), states, None, ctx, n)
        payload = {"up": tree_map(lambda v: v.sum(0), ups), "logs": log_sum}
        mean = self._mean(payload, m)
        floats_up += numel(mean["up"])
        self.server = upd.server_update(self.server, mean["up"], ctx)

        self.comm_total += floats_up + floats_down
        out = {f"train/{k}": float(v) / cfg.local_steps for k, v in mean["logs"].items()}
        out.update(
            {
                "comm/up_floats_per_client": float(floats_up),
                "comm/down_floats_per_client": float(floats_down),
                "comm/total_floats_per_client": self.comm_total,
            }
        )
        if "weights" in ctx:
            w = ctx["weights"]
            out["dro/cohort_weight_max"] = float(w.max())
            out["dro/cohort_weight_entropy"] = float(-(w * w.clamp_min(1e-30).log()).sum())
        self.round += 1
        self.fabric.call("on_round_end", loop=self, logs=out)
        return out

    def _batches(
        self, idx: Tensor, t: int, roles: tuple[str, ...], gens: list[torch.Generator]
    ) -> dict[str, dict[str, Tensor]]:
        """Step t's minibatch per role for every client of this rank: one gather each, into
        reused buffers; then the objective's conditional samples, if it draws any."""
        out = {}
        for j, role in enumerate(roles):
            x, y = self.sampler.gather(idx[t, j], role=role)
            out[role] = {"x": x, "y": y}
            if gens:
                out[role] = self.updater.objective.augment(out[role], gens)
        return out

    def _all_reduce(self, flat: Tensor) -> Tensor:
        if self.world == 1:
            return flat
        return self.fabric.all_reduce(flat, reduce_op="sum")  # type: ignore[return-value]

    def _mean(self, tree: Any, m: int) -> Any:
        """Sum ``tree`` over ranks in one collective and divide by m."""
        flat, meta, spec = flatten(tree)
        flat = self._all_reduce(flat.to(self.dtype)) / m
        return unflatten(flat, meta, spec)

    # ------------------------------------------------------------------ evaluation
    def _rows_of(self, clients: Tensor, split: str) -> tuple[Tensor, Tensor]:
        """Row indices of ``clients``' samples in ``split`` and the client id of each row."""
        offsets = (self.data.train_offsets if split == "train" else self.data.val_offsets).cpu()
        rows, owner = [], []
        for k in clients.tolist():
            lo, hi = int(offsets[k]), int(offsets[k + 1])
            rows.append(torch.arange(lo, hi))
            owner.append(torch.full((hi - lo,), k))
        device = self.fabric.device
        return torch.cat(rows).to(device), torch.cat(owner).to(device)

    def _support_rows(self, size: int) -> Tensor:
        """``size`` training rows of each client this rank evaluates, ``[n, size]``: drawn once,
        without replacement where the client has enough rows, by a generator seeded by
        (seed, client) — the same support batch at every evaluation and on any process."""
        offsets = self.data.train_offsets.cpu()
        out = []
        for k in self.eval_clients.tolist():
            lo, n_k = int(offsets[k]), int(offsets[k + 1] - offsets[k])
            state = np.random.SeedSequence([self.cfg.seed, k, 0x5099]).generate_state(2)
            g = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
            local = (
                torch.randperm(n_k, generator=g)[:size]
                if n_k >= size
                else torch.randint(n_k, (size,), generator=g)
            )
            out.append(local + lo)
        return torch.stack(out).to(self.fabric.device)

    def personal_params(self) -> State:
        """Every evaluated client's own parameters, stacked ``[n, ...]`` in the order of
        ``eval_clients``: :meth:`CompositionalUpdater.personal_params` run by the executor."""
        upd, n = self.updater, len(self.eval_clients)
        assert self._eval_support is not None
        state = {"x": broadcast(upd.eval_params(self.server), n)}
        ids = self.eval_clients.to(self.fabric.device)
        state.update({key: tree_map(lambda v: v[ids], self.clients[key]) for key in self.clients})
        support = {
            "x": self.data.x_train[self._eval_support],
            "y": self.data.y_train[self._eval_support],
        }
        return self.executor.map(
            lambda s, b, c: upd.personal_params(s, b, c), state, support, {}, n
        )

    def _outputs(self, params: Any, split: str) -> Any:
        """``(logits, targets, client)`` chunks of this rank's rows of ``split``: with the shared
        parameters, or client by client with each one's personal parameters."""
        rows, owner = self._eval_rows[split]
        x_all, y_all = (
            (self.data.x_train, self.data.y_train)
            if split == "train"
            else (self.data.x_val, self.data.y_val)
        )
        objective, chunk = self.updater.objective, self.cfg.eval_batch
        if self._eval_support is None:
            yield from objective.eval_outputs(params, x_all, y_all, rows, owner, chunk)
            return
        for i, k in enumerate(self.eval_clients.tolist()):
            mask = owner == k
            own = tree_map(lambda v: v[i], params)
            yield from objective.eval_outputs(own, x_all, y_all, rows[mask], owner[mask], chunk)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Per-client accuracy and loss on every client's train and validation data: average,
        worst, 10th percentile (``lit_fedco.metrics``). The model is the server's, or each
        client's own after adaptation when the updater personalises (ComFedL §5.2)."""
        params = (
            self.personal_params()
            if self._eval_support is not None
            else self.updater.eval_params(self.server)
        )
        out: dict[str, float] = {}
        for split, metric in self.metrics.items():
            metric.reset()
            extras = self.extra_metrics[split]
            for extra in extras.values():
                extra.reset()
            for logits, target, who in self._outputs(params, split):
                metric.update(logits, target, who)
                for extra in extras.values():
                    extra.update(logits, target, who)
            for name, extra in extras.items():
                out[f"{split}/{name}"] = float(extra.compute())
            res = metric.compute()
            for key, v in res.items():
                if v.dim() == 0:
                    out[f"{split}/{key}"] = float(v)
            if split == "train":
                w = self.updater.client_weights(self.server, res["loss_per_client"].to(self.dtype))
                if w is not None:
                    out["dro/weight_max"] = float(w.max())
                    if len(w) <= 32:
                        out.update({f"dro/weight_client{k}": float(v) for k, v in enumerate(w)})
            if split == "val":
                self.last_per_client = res["acc_per_client"].cpu()
                self.last_per_class = res["acc_per_class"].cpu()
                # per-class accuracy (imbalanced data: the minority classes are the point);
                # classes without validation samples are left out
                out.update(
                    {
                        f"val/acc_class{c}": float(v)
                        for c, v in enumerate(self.last_per_class.tolist())
                        if not math.isnan(v)
                    }
                )
        self.fabric.call("on_eval_end", loop=self, metrics=out)
        return out

    # ------------------------------------------------------------------ driver
    def run(self) -> dict[str, float]:
        """Run the remaining rounds; evaluate every E rounds and at the end; log everything."""
        cfg = self.cfg
        bar = tqdm(
            total=cfg.rounds,
            initial=self.round,
            desc=self.updater.name,
            disable=not cfg.progress or self.rank != 0,
            dynamic_ncols=True,
        )
        final: dict[str, float] = {}
        while self.round < cfg.rounds:
            logs = self.run_round()
            if self.round % cfg.eval_every == 0 or self.round == cfg.rounds:
                logs.update(self.evaluate())
                final = logs
                bar.set_postfix(
                    avg=f"{logs['val/acc_avg']:.3f}", worst=f"{logs['val/acc_worst']:.3f}"
                )
            if not math.isfinite(logs.get("train/loss", 0.0)):
                bar.close()
                raise Diverged(
                    self.round,
                    f"{self.updater.name}: training loss became {logs['train/loss']} in round "
                    f"{self.round}; lower the step size ({self.updater.name}.lr)",
                )
            if self.rank == 0:
                for logger in self.loggers:
                    logger.log_metrics(logs, step=self.round)
            self.history.append(logs)
            bar.update(1)
        bar.close()
        return final

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: round counter, server state, the state clients keep
        across rounds, communication count.

        Other client state is rebuilt from the server state at every round, and minibatches,
        cohorts and conditional samples are functions of (seed, client, round), so there is no
        other RNG state.
        """
        return {
            "round": self.round,
            "server": self.server,
            "clients": self.clients,
            "comm_total": self.comm_total,
            "seed": self.cfg.seed,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the seed must match."""
        if int(sd["seed"]) != self.cfg.seed:
            raise ConfigError.bad_value(
                "seed", self.cfg.seed, f"the checkpoint's seed {sd['seed']}", str(sd["seed"])
            )
        self.round = int(sd["round"])
        self.comm_total = float(sd["comm_total"])
        self.server = tree_map(lambda t: t.to(self.fabric.device, self.dtype), sd["server"])
        self.clients = tree_map(lambda t: t.to(self.fabric.device, self.dtype), sd["clients"])

    def save(self, path: str | Path) -> None:
        """Save :meth:`state_dict` with ``fabric.save`` (rank 0 writes)."""
        self.fabric.save(path, {"loop": self.state_dict()})

    def load(self, path: str | Path) -> None:
        """Resume from a file written by :meth:`save`."""
        if not Path(path).exists():
            raise ConfigError.bad_value(
                "resume", str(path), "an existing checkpoint file", "runs/x.ckpt"
            )
        self.load_state_dict(self.fabric.load(path)["loop"])
