"""Server optimizers (lit_fedco.core.server_opt) and the updaters built on them: the kernels
against Reddi et al.'s formulas written out by hand, torch.optim classes against torch.optim
itself, state that survives a checkpoint, FedAvgM / FedAdam / FedYogi / SCAFFOLD on quadratics
whose answer is known, and ``server_opt`` on every registered updater."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.protocol import RoundInfo
from lit_fedco.core.server_opt import ServerOptConfig, ServerOptimizer
from lit_fedco.core.state import flatten, stack
from lit_fedco.engine import simulate
from lit_fedco.engine.comm import LocalComm
from lit_fedco.engine.executors import SequentialExecutor
from lit_fedco.engine.failures import Failures
from lit_fedco.engine.round import federated_round
from lit_fedco.engine.store import make_store
from lit_fedco.objectives import Objective
from lit_fedco.updaters import FedAvg, Hparams, get_updater
from tests.updaters.test_registry import TINY
from tests.updaters.test_updaters import Scalar, quad_loss

F64 = torch.float64


def model(values) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(values, dtype=F64)}


# ---------------------------------------------------------------------- the kernels
def by_hand(name: str, cfg: ServerOptConfig, x: np.ndarray, proposals: list[np.ndarray]):
    """Reddi et al. (2021), Algorithm 2 (and Hsu et al. for momentum), written out in numpy."""
    m, v = np.zeros_like(x), np.full_like(x, cfg.eps**2)
    out = []
    for p in proposals:
        delta = p - x
        if name == "sgd":
            x = x + cfg.lr * delta
        elif name == "momentum":
            m = cfg.momentum * m + delta
            x = x + cfg.lr * m
        else:
            if name == "adagrad":
                v = v + delta**2
                step = delta
            else:
                m = cfg.beta1 * m + (1 - cfg.beta1) * delta
                if name == "adam":
                    v = cfg.beta2 * v + (1 - cfg.beta2) * delta**2
                else:
                    v = v - (1 - cfg.beta2) * delta**2 * np.sign(v - delta**2)
                step = m
            x = x + cfg.lr * step / (np.sqrt(v) + cfg.eps)
        out.append(x)
    return out


@pytest.mark.parametrize("name", ["sgd", "momentum", "adagrad", "adam", "yogi"])
def test_each_kernel_is_the_papers_update(name):
    cfg = ServerOptConfig(name, lr=0.3, momentum=0.8, beta1=0.7, beta2=0.9, eps=0.05)
    opt = ServerOptimizer(cfg)
    x = np.array([1.0, -2.0, 0.5])
    proposals = [x + d for d in (np.array([0.2, 0.1, -0.4]), np.array([-0.3, 0.05, 0.2]),
                                 np.array([0.01, -0.2, 0.3]))]  # fmt: skip
    expected = by_hand(name, cfg, x, proposals)
    current = model(x)
    for prop, exp in zip(proposals, expected, strict=True):
        prop_t = model(prop + (current["w"].numpy() - x))  # the same Δ from the current point
        current = opt.step(current, prop_t)
        x = current["w"].numpy()
        np.testing.assert_allclose(x, exp, rtol=1e-13, atol=1e-15)


def test_sgd_of_step_one_is_the_proposal():
    opt = ServerOptimizer(ServerOptConfig("sgd", lr=1.0))
    x, p = model([0.3, -1.7]), model([0.25, 2.0])
    np.testing.assert_allclose(opt.step(x, p)["w"].numpy(), p["w"].numpy(), rtol=1e-15)


TORCH_OPTIMIZERS = [
    ("SGD", {"momentum": 0.8}),
    ("Adam", {"betas": (0.7, 0.9), "eps": 0.05}),
    ("RMSprop", {"momentum": 0.8, "eps": 0.05}),
]


@pytest.mark.parametrize("name,kw", TORCH_OPTIMIZERS)
def test_a_torch_optim_class_steps_as_torch_optim_does(name, kw):
    cfg = ServerOptConfig(name, lr=0.1, momentum=0.8, beta1=0.7, beta2=0.9, eps=0.05)
    opt = ServerOptimizer(cfg)
    ref_p = torch.tensor([1.0, -2.0], dtype=F64, requires_grad=True)
    ref = getattr(torch.optim, name)([ref_p], lr=0.1, **kw)
    current = model([1.0, -2.0])
    for d in ([0.2, -0.4], [-0.1, 0.3], [0.05, 0.05]):
        proposal = {"w": current["w"] + torch.tensor(d, dtype=F64)}
        current = opt.step(current, proposal)
        ref_p.grad = -torch.tensor(d, dtype=F64)
        ref.step()
        torch.testing.assert_close(current["w"], ref_p.detach(), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("name", ["momentum", "adam", "yogi", "Adam"])
def test_the_state_survives_a_checkpoint(name):
    cfg = ServerOptConfig(name, lr=0.1)
    steps = [model([0.2, -0.4]), model([-0.1, 0.3]), model([0.05, 0.05]), model([0.3, 0.1])]

    def run(opt, x, ds):
        for d in ds:
            x = opt.step(x, {"w": x["w"] + d["w"]})
        return x

    straight = run(ServerOptimizer(cfg), model([1.0, 2.0]), steps)
    first = ServerOptimizer(cfg)
    half = run(first, model([1.0, 2.0]), steps[:2])
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    second = ServerOptimizer(cfg)
    second.load_state_dict(torch.load(buf, weights_only=False))
    resumed = run(second, half, steps[2:])
    assert torch.equal(resumed["w"], straight["w"])


@pytest.mark.parametrize(
    "cfg,key",
    [
        (ServerOptConfig("adamw2"), "server_opt.name"),
        (ServerOptConfig("adam", lr=0.0), "server_opt.lr"),
        (ServerOptConfig("adam", beta2=1.0), "server_opt.beta2"),
        (ServerOptConfig("yogi", eps=-1.0), "server_opt.eps"),
        (ServerOptConfig("Optimizer"), "server_opt.name"),  # the base class is no optimizer
    ],
)
def test_bad_settings_name_their_key(cfg, key):
    with pytest.raises(ConfigError, match=rf"^{key}: got "):
        ServerOptimizer(cfg)


# ---------------------------------------------------------------------- on quadratics
# Two clients L_1(w) = w², L_2(w) = 2 (w − 1)²: the average is minimised at w* = 2/3.
CLIENTS = {
    "inner": stack([
        {"x": torch.zeros(1, 1), "y": torch.tensor([[1.0, 0.0]], dtype=F64)},
        {"x": torch.zeros(1, 1), "y": torch.tensor([[2.0, 1.0]], dtype=F64)},
    ])
}  # fmt: skip
W_STAR = 2 / 3


def quad(name: str, **hp):  # type: ignore[no-untyped-def]
    cls = get_updater(name)
    net = Scalar(3.0)
    return cls(cls.hparams_cls(**hp), net, Objective(net, sample_loss=quad_loss))


def final_w(upd, rounds: int, local_steps: int, server_opt=None) -> float:  # type: ignore[no-untyped-def]
    hist = simulate.run_rounds(upd, CLIENTS, rounds, local_steps, server_opt=server_opt)
    return float(hist[-1]["x"]["w"])


@pytest.mark.parametrize(
    "name,hp",
    [
        ("fedavgm", {"lr": 0.05, "server_lr": 0.5, "server_momentum": 0.5}),
        ("fedadam", {"lr": 0.05, "server_lr": 0.05}),
        ("fedyogi", {"lr": 0.05, "server_lr": 0.05}),
    ],
)
def test_fedavg_with_a_server_optimizer_reaches_the_average_minimiser(name, hp):
    """One local step per round: every method's fixed point is the minimiser of the average."""
    assert final_w(quad(name, **hp), rounds=600, local_steps=1) == pytest.approx(W_STAR, abs=1e-6)


