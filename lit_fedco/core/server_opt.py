"""Server optimizers: the round's change of the model as a pseudo-gradient (Reddi et al. 2021,
"Adaptive Federated Optimization", Algorithm 2).

After ``server_update`` proposes a new model x̃ (for an averaging method, the cohort mean of
the clients' models), the server optimizer takes the pseudo-gradient ``g = x − x̃`` (minus
Reddi's Δ) and moves the model from where the round started, ``x ← x − η · opt(g)``:

==========  =============================================================================
name        update, with Δ = −g (Reddi et al. 2021, Algorithm 2; Hsu et al. 2019 for FedAvgM)
==========  =============================================================================
``sgd``     x ← x + η Δ (η = 1: the proposal itself, up to rounding)
``momentum``  v ← β v + Δ,  x ← x + η v                               (FedAvgM)
``adagrad`` v ← v + Δ²,  x ← x + η Δ / (√v + τ)                      (FedAdagrad)
``adam``    m ← β₁ m + (1 − β₁) Δ,  v ← β₂ v + (1 − β₂) Δ²,  x ← x + η m / (√v + τ)   (FedAdam)
``yogi``    m as Adam,  v ← v − (1 − β₂) Δ² sign(v − Δ²),  x ← x + η m / (√v + τ)    (FedYogi)
==========  =============================================================================

m starts at 0 and v at τ² (Reddi: v₋₁ ≥ τ²), without bias correction, as the paper writes
them. Any other name is a ``torch.optim`` class (``Adam``, ``RMSprop``, ...), given ``lr`` and
whichever of ``momentum``, ``betas`` and ``eps`` its constructor takes, stepping on g. The
optimizer's state is part of the loop's state (checkpointed, resumed bit for bit).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lit_fedco.core.errors import ConfigError

OWN = ("sgd", "momentum", "adagrad", "adam", "yogi")
"""The server optimizers written here, as Reddi et al. (2021) and Hsu et al. (2019) write them."""


@dataclass(frozen=True)
class ServerOptConfig:
    """A server optimizer and its hyperparameters (the run's ``server_opt`` node; FedAvgM,
    FedAdam and FedYogi carry theirs in their own hyperparameters).

    Attributes:
        name: empty (no server optimizer: the server takes what ``server_update`` proposes),
            ``sgd``, ``momentum`` (FedAvgM), ``adagrad``, ``adam`` (FedAdam), ``yogi``
            (FedYogi), or the name of a ``torch.optim`` class (``Adam``, ``RMSprop``, ...).
        lr: η, the server step size.
        momentum: β of ``momentum`` (and of a torch.optim class that takes ``momentum``).
        beta1: β₁, the first-moment weight of ``adam`` and ``yogi``.
        beta2: β₂, the second-moment weight of ``adam`` and ``yogi``.
        eps: τ, the adaptivity of ``adagrad``, ``adam`` and ``yogi`` (Reddi et al.: 1e-3).
    """

    name: str = ""
    lr: float = 1.0
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-3

    def validate(self, key: str = "server_opt") -> None:
        """Range checks; raise :class:`ConfigError` naming ``<key>.<field>``."""
        if self.name and self.name not in OWN and _torch_class(self.name) is None:
            raise ConfigError.bad_value(
                f"{key}.name", self.name, f"empty, one of {list(OWN)} or a torch.optim class "
                f"that steps on dense pseudo-gradients of any shape without a closure "
                f"({', '.join(torch_classes())})", "adam",
            )  # fmt: skip
        checks = {
            "lr": (self.lr > 0, "a float > 0 (η)", "0.01"),
            "momentum": (0 <= self.momentum < 1, "a float in [0, 1)", "0.9"),
            "beta1": (0 <= self.beta1 < 1, "a float in [0, 1) (β₁)", "0.9"),
            "beta2": (0 <= self.beta2 < 1, "a float in [0, 1) (β₂)", "0.99"),
            "eps": (self.eps > 0, "a float > 0 (τ)", "0.001"),
        }
        for field, (ok, expected, example) in checks.items():
            if not ok:
                raise ConfigError.bad_value(f"{key}.{field}", getattr(self, field), expected,
                                            example)  # fmt: skip


TORCH_FIRST_ORDER = (
    "ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "NAdam", "RAdam",
    "RMSprop", "Rprop", "SGD",
)  # fmt: skip
"""The ``torch.optim`` classes a server optimizer may name: first-order, stepping without a
closure on dense gradients of every shape (not ``LBFGS``, whose step needs a closure,
``SparseAdam``, sparse gradients only, or ``Muon``, 2-D parameters only)."""


def torch_classes() -> list[str]:
    """The names of :data:`TORCH_FIRST_ORDER` this torch has."""
    return [n for n in TORCH_FIRST_ORDER if _torch_class(n, any_class=True) is not None]


def _torch_class(name: str, any_class: bool = False) -> type[torch.optim.Optimizer] | None:
    if not any_class and name not in TORCH_FIRST_ORDER:
        return None
    cls = getattr(torch.optim, name, None)
    ok = isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
    return cls if ok and cls is not torch.optim.Optimizer else None


# ---------------------------------------------------------------------- the kernels
def sgd_step(x: Tensor, g: Tensor, lr: float | Tensor) -> Tensor:
    """``x − η g``: a server SGD step of size η on the pseudo-gradient g. With g = x − x̃ it
    equals ``x + η (x̃ − x)`` bit for bit (negation is exact): DS-FedDRO's server step."""
    return x - lr * g


