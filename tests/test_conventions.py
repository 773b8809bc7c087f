"""Named conventions instead of names read by reflection: an updater's own server optimizer is
configured by its hyperparameters' ``server_opt`` (no ``getattr`` on field names)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from lit_fedco.core.server_opt import ServerOptConfig
from lit_fedco.updaters import FedAvg, get_updater
from lit_fedco.updaters.hparams import Hparams, ServerOptHparams


def test_fedavgm_and_the_adaptive_methods_pass_their_own_fields():
    m = get_updater("fedavgm")
    cfg = m(m.hparams_cls(lr=0.1, server_lr=0.5, server_momentum=0.7), torch.nn.Linear(2, 2))
    assert cfg.server_opt_config() == ServerOptConfig("momentum", lr=0.5, momentum=0.7)
    a = get_updater("fedyogi")
    hp = a.hparams_cls(lr=0.1, server_lr=0.02, beta1=0.8, beta2=0.95, tau=1e-4)
    got = a(hp, torch.nn.Linear(2, 2)).server_opt_config()
    assert got == ServerOptConfig("yogi", lr=0.02, momentum=0.9, beta1=0.8, beta2=0.95, eps=1e-4)


def test_a_differently_named_field_is_passed_by_the_hparams_own_method():
    """A researcher's server-momentum method names its field ``beta``: its ``server_opt`` says
    where it goes (before, a field not named ``server_momentum`` silently got the default)."""

    @dataclass(frozen=True)
    class MyHparams(ServerOptHparams):
        """Mine.

        Attributes:
            beta: the server momentum.
        """

        beta: float = 0.5

        def server_opt(self, name: str) -> ServerOptConfig:
            return ServerOptConfig(name, lr=self.server_lr, momentum=self.beta)

    class Mine(FedAvg[MyHparams]):
        server_optimizer = "momentum"

    cfg = Mine(MyHparams(lr=0.1, beta=0.3), torch.nn.Linear(2, 2)).server_opt_config()
    assert cfg is not None and cfg.momentum == 0.3


def test_a_server_optimizer_without_server_opt_hparams_is_refused():
    class Wrong(FedAvg[Hparams]):
        server_optimizer = "adam"

    with pytest.raises(TypeError, match="ServerOptHparams"):
        Wrong(Hparams(lr=0.1), torch.nn.Linear(2, 2)).server_opt_config()


def test_an_overridden_hook_is_found_one_way():
    """``defining_class`` answers for the round's end hook (``implements``), the fast forms
    (``_own``) and the registry's declarations (``overridden``)."""
    from lit_fedco.updaters.base import CompositionalUpdater, defining_class, overridden

    class Plain(FedAvg[Hparams]):
        """FedAvg as it is."""

    class WithEnd(FedAvg[Hparams]):
        """FedAvg with an end hook."""

        def client_end(self, state, start, ctx, steps):  # type: ignore[no-untyped-def]
            return state

    model = torch.nn.Linear(2, 2)
    assert defining_class(Plain, "client_end") is CompositionalUpdater
    assert not Plain(Hparams(lr=0.1), model).implements("client_end")
    assert WithEnd(Hparams(lr=0.1), model).implements("client_end")
    assert "client_end" in overridden(WithEnd) and "client_end" not in overridden(Plain)
    wrapped = Plain(Hparams(lr=0.1), model)
    wrapped.client_end = lambda state, start, ctx, steps: state  # type: ignore[method-assign]
    assert wrapped.implements("client_end")  # a hook set on the instance runs too
    assert Plain(Hparams(lr=0.1), model).inplace()  # FedAvg's own fast form, inherited whole