def test_scaffold_reaches_the_optimum_where_fedavg_drifts():
    """Ten local steps of size 0.1 on heterogeneous clients: FedAvg's fixed point is
    Σ t_k (1 − ρ_k^I) / Σ (1 − ρ_k^I) with ρ_k = 1 − 2 s_k η (0.527 here), not w*; SCAFFOLD's
    control variates remove the drift and it reaches w* = 2/3."""
    steps, lr = 10, 0.1
    rho = [(1 - 2 * s * lr) ** steps for s in (1.0, 2.0)]
    drift = (0 * (1 - rho[0]) + 1 * (1 - rho[1])) / ((1 - rho[0]) + (1 - rho[1]))
    fedavg = final_w(quad("fedavg", lr=lr), rounds=200, local_steps=steps)
    scaffold = final_w(quad("scaffold", lr=lr), rounds=200, local_steps=steps)
    assert fedavg == pytest.approx(drift, abs=1e-9) and abs(drift - W_STAR) > 0.1
    assert scaffold == pytest.approx(W_STAR, abs=1e-9)


def test_scaffold_server_control_variate_counts_the_clients_that_uploaded():
    """c ← c + (|S| / N) mean Δc_i over the clients whose upload arrived: one of two clients
    drops out, so |S| / N = 1/2 and the mean is that one client's Δc."""
    upd = quad("scaffold", lr=0.1)

    class DropSecond(Failures):
        def steps(self, info, clients):
            return torch.tensor([2, 0])[clients]

    server = upd.init_server(upd.params(), 2)
    cohort, store = torch.arange(2), make_store(upd, server, 2)
    info = RoundInfo(0, 2, cohort, 2, 0)
    res = federated_round(upd, server, info, cohort, lambda t: CLIENTS, LocalComm(),
                          SequentialExecutor(), store, DropSecond(drop=0.5))  # fmt: skip
    # client 1 alone: two steps from w = 3 on L_1 = w², c = c_1 = 0 → y = 3 (1 − 0.2)²
    y = 3.0 * 0.8**2
    c1 = (3.0 - y) / (2 * 0.1)
    assert float(res.server["x"]["w"]) == pytest.approx(y, rel=1e-14)
    assert float(res.server["c"]["w"]) == pytest.approx(0.5 * c1, rel=1e-14)
    assert store.rows["c_i"]["w"].flatten().tolist() == pytest.approx([c1, 0.0], rel=1e-14)