def own_step(
    name: str, x: Tensor, g: Tensor, state: dict[str, Tensor], cfg: ServerOptConfig
) -> Tensor:
    """One step of server optimizer ``name`` (one of :data:`OWN`) on one tensor: the new x from
    x and the pseudo-gradient g = x − x̃ (Δ = −g); ``state`` (its moments) is updated."""
    delta = -g
    if name == "sgd":
        return sgd_step(x, g, cfg.lr)
    if name == "momentum":
        v = state["v"] = cfg.momentum * state["v"] + delta if "v" in state else delta.clone()
        return x + cfg.lr * v
    tau2 = torch.full_like(x, cfg.eps**2)
    v = state.get("v", tau2)
    if name == "adagrad":
        v = v + delta * delta
        state["v"] = v
        return x + cfg.lr * delta / (v.sqrt() + cfg.eps)
    m = state.get("m", torch.zeros_like(x))
    m = cfg.beta1 * m + (1 - cfg.beta1) * delta
    sq = delta * delta
    if name == "adam":
        v = cfg.beta2 * v + (1 - cfg.beta2) * sq
    else:  # yogi
        v = v - (1 - cfg.beta2) * sq * torch.sign(v - sq)
    state["m"], state["v"] = m, v
    return x + cfg.lr * m / (v.sqrt() + cfg.eps)


class ServerOptimizer:
    """A server optimizer over the model's entries (a dict of tensors).

    Args:
        cfg: which optimizer and its hyperparameters.
    """

    def __init__(self, cfg: ServerOptConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.state: dict[str, dict[str, Tensor]] = {}
        self._torch: torch.optim.Optimizer | None = None
        self._params: dict[str, Tensor] = {}

    def step(self, x: dict[str, Tensor], proposed: dict[str, Tensor]) -> dict[str, Tensor]:
        """The new model from the round's start ``x`` and the proposal ``proposed``."""
        if self.cfg.name in OWN:
            out = {}
            for k, v in x.items():
                out[k] = own_step(self.cfg.name, v, v - proposed[k], self.state.setdefault(k, {}),
                                  self.cfg)  # fmt: skip
            return out
        opt = self._optimizer(x)
        with torch.no_grad():
            for k, p in self._params.items():
                p.copy_(x[k])
                p.grad = x[k] - proposed[k]
        opt.step()
        return {k: p.detach().clone() for k, p in self._params.items()}

    def _optimizer(self, x: dict[str, Tensor]) -> torch.optim.Optimizer:
        """The torch.optim optimizer over leaf copies of the model's entries (made once)."""
        if self._torch is None:
            cls = _torch_class(self.cfg.name)
            assert cls is not None
            self._params = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
            accepted = inspect.signature(cls).parameters
            offered: dict[str, Any] = {
                "lr": self.cfg.lr,
                "momentum": self.cfg.momentum,
                "betas": (self.cfg.beta1, self.cfg.beta2),
                "eps": self.cfg.eps,
            }
            kwargs = {k: v for k, v in offered.items() if k in accepted}
            self._torch = cls(list(self._params.values()), **kwargs)
            if self.state:  # restored before the first step
                self._torch.load_state_dict(self.state["torch"])  # type: ignore[arg-type]
        return self._torch

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state (moments per model entry), for checkpoints."""
        if self._torch is not None:
            return {"torch": self._torch.state_dict()}
        return {k: dict(v) for k, v in self.state.items()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (an empty dict: the optimizer's initial state)."""
        self.state = {k: dict(v) for k, v in sd.items()}
        if self._torch is not None and "torch" in sd:
            self._torch.load_state_dict(sd["torch"])
