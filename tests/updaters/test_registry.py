"""One harness over the whole registry: every registered updater, from a table of tiny
configurations (``TINY``), through the plug-in contract's checks, the same functions a user's
updater runs through ``lit_fedco.testing.check_updater``:

- A state-dict round trip continues bit for bit: 2 rounds, save, load into a fresh loop, 2 more
  rounds equal 4 rounds straight (server state and client-held state, exactly).
- Vectorized = sequential: 3 rounds under both executors, float64; states to 1e-10, logs to
  rel 1e-9.
- Counted traffic = the declared payload: every round's logged floats per client, up and
  down, equal what the updater's declarations and its state say it sends (exactly).
- Failures: with dropped and stopped clients, states stay finite and the executors agree.
- 1 process = 2 processes (slow): every entry in one subprocess on 1 CPU process and in one on
  2 gloo processes (``tests/registry_two_process.py``); states to 1e-12."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
import torch
from lightning.fabric import Fabric

from lit_fedco.core.models import build_model
from lit_fedco.core.protocol import Sync
from lit_fedco.core.state import tree_clone
from lit_fedco.data import make_federated
from lit_fedco.engine.executors import make_executor
from lit_fedco.engine.loop import FederatedLoop, LoopConfig
from lit_fedco.problems import AUPRCParams, AUPRCProblem
from lit_fedco.testing import (
    RoundRecorder,
    check_executors,
    check_failures,
    check_resume,
    check_traffic,
    recorded_run,
    snapshot,
)
from lit_fedco.updaters import CompositionalUpdater, available_updaters, get_updater
from tests.helpers import make_loop, run_module
from tests.updaters.test_fcsg import invariant_loop
from tests.updaters.test_personalized import pfl_loop


def auprc_loop(
    name: str,
    hparams: dict,
    executor: str = "vectorized",
    fabric: Fabric | None = None,
    **kw,
) -> FederatedLoop:
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
    fabric = fabric or Fabric(accelerator="cpu", devices=1)
    return FederatedLoop(fabric, upd, data, LoopConfig(**cfg), make_executor(executor),
                         torch.float64, problem)  # fmt: skip


# Every builder: ``build(name, hparams, executor="vectorized", fabric=None, **loop_kw)``, a
# float64 loop of 3 rounds on a fresh 1-process CPU Fabric unless one is passed in.
def plain(name: str, hparams: dict, executor: str = "vectorized", **kw) -> FederatedLoop:
    return make_loop(name, hparams, executor=executor, **kw)


def pfl(name: str, hparams: dict, executor: str = "vectorized", **kw) -> FederatedLoop:
    return pfl_loop(name, hparams, executor=executor, **{"rounds": 3, **kw})


def conditional(name: str, hparams: dict, executor: str = "vectorized", **kw) -> FederatedLoop:
    return invariant_loop(name, hparams, executor, **kw)


TINY: dict[str, tuple[Callable[..., FederatedLoop], dict]] = {
    "fedavg": (plain, {"lr": 0.1}),
    "fedavgm": (plain, {"lr": 0.1, "server_lr": 0.5, "server_momentum": 0.9}),
    "fedadam": (plain, {"lr": 0.1, "server_lr": 0.05}),
    "fedyogi": (plain, {"lr": 0.1, "server_lr": 0.05}),
    "comfedl": (plain, {"lr": 0.05}),
    "qfedavg": (plain, {"lr": 0.05, "q": 0.5}),
    "drfl": (plain, {"lr": 0.05, "lam_lr": 0.1}),
    "ditto": (plain, {"lr": 0.1, "personal_lr": 0.1, "lam": 0.5}),
    "scaffold": (plain, {"lr": 0.1}),
    "feddro": (plain, {"lr": 0.05, "beta": 0.3}),
    "ds_feddro": (plain, {"lr": 0.05, "beta": 0.3, "gamma_x": 1.3, "gamma_y": 1.4}),
    "fedavg_co": (plain, {"lr": 0.05, "case": "II"}),
    "fedavg_co_i": (plain, {"lr": 0.05}),
    "mbsgd": (plain, {"lr": 0.05}),
    "fastdro": (plain, {"lr": 0.05, "estimator": "mlmc", "mlmc_levels": 2}),
    "pdsgd": (plain, {"lr": 0.05, "lr_dual": 0.5, "beta": 1.0}),
    "gcivr": (plain, {"lr": 0.05, "q": 2, "refresh_batches": 2}),  # refresh, recursion, refresh
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


_snapshot = snapshot


@pytest.mark.parametrize("name", sorted(TINY))
def test_state_dict_round_trip_continues_bit_for_bit(name):
    build, hp = TINY[name]
    check_resume(functools.partial(build, name, hp))


# ---------------------------------------------------------------------- traffic
class TinyRun(NamedTuple):
    """A finished run of a table entry and, for the sequential executor, its recorded rounds."""

    loop: FederatedLoop
    rec: RoundRecorder | None


@functools.cache
def _tiny_run(name: str, executor: str) -> TinyRun:
    """Entry ``name`` of the table run for 3 rounds (evaluated after the last) under
    ``executor``, once per session: the executor test and the traffic test share the runs. A
    sequential run is recorded (``lit_fedco.testing.record_rounds``; under vmap the recorded
    states would be batched tensors)."""
    build, hp = TINY[name]
    if executor == "sequential":
        return TinyRun(*recorded_run(functools.partial(build, name, hp)))
    loop = build(name, hp, executor=executor, rounds=3, eval_every=3)
    loop.run()
    return TinyRun(loop, None)


# ---------------------------------------------------------------------- executors
@pytest.mark.parametrize("name", sorted(TINY))
def test_vectorized_equals_sequential(name):
    """The same 3 rounds under both executors (float64): server state and client-held state
    (``store.rows``) to rtol = atol = 1e-10, the last round's logs (with its evaluation) to
    rel 1e-9, abs 1e-12.

    Both executors call the same per-client function; they differ only in how kernels reduce
    (a vmapped matmul or sum may add in another order than one client's), i.e. in rounding:
    1e-16 relative per operation in float64, a few hundred operations per round. Measured: the
    digits entries agree bit for bit, the conditional ones (FCSG family, CODA+) to 2e-16
    absolute; 1e-10 leaves six orders of margin and still fails on any real difference (a
    client mixed up, a step missed). No entry needs a wider tolerance. The logs are means and
    maxima of such numbers and are compared relatively (rel 1e-9), accuracies as well.
    """
    vec, seq = _tiny_run(name, "vectorized").loop, _tiny_run(name, "sequential").loop
    assert any(k.startswith("val/") for k in vec.history[-1])  # the last round was evaluated
    check_executors(vec, seq)


@pytest.mark.parametrize("name", sorted(TINY))
def test_dropped_and_stopped_clients_keep_every_state_finite_and_the_executors_equal(name):
    build, hp = TINY[name]
    check_failures(functools.partial(build, name, hp))


# What the table must exercise: each way a declaration or a hook changes the traffic.
TRAFFIC_FEATURES = {
    "probe": ("comfedl", "feddro", "drfl", "mbsgd", "fastdro", "pdsgd"),
    "STEP entries": ("feddro",),
    "server-side weights": ("drfl", "tr_maml"),
    "KEEP entries": ("ditto", "acc_fcsg_m", "scaffold"),
    "end-of-round hook": ("qfedavg", "fedavg_co", "fedavg_co_i", "scaffold"),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_counted_traffic_is_the_declared_payload(name):
    """Every round's ``comm/up_floats_per_client`` and ``comm/down_floats_per_client`` equal
    the payload computed here from the declarations (:func:`declared_traffic`), exactly."""
    loop, rec = _tiny_run(name, "sequential")
    assert rec is not None
    upd = loop.updater
    assert len(rec.rounds) == len(loop.history) == 3
    check_traffic(loop, rec)
    # the features this entry is listed under are really there
    ctx, state = rec.rounds[-1]["context"], rec.rounds[-1]["state"]
    has = {
        "probe": bool(rec.rounds[-1]["probes"]),
        "STEP entries": Sync.STEP in upd.client_state.values(),
        "server-side weights": ctx.weights is not None,
        "KEEP entries": bool(loop.store.rows),
        "end-of-round hook": type(upd).client_end is not CompositionalUpdater.client_end,
    }
    for feature, names in TRAFFIC_FEATURES.items():
        if name in names:
            assert has[feature], (name, feature)
    assert state  # the last client's state was recorded


class CopyServerState:
    """A Fabric callback that replaces the server state by a copy of itself after every round:
    the same values, every leaf its own tensor."""

    def on_round_end(self, loop: FederatedLoop, logs: dict[str, float]) -> None:
        loop.server = tree_clone(loop.server)


def test_counted_download_depends_on_values_not_on_tensor_identity():
    """CODA+ (a stage of 2 rounds, 3 rounds) counts the same download per client whether or not
    the server state is copied between rounds: the values sent are the same. CODA+'s docstring:
    "the logged download counts [the anchor] every round"."""
    build, hp = TINY["coda_plus"]
    plain_run = build("coda_plus", hp, rounds=3, eval_every=3)
    plain_run.run()
    fabric = Fabric(accelerator="cpu", devices=1, callbacks=[CopyServerState()])
    copied = build("coda_plus", hp, fabric=fabric, rounds=3, eval_every=3)
    copied.run()
    np.testing.assert_array_equal(_snapshot(copied), _snapshot(plain_run))  # the same run
    down = [[logs["comm/down_floats_per_client"] for logs in run.history]
            for run in (plain_run, copied)]  # fmt: skip
    assert down[1] == [136.0] * 3  # x 65, aux 3, anchor 67, scale 1
    assert down[0] == down[1]


# ---------------------------------------------------------------------- processes
@pytest.mark.slow
def test_two_processes_holding_only_their_clients_data_equal_one_process(tmp_path):
    """``shard_data``: every entry of the table on 2 processes, each given only the data rows of
    the clients it owns (client k on process k mod 2) and running the cohort clients it owns,
    equals 1 process holding everything (server state and kept rows to rtol = atol = 1e-12,
    accuracies and traffic exactly, other logs to rel 1e-12). The two processes' rows add up to
    all rows, and each holds exactly its own clients'."""
    one_out, two_out = tmp_path / "one.pt", tmp_path / "two.pt"
    run_module("tests.registry_two_process", "--devices=1", f"--out={one_out}")
    run_module("tests.registry_two_process", "--devices=2", "--shard-data", f"--out={two_out}")
    one = torch.load(one_out, weights_only=False)["updaters"]
    two = torch.load(two_out, weights_only=False)["updaters"]
    rank1 = torch.load(tmp_path / "two.pt.rank1", weights_only=False)["updaters"]
    for name in sorted(TINY):
        a, b, c = one[name], two[name], rank1[name]
        torch.testing.assert_close(b["state"], a["state"], rtol=1e-12, atol=1e-12, msg=name)
        k = len(a["data_clients"])
        assert b["data_clients"] == list(range(0, k, 2)), name
        assert c["data_clients"] == list(range(1, k, 2)), name
        for split in (0, 1):  # training and validation rows: split between the two
            assert b["data_rows"][split] + c["data_rows"][split] == a["data_rows"][split], name
            assert 0 < b["data_rows"][split] < a["data_rows"][split], name
        for key, v in a["logs"].items():
            if key.startswith("comm/") or "acc" in key:
                assert b["logs"][key] == v, (name, key)
            else:
                assert b["logs"][key] == pytest.approx(v, rel=1e-12, abs=1e-12), (name, key)


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
    """Every entry of the table, 3 rounds, vectorized, float64, in one subprocess on 1 CPU
    process and one on 2 (gloo; each process runs its half of the cohort, m >= 3 in every
    entry): the server state and the client-held rows equal to rtol = atol = 1e-12 (the cohort
    sums are reduced in another order), both processes hold bit-for-bit the same server state
    (the kept rows of a checkpoint are gathered on process 0 alone), the
    counted traffic and the accuracies of the last round's logs are equal exactly, and the
    other logs (losses, weights) to rel 1e-12. Each of the two processes holds the kept rows of
    its own half of the clients only (client k on process k mod 2)."""
    results = {}
    for devices in (1, 2):
        out = tmp_path / f"devices{devices}.pt"
        run_module("tests.registry_two_process", f"--devices={devices}", f"--out={out}")
        results[devices] = torch.load(out, weights_only=False)
        assert results[devices]["world_size"] == devices
    rank1 = torch.load(tmp_path / "devices2.pt.rank1", weights_only=False)
    one, two = results[1]["updaters"], results[2]["updaters"]
    assert sorted(one) == sorted(two) == sorted(TINY)
    for name in sorted(TINY):
        a, b = one[name], two[name]
        torch.testing.assert_close(b["state"], a["state"], rtol=1e-12, atol=1e-12, msg=name)
        assert torch.equal(rank1["updaters"][name]["server"], b["server"]), name
        held = (b["kept_bytes"], rank1["updaters"][name]["kept_bytes"])
        assert sum(held) == a["kept_bytes"], name  # the K rows, split between the two
        # a checkpoint's rows are gathered on process 0 only: process 1 gets none
        assert torch.equal(rank1["updaters"][name]["state"], b["server"]), name
        if a["kept_bytes"]:
            rows = (b["kept_rows"], rank1["updaters"][name]["kept_rows"])
            assert rows == ((a["kept_rows"] + 1) // 2, a["kept_rows"] // 2), name
        assert sorted(a["logs"]) == sorted(b["logs"]), name
        for key, v in a["logs"].items():
            if key.startswith("comm/") or "acc" in key:
                assert b["logs"][key] == v, (name, key)
            else:
                assert b["logs"][key] == pytest.approx(v, rel=1e-12, abs=1e-12), (name, key)
