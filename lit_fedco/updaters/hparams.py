"""The hyperparameters of an updater: a frozen dataclass, its config node (``<updater>.<key>``),
checked when it is built. :class:`Hparams` holds what every updater has; an updater with a
server optimizer of its own derives from :class:`ServerOptHparams`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.ranges import Bound, check_bounds
from lit_fedco.core.server_opt import ServerOptConfig


@dataclass(frozen=True)
class Hparams:
    """Hyperparameters shared by every updater; subclass per updater (it is the config schema).

    Attributes:
        lr: η, the client step size.
        local_steps: I for this method, or 0 to take the run's ``local_steps`` (MBSGD and the
            "parallel" baselines are defined with one step per round).
    """

    lr: float = 0.01
    local_steps: int = 0

    bounds: ClassVar[dict[str, Bound]] = {
        "lr": Bound("a float > 0", "0.01", gt=0),
        "local_steps": Bound("an int >= 0 (0: the run's local_steps)", "0", ge=0),
    }
    """The numeric range of each key (:class:`~lit_fedco.core.ranges.Bound`), checked when the
    dataclass is built and, for the updaters lit_fedco ships, before torch is imported (the
    catalog carries them); a subclass's entries add to its bases' (or replace one's)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the :attr:`bounds`; raise :class:`ConfigError` naming the key. Extend in
        subclasses with checks a range cannot say (``self.require``)."""
        check_bounds(self)

    def require(self, field: str, ok: bool, expected: str, example: str) -> None:
        """Raise a :class:`ConfigError` for ``field`` unless ``ok``."""
        if not ok:
            raise ConfigError.bad_value(field, getattr(self, field), expected, example)


@dataclass(frozen=True)
class ServerOptHparams(Hparams):
    """Hyperparameters of an updater with a server optimizer of its own (FedAvgM, FedAdam,
    FedYogi; Reddi et al. 2021, Algorithm 2). Subclasses add the optimizer's own: FedAvgM's
    ``server_momentum``, the adaptive methods' ``beta1``, ``beta2``, ``tau``.

    Attributes:
        lr: η_l, the client step size.
        server_lr: η, the server step size.
    """

    server_lr: float = 1.0

    bounds: ClassVar[dict[str, Bound]] = {
        "server_lr": Bound("a float > 0 (η)", "0.01", gt=0),
    }

    def server_opt(self, name: str) -> ServerOptConfig:
        """The server optimizer ``name`` with these hyperparameters: here the step size; a
        subclass with the optimizer's own fields passes them too (FedAvgM's momentum, the
        adaptive methods' β₁, β₂, τ), the others at :class:`ServerOptConfig`'s defaults."""
        return ServerOptConfig(name, lr=self.server_lr)
