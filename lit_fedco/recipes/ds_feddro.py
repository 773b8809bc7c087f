"""DS-FedDRO against FedDRO, FedAvg-CO, MBSGD, FastDRO and PDSGD on sample-level KL-DRO
(FedDRO paper §6).

The embedded default: scikit-learn's digits with the step imbalance of CIFAR10-ST
(``lit_fedco.data.cifar``; classes 5-9 keep 1/ρ of their training images, ρ = 10), split over 8
clients by a Dirichlet draw of each class's share (α = 0.1), a small tanh MLP, I = 5 local
steps, batch 16 per client, 3 seeds (about 40 s on 2 CPU cores). The paper splits CIFAR
equally; on an equal random split of this small pool the clients' inner values ``g_k`` barely
differ, and FedAvg-CO, which steps on its own ``g_k`` between syncs, coincides with FedDRO
(Theorem 4.1's failure needs heterogeneous inner functions). ``data.partition=iid`` runs the
equal split. The table's ``train DRO obj`` is the objective Φ(x) of eq. (2) on the full
training data, the quantity every method minimises.

MBSGD, FastDRO and PDSGD are the paper's "parallel" centralised baselines: one step per round
on the cohort's pooled batches (I = 1, fixed by their hyperparameters). Validation is
class-balanced, so the table's worst-class accuracy shows how well the minority classes are
learnt. ``preset=ds_feddro_cifar10_st`` / ``ds_feddro_cifar100_st`` run the paper's CIFAR
settings (ResNet20, equal split) from a local ``data.data_dir``.

    python -m lit_fedco.recipes.ds_feddro
    python -m lit_fedco.recipes.ds_feddro updater=ds_feddro seeds=[0]
"""

from __future__ import annotations

from typing import Any

from lit_fedco.cli import main

COLUMNS = [
    ("val/acc_avg", "val avg acc"),
    ("val/acc_worst", "worst-client acc"),
    ("val/class_acc_worst", "worst-class acc"),
    ("train/acc_avg", "train avg acc"),
    ("train/objective", "train DRO obj"),
    ("comm/total_floats_per_client", "floats/client"),
]
"""The table: average, worst-client and worst-class validation accuracy, the DRO objective
Φ(x) of eq. (2) on the full training data (what every method here minimises; lower is
better), communication."""

DEFAULTS: dict[str, Any] = {
    "updaters": ["ds_feddro", "feddro", "fedavg_co", "mbsgd", "fastdro", "pdsgd"],
    "seeds": [0, 1, 2],
    "rounds": 150,
    "local_steps": 5,
    "cohort": 8,
    "batch_size": 16,
    "eval_every": 25,
    "threads": 1,  # the MLP's operations are too small to split over threads
    "data": {
        "name": "digits_st",
        "partition": "dirichlet",  # heterogeneous inner functions (module docstring)
        "alpha": 0.1,
        "num_clients": 8,
        "imbalance_ratio": 10.0,
        "val_per_client": 60,
    },
    "model": {"name": "mlp", "hidden": 32},
    "objective": "sample_dro",
    "sample_dro": {"kind": "kl", "lam": 1.0},
    "ds_feddro": {"lr": 0.1, "beta": 0.5, "gamma_x": 1.3, "gamma_y": 1.4},
    "feddro": {"lr": 0.1, "beta": 0.5},
    "fedavg_co": {"lr": 0.1, "case": "II"},
    "fedavg_co_i": {"lr": 0.1},
    "mbsgd": {"lr": 0.1},
    # One step per round: 0.2 trains (0.1 lags; FastDRO collapses at 1.0, PDSGD diverges at 0.5).
    "fastdro": {"lr": 0.2, "estimator": "minibatch"},
    "pdsgd": {"lr": 0.2, "lr_dual": 0.5, "beta": 1.0},
}

if __name__ == "__main__":
    main("ds_feddro", DEFAULTS, columns=COLUMNS)
