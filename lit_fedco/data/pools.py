"""A training pool and a held-out pool with optional group ids, as every reader of one's own
files (:mod:`lit_fedco.data.readers`) and every data function (:mod:`lit_fedco.data.user`)
gives them, converted and checked in one place.

Conversion (:func:`as_inputs`): floating inputs become float32; ``uint8`` inputs (images as
stored) float32 in [0, 1]; other integer and boolean inputs int64, unscaled (token ids of a
text, categorical codes), which the run keeps as they are (it casts only floating inputs to
its ``dtype``). Labels become int64 [N]; group ids an int64 or a string ``numpy`` array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_fedco.core.errors import ConfigError


@dataclass
class Pools:
    """The pools of a data set read from one's own files or function.

    Attributes:
        x, y: the training pool's inputs [N, ...] and labels [N].
        x_test, y_test: the held-out pool's.
        num_classes: C.
        groups, groups_test: a group id per row of each pool (``numpy``, ints or strings), or
            None.
        note: one line saying where the pools came from (printed with the partition).
        extra: what else the reader records (a text's vocabulary) in the data's ``stats``.
    """

    x: Tensor
    y: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int
    groups: np.ndarray | None = None
    groups_test: np.ndarray | None = None
    note: str = ""
    extra: dict[str, Any] | None = None


def _array(value: Any, what: str, key: str) -> np.ndarray | Tensor:
    if isinstance(value, Tensor):
        return value.detach().cpu()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list | tuple):
        try:
            return np.asarray(value)
        except ValueError as err:
            raise ConfigError(f"{key}: {what} is a ragged {type(value).__name__} ({err}); "
                              "give arrays of one shape", key=key) from None  # fmt: skip
    raise ConfigError(
        f"{key}: {what} is a {type(value).__name__}, expected a torch tensor or a numpy array",
        key=key,
    )


def _tensor(a: np.ndarray | Tensor, kinds: str) -> np.ndarray | Tensor:
    """``a`` as a tensor where it is one or a numpy array of one of ``kinds``, else as it is."""
    if isinstance(a, np.ndarray) and a.dtype.kind in kinds:
        return torch.from_numpy(np.ascontiguousarray(a))
    return a


def as_inputs(value: Any, what: str, key: str) -> Tensor:
    """Inputs as a tensor: float32 (``uint8`` scaled to [0, 1]) or int64 (other integers).

    Raises:
        ConfigError: not an array, or of a dtype that is neither numeric nor boolean.
    """
    a = _array(value, what, key)
    t = _tensor(a, "biuf")
    if not isinstance(t, Tensor):
        raise ConfigError(
            f"{key}: {what} has dtype {a.dtype}, expected numbers (floats, or ints such as "
            "token ids or uint8 pixels)",
            key=key,
        )
    if t.dim() == 0:
        raise ConfigError(f"{key}: {what} is a scalar, expected one row per sample", key=key)
    if t.dtype == torch.uint8:
        return t.to(torch.float32) / 255.0
    if t.is_floating_point():
        return t.to(torch.float32)
    if t.is_complex():
        raise ConfigError(f"{key}: {what} is complex, expected real numbers", key=key)
    return t.to(torch.int64)


def as_labels(value: Any, what: str, key: str) -> Tensor:
    """Labels as an int64 tensor [N].

    Raises:
        ConfigError: not an array, not one-dimensional, or not integers.
    """
    a = _array(value, what, key)
    t = _tensor(a, "biu")
    if not isinstance(t, Tensor) or t.is_floating_point() or t.is_complex() or t.dim() != 1:
        shape = list(getattr(a, "shape", ()))
        raise ConfigError(
            f"{key}: {what} has dtype {a.dtype} and shape {shape}, expected integer class "
            "labels of shape [N]",
            key=key,
        )
    return t.to(torch.int64)


def as_groups(value: Any, what: str, key: str) -> np.ndarray | None:
    """Group ids as an int64 or a string array [N], or None.

    Raises:
        ConfigError: not one-dimensional, or of floats.
    """
    if value is None:
        return None
    a = _array(value, what, key)
    g = a.numpy() if isinstance(a, Tensor) else a
    if g.ndim != 1 or g.dtype.kind in "fc":
        raise ConfigError(
            f"{key}: {what} has dtype {g.dtype} and shape {list(g.shape)}, expected a group id "
            "(an int or a string) per row, shape [N]",
            key=key,
        )
    if g.dtype.kind in "biu":
        return g.astype(np.int64)
    return g.astype(str)


def check(pools: Pools, key: str, source: str) -> Pools:
    """``pools`` if it is consistent: as many labels (and group ids) as inputs, at least one
    row per pool, the held-out inputs of the training inputs' shape and kind, labels in
    ``[0, num_classes)``.

    Raises:
        ConfigError: naming ``key`` and ``source`` and what was found.
    """
    c = pools.num_classes
    if isinstance(c, bool) or not isinstance(c, int | np.integer) or c < 1:
        raise ConfigError(f"{key}: {source} gives num_classes={c!r}, expected an int >= 1",
                          key=key)  # fmt: skip
    for pool, x, y, g in (("training", pools.x, pools.y, pools.groups),
                          ("test", pools.x_test, pools.y_test, pools.groups_test)):  # fmt: skip
        if len(x) == 0 or len(x) != len(y):
            raise ConfigError(
                f"{key}: {source} gives {len(x)} {pool} inputs and {len(y)} labels, expected "
                "as many labels as inputs, at least one",
                key=key,
            )
        if g is not None and len(g) != len(y):
            raise ConfigError(
                f"{key}: {source} gives {len(g)} {pool} group ids for {len(y)} rows, expected "
                "one per row",
                key=key,
            )
        bad = torch.nonzero((y < 0) | (y >= c)).flatten()
        if len(bad):
            raise ConfigError(
                f"{key}: {source}'s {pool} labels include {int(y[bad[0]])} (row {int(bad[0])}, "
                f"{len(bad)} such rows), expected class labels in [0, {c}) (num_classes={c})",
                key=key,
            )
    if pools.x.shape[1:] != pools.x_test.shape[1:] or pools.x.dtype != pools.x_test.dtype:
        raise ConfigError(
            f"{key}: {source} gives training inputs {pools.x.dtype} {list(pools.x.shape[1:])} "
            f"and test inputs {pools.x_test.dtype} {list(pools.x_test.shape[1:])} per row, "
            "expected one shape and kind",
            key=key,
        )
    pools.num_classes = int(c)
    return pools


def split_off_test(
    x: Tensor, y: Tensor, groups: np.ndarray | None, fraction: float = 0.2
) -> tuple[Tensor, Tensor, np.ndarray | None, Tensor, Tensor, np.ndarray | None]:
    """A training and a held-out pool cut from one set of rows: ``fraction`` of each class,
    stratified, with the fixed seed 0 (the same on every run and rank)."""
    rng = np.random.default_rng(0)
    labels = y.numpy()
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cut = round(len(idx) * fraction)
        test.append(idx[:cut])
        train.append(idx[cut:])
    tr, te = np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
    g_tr = groups[tr] if groups is not None else None
    g_te = groups[te] if groups is not None else None
    t_tr, t_te = torch.from_numpy(tr), torch.from_numpy(te)
    return x[t_tr], y[t_tr], g_tr, x[t_te], y[t_te], g_te
