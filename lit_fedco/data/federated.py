"""The federated container: every client's data in flat tensors, and minibatch sampling.

Samples are stored contiguously per client (client k's training rows are
``train_offsets[k]:train_offsets[k+1]``), so a batch for all cohort clients is one gather.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from lit_fedco.data import partition as P
from lit_fedco.data.sources import load_source
from lit_fedco.errors import ConfigError


@dataclass
class FederatedData:
    """All clients' training and validation data.

    Attributes:
        x_train, y_train: training samples, grouped by client.
        train_offsets: int64 [K + 1]; client k owns rows ``offsets[k]:offsets[k+1]``.
        x_val, y_val, val_offsets: the same for validation.
        num_classes: C.
        name: the source's name.
        stats: sizes and class counts per client (``"train"`` and ``"val"``).
    """

    x_train: Tensor
    y_train: Tensor
    train_offsets: Tensor
    x_val: Tensor
    y_val: Tensor
    val_offsets: Tensor
    num_classes: int
    name: str
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        """K."""
        return len(self.train_offsets) - 1

    def _split(self, split: str) -> tuple[Tensor, Tensor, Tensor]:
        if split == "train":
            return self.x_train, self.y_train, self.train_offsets
        if split == "val":
            return self.x_val, self.y_val, self.val_offsets
        raise ValueError(f"split: got {split!r}, expected 'train' or 'val'")

    def sizes(self, split: str = "train") -> Tensor:
        """Samples per client in ``split`` (``"train"`` or ``"val"``), int64 [K]."""
        off = self._split(split)[2]
        return off[1:] - off[:-1]

    def client_slice(self, k: int, split: str = "train") -> tuple[Tensor, Tensor]:
        """Client k's inputs and targets in ``split`` (views, no copy)."""
        if not 0 <= k < self.num_clients:
            raise IndexError(f"client {k} out of range [0, {self.num_clients})")
        x, y, off = self._split(split)
        lo, hi = int(off[k]), int(off[k + 1])
        return x[lo:hi], y[lo:hi]

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> FederatedData:
        """A copy on ``device`` with floating inputs cast to ``dtype`` (offsets stay on CPU)."""

        def mv(t: Tensor) -> Tensor:
            return (
                t.to(device, dtype) if dtype is not None and t.is_floating_point() else t.to(device)
            )

        return replace(
            self,
            x_train=mv(self.x_train),
            y_train=self.y_train.to(device),
            x_val=mv(self.x_val),
            y_val=self.y_val.to(device),
        )

    def describe(self) -> str:
        """A short table: client, training and validation sizes, classes present."""
        lines = [f"{self.name}: {self.num_clients} clients, {self.num_classes} classes"]
        lines.append(f"{'client':>6} {'n_train':>8} {'n_val':>6}  classes (train)")
        tr, va = self.sizes("train"), self.sizes("val")
        counts = self.stats.get("train", {}).get("class_counts", [])
        for k in range(self.num_clients):
            present = [c for c, n in enumerate(counts[k]) if n] if counts else []
            lines.append(f"{k:>6} {int(tr[k]):>8} {int(va[k]):>6}  {present}")
        return "\n".join(lines)


def _concat(x: Tensor, y: Tensor, parts: list[np.ndarray]) -> tuple[Tensor, Tensor, Tensor]:
    idx = torch.from_numpy(np.concatenate(parts).astype(np.int64))
    sizes = torch.tensor([0] + [len(p) for p in parts], dtype=torch.int64)
    return x[idx].contiguous(), y[idx].contiguous(), sizes.cumsum(0)


def build_federated(
    x_pool: Tensor,
    y_pool: Tensor,
    x_test: Tensor,
    y_test: Tensor,
    parts: list[np.ndarray],
    val_parts: list[np.ndarray],
    num_classes: int,
    name: str,
) -> FederatedData:
    """Gather each client's training rows (from the pool) and validation rows (from the
    held-out pool) into contiguous per-client blocks."""
    if len(parts) != len(val_parts):
        raise ValueError("parts and val_parts must have one entry per client")
    x_tr, y_tr, off_tr = _concat(x_pool, y_pool, parts)
    x_va, y_va, off_va = _concat(x_test, y_test, val_parts)
    stats = {
        "train": P.partition_stats(y_pool.numpy(), parts, num_classes),
        "val": P.partition_stats(y_test.numpy(), val_parts, num_classes),
    }
    return FederatedData(x_tr, y_tr, off_tr, x_va, y_va, off_va, num_classes, name, stats)


