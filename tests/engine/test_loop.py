"""The loop: resume exactness, 1 vs 2 processes, communication accounting, cohort sampling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lit_fedco.engine.loop import sample_cohort
from tests.helpers import final_checkpoint, flat_server, make_loop, run_recipe, the_run


def test_cohort_is_a_function_of_seed_and_round():
    a = sample_cohort(0, 5, 100, 10)
    assert torch.equal(a, sample_cohort(0, 5, 100, 10))
    assert not torch.equal(a, sample_cohort(0, 6, 100, 10))
    assert len(set(a.tolist())) == 10 and a.tolist() == sorted(a.tolist())
    assert torch.equal(sample_cohort(0, 5, 10, 10), torch.arange(10))


def test_save_load_round_trip_continues_exactly(tmp_path):
    straight = make_loop("comfedl", {"lr": 0.05}, rounds=4)
    straight.run()

    first = make_loop("comfedl", {"lr": 0.05}, rounds=2)
    first.run()
    first.save(tmp_path / "run.ckpt")

    resumed = make_loop("comfedl", {"lr": 0.05}, rounds=4)
    resumed.load(tmp_path / "run.ckpt")
    assert resumed.round == 2
    resumed.run()
    np.testing.assert_array_equal(flat_server(resumed), flat_server(straight))
    assert resumed.comm_total == straight.comm_total
    assert resumed.history[-1]["val/acc_avg"] == straight.history[-1]["val/acc_avg"]


def test_communication_is_counted_per_client():
    loop = make_loop("fedavg", {"lr": 0.1}, rounds=1)
    logs = loop.run_round()
    d = sum(p.numel() for p in loop.server["x"].values())
    assert logs["comm/up_floats_per_client"] == d
    assert logs["comm/down_floats_per_client"] == d
    # ComFedL's stable form adds one probe value up and the shift and normaliser down
    loop = make_loop("comfedl", {"lr": 0.1}, rounds=1)
    logs = loop.run_round()
    assert logs["comm/up_floats_per_client"] == d + 1
    assert logs["comm/down_floats_per_client"] == d + 2


def test_callbacks_see_every_round_and_evaluation():
    from lightning.fabric import Fabric

    class Recorder:
        def __init__(self):
            self.events = []

        def on_round_start(self, loop, cohort):
            self.events.append(("start", loop.round, len(cohort)))

        def on_round_end(self, loop, logs):
            self.events.append(("end", loop.round, "train/loss" in logs))

        def on_eval_end(self, loop, metrics):
            self.events.append(("eval", loop.round, "val/acc_worst" in metrics))

    rec = Recorder()
    fabric = Fabric(accelerator="cpu", devices=1, callbacks=[rec])
    loop = make_loop("fedavg", {"lr": 0.1}, rounds=2, eval_every=2, fabric=fabric)
    loop.run()
    assert rec.events == [
        ("start", 0, 4),
        ("end", 1, True),
        ("start", 1, 4),
        ("end", 2, True),
        ("eval", 2, True),
    ]


def test_comfedl_lifts_the_weight_of_the_worst_client():
    loop = make_loop("comfedl", {"lr": 0.05}, rounds=2, cohort=6, problem={"gamma": 0.2})
    out = loop.run()
    weights = [out[f"dro/weight_client{k}"] for k in range(6)]
    assert sum(weights) == pytest.approx(1.0)
    losses = loop.evaluate_clients.metrics["train"].compute()["loss_per_client"]
    assert int(np.argmax(weights)) == int(losses.argmax())
    # the logged weights are softmax(L/γ) of each client's mean training cross-entropy under
    # the final server model, recomputed here from the model's outputs
    data, model = loop.data, loop.updater.model
    hand = []
    for k in range(6):
        lo, hi = int(data.train_offsets[k]), int(data.train_offsets[k + 1])
        with torch.no_grad():
            logits = torch.func.functional_call(model, loop.server["x"], (data.x_train[lo:hi],))
        hand.append(float(torch.nn.functional.cross_entropy(logits, data.y_train[lo:hi])))
    np.testing.assert_allclose(losses.numpy(), hand, rtol=1e-12)
    expected = torch.softmax(torch.tensor(hand, dtype=torch.float64) / 0.2, 0).numpy()
    np.testing.assert_allclose(weights, expected, rtol=1e-10, atol=1e-14)


def _run_recipe(out: Path, devices: int) -> dict:
    args = [
        "updaters=[comfedl,fedavg]", "rounds=3", "eval_every=3", "cohort=6", "local_steps=3",
        "dtype=float64", "data.big=200", "data.val_per_client=30",
    ]  # fmt: skip
    return run_recipe("comfedl_dro", out, devices, *args)[0]


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
    """2-process gloo equals 1 process: server state to 1e-12 (float64), metrics exactly."""
    one = _run_recipe(tmp_path / "one", 1)
    two = _run_recipe(tmp_path / "two", 2)
    for name in ("comfedl", "fedavg"):
        a = final_checkpoint(the_run(tmp_path / "one", "comfedl_dro") / f"{name}-seed0")
        b = final_checkpoint(the_run(tmp_path / "two", "comfedl_dro") / f"{name}-seed0")
        for key, va in a["loop"]["server"]["x"].items():
            torch.testing.assert_close(b["loop"]["server"]["x"][key], va, rtol=1e-12, atol=1e-12)
        ra, rb = one["results"][name][0], two["results"][name][0]
        for key in ("val/acc_avg", "val/acc_worst", "train/acc_avg", "train/acc_worst"):
            assert ra[key] == rb[key], (name, key)
        assert ra["val/loss_avg"] == pytest.approx(rb["val/loss_avg"], rel=1e-12)
