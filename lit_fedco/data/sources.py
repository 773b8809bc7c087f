"""Real data sources: scikit-learn's digits (embedded) and MNIST / Fashion-MNIST from a local
folder through torchvision's own dataset classes; :func:`load_source` also hands out CIFAR's
pools (read by :mod:`lit_fedco.data.cifar`). Nothing is downloaded.

Readers only: nothing here knows about clients. The bottom layer of ``lit_fedco.data``
(with ``cifar`` and ``omniglot``); partitions, samplers and the container never read files.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torchvision.datasets import MNIST, FashionMNIST

from lit_fedco.core.errors import ConfigError
from lit_fedco.data.cifar import load_cifar_pools
from lit_fedco.data.names import BUILTIN_SOURCES, FILE_READERS

SOURCES = BUILTIN_SOURCES

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
        "place the four IDX files of the MNIST distribution (train-images-idx3-ubyte, "
        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte; optionally "
        ".gz) in DIR/MNIST/raw/ or directly in DIR, and set data.data_dir=DIR"
    )


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _locate(root: Path, fashion: bool, train: bool) -> list[Path] | None:
    """The image and label files of one split: torchvision's layout first, then flat."""
    cls = FashionMNIST if fashion else MNIST
    for folder in (root / cls.__name__ / "raw", root):
        paths = [_find(folder, stem) for stem in _FILES[train]]
        if all(p is not None for p in paths):
            return [p for p in paths if p is not None]
    return None


def _cache_bases() -> list[Path]:
    """Where decompressed IDX files go: the user's cache, else the temporary folder.

    Never the data folder itself: it is often a system or shared folder (e.g.
    ``/usr/share/datasets``) that a process running as root could write but should not.
    """
    bases = []
    xdg = os.environ.get("XDG_CACHE_HOME")
    with contextlib.suppress(RuntimeError):  # no home directory
        bases.append(Path(xdg) if xdg else Path.home() / ".cache")
    return [b / "lit_fedco" / "idx" for b in bases] + [
        Path(tempfile.gettempdir()) / "lit_fedco-idx"
    ]


def _writable_cache(root: Path, key: str) -> Path:
    """A writable cache folder for the files keyed by ``key``."""
    bases = _cache_bases()
    for base in bases:
        folder = base / key
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    raise ConfigError(
        f"data.data_dir: the gzipped IDX files in {str(root)!r} must be decompressed, but none "
        f"of {[str(b) for b in bases]} is writable; decompress them yourself (gunzip -k) and "
        "set data.data_dir to their folder, or set XDG_CACHE_HOME to a writable folder"
    )


def _uncompressed(found: list[Path], stems: tuple[str, ...], root: Path) -> Path:
    """A folder holding ``stems`` uncompressed: the files' own folder if they are plain, else a
    cache into which the ``.gz`` files are decompressed once (keyed by path, size and mtime)."""
    if all(p.suffix != ".gz" for p in found) and len({p.parent for p in found}) == 1:
        return found[0].parent
    ident = "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in found)
    folder = _writable_cache(root, hashlib.sha1(ident.encode()).hexdigest()[:12])
    for src, stem in zip(found, stems, strict=True):
        dst = folder / stem
        if dst.is_file():
            continue
        # A unique temporary name and an atomic rename: ranks decompressing at once never
        # read (or clobber) a half-written file.
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{stem}.")
        try:
            with (
                os.fdopen(fd, "wb") as fout,
                gzip.open(src, "rb") if src.suffix == ".gz" else open(src, "rb") as fin,
            ):
                shutil.copyfileobj(fin, fout)
            os.replace(tmp, dst)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return folder


def _read_with_torchvision(
    fashion: bool, root: Path, raw: Path, train: bool
) -> tuple[Tensor, Tensor]:
    """torchvision's own ``MNIST`` / ``FashionMNIST`` reader, pointed at ``raw``."""
    cls = FashionMNIST if fashion else MNIST
    stems = _FILES[train]

    class _Reader(cls):  # type: ignore[valid-type,misc]
        """torchvision's class reading one split from ``raw`` (no download, no legacy cache)."""

        @property
        def raw_folder(self) -> str:
            return str(raw)

        def _check_exists(self) -> bool:
            # torchvision checks all four files; one split is enough here.
            return all((raw / stem).is_file() for stem in stems)

        def _check_legacy_exist(self) -> bool:
            return False  # read exactly the files named in the messages, never processed/*.pt

    ds = _Reader(str(root), train=train, download=False)
    return ds.data, ds.targets


