"""The run's ``model`` config node (:class:`ModelConfig`) and a researcher's own model,
``model.name=MODULE:NAME``: its class or factory, its ``Params`` (further ``model.*`` keys), and
its build under the run's seed."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.imports import import_module
from lit_fedco.core.model_stats import check_running_stats


def is_model_ref(name: str) -> bool:
    """Whether ``model.name`` names a researcher's model, ``MODULE:NAME``."""
    return ":" in name


def model_factory(ref: str) -> tuple[Callable[..., nn.Module], type | None]:
    """The class or factory ``MODULE:NAME`` names, and its parameters' dataclass (its
    ``Params`` attribute, a frozen dataclass whose fields are ``model.*`` keys; None if it
    declares none).

    Raises:
        ConfigError: (key ``model.name``) a module that cannot be imported, a missing name, or
            a name that is neither an ``nn.Module`` class nor a callable.
    """
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr.isidentifier():
        raise ConfigError.bad_value(
            "model.name", ref, "one of the built-in names or MODULE:NAME", "my_models:MyCNN"
        )
    module = import_module(module_name, "model.name")
    obj = getattr(module, attr, None)
    if obj is None or not callable(obj):
        found = sorted(
            k for k, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, nn.Module) and v.__module__ == module.__name__
        )  # fmt: skip
        what = "no" if obj is None else f"a non-callable {type(obj).__name__}"
        raise ConfigError(
            f"model.name: module {module_name!r} has {what} {attr!r} (its nn.Module classes: "
            f"{', '.join(found) or 'none'}); name an nn.Module class or a factory function, "
            f"e.g. model.name={module_name}:{found[0] if found else 'MyNet'}",
            key="model.name",
        )
    params_cls = getattr(obj, "Params", None)
    if params_cls is not None and not dataclasses.is_dataclass(params_cls):
        raise ConfigError(
            f"model.name: {ref}.Params is a {type(params_cls).__name__}, expected a dataclass "
            "(its fields are the model.* keys); decorate it with @dataclasses.dataclass",
            key="model.name",
        )
    if isinstance(params_cls, type):
        for f in dataclasses.fields(params_cls):
            no_default = f.default is dataclasses.MISSING
            if no_default and f.default_factory is dataclasses.MISSING:
                raise ConfigError(
                    f"model.name: {ref}.Params.{f.name} has no default; give every field of "
                    "Params a default (the model.* key's value when none is set)",
                    key="model.name",
                )
            if f.name in MODEL_KEYS:
                raise ConfigError(
                    f"model.name: {ref}.Params.{f.name} clashes with lit_fedco's own key "
                    f"model.{f.name}; rename the field (lit_fedco's keys: "
                    f"{', '.join(MODEL_KEYS)})",
                    key="model.name",
                )
        return obj, params_cls
    return obj, None


@dataclasses.dataclass
class ModelConfig:
    """The network (``lit_fedco.core.models``).

    Attributes:
        name: ``logreg`` (multinomial logistic regression), ``mlp`` (tanh, ``hidden``),
            ``resnet20``, ``linear`` (a score without bias), ``cnn`` (a small CNN, ``hidden``
            units), ``conv4`` (MAML's four-layer CNN, ``hidden`` filters), ``char_lstm`` (a
            two-layer LSTM of ``hidden`` units over token ids, for ``data.name=text``), or
            your own ``MODULE:NAME``: an ``nn.Module`` class or factory built as
            ``NAME(input_shape, num_classes[, seed][, params])``, whose ``Params`` dataclass
            fields are further ``model.*`` keys.
        hidden: hidden units (``mlp``, ``cnn``, ``char_lstm``) or filters (``conv4``).
        buffers: batch norms' running statistics: ``average`` (averaged over the clients like
            the parameters, the FedAvg convention) or ``local`` (each client keeps its own
            across rounds and is evaluated with them: FedBN, Li et al. 2021).
    """

    name: str = "logreg"
    hidden: int = 64
    buffers: str = "average"


MODEL_BUFFERS = ("average", "local")
"""``model.buffers``: running statistics averaged like the parameters, or kept per client."""
MODEL_KEYS = tuple(f.name for f in dataclasses.fields(ModelConfig))
"""lit_fedco's own ``model.*`` keys, which a researcher's ``Params`` may not reuse."""


def build_user_model(
    ref: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    params: dict[str, Any] | None = None,
) -> nn.Module:
    """Build a researcher's model ``MODULE:NAME``: ``NAME(input_shape, num_classes)`` with
    ``seed=`` and ``params=`` (its ``Params`` built from ``params``, the ``model.*`` keys)
    passed too when its signature takes them, under a generator seeded by ``seed``; its
    output for two rows of zeros must be ``[2, num_classes]``.

    Raises:
        ConfigError: (key ``model.name``) see :func:`model_factory`; a call that fails; a
            result that is not an ``nn.Module``, or outputs of the wrong shape.
    """
    factory, params_cls = model_factory(ref)
    kwargs: dict[str, Any] = {}
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        accepted = {}  # type: ignore[assignment]
    if "seed" in accepted:
        kwargs["seed"] = seed
    if params_cls is not None and "params" in accepted:
        names = {f.name for f in dataclasses.fields(params_cls)}
        kwargs["params"] = params_cls(**{k: v for k, v in (params or {}).items() if k in names})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = factory(tuple(input_shape), num_classes, **kwargs)
        except ConfigError:
            raise
        except Exception as err:
            first = (str(err).splitlines() or [""])[0][:200]
            raise ConfigError(
                f"model.name: {ref}(input_shape={tuple(input_shape)}, num_classes="
                f"{num_classes}{', seed=...' if 'seed' in kwargs else ''}"
                f"{', params=...' if 'params' in kwargs else ''}) raised {type(err).__name__}: "
                f"{first}; a model is built as NAME(input_shape, num_classes[, seed][, params])",
                key="model.name",
            ) from None
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model.name: {ref} returned a {type(model).__name__}, expected a torch.nn.Module",
            key="model.name",
        )
    check_running_stats(model, "model.name")
    _check_outputs(model, ref, input_shape, num_classes)
    return model


def _check_outputs(
    model: nn.Module, ref: str, input_shape: tuple[int, ...], num_classes: int
) -> None:
    """One eval-mode forward of two rows of zeros (token id 0 for integer inputs) must give
    ``[2, num_classes]``."""
    p = next(model.parameters(), None)
    dtype = p.dtype if p is not None else torch.get_default_dtype()
    x = torch.zeros((2, *input_shape), dtype=dtype)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            try:
                out = model(x)
            except Exception:  # token inputs (an embedding) take integer ids
                out = model(x.long())
    except Exception as err:
        first = (str(err).splitlines() or [""])[0][:200]
        raise ConfigError(
            f"model.name: {ref} fails on inputs of the data's shape [2, "
            f"{', '.join(map(str, input_shape))}] ({type(err).__name__}: {first}); make its "
            "forward take the data set's rows",
            key="model.name",
        ) from None
    finally:
        model.train(was_training)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
    if shape != (2, num_classes):
        raise ConfigError(
            f"model.name: {ref} gives outputs of shape {list(shape) if shape else type(out)} "
            f"for 2 rows, expected [2, {num_classes}] (one output per class of the data); "
            "make its last layer's size the num_classes it is built with",
            key="model.name",
        )
