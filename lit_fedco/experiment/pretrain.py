"""A shared starting point for every method of a run: ``init_from=PATH`` and the ``pretrain``
phase.

- ``init_from=PATH``: the model parameters of a lit_fedco checkpoint (the server's ``x`` of any
  sub-run's ``checkpoints/round-*.ckpt``, or a pre-training's ``pretrained.ckpt``) are every
  updater's initial model, whatever the seed. The file is verified (magic line, SHA-256) and its
  parameters must have the names and shapes of this run's model.
- ``pretrain.rounds=N`` (N > 0): before the methods of a seed run, ``pretrain.updater``
  (``fedavg``: the problem's ``erm`` objective, cross-entropy) trains N rounds with step size
  ``pretrain.lr`` and the run's schedule (cohort, local steps, batch size), from ``init_from``'s
  parameters if given, else from the model's seeded initialisation. It is a sub-run like any
  other, in ``<run>/pretrain-seed<s>/`` (metrics, checkpoints, resume), and its final model is
  also written to ``<run>/pretrain-seed<s>/pretrained.ckpt`` for ``init_from=`` to reuse. Every
  method of that seed starts from that model: the same seed gives the same starting point, and
  the same one for every method. Its rounds and communication are its own row of the table
  (``pretrain``); the methods' ``floats/client`` count only their own rounds.

Each method's ``status.json`` and logged config record where it started (``init``: the file or
the pre-training, and a fingerprint of the parameters).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from torch import Tensor

from lit_fedco.core.errors import ConfigError
from lit_fedco.experiment.subruns import pretrains
from lit_fedco.store import checkpoint as ckpt

PRETRAINED = "pretrained.ckpt"
"""The file, in the pre-training's sub-run folder, holding its final model."""


def pretrain_config(cfg: DictConfig) -> DictConfig:
    """The run config of the pre-training: its updater alone, ``pretrain.rounds`` rounds, its
    step size ``pretrain.lr``; everything else (data, model, problem, schedule) the run's."""
    p = cfg.pretrain
    out = copy.deepcopy(cfg)
    out.updaters = [str(p.updater)]
    out.rounds = int(p.rounds)
    out.variants = []
    out[str(p.updater)].lr = float(p.lr)
    return out


def check(cfg: DictConfig) -> None:
    """The ``pretrain`` node's ranges (its updater and objective are checked by building it).

    Raises:
        ConfigError: naming ``pretrain.rounds``, ``pretrain.lr`` or ``pretrain.updater``.
    """
    from lit_fedco.updaters import available_updaters

    p = cfg.pretrain
    if p.rounds < 0:
        raise ConfigError.bad_value(
            "pretrain.rounds", p.rounds, "an int >= 0 (0: no pre-training)", "20"
        )
    if not pretrains(cfg):
        return
    if p.updater not in available_updaters():
        raise ConfigError.bad_value(
            "pretrain.updater", p.updater, f"one of {available_updaters()}", "fedavg"
        )
    if not p.lr > 0:
        raise ConfigError.bad_value("pretrain.lr", p.lr, "a float > 0", "0.05")


def load_params(path: str | Path) -> dict[str, Tensor]:
    """The model parameters (the server's ``x``) of the lit_fedco checkpoint at ``path``.

    Raises:
        ConfigError: a missing, unreadable or corrupted file, or one without model parameters.
    """
    found = ckpt.load(Path(path), key="init_from")
    server = found["loop"].get("server") if isinstance(found.get("loop"), dict) else None
    x = server.get("x") if isinstance(server, dict) else None
    if not isinstance(x, dict) or not x or not all(isinstance(v, Tensor) for v in x.values()):
        raise ConfigError(
            f"init_from: {path} holds no model parameters (no server 'x' of tensors); give a "
            "checkpoint of a run whose updater trains a model (e.g. a pretrained.ckpt)",
            key="init_from",
        )
    bad = next((k for k, v in x.items() if v.is_floating_point() and not v.isfinite().all()), "")
    if bad:
        raise ConfigError(
            f"init_from: {path} holds non-finite values (NaN or inf) in parameter {bad!r}; give a "
            "checkpoint of a run that did not diverge",
            key="init_from",
        )
    return dict(x)


def check_shapes(
    params: dict[str, Tensor], expected: dict[str, Tensor], path: str | Path, cfg: DictConfig
) -> None:
    """``params`` (from ``path``) has the parameter names and shapes of this run's model.

    Raises:
        ConfigError: naming ``init_from``, the first parameter that differs and this model.
    """
    got, want = ckpt.model_signature(params), ckpt.model_signature(expected)
    if got == want:
        return
    diff = next(
        (f"{a} there, {b} here" for a, b in zip(got, want, strict=False) if a != b),
        f"{len(got)} parameters there, {len(want)} here",
    )
    raise ConfigError(
        f"init_from: {path} holds another model than this run's (model.name={cfg.model.name}, "
        f"model.hidden={cfg.model.hidden}, {len(want)} parameters; first difference: {diff}); "
        "give a checkpoint of a run with the same model, data and objective, or set the model "
        "keys it was made with",
        key="init_from",
    )


def fingerprint(params: dict[str, Tensor]) -> str:
    """A short fingerprint of parameters (names in order, shapes, dtypes and bytes)."""
    return ckpt.fingerprint([params[k] for k in params]) + f"/{len(params)}"


def describe(source: str, params: dict[str, Tensor]) -> dict[str, Any]:
    """What a sub-run records of its starting point."""
    return {"from": source, "fingerprint": fingerprint(params)}