def load_mnist(data_dir: str | Path, train: bool, fashion: bool = False) -> tuple[Tensor, Tensor]:
    """MNIST or Fashion-MNIST read by torchvision's ``MNIST`` / ``FashionMNIST`` class.

    ``data_dir`` may use torchvision's layout (``data_dir/MNIST/raw/<files>``,
    ``data_dir/FashionMNIST/raw/<files>``) or hold the IDX files directly (the layout of
    Debian's ``dataset-fashion-mnist`` package and of a bare download). Files may be gzipped:
    torchvision reads only uncompressed files, so ``.gz`` files are decompressed once into
    ``$XDG_CACHE_HOME/lit_fedco/idx/<key>/`` (default ``~/.cache``; the temporary folder if that
    is not writable), keyed by the files' paths, sizes and modification times, and torchvision
    reads them there. Uncompressed files are read in place. The data folder is never written.

    Args:
        data_dir: the folder described above.
        train: the training split (``train-*``) or the test split (``t10k-*``).
        fashion: Fashion-MNIST instead of MNIST.

    Returns:
        Images as float32 in [0, 1], shape [N, 1, 28, 28], and int64 labels [N].

    Raises:
        ConfigError: the files are missing or unreadable; the message names the files, where
            they were looked for and how to get them.
    """
    name = "fashion_mnist" if fashion else "mnist"
    if not str(data_dir):
        raise ConfigError(
            f"data.data_dir: empty, expected the folder holding the {name} IDX files; "
            + _how_to_get(fashion)
        )
    root = Path(data_dir).expanduser()
    found = _locate(root, fashion, train)
    if found is None:
        raise _not_found(root, fashion, train)
    data, targets = _read_idx(found, root, fashion, train)
    x = data.to(torch.float32).unsqueeze(1) / 255.0
    return x, targets.to(torch.int64)


def _not_found(root: Path, fashion: bool, train: bool) -> ConfigError:
    """The error for a ``root`` without the split's files: where they were looked for, and
    whether the other split is there."""
    name = "fashion_mnist" if fashion else "mnist"
    folder = (FashionMNIST if fashion else MNIST).__name__
    stems = _FILES[train]
    other = (
        f" (only the {'test' if train else 'training'} split is there; "
        f"load_source({name!r}) splits a lone test split 80/20)"
        if _locate(root, fashion, not train)
        else ""
    )
    return ConfigError(
        f"data.data_dir: got {str(root)!r}, expected the {name} "
        f"{'training' if train else 'test'} files {stems[0]}[.gz] and {stems[1]}[.gz] in "
        f"{root / folder / 'raw'} or in {root}{other}; " + _how_to_get(fashion)
    )


def _read_idx(found: list[Path], root: Path, fashion: bool, train: bool) -> tuple[Tensor, Tensor]:
    """The images and labels of the IDX files ``found`` (decompressed first where gzipped),
    read by torchvision.

    Raises:
        ConfigError: bytes that do not decode as IDX, or files of different lengths.
    """
    name = "fashion_mnist" if fashion else "mnist"
    try:
        raw = _uncompressed(found, _FILES[train], root)
        data, targets = _read_with_torchvision(fashion, root, raw, train)
    except ConfigError:
        raise
    except Exception as err:  # bytes that do not decode: whatever the reader raises on them
        raise ConfigError(
            f"data.data_dir: got {str(root)!r}, whose {name} files {[p.name for p in found]} "
            f"could not be read as IDX ({type(err).__name__}: {err}); " + _how_to_get(fashion)
        ) from err
    if len(data) != len(targets):
        raise ConfigError(
            f"data.data_dir: {found[0]} holds {len(data)} images but {found[1]} holds "
            f"{len(targets)} labels; " + _how_to_get(fashion)
        )
    return data, targets


def mnist_split(name: str, data_dir: str | Path) -> str:
    """Which split :func:`read_source` reads for ``mnist`` / ``fashion_mnist`` in ``data_dir``.

    Returns:
        ``"standard"`` where the training files (``train-*``) are there: they are the training
        pool and the test files (``t10k-*``) the held-out pool, as in the papers;
        ``"test_only"`` where only the test files are: they are split 80 / 20; ``""`` for any
        other source, or a folder with neither (reading it raises the missing-files error).
    """
    if name not in ("mnist", "fashion_mnist") or not str(data_dir):
        return ""
    root, fashion = Path(data_dir).expanduser(), name == "fashion_mnist"
    if _locate(root, fashion, True) is not None:
        return "standard"
    return "test_only" if _locate(root, fashion, False) is not None else ""


def source_note(name: str, data_dir: str | Path, n_train: int, n_test: int) -> str:
    """One line saying which files a source's pools came from (the run prints it with its
    partition and records it in ``partition.json``), or ``""`` for the embedded data.

    Args:
        name: the source.
        data_dir: its folder.
        n_train, n_test: the sizes of the training and held-out pools as read.
    """
    split = mnist_split(name, data_dir)
    where = str(Path(data_dir).expanduser())
    if split == "standard":
        return (
            f"{name}'s standard split from {where}: the training files (train-*, {n_train} "
            f"images) are the training pool, the test files (t10k-*, {n_test}) the held-out pool"
        )
    if split == "test_only":
        return (
            f"{name}'s test files (t10k-*) alone from {where}, split 80/20 (stratified, seed 0): "
            f"{n_train} training and {n_test} held-out images (no train-* files there)"
        )
    return ""


