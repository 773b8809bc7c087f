"""Synthetic data of FCSG §5.1 (invariant logistic regression, after Hu et al. 2020).

Outer samples ξ = (a, b): ``a ~ N(0, σ₁² I_d)`` and ``b = sign(aᵀx*)`` for a ground truth x*
drawn once per seed. The inner samples ``η ~ N(a, σ₂² I_d)`` are drawn conditionally on ξ at
every step by the objective (:class:`~lit_fedco.objectives.conditional.InvariantLogReg`), so
the data set holds only ξ. Labels are stored as ``y = (b + 1) / 2 ∈ {0, 1}``.

Every client draws from the same distribution (the paper's 16 clients). The test set — the
validation split — is ``K × val_per_client`` fresh outer samples (FCSG: 50000 = 16 × 3125),
split evenly over the clients, so the pooled validation accuracy is the paper's test accuracy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_fedco.data.federated import FederatedData
from lit_fedco.errors import ConfigError


def invariant_logreg_samples(
    n: int, x_star: Tensor, sigma1: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``n`` outer samples: ``a ~ N(0, σ₁² I)`` [n, d] and labels ``y = 1(aᵀx* > 0)`` [n]."""
    a = sigma1 * torch.randn(n, len(x_star), generator=generator)
    return a, (a @ x_star > 0).long()


def make_invariant_logreg(spec: Any) -> FederatedData:
    """The federated invariant logistic regression data (FCSG §5.1).

    Reads ``num_clients`` (K), ``dim`` (d), ``sigma1`` (σ₁), ``train_per_client`` and
    ``val_per_client`` (test samples per client) and ``seed`` from ``spec``. x* ~ N(0, I_d)
    and every sample come from one generator seeded by (seed, 0x1A7); nothing else is random.
    """
    k, d, n, n_val = spec.num_clients, spec.dim, spec.train_per_client, spec.val_per_client
    for key, value in (
        ("data.num_clients", k),
        ("data.dim", d),
        ("data.train_per_client", n),
        ("data.val_per_client", n_val),
    ):
        if value < 1:
            raise ConfigError.bad_value(key, value, "an int >= 1", "16")
    if not spec.sigma1 > 0:
        raise ConfigError.bad_value("data.sigma1", spec.sigma1, "a float > 0", "1.0")
    state = np.random.SeedSequence([spec.seed, 0x1A7]).generate_state(2)
    g = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    x_star = torch.randn(d, generator=g)
    a, y = invariant_logreg_samples(k * n, x_star, spec.sigma1, g)
    a_te, y_te = invariant_logreg_samples(k * n_val, x_star, spec.sigma1, g)
    off = torch.arange(k + 1, dtype=torch.int64)
    return FederatedData(
        a,
        y,
        off * n,
        a_te,
        y_te,
        off * n_val,
        num_classes=2,
        name="invariant_logreg",
        stats={"x_star": x_star.tolist()},
    )
