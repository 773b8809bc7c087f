"""A data set from a function of one's own: ``data.name=MODULE:FUNCTION``.

The function is imported the way ``updater=MODULE:Class`` is (from ``sys.path``: the current
folder, ``PYTHONPATH`` or an installed package) and called once per run and seed with the
keyword arguments it declares, any of:

- ``params``: its parameters, a frozen dataclass declared by annotating ``params`` with it
  (``def load(params: Params, data_dir: str, seed: int)``) or as the function's attribute
  ``Params``; its fields become ``data.<field>`` keys, set on the command line and listed by
  ``--help``, like an updater's ``Hparams``;
- ``data_dir``: ``data.data_dir`` as given (a string, possibly empty);
- ``seed``: the run's seed (for a synthetic data set; the partition has a stream of its own).

It returns the training and test pools and the number of classes, as any of:

- a :class:`UserData` (``x_train``, ``y_train``, ``x_test``, ``y_test``, ``num_classes`` and
  optionally ``group_train``, ``group_test``: a group id per row, for ``partition=natural``
  and ``val_mode=own``), or a ``dict`` with those keys;
- a tuple ``(x_train, y_train, x_test, y_test, num_classes)``;
- a tuple ``(train, test, num_classes)`` of ``torch.utils.data.Dataset``\\ s whose items are
  ``(x, y)`` or ``(x, y, group)``.

Inputs and labels may be tensors or ``numpy`` arrays: floating inputs become float32,
``uint8`` ones (images) float32 in [0, 1], other integer ones (token ids) stay int64; labels
are ints in ``[0, num_classes)``; group ids ints or strings. Everything is checked, and a
wrong type, mismatched lengths or a label outside the classes is a one-line
:class:`~lit_fedco.core.errors.ConfigError` naming ``data.name``.

This module imports torch only when the function's result is converted, so the command line
can import a data function and list its keys first.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.imports import import_module, raised

ARGUMENTS = ("params", "data_dir", "seed")
"""The keyword arguments a data function may declare."""
KEY_TYPES: tuple[Any, ...] = (int, float, str, bool, list[int], list[float], list[str])
"""The types a parameter (a config key) may have."""


@dataclass
class UserData:
    """What a data function returns (or a ``dict`` with these keys).

    Attributes:
        x_train: training inputs [N, ...] (a tensor or a ``numpy`` array).
        y_train: training labels [N], ints in ``[0, num_classes)``.
        x_test: held-out inputs [M, ...], of the training inputs' shape.
        y_test: held-out labels [M].
        num_classes: C.
        group_train: a group id per training row (ints or strings), or None.
        group_test: a group id per held-out row, or None.
    """

    x_train: Any
    y_train: Any
    x_test: Any
    y_test: Any
    num_classes: int
    group_train: Any = None
    group_test: Any = None


def resolve_function(ref: str) -> Callable[..., Any]:
    """The function ``module:function`` names, imported.

    Raises:
        ConfigError: a missing module or function, or one that is not callable.
    """
    module_name, _, attr = ref.partition(":")
    module = import_module(module_name, "data.name")
    fn = getattr(module, attr, None)
    if fn is None:
        found = sorted(
            k for k, v in vars(module).items()
            if inspect.isfunction(v) and v.__module__ == module.__name__ and not k.startswith("_")
        )  # fmt: skip
        raise ConfigError(
            f"data.name: module {module_name!r} has no function {attr!r} (its functions: "
            f"{', '.join(found) or 'none'}); name one, e.g. data.name={module_name}:"
            f"{found[0] if found else 'load'}",
            key="data.name",
        )
    if not callable(fn) or isinstance(fn, type):
        raise ConfigError(
            f"data.name: {ref!r} is a {type(fn).__name__}, expected a function returning the "
            "data (see lit_fedco.data.user)",
            key="data.name",
        )
    unknown = [
        p.name for p in inspect.signature(fn).parameters.values()
        if p.name not in ARGUMENTS and p.default is inspect.Parameter.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]  # fmt: skip
    if unknown:
        raise ConfigError(
            f"data.name: {ref!r} requires the argument {unknown[0]!r}, expected only arguments "
            f"among {ARGUMENTS} (each optional); rename it or give it a default",
            key="data.name",
        )
    return typing.cast(Callable[..., Any], fn)


def params_class(fn: Callable[..., Any], ref: str, taken: Collection[str] = ()) -> type | None:
    """The frozen dataclass of ``fn``'s parameters: the annotation of its ``params`` argument,
    else its attribute ``Params``; None where it declares neither.

    Args:
        fn: the data function.
        ref: its ``module:function`` (for the messages).
        taken: lit_fedco's own ``data`` keys, which no field may be named.

    Raises:
        ConfigError: a declared class that is not a frozen dataclass with defaults, or a field
            whose name is a built-in ``data`` key.
    """
    cls = None
    if "params" in inspect.signature(fn).parameters:
        try:
            cls = typing.get_type_hints(fn).get("params")
        except Exception:  # an annotation that does not resolve: fall back on Params
            cls = None
    cls = cls if isinstance(cls, type) else getattr(fn, "Params", None)
    if cls is None:
        return None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ConfigError(
            f"data.name: {ref!r} declares parameters {cls!r}, expected a frozen dataclass "
            "(@dataclass(frozen=True) class Params: ...)",
            key="data.name",
        )
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if hints.get(f.name) not in KEY_TYPES:
            raise ConfigError(
                f"data.name: the parameter {f.name!r} of {ref!r} has the type "
                f"{getattr(hints.get(f.name), '__name__', hints.get(f.name))}, expected one a "
                "config key can hold: int, float, str, bool, list[int], list[float] or list[str]",
                key="data.name",
            )
        if f.name in taken or f.name == "seed":
            raise ConfigError(
                f"data.name: {ref!r} has a parameter {f.name!r}, which is a data key of "
                f"lit_fedco's own (data.{f.name}); rename the field",
                key="data.name",
            )
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(
                f"data.name: {ref!r}'s parameter {f.name!r} has no default; give it one (its "
                f"key data.{f.name} then defaults to it)",
                key="data.name",
            )
    return cls


def function_params(
    fn: Callable[..., Any], ref: str, spec: object, taken: Collection[str] = ()
) -> Any:
    """``fn``'s parameters built from ``spec``'s attributes (``data.<field>``), each field's
    default where ``spec`` has none; None where ``fn`` declares no parameters. ``taken``: as
    for :func:`params_class`.

    Raises:
        ConfigError: the class's own checks (its ``__post_init__``) refused a value.
    """
    cls = params_class(fn, ref, taken)
    if cls is None:
        return None
    names = [f.name for f in dataclasses.fields(cls)]
    values = {name: getattr(spec, name) for name in names if hasattr(spec, name)}
    try:
        return cls(**values)
    except ConfigError as err:
        raise err.under("data") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"data: {ref!r}'s parameters refused {values} ({err})",
                          key="data.name") from None  # fmt: skip


def call_function(ref: str, params: Any, data_dir: str, seed: int) -> Any:
    """Call the data function with the arguments it declares.

    Raises:
        ConfigError: the function raised (one line: the error and where).
    """
    fn = resolve_function(ref)
    given = {"params": params, "data_dir": data_dir, "seed": seed}
    names = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in given.items() if k in names}
    try:
        return fn(**kwargs)
    except ConfigError:
        raise
    except Exception as err:
        raise raised(f"calling {ref!r}", "data.name", err) from None


def _dataset_arrays(ds: Any, what: str, ref: str) -> tuple[Any, Any, Any]:
    """A ``torch.utils.data.Dataset``'s items ``(x, y)`` or ``(x, y, group)`` stacked."""
    import numpy as np
    import torch

    key = "data.name"
    try:
        items = [ds[i] for i in range(len(ds))]
    except Exception as err:
        raise raised(f"reading the {what} Dataset of {ref!r}", key, err) from None
    if not items or not all(isinstance(it, tuple | list) and len(it) in (2, 3) for it in items):
        first = type(items[0]).__name__ if items else "nothing"
        raise ConfigError(
            f"data.name: {ref!r}'s {what} Dataset yields {first}, expected (x, y) or "
            "(x, y, group) items, at least one",
            key=key,
        )
    xs = [torch.as_tensor(np.asarray(it[0])) if not isinstance(it[0], torch.Tensor) else it[0]
          for it in items]  # fmt: skip
    try:
        x = torch.stack(xs)
    except RuntimeError as err:
        raise ConfigError(f"data.name: {ref!r}'s {what} Dataset yields inputs of different "
                          f"shapes ({err})", key=key) from None  # fmt: skip
    y = np.asarray([int(it[1]) for it in items])
    g = np.asarray([it[2] for it in items]) if len(items[0]) == 3 else None
    return x, y, g