def load_source(name: str, data_dir: str | Path = "") -> Arrays:
    """:func:`read_source`, checked: images of the source's shape in both pools, as many labels
    as images, every label a class of the source (:func:`check_pools`)."""
    arrays = read_source(name, data_dir)
    if name != "digits":  # embedded: nothing to check
        check_pools(name, data_dir, arrays)
    return arrays


IMAGE_SHAPES = {"mnist": (1, 28, 28), "fashion_mnist": (1, 28, 28), "cifar10": (3, 32, 32),
                "cifar100": (3, 32, 32)}  # fmt: skip


def check_pools(name: str, data_dir: str | Path, arrays: Arrays) -> None:
    """Files that decode to nonsense are refused before training: an empty pool, images of
    another shape than the source's (:data:`IMAGE_SHAPES`), fewer labels than images, or a
    label outside ``[0, num_classes)``.

    Raises:
        ConfigError: naming ``data.data_dir``, the pool and what was found.
    """
    x, y, x_te, y_te, c = arrays
    head = f"data.data_dir: got {str(data_dir)!r}, whose {name}"
    fix = f"replace them with the files of {name}, or set data.name to the data set they hold"
    for pool, xs, ys in (("training", x, y), ("held-out", x_te, y_te)):
        shape = tuple(xs.shape[1:])
        if len(xs) == 0 or len(xs) != len(ys):
            raise ConfigError(
                f"{head} {pool} files hold {len(xs)} images and {len(ys)} labels, expected as "
                f"many labels as images, at least one; {fix}",
                key="data.data_dir",
            )
        if name in IMAGE_SHAPES and shape != IMAGE_SHAPES[name]:
            raise ConfigError(
                f"{head} {pool} images have shape {list(shape)}, expected "
                f"{list(IMAGE_SHAPES[name])}; {fix}",
                key="data.data_dir",
            )
        bad = torch.nonzero((ys < 0) | (ys >= c)).flatten()
        if len(bad):
            raise ConfigError(
                f"{head} {pool} labels include {int(ys[bad[0]])} (row {int(bad[0])}, "
                f"{len(bad)} such rows), expected class labels in [0, {c}); {fix}",
                key="data.data_dir",
            )


def read_source(name: str, data_dir: str | Path = "") -> Arrays:
    """A training pool and a held-out pool for data set ``name``.

    - ``digits``: scikit-learn's 1797 digits, split 70 / 30 stratified with the fixed seed 0
      (the same split on every run and rank); ``data_dir`` is not used.
    - ``mnist``, ``fashion_mnist``: the training files are the pool, the test files the
      held-out pool. Where only the test split is present (e.g. a folder with MNIST's t10k
      files alone) it is split 80 / 20 stratified with the fixed seed 0, with a warning.
    - ``cifar10``, ``cifar100``: torchvision's CIFAR classes on ``data_dir`` (training and test
      batches), standardised per channel with the training split's statistics.

    Returns:
        ``(x_pool, y_pool, x_test_pool, y_test_pool, num_classes)``.

    Raises:
        ConfigError: an unknown ``name`` (the message lists the available ones) or missing files.
    """
    if name == "digits":
        x, y = load_digits_arrays()
        tr, te = _stratified_split(y, 0.3, seed=0)
        return x[tr], y[tr], x[te], y[te], 10
    if name in ("mnist", "fashion_mnist"):
        fashion = name == "fashion_mnist"
        root = Path(data_dir).expanduser()
        if mnist_split(name, data_dir) == "test_only":
            warnings.warn(
                f"data.data_dir={str(root)!r} holds only the {name} test split; splitting it "
                "80/20 into a training pool and a held-out pool",
                stacklevel=2,
            )
            x_test, y_test = load_mnist(root, train=False, fashion=fashion)
            tr, te = _stratified_split(y_test, 0.2, seed=0)
            return x_test[tr], y_test[tr], x_test[te], y_test[te], 10
        x_train, y_train = load_mnist(root if str(data_dir) else "", train=True, fashion=fashion)
        x_test, y_test = load_mnist(root, train=False, fashion=fashion)
        return x_train, y_train, x_test, y_test, 10
    if name in ("cifar10", "cifar100"):  # torchvision's CIFAR classes, standardised per channel
        return load_cifar_pools(name, data_dir)
    raise ConfigError.bad_value(
        "data.name",
        name,
        f"one of {SOURCES}, a reader of your own files {FILE_READERS} (with data.data_dir), or "
        "a function of your own, MODULE:FUNCTION",
        "digits",
    )
