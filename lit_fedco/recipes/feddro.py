"""FedDRO (Algorithm 2) against FedAvg-CO (Algorithm 1, cases I and II) and MBSGD, on χ²-DRO
(FedDRO paper §2.1, §6).

The same embedded default as ``ds_feddro`` (step-imbalanced digits over 8 Dirichlet-split
clients, small MLP, I = 5, batch 16, 3 seeds), with the χ²-divergence objective
``ℓ̄ + Var(ℓ)/(2λ)`` (derived in ``lit_fedco.objectives.distributed``; valid while
``min ℓ ≥ ℓ̄ − λ``, hence λ = 3 for cross-entropies that start near log 10 ≈ 2.3). FedDRO
shares the scalar ȳ after every local step; FedAvg-CO case II (``fedavg_co``) shares it only
with x, case I (``fedavg_co_i``) not at all; the table shows what the extra floats buy.
``sample_dro.kind=kl`` runs KL-DRO instead.

    python -m lit_fedco.recipes.feddro
    python -m lit_fedco.recipes.feddro updater=feddro local_steps=10
"""

from __future__ import annotations

from typing import Any

from lit_fedco.cli import main
from lit_fedco.recipes.ds_feddro import COLUMNS
from lit_fedco.recipes.ds_feddro import DEFAULTS as DS_DEFAULTS

DEFAULTS: dict[str, Any] = {
    **DS_DEFAULTS,
    "updaters": ["feddro", "fedavg_co", "fedavg_co_i", "mbsgd"],
    "sample_dro": {"kind": "chi2", "lam": 3.0},
}

if __name__ == "__main__":
    main("feddro", DEFAULTS, columns=COLUMNS)
