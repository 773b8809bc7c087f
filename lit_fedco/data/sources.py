"""Real data sources: scikit-learn's digits (embedded) and MNIST / Fashion-MNIST from a local
folder through torchvision's own dataset classes. Nothing is downloaded."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torchvision.datasets import MNIST, FashionMNIST

from lit_fedco.errors import ConfigError

SOURCES = ("digits", "mnist", "fashion_mnist")

Arrays = tuple[Tensor, Tensor, Tensor, Tensor, int]
"""(x_pool, y_pool, x_test_pool, y_test_pool, num_classes): training pool and held-out pool."""


def load_digits_arrays() -> tuple[Tensor, Tensor]:
    """scikit-learn's 1797 real 8×8 handwritten digits, scaled to [0, 1], as [N, 1, 8, 8]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.tensor(d.target, dtype=torch.int64)


def _stratified_split(y: Tensor, test_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Row indices of a stratified split (fixed seed: the same on every run and rank)."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    labels = y.numpy()
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cut = round(len(idx) * test_fraction)
        test.append(idx[:cut])
        train.append(idx[cut:])
    return torch.from_numpy(np.sort(np.concatenate(train))), torch.from_numpy(
        np.sort(np.concatenate(test))
    )


_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _how_to_get(fashion: bool) -> str:
    if fashion:
        return (
            "install them offline with 'apt-get install dataset-fashion-mnist' and set "
            "data.data_dir=/usr/share/datasets/fashion-mnist"
        )
    return (
        "place the IDX files of the MNIST distribution (optionally .gz) in DIR/MNIST/raw/ or "
        "directly in DIR, and set data.data_dir=DIR"
    )


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def load_mnist(data_dir: str | Path, train: bool, fashion: bool = False) -> tuple[Tensor, Tensor]:
    """MNIST or Fashion-MNIST read by torchvision's ``MNIST`` / ``FashionMNIST`` class.

    ``data_dir`` may use torchvision's layout (``data_dir/MNIST/raw/<files>``,
    ``data_dir/FashionMNIST/raw/<files>``) or hold the IDX files directly (Debian's
    ``dataset-fashion-mnist`` layout); files may be gzipped. torchvision reads only
    uncompressed files and checks all four, so the files of the requested split are
    decompressed (or linked) into a cache folder that torchvision then reads.

    Returns:
        Images as float32 in [0, 1], shape [N, 1, 28, 28], and int64 labels.

    Raises:
        ConfigError: the files are not there; the message says where and how to get them.
    """
    cls = FashionMNIST if fashion else MNIST
    name = "fashion_mnist" if fashion else "mnist"
    if not str(data_dir):
        raise ConfigError(
            f"data.data_dir: empty, expected the folder holding the {name} IDX files; "
            + _how_to_get(fashion)
        )
    root = Path(data_dir).expanduser()
    stems = _FILES[train]
    found: list[Path] = []
    for folder in (root / cls.__name__ / "raw", root):
        paths = [_find(folder, s) for s in stems]
        if all(p is not None for p in paths):
            found = [p for p in paths if p is not None]
            break
    if not found:
        raise ConfigError(
            f"data.data_dir: got {str(root)!r}, expected the {name} "
            f"{'training' if train else 'test'} files {stems[0]}[.gz] and {stems[1]}[.gz] in "
            f"{root / cls.__name__ / 'raw'} or in {root}; " + _how_to_get(fashion)
        )
    ident = "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in found)
    key = hashlib.sha1(ident.encode()).hexdigest()[:12]  # a changed file gets a new cache
    cache = Path(tempfile.gettempdir()) / "lit_fedco-idx" / key
    raw = cache / cls.__name__ / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for src, stem in zip(found, stems, strict=True):
        dst = raw / stem
        if dst.exists():
            continue
        tmp = raw / f".{stem}.part"
        if src.suffix == ".gz":
            with gzip.open(src, "rb") as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout)
        else:
            shutil.copyfile(src, tmp)
        tmp.replace(dst)  # atomic: a half-written file is never read

    class _OneSplit(cls):  # type: ignore[valid-type,misc]
        """torchvision's class, checking only the split that is read."""

        def _check_exists(self) -> bool:
            return all((Path(self.raw_folder) / s).is_file() for s in stems)

    _OneSplit.__name__ = cls.__name__  # raw_folder is root/<class name>/raw
    try:
        ds = _OneSplit(str(cache), train=train, download=False)
    except (RuntimeError, ValueError, AssertionError) as err:
        raise ConfigError(
            f"data.data_dir: the {name} files in {str(root)!r} could not be read as IDX "
            f"({err}); " + _how_to_get(fashion)
        ) from None
    x = ds.data.to(torch.float32).unsqueeze(1) / 255.0
    return x, ds.targets.to(torch.int64)


def load_source(name: str, data_dir: str | Path = "") -> Arrays:
    """A training pool and a held-out pool for data set ``name``.

    - ``digits``: the 1797 digits, split 70 / 30 stratified with a fixed seed.
    - ``mnist``, ``fashion_mnist``: the train and test files; where only the test split is
      present (e.g. the MNIST t10k files alone) it is split 80 / 20 stratified.
    """
    if name == "digits":
        x, y = load_digits_arrays()
        tr, te = _stratified_split(y, 0.3, seed=0)
        return x[tr], y[tr], x[te], y[te], 10
    if name in ("mnist", "fashion_mnist"):
        fashion = name == "fashion_mnist"
        x_test, y_test = load_mnist(data_dir, train=False, fashion=fashion)
        try:
            x_train, y_train = load_mnist(data_dir, train=True, fashion=fashion)
        except ConfigError:
            tr, te = _stratified_split(y_test, 0.2, seed=0)
            return x_test[tr], y_test[tr], x_test[te], y_test[te], 10
        return x_train, y_train, x_test, y_test, 10
    raise ConfigError.bad_value("data.name", name, f"one of {SOURCES}", "digits")
