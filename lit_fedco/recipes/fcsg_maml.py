"""Federated MAML with task sampling (FCSG paper §5.2, Figures 2-3): FCSG, FCSG-M and
Acc-FCSG-M on the conditional MAML objective against Local-SCGD and Local-SCGDM (the
compositional reading, with a moving-average inner state) and FedAvg (task-level cross-entropy,
no adaptation in training).

Every local step draws fresh N-way K-shot tasks from the client's own classes; the exact
second-order meta-gradient flows through one adaptation step (α = 0.4). All methods are
evaluated alike: query accuracy after ``maml.eval_steps`` adaptation steps on tasks drawn from
held-out classes (``val/acc_avg``; chance is 1/N). The embedded default draws 5-way 1-shot
tasks from scikit-learn's digits (7 digits × 4 rotations = 28 training classes, 6 per client;
3 held-out digits × 4 rotations = 12 evaluation classes); ``preset=fcsg_maml_omniglot_1shot``
(or ``_5shot``) runs the paper's Omniglot setting from a local ``data.data_dir``. The default
runs 1 seed (about 1 min on 2 shared CPU cores).

    python -m lit_fedco.recipes.fcsg_maml
    python -m lit_fedco.recipes.fcsg_maml maml.first_order=true updaters=[fcsg_m]
"""

from __future__ import annotations

from typing import Any

from lit_fedco.cli import main

DEFAULTS: dict[str, Any] = {
    "updaters": ["fedavg", "local_scgd", "local_scgdm", "fcsg", "fcsg_m", "acc_fcsg_m"],
    "objective": "maml",
    "rounds": 30,
    "local_steps": 5,
    "cohort": 8,
    "batch_size": 1,  # tasks per client per step (the meta-batch; 1 keeps it to minutes)
    "eval_every": 10,
    "threads": 1,
    "data": {
        "name": "digits",
        "partition": "classes",
        "num_clients": 16,
        "rotations": 4,
        "classes_per_client": 6,
        "heldout_classes": 3,
    },
    "model": {"name": "conv4", "hidden": 32},  # the paper's 64 filters in the Omniglot presets
    "maml": {
        "ways": 5,
        "shots": 1,
        "queries": 5,
        "inner_lr": 0.4,
        "inner_steps": 1,
        "eval_steps": 3,
        "eval_tasks": 10,
    },
    "fedavg": {"lr": 0.1},
    "local_scgd": {"lr": 0.1, "beta": 0.5},
    "local_scgdm": {"lr": 0.1, "beta": 0.5, "momentum": 0.5},
    "fcsg": {"lr": 0.1},
    "fcsg_m": {"lr": 0.1, "beta": 0.5},
    "acc_fcsg_m": {"lr": 0.1, "beta": 0.5},
}

COLUMNS = [
    ("val/acc_avg", "held-out query acc"),
    ("val/acc_worst", "worst client"),
    ("train/acc_avg", "train query acc"),
    ("comm/total_floats_per_client", "floats/client"),
    ("time_s", "time s"),
]

if __name__ == "__main__":
    main("fcsg_maml", DEFAULTS, columns=COLUMNS)
