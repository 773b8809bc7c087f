"""Pytree helpers for client and server state.

State is a nested ``dict`` of tensors (a pytree): the model's parameters live under the
updater's ``model_key`` (``"x"`` by default) as ``{name: tensor}``; an updater adds its own
entries (``"v"`` for momentum, ``"y"`` for an inner estimate, ...). One client's state has unbatched
leaves; the executors stack the states of many clients along a new leading dimension.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

State = dict[str, Any]
"""A nested dict of tensors."""


def tree_map(fn: Callable[..., Tensor], tree: Any, *rest: Any) -> Any:
    """Apply ``fn`` leaf-wise over one or more trees of the same structure."""
    return pytree.tree_map(fn, tree, *rest)


def tree_leaves(tree: Any) -> list[Tensor]:
    """The leaves of ``tree`` in a fixed (insertion) order."""
    return pytree.tree_leaves(tree)


def tree_clone(tree: Any) -> Any:
    """A deep copy of every tensor leaf."""
    return tree_map(lambda t: t.clone(), tree)


def tree_axpy(alpha: float | Tensor, x: Any, y: Any) -> Any:
    """``y + alpha * x`` leaf-wise."""
    return tree_map(lambda a, b: b + alpha * a, x, y)


_ONE: dict[tuple[torch.device, torch.dtype], Tensor | None] = {}
"""Per device and dtype: a 0-d one when ``addcmul_`` rounds ``alpha · x`` before adding it (a
one-pass :func:`foreach_axpy_`), else None."""


def _one_pass(device: torch.device, dtype: torch.dtype) -> Tensor | None:
    """A 0-d one on ``device`` if ``y.addcmul_(x, one, value=alpha)`` gives exactly
    ``y + alpha * x`` there in ``dtype`` (the product rounded, then the sum: no fused
    multiply-add, no wider accumulator), else None. Checked once, on 4,099 random elements (a
    vector kernel's body and its tail): a single rounding differs from two on many of them."""
    key = (device, dtype)
    if key not in _ONE:
        gen = torch.Generator().manual_seed(20)
        x, y = (torch.randn(4099, generator=gen, dtype=torch.float64).to(device, dtype)
                for _ in range(2))  # fmt: skip
        one = torch.ones((), dtype=dtype, device=device)
        same = torch.equal(y.clone().addcmul_(x, one, value=-0.05), y + -0.05 * x)
        _ONE[key] = one if same else None
    return _ONE[key]


def foreach_axpy_(alpha: float, xs: Sequence[Tensor], ys: Sequence[Tensor]) -> None:
    """``ys[i] ← ys[i] + alpha · xs[i]`` in place, with the numbers of :func:`tree_axpy` (the
    product rounded, then the sum). In one pass over memory where the device's ``addcmul_`` keeps
    those two roundings (checked once per device and dtype; true of the CPU kernels in float32
    and float64), else the product in a new tensor and then the sum. ``ys`` must share no memory
    with ``xs`` or with each other. Tensors of several devices or dtypes take two passes."""
    if not ys:
        return
    kinds = {(y.device, y.dtype) for y in ys}
    one = _one_pass(*kinds.pop()) if len(kinds) == 1 else None
    if one is not None:
        torch._foreach_addcmul_(list(ys), list(xs), [one] * len(ys), value=alpha)
    else:
        torch._foreach_add_(list(ys), torch._foreach_mul(list(xs), alpha))


def own_storage(tensors: Sequence[Tensor], others: Sequence[Tensor] = ()) -> bool:
    """Whether each of ``tensors`` may be overwritten in place without touching another or any of
    ``others``: each contiguous (no element seen twice, as in an expanded tensor) and no two
    sharing memory. True of the gradients ``torch.autograd.grad`` returns for most graphs; not
    where a forward adds two parameters (``p + q`` may hand both one tensor) or sums one up
    (``p.sum()`` hands back an expanded scalar)."""
    mine = {t.untyped_storage().data_ptr() for t in tensors}
    return (
        len(mine) == len(tensors)
        and all(t.is_contiguous() for t in tensors)
        and mine.isdisjoint(t.untyped_storage().data_ptr() for t in others)
    )


def tree_sub(a: Any, b: Any) -> Any:
    """``a - b`` leaf-wise."""
    return tree_map(lambda u, v: u - v, a, b)


def tree_scale(alpha: float | Tensor, a: Any) -> Any:
    """``alpha * a`` leaf-wise."""
    return tree_map(lambda u: alpha * u, a)


def tree_zeros(tree: Any) -> Any:
    """Zeros shaped like every leaf of ``tree`` (a control variate's start)."""
    return tree_map(torch.zeros_like, tree)


def tree_dot(a: Any, b: Any) -> Tensor:
    """Sum over leaves of the elementwise product (an inner product of flattened trees)."""
    leaves_a, leaves_b = tree_leaves(a), tree_leaves(b)
    return sum(((u * v).sum() for u, v in zip(leaves_a, leaves_b, strict=True)), torch.tensor(0.0))


def stack(trees: list[Any]) -> Any:
    """Stack a list of same-structure trees along a new leading dimension."""
    return tree_map(lambda *ts: torch.stack(ts), *trees)


def broadcast(tree: Any, n: int) -> Any:
    """``n`` copies of ``tree`` stacked along a new leading dimension (materialised)."""
    return tree_map(lambda t: t.unsqueeze(0).expand(n, *t.shape).clone(), tree)


def index(tree: Any, i: int | slice | Tensor) -> Any:
    """Select along the leading (client) dimension."""
    return tree_map(lambda t: t[i], tree)


def flatten(tree: Any) -> tuple[Tensor, list[tuple[torch.Size, int]], pytree.TreeSpec]:
    """Concatenate all leaves into one flat 1-D buffer (one collective instead of one per leaf).

    Returns:
        The flat buffer, each leaf's (shape, numel), and the tree spec for :func:`unflatten`.
    """
    leaves, spec = pytree.tree_flatten(tree)
    if not leaves:
        return torch.zeros(0), [], spec
    meta = [(t.shape, t.numel()) for t in leaves]
    flat = torch.cat([t.reshape(-1) for t in leaves])
    return flat, meta, spec


def unflatten(flat: Tensor, meta: list[tuple[torch.Size, int]], spec: pytree.TreeSpec) -> Any:
    """Inverse of :func:`flatten`."""
    leaves = []
    offset = 0
    for shape, numel in meta:
        leaves.append(flat[offset : offset + numel].view(shape))
        offset += numel
    return pytree.tree_unflatten(leaves, spec)


def numel(tree: Any) -> int:
    """Total number of elements over all leaves."""
    return sum(t.numel() for t in tree_leaves(tree))
