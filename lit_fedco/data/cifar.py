"""Step-imbalanced data sets: CIFAR10-ST, CIFAR100-ST (FedDRO paper §6) and digits-ST.

The FedDRO paper trains on "CIFAR10-ST and CIFAR100-ST (unbalanced versions of CIFAR10 and
CIFAR100)" after Qi et al., without stating the construction. We implement the *step
imbalance* of Buda et al. (2018) and Cao et al. (2019), which those data sets follow, with the
imbalance ratio ρ a parameter (``data.imbalance_ratio``):

- classes ``0 .. C − ⌊C/2⌋ − 1`` are the majority and keep all their training images;
- classes ``C − ⌊C/2⌋ .. C − 1`` (the last ⌊C/2⌋, the minority) each keep ``max(1, ⌊n_c/ρ⌋)``
  of their ``n_c`` training images, drawn uniformly without replacement;
- ρ = 1 leaves the data unchanged. CIFAR10-ST with ρ = 100 keeps 5000 images of each of the
  classes 0-4 and 50 of each of the classes 5-9 (25,250 in all).

The imbalanced training pool is then split over the K clients — ``iid`` (a shuffled equal
split, the paper's "split the (unbalanced) dataset equally") or ``dirichlet`` (label skew).
Validation is class-**balanced**, like the CIFAR test set the paper reports on: each client
gets ``val_per_client`` held-out images with equal counts per class, disjoint across clients
while the held-out pool lasts; so average, worst-client and worst-class accuracy measure how
well the minority classes are learnt.

CIFAR is read from a local ``data_dir`` with torchvision's ``CIFAR10`` / ``CIFAR100`` classes
(``DIR/cifar-10-batches-py/…``, ``DIR/cifar-100-python/…``; nothing is downloaded); images are
standardised per channel with the training split's mean and standard deviation. The digits
variant uses scikit-learn's embedded 8×8 digits (``lit_fedco.data.sources``).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor
from torchvision.datasets import CIFAR10, CIFAR100

from lit_fedco.data import partition as P
from lit_fedco.data.federated import FederatedData, build_federated
from lit_fedco.data.sources import load_source
from lit_fedco.errors import ConfigError

ST_SOURCES = ("digits_st", "cifar10_st", "cifar100_st")
ST_PARTITIONS = ("iid", "dirichlet")


class STSpec(Protocol):
    """The fields :func:`make_step_imbalanced` reads (``lit_fedco.config.DataConfig``)."""

    name: str
    data_dir: str
    partition: str
    num_clients: int
    alpha: float
    val_per_client: int
    seed: int


def step_imbalance(labels: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices kept by the step imbalance of ratio ρ (module docstring).

    Args:
        labels: int class labels ``[N]`` (classes are ``0 .. C − 1``, C = max + 1).
        ratio: ρ ≥ 1; each of the last ⌊C/2⌋ classes keeps ``max(1, ⌊n_c/ρ⌋)`` samples.
        rng: draws which minority samples are kept.
    """
    if not ratio >= 1:
        raise ConfigError.bad_value(
            "data.imbalance_ratio", ratio, "a float >= 1 (n_majority / n_minority)", "100"
        )
    c = int(labels.max()) + 1
    first_minority = c - c // 2
    keep = []
    for k in range(c):
        idx = np.flatnonzero(labels == k)
        if k >= first_minority and len(idx):
            n = max(1, int(len(idx) // ratio))
            idx = rng.choice(idx, size=n, replace=False)
        keep.append(idx)
    return np.sort(np.concatenate(keep)).astype(np.int64)


def balanced_validation(
    labels: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """For each client ``per_client`` held-out indices with (nearly) equal counts per class.

    Remainders go to different classes for different clients. Within a class, clients take
    consecutive slices of one shuffled order, so they are disjoint while the class lasts and
    wrap around (reusing samples) beyond.
    """
    if per_client < 1:
        raise ConfigError.bad_value("data.val_per_client", per_client, "an int >= 1", "100")
    classes = np.unique(labels)
    c = len(classes)
    order = {k: rng.permutation(np.flatnonzero(labels == k)) for k in classes}
    used = dict.fromkeys(classes, 0)
    out = []
    for client in range(num_clients):
        base, extra = divmod(per_client, c)
        chosen = []
        for j, k in enumerate(classes):
            n = base + (1 if (j - client) % c < extra else 0)
            pool = order[k]
            take = pool[(used[k] + np.arange(n)) % len(pool)]
            used[k] += n
            chosen.append(take)
        out.append(np.sort(np.concatenate(chosen)).astype(np.int64))
    return out


# ---------------------------------------------------------------------- CIFAR files
def _lenient(cls: type[CIFAR10], train: bool) -> type[CIFAR10]:
    """torchvision's class, checking that the requested split's files exist instead of their
    MD5 sums (so that smaller CIFAR-format files, as the tests write, are read too)."""
    files = cls.train_list if train else cls.test_list

    class _Local(cls):  # type: ignore[valid-type,misc]
        def _check_integrity(self) -> bool:
            return all(
                os.path.isfile(os.path.join(self.root, self.base_folder, name)) for name, _ in files
            )

        def _load_meta(self) -> None:
            self.classes: list[str] = []
            self.class_to_idx: dict[str, int] = {}

    _Local.__name__ = cls.__name__
    return _Local


def load_cifar(name: str, data_dir: str | Path, train: bool) -> tuple[Tensor, Tensor]:
    """CIFAR-10 (``name="cifar10"``) or CIFAR-100 read by torchvision from ``data_dir``.

    Returns:
        uint8 images ``[N, 3, 32, 32]`` and int64 labels.

    Raises:
        ConfigError: the files are not there or cannot be read; the message says where.
    """
    cls = CIFAR10 if name == "cifar10" else CIFAR100
    if not str(data_dir):
        raise ConfigError(
            f"data.data_dir: empty, expected the folder holding {cls.base_folder}/ (the "
            f"python version of {name.upper()}); set data.data_dir=DIR"
        )
    root = Path(data_dir).expanduser()
    try:
        ds = _lenient(cls, train)(str(root), train=train, download=False)
    except (RuntimeError, OSError, KeyError, ValueError, EOFError, pickle.UnpicklingError) as err:
        files = [n for n, _ in (cls.train_list if train else cls.test_list)]
        raise ConfigError(
            f"data.data_dir: got {str(root)!r}, expected {name.upper()}'s python-format files "
            f"{files} in {root / cls.base_folder} ({type(err).__name__}: {err}); unpack "
            f"{cls.filename} there and set data.data_dir=DIR"
        ) from None
    x = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2).contiguous()
    return x, torch.tensor(ds.targets, dtype=torch.int64)


def _standardise(x: Tensor, ref: Tensor) -> Tensor:
    """Per-channel standardisation with the mean and std of ``ref`` (uint8 images)."""
    ref_f = ref.to(torch.float64) / 255.0
    mean = ref_f.mean(dim=(0, 2, 3), keepdim=True)
    std = ref_f.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return ((x.to(torch.float64) / 255.0 - mean) / std).to(torch.float32)


def load_st_source(name: str, data_dir: str | Path) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """The balanced training and held-out pools of an ST source, before the imbalance."""
    if name == "digits_st":
        return load_source("digits")
    if name in ("cifar10_st", "cifar100_st"):
        base = name.removesuffix("_st")
        x_tr, y_tr = load_cifar(base, data_dir, train=True)
        x_te, y_te = load_cifar(base, data_dir, train=False)
        num_classes = 10 if base == "cifar10" else 100
        return _standardise(x_tr, x_tr), y_tr, _standardise(x_te, x_tr), y_te, num_classes
    raise ConfigError.bad_value("data.name", name, f"one of {ST_SOURCES}", "digits_st")


def make_step_imbalanced(spec: STSpec) -> FederatedData:
    """A step-imbalanced federated data set (module docstring) from a ``DataConfig``-like
    ``spec`` with ``imbalance_ratio`` (default 10 when absent).

    The imbalance and the split are drawn from one generator seeded by (seed, 12345), like
    :func:`lit_fedco.data.federated.make_federated`.
    """
    ratio = float(getattr(spec, "imbalance_ratio", 10.0))
    x, y, x_te, y_te, num_classes = load_st_source(spec.name, spec.data_dir)
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 12345]))
    kept = step_imbalance(y.numpy(), ratio, rng)
    x, y = x[torch.from_numpy(kept)], y[torch.from_numpy(kept)]
    labels = y.numpy()
    k = spec.num_clients
    if spec.partition == "iid":
        parts = P.partition_iid(labels, k, rng)
    elif spec.partition == "dirichlet":
        parts = P.partition_dirichlet(labels, k, spec.alpha, rng)
    else:
        raise ConfigError.bad_value(
            "data.partition", spec.partition, f"one of {ST_PARTITIONS} for {spec.name}", "iid"
        )
    val = balanced_validation(y_te.numpy(), k, spec.val_per_client, rng)
    data = build_federated(x, y, x_te, y_te, parts, val, num_classes, spec.name)
    data.stats["imbalance_ratio"] = ratio
    return data