def _seed_of(*words: int) -> int:
    """A 64-bit torch seed from ``SeedSequence(words)`` (e.g. (seed, client, round))."""
    state = np.random.SeedSequence(list(words)).generate_state(2)
    return int(state[0]) << 32 | int(state[1])


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
        out = torch.empty(steps, r, n, batch_size, dtype=torch.int64)
        for i, k in enumerate(clients.tolist()):
            if not 0 <= k < len(self.sizes):
                raise IndexError(f"client {k} out of range [0, {len(self.sizes)})")
            g = torch.Generator().manual_seed(_seed_of(self.seed, k, round_idx))
            size, base = self.sizes[k], int(self.offsets[k])
            if size >= batch_size:
                local = torch.stack(
                    [torch.randperm(size, generator=g)[:batch_size] for _ in range(steps * r)]
                )
            else:
                local = torch.randint(size, (steps * r, batch_size), generator=g)
            out[:, :, i] = (local + base).view(steps, r, batch_size)
        return out.to(self.data.y_train.device)

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
        x_all, y_all, _ = self.data._split(split)
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


class DataSpec(Protocol):
    """The fields :func:`make_federated` reads (``lit_fedco.config.DataConfig`` + ``seed``)."""

    name: str
    data_dir: str
    partition: str
    num_clients: int
    big: int
    small: int
    small_classes: int
    alpha: float
    rho: float
    val_per_client: int
    seed: int


def make_federated(spec: DataSpec) -> FederatedData:
    """Load the source, split its training pool over the clients, and draw each client's
    validation set from the held-out pool with the client's class proportions.

    ``spec`` is any object with the :class:`DataSpec` attributes (``DataConfig`` plus ``seed``).
    ``partition`` is ``quantity`` (client 0 holds ``big`` samples, the others ``small``, each
    from ``small_classes`` classes, 0 meaning all), ``iid``, ``dirichlet`` (``alpha``) or
    ``dominant_class`` (``rho``).

    The partition's RNG is seeded by (seed, 12345), independent of the training RNGs.
    Step-imbalanced sources (``*_st``) are built by :mod:`lit_fedco.data.cifar`.
    """
    if spec.name.endswith("_st"):
        from lit_fedco.data.cifar import make_step_imbalanced

        return make_step_imbalanced(spec)
    if spec.name == "invariant_logreg":  # FCSG §5.1, synthetic
        from lit_fedco.data.synthetic import make_invariant_logreg

        return make_invariant_logreg(spec)
    if spec.partition == "classes":  # few-shot tasks from each client's own classes
        from lit_fedco.data.tasks import make_task_data

        return make_task_data(spec)
    if spec.partition not in P.PARTITIONS:
        raise ConfigError.bad_value(
            "data.partition", spec.partition, f"one of {P.PARTITIONS}", "quantity"
        )
    if spec.val_per_client < 1:
        raise ConfigError.bad_value(
            "data.val_per_client", spec.val_per_client, "an int >= 1", "100"
        )
    x, y, x_te, y_te, num_classes = load_source(spec.name, spec.data_dir)
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 12345]))
    if getattr(spec, "binary", False):  # FCSG §5.3: imbalanced binary task, test unchanged
        from lit_fedco.data.tasks import binarize, drop_positives

        y, y_te, num_classes = binarize(y, num_classes), binarize(y_te, num_classes), 2
        keep = drop_positives(y, getattr(spec, "drop_positive", 0.0), rng)
        x, y = x[keep], y[keep]
    labels = y.numpy()
    k = spec.num_clients
    if spec.partition == "quantity":
        parts = P.partition_quantity_imbalanced(
            labels, k, spec.big, spec.small, rng, spec.small_classes or None
        )
    elif spec.partition == "iid":
        parts = P.partition_iid(labels, k, rng)
    elif spec.partition == "dirichlet":
        parts = P.partition_dirichlet(labels, k, spec.alpha, rng)
    elif spec.partition == "dominant_class":
        parts = P.partition_dominant_class(labels, k, spec.rho, rng)
    else:
        raise ConfigError.bad_value(
            "data.partition", spec.partition, f"one of {P.PARTITIONS}", "quantity"
        )
    val_mode = getattr(spec, "val_mode", "client")
    if val_mode == "all":  # the whole held-out set, unchanged, split evenly over the clients
        val = P.partition_iid(y_te.numpy(), k, rng)
    elif val_mode == "client":
        val = P.validation_like([labels[p] for p in parts], y_te.numpy(), spec.val_per_client, rng)
    else:
        raise ConfigError.bad_value("data.val_mode", val_mode, "'client' or 'all'", "all")
    return build_federated(x, y, x_te, y_te, parts, val, num_classes, spec.name)
