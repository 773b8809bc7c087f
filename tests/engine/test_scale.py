"""Scale in one process: 100,000 logistic-regression clients (issue 13)."""

from __future__ import annotations

import json

import pytest

from lit_fedco.cli import run as main
from lit_fedco.recipes.fcsg_invariant import COLUMNS, DEFAULTS

pytestmark = pytest.mark.slow  # about 15 s


def test_100000_clients_train_and_are_each_evaluated_in_one_process(tmp_path):
    """Acc-FCSG-M (its previous iterate kept per client, Sync.KEEP) on FCSG §5.1's invariant
    logistic regression split over 100,000 clients of 20 training samples: a cohort of 100
    trains, and every client's held-out accuracy is computed at each evaluation."""
    argv = [
        "variants=[]", "updaters=[acc_fcsg_m]", "data.num_clients=100000",
        "data.train_per_client=20", "data.val_per_client=4", "cohort=100", "rounds=2",
        "eval_every=2", "local_steps=5", "tracking=[none]", "progress=false",
        f"out_dir={tmp_path}", "run_name=big",
    ]  # fmt: skip
    rows = main("fcsg_invariant", DEFAULTS, argv, columns=COLUMNS, evaluated_on="test")
    ((name, (final,)),) = rows
    assert name == "acc_fcsg_m" and 0.0 < final["val/acc_pooled"] <= 1.0
    status = json.loads((tmp_path / "fcsg_invariant/big/acc_fcsg_m-seed0/status.json").read_text())
    assert status["state"] == "complete" and status["round"] == 2
    assert len(status["per_client"]) == 100_000  # every client evaluated
