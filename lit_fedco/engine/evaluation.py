"""Evaluation of a federated model on every client's own data.

Each process evaluates its share of the K clients (``rank::world``, like the cohort) and the
per-client metrics are sum states (:mod:`lit_fedco.core.metrics`), so the result is the same on 1
and N processes. The model is the server's, or, when the updater personalises, each client's
own parameters after adaptation on a fixed support batch of its training rows (ComFedL §5.2).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from lit_fedco.core.metrics import PerClientClassification
from lit_fedco.core.protocol import LOCAL_STATS
from lit_fedco.core.seeding import support_generator
from lit_fedco.core.state import State, broadcast, tree_map
from lit_fedco.data import FederatedData
from lit_fedco.engine.executors import Executor
from lit_fedco.engine.store import ClientStore, owned_by
from lit_fedco.objectives.base import class_labels
from lit_fedco.problems import Problem
from lit_fedco.updaters.base import CompositionalUpdater


class Evaluator:
    """Per-client accuracy and loss on train and validation data, and the problem's extras.

    Args:
        updater: the algorithm (its objective, and its kept personal models if any).
        problem: the task: outputs, classes, extra metrics, adaptation before scoring.
        data: every client's data, on ``device``.
        executor: runs each client's adaptation (personalised FL).
        rank, world: this process and the number of processes.
        seed: seeds the support batches, by (seed, client).
        support_size: rows of a support batch when the problem does not say.
        eval_batch: rows per forward pass.
        device: where the data and metrics live.
    """

    def __init__(
        self,
        updater: CompositionalUpdater,
        problem: Problem,
        data: FederatedData,
        executor: Executor,
        rank: int,
        world: int,
        seed: int,
        support_size: int,
        eval_batch: int,
        device: torch.device,
    ) -> None:
        self.updater, self.problem, self.data, self.executor = updater, problem, data, executor
        self.seed, self.eval_batch, self.device = seed, eval_batch, device
        k = data.num_clients
        self.clients = owned_by(rank, world, k)  # the clients this process evaluates and keeps
        self.rows = {split: self._rows_of(split) for split in ("train", "val")}
        # each client scored with its own parameters: its kept personal model (Ditto), or the
        # shared model adapted on a fixed support batch of its own rows (personalised FL)
        self.kept_personal = bool(updater.personal_key)
        self.local_stats = bool(updater.local_stats)  # model.buffers=local: its own statistics
        self.support = (
            self._support_rows(problem.eval_support or support_size)
            if self.kept_personal or problem.eval_adapt_steps > 0
            else None
        )
        classes = problem.eval_classes()
        self.metrics = {
            split: PerClientClassification(k, classes).to(device) for split in ("train", "val")
        }
        self.extra_metrics = {  # e.g. average precision over all rows of the split
            split: {name: m.to(device) for name, m in problem.eval_metrics().items()}
            for split in ("train", "val")
        }
        self.last_per_client: Tensor | None = None
        self.last_per_class: Tensor | None = None

    def _rows_of(self, split: str) -> tuple[Tensor, Tensor]:
        """Row indices of this process's clients' samples in ``split`` and each row's client."""
        offsets = (self.data.train_offsets if split == "train" else self.data.val_offsets).cpu()
        rows, owner = [], []
        for k in self.clients.tolist():
            lo, hi = int(offsets[k]), int(offsets[k + 1])
            rows.append(torch.arange(lo, hi))
            owner.append(torch.full((hi - lo,), k))
        return torch.cat(rows).to(self.device), torch.cat(owner).to(self.device)

    def _support_rows(self, size: int) -> Tensor:
        """``size`` training rows of each evaluated client, ``[n, size]``: drawn once, without
        replacement where the client has enough rows, by a generator seeded by (seed, client)
        — the same support batch at every evaluation and on any process."""
        offsets = self.data.train_offsets.cpu()
        out = []
        for k in self.clients.tolist():
            lo, n_k = int(offsets[k]), int(offsets[k + 1] - offsets[k])
            g = support_generator(self.seed, k)
            local = (
                torch.randperm(n_k, generator=g)[:size]
                if n_k >= size
                else torch.randint(n_k, (size,), generator=g)
            )
            out.append(local + lo)
        return torch.stack(out).to(self.device)

    def personal_params(self, server: State, store: ClientStore) -> State:
        """Every evaluated client's own parameters, stacked ``[n, ...]`` in the order of
        :attr:`clients`: its kept personal model (the updater's ``personal_key``), or the shared
        model after the problem's adaptation on the client's support batch (run by the
        executor)."""
        n = len(self.clients)
        if self.kept_personal:
            return store.read(self.clients)[self.updater.personal_key]
        assert self.support is not None
        x = broadcast(self.updater.eval_params(server), n)
        if self.local_stats:  # adapted from the client's own statistics
            x = {**x, **self._own_stats(store)}
        support = {"x": self.data.x_train[self.support], "y": self.data.y_train[self.support]}
        adapt, objective = self.problem.adapt_for_eval, self.updater.objective
        return self.executor.map(lambda s, b, c: adapt(objective, s, b), x, support, {}, n)

    def _own_stats(self, store: ClientStore) -> State:
        """The running statistics each evaluated client keeps (``model.buffers=local``)."""
        return store.read(self.clients)[LOCAL_STATS] if LOCAL_STATS in store.rows else {}

    def _outputs(self, params: Any, split: str) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """``(logits, targets, client)`` chunks of this process's rows of ``split``: with the
        shared parameters, or client by client with each one's personal parameters."""
        rows, owner = self.rows[split]
        d = self.data
        xy = (d.x_train, d.y_train) if split == "train" else (d.x_val, d.y_val)
        outputs, objective = self.problem.eval_outputs, self.updater.objective
        chunk, seed = self.eval_batch, self.seed
        if self.support is None and not self.local_stats:
            yield from outputs(objective, params, xy, rows, owner, chunk, seed)
            return
        for i, k in enumerate(self.clients.tolist()):
            mask = owner == k
            own = tree_map(lambda v: v[i], params)
            yield from outputs(objective, own, xy, rows[mask], owner[mask], chunk, seed)

    @torch.no_grad()
    def __call__(self, server: State, store: ClientStore, dtype: torch.dtype) -> dict[str, float]:
        """Average, worst and 10th-percentile client accuracy and loss on every client's train
        and validation data, per-class validation accuracy, and the updater's client weights.
        The model is in eval mode meanwhile (batch norms normalise with their running
        statistics, dropout is off), and back in train mode after."""
        model = self.updater.model
        was_training = model.training
        model.eval()
        try:
            return self._evaluate(server, store, dtype)
        finally:
            model.train(was_training)

    def _evaluate(self, server: State, store: ClientStore, dtype: torch.dtype) -> dict[str, float]:
        params = (
            self.personal_params(server, store)
            if self.support is not None
            else self.updater.eval_params(server)
        )
        if self.local_stats and self.support is None:  # each client its own statistics
            params = {**broadcast(params, len(self.clients)), **self._own_stats(store)}
        out: dict[str, float] = {}
        for split, metric in self.metrics.items():
            metric.reset()
            extras = self.extra_metrics[split]
            for extra in extras.values():
                extra.reset()
            for logits, target, who in self._outputs(params, split):
                metric.update(logits, class_labels(target, logits), who)  # the extras: all columns
                for extra in extras.values():
                    extra.update(logits, target, who)
            for name, extra in extras.items():
                out[f"{split}/{name}"] = float(extra.compute())
            res = metric.compute()
            res = {  # torchmetrics squeezes one client's [1] to 0-d: its vectors stay [K]
                k: v.reshape(-1) if k.endswith(("_per_client", "_per_class")) else v
                for k, v in res.items()
            }
            out.update({f"{split}/{key}": float(v) for key, v in res.items() if v.dim() == 0})
            if split == "train":
                w = self.updater.client_weights(server, res["loss_per_client"].to(dtype))
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
        return out
