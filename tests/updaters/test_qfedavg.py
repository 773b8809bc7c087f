"""q-FedAvg (q-FFL, Algorithm 2): a hand-computed round, q = 0 against FedAvg, executor parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.state import stack
from lit_fedco.engine.simulate import run_rounds
from lit_fedco.objectives import Objective
from lit_fedco.updaters import QFedAvg, QFedAvgHparams
from tests.helpers import assert_executors_agree, flat_server, make_loop


class Line(nn.Module):
    """``a + b u`` for every input row u (two float64 parameters)."""

    def __init__(self, a0: float, b0: float) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a0, dtype=torch.float64))
        self.b = nn.Parameter(torch.tensor(b0, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a + self.b * x[:, 0]


def quad_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """ℓ = s (pred − t)², with the scale s and target t packed as target[:, 0], target[:, 1]."""
    return target[:, 0] * (pred - target[:, 1]) ** 2


def quad_qfedavg(hparams: QFedAvgHparams) -> QFedAvg:
    """q-FedAvg on the per-row quadratic losses below."""
    model = Line(A0, B0)
    return QFedAvg(hparams, model, Objective(model, sample_loss=quad_loss))


# BATCHES[k][t] = client k's batch at local step t: rows (u, s, t).
BATCHES = [
    [[(1.0, 1.0, 2.0), (-0.5, 2.0, 0.5)], [(0.3, 1.5, -1.0), (2.0, 0.5, 1.0)]],
    [[(0.7, 3.0, -2.0), (1.2, 1.0, 3.0)], [(-1.0, 2.0, 0.0), (0.5, 1.0, 4.0)]],
]
A0, B0, LR = 0.4, -0.3, 0.05


def torch_batch(rows):
    arr = torch.tensor(rows, dtype=torch.float64)
    return {"inner": {"x": arr[:, :1], "y": arr[:, 1:]}}


def by_hand(q: float) -> np.ndarray:
    """One q-FedAvg round in numpy, from the formulas of q-FFL Algorithm 2."""
    lip = 1.0 / LR
    x_bar = np.array([A0, B0])
    deltas, hs = [], []
    for client in BATCHES:
        x = x_bar.copy()
        f_k = None
        for t, rows in enumerate(client):
            u, s, tgt = (np.array(c) for c in zip(*rows, strict=True))
            r = x[0] + x[1] * u - tgt
            loss = np.mean(s * r**2)
            grad = np.array([np.mean(2 * s * r), np.mean(2 * s * r * u)])
            if t == 0:
                f_k = loss
            x = x - LR * grad
        dw = lip * (x_bar - x)
        deltas.append(f_k**q * dw)
        hs.append(q * f_k ** (q - 1) * dw @ dw + lip * f_k**q)
    return x_bar - np.sum(deltas, axis=0) / np.sum(hs)


def one_round(upd: QFedAvg) -> np.ndarray:
    """The same round through the round the loop runs (lit_fedco.engine.round): client k's step-t
    batch is BATCHES[k][t]."""
    steps = [stack([torch_batch(client[t]) for client in BATCHES]) for t in range(len(BATCHES[0]))]
    hist = run_rounds(upd, lambda t: steps[t], 1, len(steps))
    assert set(hist[-1]) == {"x"}
    return np.array([float(hist[-1]["x"]["a"]), float(hist[-1]["x"]["b"])])


@pytest.mark.parametrize("q", [0.5, 2.0])
def test_server_update_matches_a_hand_computation(q):
    upd = quad_qfedavg(QFedAvgHparams(lr=LR, q=q))
    got, want = one_round(upd), by_hand(q)
    assert not np.allclose(want, by_hand(0.0), atol=1e-6)  # q matters on this problem
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_q_zero_is_fedavg():
    kw = dict(rounds=3, model="mlp")
    qfed = make_loop("qfedavg", {"lr": 0.05, "q": 0.0}, **kw)
    fed = make_loop("fedavg", {"lr": 0.05}, **kw)
    qfed.run()
    fed.run()
    start = flat_server(make_loop("fedavg", {"lr": 0.05}, **kw))
    assert not np.allclose(flat_server(fed), start, atol=1e-6)  # the runs moved
    np.testing.assert_allclose(flat_server(qfed), flat_server(fed), rtol=1e-10, atol=1e-10)


def test_vectorized_equals_sequential():
    assert_executors_agree("qfedavg", {"lr": 0.05, "q": 0.5})


@pytest.mark.parametrize("q", [-0.1, -2.0])
def test_negative_q_is_a_config_error(q):
    with pytest.raises(ConfigError, match=r"^q: got"):
        QFedAvgHparams(q=q)
