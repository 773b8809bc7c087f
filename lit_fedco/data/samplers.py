"""Samplers: which rows of each client a round's minibatches hold.

- :class:`BatchSampler`: uniform minibatches, the default.
- :class:`PositiveSampler`: a fixed number of positives in every minibatch (the imbalanced
  binary AUPRC task of FCSG §5.3, whose estimator needs positives in every batch).
- :class:`TaskSampler`: N-way few-shot tasks drawn afresh at every local step from the
  client's own classes (FCSG §5.2; task sampling is what makes MAML a *conditional*
  problem: the support set η is drawn given the task ξ).

Every sampler draws client k's batches of round r from its own generator named
(seed, k, r) (:func:`lit_fedco.core.seeding.generator`), so they do not depend on which other
clients are sampled or on which process runs client k.

Batch layout of a task batch (rows of one client, one step): ``T`` tasks one after the other,
each ``N`` classes one after the other, each ``K + Q`` rows (support first). The objective
relabels classes 0..N−1 by position, so no label arithmetic happens inside ``vmap``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.seeding import generators
from lit_fedco.data.container import FederatedData


class BatchSampler:
    """Per-client minibatch indices from generators seeded by (seed, client, round).

    Client k's generator in round r is ``torch.Generator`` seeded from
    ``np.random.SeedSequence([seed, k, r]).generate_state(2)``, so the batches a client sees in
    a round do not depend on which other clients are sampled or on which process runs it: 1 and
    N processes see the same data. The generator draws the round's ``steps × len(roles)``
    batches in (step, role) order. Within one draw a client with n_k >= b samples draws without
    replacement (``randperm(n_k)[:b]``); a smaller client (20 samples, b = 32) draws with
    replacement (``randint``). Draws are independent of each other.

    Args:
        data: the federated data (offsets are read on the CPU).
        seed: the run's seed.
    """

    def __init__(self, data: FederatedData, seed: int) -> None:
        self.data = data
        self.seed = seed
        self.offsets = data.train_offsets.cpu()
        self.sizes = (self.offsets[1:] - self.offsets[:-1]).tolist()
        self._buffers: dict[str, tuple[Tensor, Tensor]] = {}

    def sample_round(
        self, clients: Tensor, round_idx: int, steps: int, roles: tuple[str, ...], batch_size: int
    ) -> Tensor:
        """Minibatch indices of ``clients`` for round ``round_idx``.

        Args:
            clients: int64 [n], the client ids (any order, any subset).
            round_idx: r.
            steps: local steps I.
            roles: the batches each step draws (e.g. ``("inner", "outer")``).
            batch_size: b.

        Returns:
            Global row indices into ``x_train`` (client offset + local index), int64
            ``[steps, len(roles), n, batch_size]``, on the data's device.
        """
        if batch_size < 1 or steps < 0:
            raise ValueError(
                f"batch_size: got {batch_size}, steps: got {steps}; need batch_size >= 1, "
                "steps >= 0"
            )
        n, r = len(clients), len(roles)
        draws = steps * r
        local = []  # client i's draws, [steps · r, b] each
        for k, g in self.streams(clients, round_idx):
            size = self.sizes[k]
            if size >= batch_size:
                perms = [torch.randperm(size, generator=g)[:batch_size] for _ in range(draws)]
                local.append(torch.stack(perms) if perms else torch.empty(0, batch_size).long())
            else:
                local.append(torch.randint(size, (draws, batch_size), generator=g))
        if not local:
            return torch.empty(steps, r, 0, batch_size, dtype=torch.int64).to(
                self.data.y_train.device
            )
        base = self.offsets[clients].view(1, n, 1)
        out = torch.stack(local, dim=1).add_(base).view(steps, r, n, batch_size)
        return out.to(self.data.y_train.device)

    def streams(self, clients: Tensor, round_idx: int) -> list[tuple[int, torch.Generator]]:
        """``(k, client k's generator of round round_idx)`` for every client, in order; the
        streams' names are hashed all at once (:func:`lit_fedco.core.seeding.generators`).

        Raises:
            IndexError: a client id outside [0, K).
        """
        ids = clients.tolist()
        for k in ids:
            if not 0 <= k < len(self.sizes):
                raise IndexError(f"client {k} out of range [0, {len(self.sizes)})")
        return list(zip(ids, generators(self.seed, ids, round_idx), strict=True))

    def gather(
        self, idx: Tensor, role: str = "inner", split: str = "train"
    ) -> tuple[Tensor, Tensor]:
        """Inputs ``[n, b, ...]`` and targets ``[n, b]`` for indices ``idx [n, b]``.

        Equal to ``(x_all[idx], y_all[idx])``, but written with ``torch.index_select(...,
        out=...)`` into buffers kept per (role, split) and reused across steps: no allocation
        per step; a buffer is (re)allocated on the first call or when ``[n, b]`` changes. A
        returned tensor is overwritten by the next call for the same role and split.

        Args:
            idx: global row indices [n, b] (from :meth:`sample_round`).
            role: the buffer to write into (one per role, so batches of different roles of one
                step can be alive together).
            split: ``"train"`` or ``"val"``.
        """
        x_all, y_all, _ = self.data.arrays(split)
        n, b = idx.shape
        key = f"{role}/{split}"
        buf = self._buffers.get(key)
        if buf is None or buf[0].shape[:2] != (n, b) or buf[0].device != x_all.device:
            buf = (
                x_all.new_empty((n, b, *x_all.shape[1:])),
                y_all.new_empty((n, b, *y_all.shape[1:])),
            )
            self._buffers[key] = buf
        flat = idx.reshape(-1)
        torch.index_select(x_all, 0, flat, out=buf[0].view(n * b, *x_all.shape[1:]))
        torch.index_select(y_all, 0, flat, out=buf[1].view(n * b, *y_all.shape[1:]))
        return buf[0], buf[1]


def _draw(n: int, k: int, g: torch.Generator) -> Tensor:
    """k indices in [0, n): without replacement when n >= k, with replacement otherwise."""
    if n >= k:
        return torch.randperm(n, generator=g)[:k]
    return torch.randint(n, (k,), generator=g)


class PositiveSampler(BatchSampler):
    """Minibatches with ``positives`` rows drawn from the client's positives and the other
    ``b − positives`` uniformly from all its rows (the AUPRC sampler of FCSG §5.3).

    Seeded by (seed, client, round) like :class:`BatchSampler`.

    Raises:
        ConfigError: a client holds no positive sample.
    """

    def __init__(self, data: FederatedData, seed: int, positives: int) -> None:
        super().__init__(data, seed)
        self.positives = positives
        y = data.y_train.cpu()
        self.pos_rows: dict[int, Tensor] = {}
        for k in data.holds():
            lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
            rows = torch.nonzero(y[lo:hi] == 1).flatten()
            if len(rows) == 0:
                raise ConfigError(
                    f"auprc: client {k} holds no positive sample; use fewer clients "
                    "(data.num_clients) or remove fewer positives (data.drop_positive)"
                )
            self.pos_rows[k] = rows

    def sample_round(
        self, clients: Tensor, round_idx: int, steps: int, roles: tuple[str, ...], batch_size: int
    ) -> Tensor:
        """Global row indices ``[steps, len(roles), n, b]``; the first ``positives`` of each
        batch are positives."""
        p = self.positives
        if batch_size <= p:
            raise ConfigError.bad_value(
                "batch_size", batch_size, f"more than auprc.positives = {p}", str(4 * p)
            )
        n, r = len(clients), len(roles)
        out = torch.empty(steps, r, n, batch_size, dtype=torch.int64)
        for i, (k, g) in enumerate(self.streams(clients, round_idx)):
            pos, size, base = self.pos_rows[k], self.sizes[k], int(self.offsets[k])
            for s in range(steps):
                for j in range(r):
                    chosen = pos[_draw(len(pos), p, g)]
                    rest = _draw(size, batch_size - p, g)
                    out[s, j, i] = torch.cat([chosen, rest]) + base
        return out.to(self.data.y_train.device)


# ---------------------------------------------------------------------- few-shot tasks


def rows_by_class(y: Tensor) -> dict[int, Tensor]:
    """Row indices of each label present in ``y``."""
    labels = y.cpu()
    return {int(c): torch.nonzero(labels == c).flatten() for c in torch.unique(labels)}


def sample_task_rows(
    by_class: dict[int, Tensor], ways: int, per_class: int, tasks: int, g: torch.Generator
) -> Tensor:
    """Row indices of ``tasks`` tasks, each ``ways`` distinct classes with ``per_class``
    distinct rows, in the task-batch layout (int64 ``[tasks · ways · per_class]``)."""
    classes = list(by_class)
    out = []
    for _ in range(tasks):
        for c in torch.randperm(len(classes), generator=g)[:ways].tolist():
            rows = by_class[classes[c]]
            out.append(rows[torch.randperm(len(rows), generator=g)[:per_class]])
    return torch.cat(out)


def check_tasks(by_class: dict[int, Tensor], ways: int, per_class: int, where: str) -> None:
    """Raise a :class:`ConfigError` unless ``ways`` classes have ``per_class`` rows each."""
    usable = sum(len(r) >= per_class for r in by_class.values())
    if usable < ways:
        raise ConfigError(
            f"maml: {where} has {usable} classes with at least {per_class} images "
            f"(shots + queries), fewer than ways = {ways}; lower maml.ways, maml.shots or "
            "maml.queries, or give each client more classes (data.classes_per_client)"
        )


class TaskSampler(BatchSampler):
    """Fresh N-way tasks from each client's own classes at every local step.

    ``batch_size`` is the number of tasks per step (the meta-batch); a batch holds
    ``batch_size · ways · per_class`` rows (module docstring for the layout). Seeded by
    (seed, client, round) like :class:`BatchSampler`.
    """

    def __init__(self, data: FederatedData, seed: int, ways: int, per_class: int) -> None:
        super().__init__(data, seed)
        self.ways, self.per_class = ways, per_class
        self.by_class: dict[int, dict[int, Tensor]] = {}
        for k in data.holds():
            lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
            local = {c: r + lo for c, r in rows_by_class(data.y_train[lo:hi]).items()}
            check_tasks(local, ways, per_class, f"client {k}")
            self.by_class[k] = {c: r for c, r in local.items() if len(r) >= per_class}

    def sample_round(
        self, clients: Tensor, round_idx: int, steps: int, roles: tuple[str, ...], batch_size: int
    ) -> Tensor:
        """Global row indices ``[steps, len(roles), n, batch_size · ways · per_class]``."""
        n, r = len(clients), len(roles)
        rows = batch_size * self.ways * self.per_class
        out = torch.empty(steps, r, n, rows, dtype=torch.int64)
        for i, (k, g) in enumerate(self.streams(clients, round_idx)):
            for s in range(steps):
                for j in range(r):
                    out[s, j, i] = sample_task_rows(
                        self.by_class[k], self.ways, self.per_class, batch_size, g
                    )
        return out.to(self.data.y_train.device)