# ---------------------------------------------------------------------- every updater
@pytest.mark.parametrize("name", [n for n in sorted(TINY) if not get_updater(n).server_optimizer])
def test_server_opt_runs_with_every_registered_updater(name):
    """``server_opt`` (here Adam) moves the model of every updater from where the round
    started, and SGD of step 1 gives what the updater alone gives (to rounding)."""
    build, hp = TINY[name]
    plain_run = build(name, hp, rounds=2, eval_every=2)
    plain_run.run()
    sgd = build(name, hp, rounds=2, eval_every=2, server_opt=ServerOptConfig("sgd", lr=1.0))
    sgd.run()
    np.testing.assert_allclose(flatten(sgd.server)[0].numpy(), flatten(plain_run.server)[0].numpy(),
                               rtol=1e-9, atol=1e-12)  # fmt: skip
    adam = build(name, hp, rounds=2, eval_every=2, server_opt=ServerOptConfig("adam", lr=0.01))
    adam.run()
    key = adam.updater.model_key
    x = flatten(adam.server[key])[0]
    assert torch.isfinite(x).all() and not torch.equal(x, flatten(plain_run.server[key])[0])
    assert "server_opt" in adam.state_dict()


def test_a_run_level_server_optimizer_leaves_an_updaters_own_alone():
    from tests.helpers import make_loop

    own = make_loop("fedadam", {"lr": 0.1, "server_lr": 0.05}, rounds=2)
    both = make_loop("fedadam", {"lr": 0.1, "server_lr": 0.05}, rounds=2,
                     server_opt=ServerOptConfig("sgd", lr=0.5))  # fmt: skip
    own.run()
    both.run()
    assert both.server_opt is not None and both.server_opt.cfg.name == "adam"
    assert torch.equal(flatten(own.server)[0], flatten(both.server)[0])
    assert math.isfinite(float(flatten(own.server)[0].sum()))


def test_fedavg_hparams_are_not_server_opt_hparams():
    assert get_updater("fedavg").hparams_cls is Hparams
    assert FedAvg.server_optimizer == "" and get_updater("fedadam").server_optimizer == "adam"
