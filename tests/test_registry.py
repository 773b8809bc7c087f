"""One harness over the whole registry: every registered updater, from a table of tiny
configurations, through the same checks.

- A state-dict round trip continues bit for bit: 2 rounds, save, load into a fresh loop, 2 more
  rounds equal 4 rounds straight (server state and client-held state, exactly).

Vectorized = sequential and 1 = 2 processes are held per family (``assert_executors_agree`` and
the recipes' 2-process tests); the table here makes sure no registered updater is left out.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.fabric import Fabric

from lit_fedco.data import make_federated
from lit_fedco.executors import make_executor
from lit_fedco.loop import FederatedLoop, LoopConfig
from lit_fedco.models import build_model
from lit_fedco.problems import AUPRCParams, AUPRCProblem
from lit_fedco.state import flatten
from lit_fedco.updaters import available_updaters, get_updater
from tests.helpers import make_loop
from tests.test_fcsg import invariant_loop
from tests.test_personalized import pfl_loop


def auprc_loop(name: str, hparams: dict, **kw) -> FederatedLoop:
    """Binarised digits with the AP problem's objectives (CODA+'s min-max AUC loss)."""
    spec = SimpleNamespace(
        name="digits", data_dir="", partition="iid", num_clients=4, big=0, small=0,
        small_classes=2, alpha=0.5, rho=0.28, val_per_client=20, seed=0, binary=True,
        positive_classes=[5, 6, 7, 8, 9], drop_positive=0.5, val_mode="all",
    )  # fmt: skip
    data = make_federated(spec)
    problem = AUPRCProblem(AUPRCParams(), data)
    net = build_model("logreg", tuple(data.x_train.shape[1:]), problem.num_outputs(), seed=0)
    cls = get_updater(name)
    upd = cls(cls.hparams_cls(**hparams), net, problem.objective_for(cls.compositions, net))
    cfg = dict(rounds=3, local_steps=2, cohort=3, batch_size=6, eval_every=1, progress=False)
    cfg.update(kw)
    fabric = Fabric(accelerator="cpu", devices=1)
    return FederatedLoop(fabric, upd, data, LoopConfig(**cfg), make_executor("vectorized"),
                         torch.float64, problem)  # fmt: skip


def plain(name: str, hparams: dict, **kw) -> FederatedLoop:
    return make_loop(name, hparams, **kw)


def pfl(name: str, hparams: dict, **kw) -> FederatedLoop:
    return pfl_loop(name, hparams, executor="vectorized", **kw)


def conditional(name: str, hparams: dict, **kw) -> FederatedLoop:
    return invariant_loop(name, hparams, "vectorized", **kw)


TINY: dict[str, tuple[Callable[..., FederatedLoop], dict]] = {
    "fedavg": (plain, {"lr": 0.1}),
    "comfedl": (plain, {"lr": 0.05}),
    "qfedavg": (plain, {"lr": 0.05, "q": 0.5}),
    "drfl": (plain, {"lr": 0.05, "lam_lr": 0.1}),
    "ditto": (plain, {"lr": 0.1, "personal_lr": 0.1, "lam": 0.5}),
    "feddro": (plain, {"lr": 0.05, "beta": 0.3}),
    "ds_feddro": (plain, {"lr": 0.05, "beta": 0.3, "gamma_x": 1.3, "gamma_y": 1.4}),
    "fedavg_co": (plain, {"lr": 0.05, "case": "II"}),
    "mbsgd": (plain, {"lr": 0.05}),
    "fastdro": (plain, {"lr": 0.05, "estimator": "mlmc", "mlmc_levels": 2}),
    "pdsgd": (plain, {"lr": 0.05, "lr_dual": 0.5, "beta": 1.0}),
    "comfedl_maml": (pfl, {"lr": 0.1}),
    "comfedl_damaml": (pfl, {"lr": 0.05}),
    "fedmaml": (pfl, {"lr": 0.1}),
    "tr_maml": (pfl, {"lr": 0.1, "lam_lr": 0.1}),
    "fcsg": (conditional, {"lr": 0.1}),
    "fcsg_m": (conditional, {"lr": 0.1, "beta": 0.3, "init_batches": 2}),
    "acc_fcsg_m": (conditional, {"lr": 0.1, "beta": 0.3, "init_batches": 2}),
    "local_scgd": (conditional, {"lr": 0.1, "beta": 0.5}),
    "local_scgdm": (conditional, {"lr": 0.1, "beta": 0.5, "momentum": 0.5}),
    "coda_plus": (auprc_loop, {"lr": 0.05, "stage_rounds": 2}),
}


def test_every_registered_updater_is_in_the_table():
    assert sorted(TINY) == available_updaters()


def _snapshot(loop: FederatedLoop) -> np.ndarray:
    return np.concatenate(
        [flatten(loop.server)[0].double().numpy(), flatten(loop.store.rows)[0].double().numpy()]
    )


@pytest.mark.parametrize("name", sorted(TINY))
def test_state_dict_round_trip_continues_bit_for_bit(name):
    build, hp = TINY[name]
    straight = build(name, hp, rounds=4)
    straight.run()
    first = build(name, hp, rounds=2)
    first.run()
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = build(name, hp, rounds=4)
    resumed.load_state_dict(torch.load(buf, weights_only=False))
    resumed.run()
    assert not np.array_equal(_snapshot(first), _snapshot(straight))  # the runs moved on
    np.testing.assert_array_equal(_snapshot(resumed), _snapshot(straight))
    assert resumed.comm_total == straight.comm_total