def function_pools(ref: str, result: Any) -> Any:
    """The :class:`~lit_fedco.data.pools.Pools` of a data function's ``result``, converted and
    checked.

    Raises:
        ConfigError: naming ``data.name``: a result of another form, inputs or labels that are
            not arrays, mismatched lengths, labels outside ``[0, num_classes)``.
    """
    from torch.utils.data import Dataset

    from lit_fedco.data.pools import Pools, as_groups, as_inputs, as_labels, check

    key = "data.name"
    forms = (
        "a lit_fedco.data.UserData, a dict with its keys, (x_train, y_train, x_test, y_test, "
        "num_classes) or (train_dataset, test_dataset, num_classes)"
    )
    if isinstance(result, UserData):
        result = dataclasses.asdict(result)
    if isinstance(result, tuple | list) and len(result) == 3:
        train, test, c = result
        if not (isinstance(train, Dataset) and isinstance(test, Dataset)):
            raise ConfigError(
                f"data.name: {ref!r} returned a {len(result)}-tuple of "
                f"({type(train).__name__}, {type(test).__name__}, ...), expected {forms}",
                key=key,
            )
        x, y, g = _dataset_arrays(train, "training", ref)
        x_te, y_te, g_te = _dataset_arrays(test, "test", ref)
        result = {"x_train": x, "y_train": y, "x_test": x_te, "y_test": y_te, "num_classes": c,
                  "group_train": g, "group_test": g_te}  # fmt: skip
    elif isinstance(result, tuple | list) and len(result) == 5:
        result = dict(zip(("x_train", "y_train", "x_test", "y_test", "num_classes"), result,
                          strict=True))  # fmt: skip
    if not isinstance(result, dict):
        kind = type(result).__name__
        shown = f"a {len(result)}-item {kind}" if isinstance(result, tuple | list) else f"a {kind}"
        raise ConfigError(f"data.name: {ref!r} returned {shown}, expected {forms}", key=key)
    needed = ("x_train", "y_train", "x_test", "y_test", "num_classes")
    missing = [k for k in needed if k not in result]
    unknown = [k for k in result if k not in (*needed, "group_train", "group_test")]
    if missing or unknown:
        raise ConfigError(
            f"data.name: {ref!r} returned a dict with keys {sorted(result)}, expected "
            f"{', '.join(needed)} and optionally group_train, group_test",
            key=key,
        )
    src = f"{ref!r} returned"
    pools = Pools(
        as_inputs(result["x_train"], f"{src} x_train that", key),
        as_labels(result["y_train"], f"{src} y_train that", key),
        as_inputs(result["x_test"], f"{src} x_test that", key),
        as_labels(result["y_test"], f"{src} y_test that", key),
        result["num_classes"],
        as_groups(result.get("group_train"), f"{src} group_train that", key),
        as_groups(result.get("group_test"), f"{src} group_test that", key),
        note=f"the data function {ref}",
    )
    return check(pools, key, ref)
