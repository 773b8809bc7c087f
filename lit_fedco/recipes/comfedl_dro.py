"""ComFedL on client-level KL-DRO (ComFedL paper §5.1) against the paper's baselines — DRFL
(λ-weighted averaging with projected ascent on the client weights), q-FedAvg (q-FFL) and
FedAvg — and FedAvg's adaptive and drift-corrected variants (FedAvgM, FedAdam, FedYogi,
SCAFFOLD), on imbalanced data.

The embedded default: scikit-learn's digits split over 10 clients, one client with 1000
training images of all classes and nine with 20 images of 2 classes each (quantity and label
imbalance), multinomial logistic regression, I = 5; every method at η = 0.05, 3 seeds (about two
minutes on 2 shared CPU cores; ``seeds=[0]`` runs one). DRFL's step on the client weights and
q-FedAvg's q are the paper's (8e-2 and 0.2); the server step sizes of FedAvgM (η = 1, β = 0.9,
Hsu et al.'s) and FedAdam / FedYogi (η = 0.1, τ = 1e-3, chosen on seed 0 from
{0.003, 0.01, 0.03, 0.1, 0.3}) are the baselines' own. ``preset=comfedl_dro_mnist``
runs the paper's MNIST setting from a local ``data.data_dir``; its §5.3 grids are the presets
``comfedl_dro_mnist_{lr,gamma,drfl,q,tau}_grid``.

    python -m lit_fedco.recipes.comfedl_dro
    python -m lit_fedco.recipes.comfedl_dro client_dro.gamma=0.2 seeds=[0]
    python -m lit_fedco.recipes.comfedl_dro updater=qfedavg \
        'variants=["qfedavg.q=0.1","qfedavg.q=1"]'
"""

from __future__ import annotations

from typing import Any

from lit_fedco.cli import main

DEFAULTS: dict[str, Any] = {
    "updaters": [
        "comfedl",
        "drfl",
        "qfedavg",
        "fedavg",
        "fedavgm",
        "fedadam",
        "fedyogi",
        "scaffold",
    ],
    "seeds": [0, 1, 2],  # mean ± std over 3 seeds by default: about two minutes for all eight
    "rounds": 200,
    "local_steps": 5,
    "cohort": 10,
    "batch_size": 16,
    "eval_every": 20,
    "threads": 1,  # logistic regression: operations too small to split over threads
    "data": {
        "name": "digits",
        "partition": "quantity",
        "num_clients": 10,
        "big": 1000,
        "small": 20,
        "small_classes": 2,
        "val_per_client": 100,
    },
    "model": {"name": "logreg"},
    # ComFedL on client-level KL-DRO; the baselines on the same problem train empirical risk
    "objective": "client_dro",
    "client_dro": {"gamma": 0.5, "form": "stable"},
    "comfedl": {"lr": 0.05},
    "drfl": {"lr": 0.05, "lam_lr": 0.08},  # ComFedL §5.1: client-weight step 8e-2
    "qfedavg": {"lr": 0.05, "q": 0.2},  # ComFedL §5.1: q = 0.2
    "fedavg": {"lr": 0.05},
    "fedavgm": {"lr": 0.05, "server_lr": 1.0, "server_momentum": 0.9},  # Hsu et al. 2019
    "fedadam": {"lr": 0.05, "server_lr": 0.1, "tau": 1e-3},  # Reddi et al. 2021: τ = 1e-3
    "fedyogi": {"lr": 0.05, "server_lr": 0.1, "tau": 1e-3},
    "scaffold": {"lr": 0.05},  # option II; η_g = 1
}

if __name__ == "__main__":
    main("comfedl_dro", DEFAULTS)
