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

    def sizes(self, split: str = "train") -> Tensor:
        """Samples per client, int64 [K]."""
        off = self.train_offsets if split == "train" else self.val_offsets
        return off[1:] - off[:-1]

    def client_slice(self, k: int, split: str = "train") -> tuple[Tensor, Tensor]:
        """Client k's inputs and targets in ``split``."""
        if split == "train":
            lo, hi = int(self.train_offsets[k]), int(self.train_offsets[k + 1])
            return self.x_train[lo:hi], self.y_train[lo:hi]
        lo, hi = int(self.val_offsets[k]), int(self.val_offsets[k + 1])
        return self.x_val[lo:hi], self.y_val[lo:hi]

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
    state = np.random.SeedSequence(list(words)).generate_state(2)
    return int(state[0]) << 32 | int(state[1])


class BatchSampler:
    """Per-client minibatch indices from generators seeded by (seed, client, round).

    The batches a client sees in a round do not depend on which other clients are sampled or on
    which process runs it: 1 and N processes see the same data. Within one draw a client
    samples without replacement when it has at least b samples, with replacement otherwise (a
    client with 20 samples and b = 32).

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
        """Global row indices, int64 ``[steps, len(roles), n, batch_size]``."""
        n, r = len(clients), len(roles)
        out = torch.empty(steps, r, n, batch_size, dtype=torch.int64)
        for i, k in enumerate(clients.tolist()):
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

        Writes into buffers kept per role and reused across steps (no fresh allocation per
        step); a returned tensor is valid until the next call for the same role.
        """
        x_all = self.data.x_train if split == "train" else self.data.x_val
        y_all = self.data.y_train if split == "train" else self.data.y_val
        n, b = idx.shape
        key = f"{role}/{split}"
        buf = self._buffers.get(key)
        if buf is None or buf[0].shape[:2] != (n, b):
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

    The partition's RNG is seeded by (seed, 12345), independent of the training RNGs.
    """
    x, y, x_te, y_te, num_classes = load_source(spec.name, spec.data_dir)
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 12345]))
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
    val = P.validation_like([labels[p] for p in parts], y_te.numpy(), spec.val_per_client, rng)
    return build_federated(x, y, x_te, y_te, parts, val, num_classes, spec.name)
