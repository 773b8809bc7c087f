"""CIFAR-10 and CIFAR-100 read from a local folder by torchvision's own dataset classes.

Only reading lives here: ``DIR/cifar-10-batches-py/…`` or ``DIR/cifar-100-python/…`` (the
python version of the distribution; nothing is downloaded), images standardised per channel
with the training split's mean and standard deviation. The step-imbalanced CIFAR10-ST /
CIFAR100-ST of the FedDRO paper are built from these pools by :mod:`lit_fedco.data.build`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torchvision.datasets import CIFAR10, CIFAR100

from lit_fedco.core.errors import ConfigError


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
    except Exception as err:  # bytes that do not decode: whatever the reader raises on them
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


def load_cifar_pools(name: str, data_dir: str | Path) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """The training and held-out pools of ``cifar10`` or ``cifar100``, standardised.

    Both splits are standardised with the *training* split's statistics, so that the
    held-out images are transformed exactly as the model's inputs were.

    Returns:
        ``(x_train, y_train, x_test, y_test, num_classes)``, images float32 ``[N, 3, 32, 32]``.
    """
    x_tr, y_tr = load_cifar(name, data_dir, train=True)
    x_te, y_te = load_cifar(name, data_dir, train=False)
    num_classes = 10 if name == "cifar10" else 100
    return _standardise(x_tr, x_tr), y_tr, _standardise(x_te, x_tr), y_te, num_classes
