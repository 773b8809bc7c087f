"""The federated container: every client's data in flat tensors, and its partition statistics.

Samples are stored contiguously per client (client k's training rows are
``train_offsets[k]:train_offsets[k+1]``), so a batch for all cohort clients is one gather and
moving the data to a device is four copies, however many clients there are.

This module knows nothing about where the data come from or how they were split: builders
(:mod:`lit_fedco.data.build`) hand :func:`build_federated` index arrays, samplers
(:mod:`lit_fedco.data.samplers`) read the offsets.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_fedco.data import partition as P


def labels_of(y: Tensor) -> Tensor:
    """The class labels of targets ``y``: ``y`` itself (``[n]``), or its column 0 when the
    targets carry side columns (``[n, 1 + s]``: Adult's protected group in column 1)."""
    return y if y.dim() == 1 else y[:, 0]


@dataclass(frozen=True)
class Whole:
    """What a copy that holds some clients' rows (:meth:`FederatedData.held_by`) keeps of the
    whole data set: every client's sizes and class counts per split, and the whole data's
    fingerprint (what a checkpoint is matched against)."""

    train_sizes: Tensor
    val_sizes: Tensor
    train_class_counts: Tensor
    val_class_counts: Tensor
    fingerprint: str


@dataclass
class FederatedData:
    """All clients' training and validation data (or, :meth:`held_by`, some clients' rows).

    Attributes:
        x_train, y_train: training samples, grouped by client; targets ``[n]`` class labels,
            or ``[n, 1 + s]`` with the label in column 0 and side columns after it
            (:func:`labels_of`).
        train_offsets: int64 [K + 1]; client k owns rows ``offsets[k]:offsets[k+1]``.
        x_val, y_val, val_offsets: the same for validation.
        num_classes: C.
        name: the source's name.
        stats: what the builder recorded (sizes and class counts per client under ``"train"``
            and ``"val"``, a synthetic source's ground truth, an imbalance ratio).
        held: the clients whose rows this copy holds (sorted), or None: all of them. The
            offsets of the others are empty ranges.
        whole: the whole data set's sizes, class counts and fingerprint, where ``held`` is
            set (:meth:`sizes`, :meth:`class_counts` and :meth:`partition_stats` answer for
            the whole).
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
    held: Tensor | None = None
    whole: Whole | None = None

    @property
    def num_clients(self) -> int:
        """K."""
        return len(self.train_offsets) - 1

    def holds(self) -> list[int]:
        """The clients whose rows this copy holds: all K, or :attr:`held`."""
        return list(range(self.num_clients)) if self.held is None else self.held.tolist()

    def held_by(self, clients: Tensor, fingerprint: str) -> FederatedData:
        """A copy holding only ``clients``' rows (new tensors: the rows of the others can go),
        with the same offsets layout (the other clients' ranges empty) and what it needs of
        the whole (:class:`Whole`: sizes, class counts, ``fingerprint``). A process of a run
        with ``shard_data`` keeps this of the clients it owns.

        Args:
            clients: client indices, each once.
            fingerprint: the whole data's fingerprint (checkpoints match it).
        """
        if self.held is not None:
            raise ValueError("held_by: this copy already holds only some clients' rows")
        k = self.num_clients
        clients = torch.unique(clients.cpu().long())  # sorted, each once
        if len(clients) and not 0 <= int(clients[0]) <= int(clients[-1]) < k:
            raise IndexError(f"held_by: clients must be in [0, {k}), got {clients.tolist()}")
        keep = torch.zeros(k, dtype=torch.bool)
        keep[clients] = True

        def part(split: str) -> tuple[Tensor, Tensor, Tensor]:
            x, y, off = self.arrays(split)
            where, off = off.device, off.cpu()
            sizes = torch.where(keep, off[1:] - off[:-1], 0)
            rows = [torch.arange(int(off[c]), int(off[c + 1])) for c in clients.tolist()]
            idx = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)
            new_off = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
            return x[idx.to(x.device)], y[idx.to(y.device)], new_off.to(where)

        whole = Whole(self.sizes("train"), self.sizes("val"), self.class_counts("train"),
                      self.class_counts("val"), fingerprint)  # fmt: skip
        x_tr, y_tr, off_tr = part("train")
        x_va, y_va, off_va = part("val")
        return replace(self, x_train=x_tr, y_train=y_tr, train_offsets=off_tr, x_val=x_va,
                       y_val=y_va, val_offsets=off_va, held=clients, whole=whole)  # fmt: skip

    def nbytes(self) -> int:
        """Bytes of the inputs and targets this copy holds (both splits)."""
        return sum(t.numel() * t.element_size() for t in (self.x_train, self.y_train,
                                                           self.x_val, self.y_val))  # fmt: skip

    def arrays(self, split: str) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs, targets and offsets of ``split`` (``"train"`` or ``"val"``).

        Public because the samplers gather from it: they live in their own module and should
        not reach for a private name.
        """
        if split == "train":
            return self.x_train, self.y_train, self.train_offsets
        if split == "val":
            return self.x_val, self.y_val, self.val_offsets
        raise ValueError(f"split: got {split!r}, expected 'train' or 'val'")

    def sizes(self, split: str = "train") -> Tensor:
        """Samples per client in ``split`` (``"train"`` or ``"val"``), int64 [K] (of the whole
        data set, also in a copy that holds some clients' rows)."""
        off = self.arrays(split)[2]
        if self.whole is not None:
            return self.whole.train_sizes if split == "train" else self.whole.val_sizes
        return off[1:] - off[:-1]

    def client_slice(self, k: int, split: str = "train") -> tuple[Tensor, Tensor]:
        """Client k's inputs and targets in ``split`` (views, no copy)."""
        if not 0 <= k < self.num_clients:
            raise IndexError(f"client {k} out of range [0, {self.num_clients})")
        x, y, off = self.arrays(split)
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

    def class_counts(self, split: str = "train") -> Tensor:
        """Samples of each class held by each client in ``split``, int64 ``[K, C]``.

        Computed from the labels themselves (one ``bincount`` over ``client · C + label``), not
        from what the builder recorded, so it is right for every source, synthetic ones too;
        in a copy that holds some clients' rows, the whole data set's (computed before).
        """
        _, y, off = self.arrays(split)
        if self.whole is not None:
            return (
                self.whole.train_class_counts if split == "train" else self.whole.val_class_counts
            )
        k, c = self.num_clients, self.num_classes
        owner = torch.repeat_interleave(torch.arange(k), (off[1:] - off[:-1]).cpu())
        flat = owner * c + labels_of(y).detach().cpu().long()
        return torch.bincount(flat, minlength=k * c).view(k, c)

    def partition_stats(self) -> dict[str, Any]:
        """The partition's statistics: clients, sizes and class mix, as plain Python values.

        Printed and logged at the start of every run, because how the data are split (one big
        client and many small ones, a dominant class, a step imbalance) decides what an
        algorithm's result means. Plain lists and ints, so the dict goes to JSON or W&B as is.

        Returns:
            ``name``, ``num_clients`` (K), ``num_classes`` (C), ``train_sizes`` and
            ``val_sizes`` (K ints), ``train_class_counts`` and ``val_class_counts``
            (K lists of C ints); and ``source``, the files the pools were read from, where
            the builder recorded it (``stats["source"]``: MNIST's standard split or its test
            files alone), and ``client_groups``, each client's group id, for a natural
            partition.
        """
        out = {
            "name": self.name,
            "num_clients": self.num_clients,
            "num_classes": self.num_classes,
            "train_sizes": self.sizes("train").tolist(),
            "val_sizes": self.sizes("val").tolist(),
            "train_class_counts": self.class_counts("train").tolist(),
            "val_class_counts": self.class_counts("val").tolist(),
        }
        if self.stats.get("source"):
            out["source"] = self.stats["source"]
        if self.stats.get("client_groups"):
            out["client_groups"] = list(self.stats["client_groups"])
        return out

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


def _spread(values: list[int]) -> str:
    """``min 20, median 20, max 1000`` of a list of counts."""
    if not values:
        return "none"
    return f"min {min(values)}, median {statistics.median(values):g}, max {max(values)}"


def _mix(counts: list[int], top: int = 10) -> str:
    """A client's class mix, ``class:count`` for the classes it holds; with many classes the
    ``top`` largest and how many more, so that a line stays readable for CIFAR-100."""
    held = [(c, n) for c, n in enumerate(counts) if n]
    if len(held) > top:
        shown = sorted(held, key=lambda cn: -cn[1])[:top]
        return " ".join(f"{c}:{n}" for c, n in shown) + f" (+{len(held) - top} more)"
    return " ".join(f"{c}:{n}" for c, n in held)


def format_partition_stats(stats: dict[str, Any], max_clients: int = 4) -> str:
    """A few lines summarising :meth:`FederatedData.partition_stats`.

    Sizes and numbers of classes per client as min / median / max, then the first
    ``max_clients`` clients one per line: one line per client would bury the run's output
    with K = 1000. Where the stats name the files the pools came from (``source``), a last
    line says which.

    Args:
        stats: the dict returned by :meth:`FederatedData.partition_stats`.
        max_clients: clients listed individually.
    """
    k, tr, va = stats["num_clients"], stats["train_sizes"], stats["val_sizes"]
    held = [sum(1 for n in row if n) for row in stats["train_class_counts"]]
    lines = [
        f"{stats['name']}: {k} clients, {stats['num_classes']} classes, "
        f"{sum(tr)} training and {sum(va)} validation samples",
        f"  training samples per client:   {_spread(tr)}",
        f"  validation samples per client: {_spread(va)}",
        f"  classes per client (training): {_spread(held)}",
    ]
    groups = stats.get("client_groups")
    for i in range(min(k, max_clients)):
        mix = _mix(stats["train_class_counts"][i])
        who = f" ({groups[i]})" if groups else ""
        lines.append(f"  client {i}{who}: {tr[i]} train, {va[i]} val; classes {mix}")
    if k > max_clients:
        lines.append(f"  ... {k - max_clients} more clients")
    if stats.get("source"):
        lines.append(f"  data: {stats['source']}")
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
    held-out pool) into contiguous per-client blocks.

    Args:
        x_pool, y_pool: the training pool.
        x_test, y_test: the held-out pool.
        parts: each client's row indices into the training pool (a partitioner's output).
        val_parts: each client's row indices into the held-out pool.
        num_classes: C.
        name: the data set's name.
    """
    if len(parts) != len(val_parts):
        raise ValueError("parts and val_parts must have one entry per client")
    x_tr, y_tr, off_tr = _concat(x_pool, y_pool, parts)
    x_va, y_va, off_va = _concat(x_test, y_test, val_parts)
    stats = {
        "train": P.partition_stats(labels_of(y_pool).numpy(), parts, num_classes),
        "val": P.partition_stats(labels_of(y_test).numpy(), val_parts, num_classes),
    }
    return FederatedData(x_tr, y_tr, off_tr, x_va, y_va, off_va, num_classes, name, stats)
