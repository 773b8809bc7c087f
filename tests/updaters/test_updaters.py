"""Every updater on a tiny problem with a known answer, calling its pure functions directly."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import grad

from lit_fedco.core.state import stack
from lit_fedco.engine import simulate
from lit_fedco.objectives import Objective
from lit_fedco.objectives.dro import ClientKLDRO, kl_dro_value
from lit_fedco.updaters import ComFedL, FedAvg, Hparams


class Scalar(nn.Module):
    """A model whose output is its one parameter w, for every input row."""

    def __init__(self, w0: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([w0], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.expand(len(x))


def quad_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """ℓ = s (w − t)², with the scale s and target t packed as target[:, 0], target[:, 1]."""
    return target[:, 0] * (pred - target[:, 1]) ** 2


def quad_comfedl(lr: float, gamma: float, form: str, w0: float) -> ComFedL:
    """ComFedL on client-level KL-DRO of the two quadratic clients below."""
    model = Scalar(w0)
    return ComFedL(Hparams(lr=lr), model, ClientKLDRO(model, gamma, form, sample_loss=quad_loss))


# Two clients: L_1(w) = w², L_2(w) = 2 (w − 1)². The worst case max(L_1, L_2) is minimised
# where w² = 2(w − 1)², at w* = 2 − √2; the KL-DRO minimiser tends to it as γ → 0.
CLIENTS = [
    {"x": torch.zeros(1, 1), "y": torch.tensor([[1.0, 0.0]], dtype=torch.float64)},
    {"x": torch.zeros(1, 1), "y": torch.tensor([[2.0, 1.0]], dtype=torch.float64)},
]


def run_rounds(upd, rounds: int, local_steps: int) -> float:
    """Full participation through the round the loop runs (lit_fedco.engine.round)."""
    batches = {"inner": stack(CLIENTS)}
    return float(simulate.run_rounds(upd, batches, rounds, local_steps)[-1]["x"]["w"])


def dro_minimiser(gamma: float) -> float:
    """argmin_w γ log mean exp(L_k(w)/γ) by bisection on its (monotone) derivative."""

    def dvalue(w: float) -> float:
        wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
        v = kl_dro_value(torch.stack([wt**2, 2 * (wt - 1) ** 2]), gamma)
        return float(torch.autograd.grad(v, wt)[0])

    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if dvalue(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("form,lr,w0", [("stable", 0.05, 3.0), ("literal", 2e-5, 0.55)])
def test_comfedl_converges_to_the_kl_dro_minimiser(form, lr, w0):
    gamma = 0.1
    upd = quad_comfedl(lr, gamma, form, w0)
    w = run_rounds(upd, rounds=400, local_steps=1)
    target = dro_minimiser(gamma)
    assert abs(target - (2 - math.sqrt(2))) < 0.06  # the DRO solution is near the minimax one
    assert w == pytest.approx(target, abs=1e-6)


def test_literal_form_blows_up_where_the_stable_form_converges():
    """From w = 3 the literal weight exp(L/γ)/γ is ~e⁸⁰: no fixed step size survives it."""
    upd = quad_comfedl(2e-4, 0.1, "literal", 3.0)
    assert not math.isfinite(run_rounds(upd, rounds=5, local_steps=1))


def test_fedavg_converges_to_the_average_minimiser():
    model = Scalar(3.0)
    upd = FedAvg(Hparams(lr=0.05), model, Objective(model, sample_loss=quad_loss))
    # minimiser of (w² + 2 (w − 1)²)/2 is w = 2/3, whatever I (the clients are deterministic)
    assert run_rounds(upd, rounds=200, local_steps=1) == pytest.approx(2 / 3, abs=1e-8)


def test_comfedl_one_step_is_the_gradient_of_the_composite_literal():
    """One literal ComFedL step at every client, averaged, is x − η ∇[(1/K) Σ exp(L_k/γ)]."""
    gamma, lr = 0.5, 0.01
    upd = quad_comfedl(lr, gamma, "literal", 0.3)
    w_new = run_rounds(upd, rounds=1, local_steps=1)

    def composite(w):
        return (torch.exp(w**2 / gamma) + torch.exp(2 * (w - 1) ** 2 / gamma)) / 2

    w0 = torch.tensor(0.3, dtype=torch.float64)
    assert w_new == pytest.approx(float(w0 - lr * grad(composite)(w0)), rel=1e-12)
