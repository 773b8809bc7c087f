"""FCSG and FCSG-M on federated invariant logistic regression (FCSG paper §5.1, Figure 1).

16 clients each draw outer samples ξ = (a, b), a ~ N(0, σ₁² I₁₀), b = sign(aᵀx*), and, at every
step, m inner samples η ~ N(a, σ₂² I) for each; the loss is log(1 + exp(−b mean_j η_jᵀx)) plus
the non-convex regulariser λ Σ γx_i²/(1 + γx_i²) (λ = 0.001, γ = 10). Outer batch 1, I = 50
local steps. The default runs the paper's grid σ₂/σ₁ ∈ {1, 1.5, 2} × m ∈ {1, 10, 100} as
``variants`` and reports test accuracy on 50000 fresh samples (``val/acc_pooled``; the table and
figures say "test"), 1 seed: about 1.5 min on 2 shared CPU cores.

    python -m lit_fedco.recipes.fcsg_invariant
    python -m lit_fedco.recipes.fcsg_invariant variants=[] invariant_logreg.m=100 updater=fcsg_m
"""

from __future__ import annotations

from typing import Any

from lit_fedco.cli import main

RATIOS = (1.0, 1.5, 2.0)  # σ₂/σ₁ with σ₁ = 1
INNER = (1, 10, 100)  # m

DEFAULTS: dict[str, Any] = {
    "updaters": ["fcsg", "fcsg_m"],
    "objective": "invariant_logreg",
    "rounds": 20,
    "local_steps": 50,  # the paper's local update steps
    "cohort": 16,
    "batch_size": 1,  # outer batch size (paper: 1)
    "eval_every": 5,
    "threads": 1,  # a 10-parameter model: one thread is fastest
    "data": {
        "name": "invariant_logreg",
        "num_clients": 16,
        "dim": 10,
        "sigma1": 1.0,
        "train_per_client": 2000,  # ≥ rounds · I: each ξ is seen about once (online)
        "val_per_client": 3125,  # 16 · 3125 = 50000 test samples
    },
    "model": {"name": "linear"},
    "invariant_logreg": {"sigma2": 1.0, "m": 10, "lam": 0.001, "gamma": 10.0},
    "fcsg": {"lr": 0.01},
    "fcsg_m": {"lr": 0.01, "beta": 0.1, "init_batches": 4},
    "variants": [
        f"invariant_logreg.sigma2={r} invariant_logreg.m={m}" for r in RATIOS for m in INNER
    ],
}

COLUMNS = [
    ("val/acc_pooled", "test acc"),
    ("val/loss_avg", "test loss"),
    ("train/loss", "train F̂"),
    ("time_s", "time s"),
]

if __name__ == "__main__":
    main("fcsg_invariant", DEFAULTS, columns=COLUMNS, evaluated_on="test")
