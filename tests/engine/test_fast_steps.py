"""The fast forms of a client step give the same numbers as ``client_step``.

- Stacked (the vectorized executor without ``vmap``): the small models' stacked forwards, the
  plain objective's per-client values and the gradient of their sum equal ``vmap`` of the
  per-client functions; FedAvg's rounds are the same with and without it. Equal to
  :data:`STACKED_TOL` of the dtype, not bit for bit: the stacked form multiplies with
  ``baddbmm``, ``vmap`` with batched ``linear``, and which kernel (and so which order of the
  sums) MKL and ATen pick for each depends on the CPU (AVX2 against AVX-512) and the shapes.
- In place (the sequential executor writing each client's step into its rows), bit for bit:
  FedAvg's rounds are the same with and without it, also when clients stop early (the
  stopped ones step out of place).
- Each is taken only where it is the updater's own (a subclass overriding ``client_step`` only
  is run through ``client_step``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import grad_and_value as func_gv
from torch.func import vmap

from lit_fedco.core.autodiff import stacked_grad_and_value
from lit_fedco.core.models import build_model, call, call_stacked, stacks
from lit_fedco.engine.executors import SequentialExecutor, VectorizedExecutor
from lit_fedco.engine.failures import Failures
from lit_fedco.objectives.base import Objective, cross_entropy
from lit_fedco.updaters.fedavg import FedAvg
from tests.helpers import assert_executors_agree, flat_server, make_loop

STACKED_TOL = {torch.float32: 1e-6, torch.float64: 1e-14}
"""Absolute and relative tolerance between the stacked and the ``vmap`` forms: a few units in
the last place of the values a 3-round run reaches (measured: 4.5e-8 and 8.3e-17 apart)."""


def assert_close(got: torch.Tensor | np.ndarray, want: torch.Tensor | np.ndarray, dtype, msg=""):
    """``got`` equals ``want`` to :data:`STACKED_TOL` of ``dtype``."""
    tol = STACKED_TOL[dtype]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol, err_msg=msg)


MODELS = [("logreg", (8,)), ("linear", (8,)), ("mlp", (8,)), ("mlp", (2, 2, 2))]


def _clients(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, n: int = 5, b: int = 7, hidden: int = 6
):
    g = torch.Generator().manual_seed(3)
    net = build_model(name, shape, 4, 0, hidden=hidden)
    params = {
        k: v.detach().to(dtype) + 0.3 * torch.randn(n, *v.shape, generator=g, dtype=dtype)
        for k, v in net.named_parameters()
    }
    x = torch.randn(n, b, *shape, generator=g, dtype=dtype)
    y = torch.randint(4, (n, b), generator=g)
    return net, params, x, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,shape", MODELS)
@pytest.mark.parametrize("clients,width", [((5, 7), 6), ((4, 8), 16), ((1, 8), 16)])
def test_stacked_forward_values_and_gradients_equal_vmap(name, shape, dtype, clients, width):
    """Also at the digits run's widths (16 hidden units, batches of 8), where the kernels of the
    two forms sum in another order on this CPU (float64 forwards, float32 gradients)."""
    shape = (64,) if width > 6 else shape  # the digits' 64 features
    net, params, x, y = _clients(name, shape, dtype, *clients, hidden=width)
    assert stacks(net)
    with torch.no_grad():
        forward = call_stacked(net, params, x)
        assert_close(forward, vmap(lambda p, v: call(net, p, v))(params, x), dtype)
    obj = Objective(net)
    batches = {"inner": {"x": x, "y": y}}
    assert obj.stacks()
    values = obj.values(params, batches, {})
    assert_close(values, vmap(obj.value, in_dims=(0, 0, None))(params, batches, {}), dtype)
    got_g, got_v = stacked_grad_and_value(lambda p: obj.values(p, batches, {}))(params)
    want_g, want_v = vmap(func_gv(obj.value), in_dims=(0, 0, None))(params, batches, {})
    assert_close(got_v, want_v, dtype)
    assert not got_v.requires_grad
    for k in params:
        assert_close(got_g[k], want_g[k], dtype, k)
        assert not got_g[k].requires_grad


def test_values_with_side_columns_and_without_a_stacked_form():
    net, params, x, y = _clients("logreg", (8,), torch.float64)
    side = torch.stack([y, torch.zeros_like(y)], dim=-1)  # [n, b, 1 + s]: the label in column 0
    obj = Objective(net)
    assert torch.equal(
        obj.values(params, {"inner": {"x": x, "y": side}}, {}),
        obj.values(params, {"inner": {"x": x, "y": y}}, {}),
    )
    # no stacked form: another loss, a subclass, a model without a stacked forward — vmap
    squared = Objective(net, sample_loss=lambda z, t: (z[..., 0] - t.to(z.dtype)) ** 2)

    class Shifted(Objective):
        def inner(self, params, batch, ctx):
            return super().inner(params, batch, ctx) + 1.0

    cnn = build_model("cnn", (1, 4, 4), 4, 0, hidden=3)
    assert not squared.stacks() and not Shifted(net).stacks() and not Objective(cnn).stacks()
    batches = {"inner": {"x": x, "y": y}}
    for obj in (squared, Shifted(net)):
        want = vmap(obj.value, in_dims=(0, 0, None))(params, batches, {})
        assert torch.equal(obj.values(params, batches, {}), want)
    assert torch.equal(
        Shifted(net).values(params, batches, {}), Objective(net).values(params, batches, {}) + 1
    )
    # a model without a stacked forward still runs stacked, through vmap
    cp = {k: torch.stack([v.detach()] * 2) for k, v in cnn.named_parameters()}
    xs = torch.randn(2, 3, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(call_stacked(cnn, cp, xs), vmap(lambda p, v: call(cnn, p, v))(cp, xs))


def test_stacked_gradient_keeps_clients_apart_and_zeros_for_unused_rows():
    w = torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)
    params = {"w": w, "unused": torch.ones(2, 3)}
    g, v = stacked_grad_and_value(lambda p: (p["w"] ** 3).sum(1))(params)
    assert g["w"].tolist() == [[3.0, 12.0], [27.0, 3.0]] and g["unused"].tolist() == [[0.0] * 3] * 2
    assert v.tolist() == [9.0, 26.0]
    # an outer autograd sees through it (the graph is kept)
    leaf = w.clone().requires_grad_()
    g, _ = stacked_grad_and_value(lambda p: (p["w"] ** 3).sum(1))({"w": leaf})
    (outer,) = torch.autograd.grad(g["w"].sum(), leaf)
    assert torch.equal(outer, 6 * w)


def test_only_the_updaters_own_stacked_step_runs():
    net = build_model("logreg", (8,), 4, 0)
    hp = FedAvg.hparams_cls(lr=0.1)
    assert FedAvg(hp, net).stacked()

    class MyStep(FedAvg):  # overrides client_step only: its step must be vmapped
        def client_step(self, state, batches, ctx, step):
            new, logs = super().client_step(state, batches, ctx, step)
            return {**new, "x": {k: 0.5 * v for k, v in new["x"].items()}}, logs

    assert not MyStep(hp, net).stacked() and not MyStep(hp, net).inplace()
    wrapped = FedAvg(hp, net)  # client_step replaced on the instance (a recorder, a test)
    wrapped.client_step = lambda *a: FedAvg.client_step(wrapped, *a)  # type: ignore[method-assign]
    assert not wrapped.stacked() and not wrapped.inplace()
    assert FedAvg(hp, net).inplace()
    assert not FedAvg(hp, build_model("cnn", (1, 4, 4), 4, 0, hidden=3)).stacked()
    assert not FedAvg(hp, net, Objective(net, sample_loss=lambda z, t: z.sum(-1))).stacked()
    assert Objective(net).sample_loss is cross_entropy
    with pytest.raises(ValueError, match="sequential executor runs clients one by one"):
        SequentialExecutor().map(lambda s, b, c: s, {"a": torch.ones(2)}, None, {}, 2, True)


@pytest.mark.parametrize("name", ["fedavg", "fedadam", "scaffold"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rounds_equal_vmapped_steps(name, dtype, monkeypatch):
    """Whole runs (cohort 4 of 6, 3 local steps, 3 rounds; SCAFFOLD with its kept c_i): the
    stacked step against the same run with ``vmap`` of ``client_step``, to
    :data:`STACKED_TOL` (server state and logs); and a process running no client (``n = 0``)."""
    servers, logs = [], []
    for stacked in (True, False):
        loop = make_loop(name, {"lr": 0.1}, dtype=dtype, model="mlp")
        assert loop.updater.stacked() is stacked
        loop.run()
        monkeypatch.setattr(type(loop.updater), "stacked", lambda self: False)
        servers.append(flat_server(loop))
        logs.append(loop.history[-1])
    assert_close(servers[0], servers[1], dtype)
    assert logs[0].keys() == logs[1].keys()
    for k in (k for k in logs[0] if not k.startswith("time")):
        assert logs[0][k] == pytest.approx(logs[1][k], rel=STACKED_TOL[dtype], abs=1e-12), k
    # a process that runs none of the cohort: a phantom row, 0 rows out, the logs' shapes kept
    net = build_model("logreg", (8,), 4, 0)
    upd = FedAvg(FedAvg.hparams_cls(lr=0.1), net)
    none = {"x": {k: torch.ones(0, *v.shape) for k, v in net.named_parameters()}}
    batches = {"inner": {"x": torch.ones(0, 2, 8), "y": torch.zeros(0, 2, dtype=torch.long)}}
    step = lambda s, b, c: upd.client_step_stacked(s, b, c, None)  # type: ignore[arg-type]  # noqa: E731
    out, out_logs = VectorizedExecutor().map(step, none, batches, {}, 0, stacked=True)
    assert out_logs["loss"].shape == (0,) and out["x"]["linear.weight"].shape == (0, 4, 8)


def test_executors_still_agree_with_the_stacked_step():
    assert_executors_agree("fedavg", {"lr": 0.1}, model="logreg")
    assert_executors_agree("fedavg", {"lr": 0.1})  # mlp


@pytest.mark.parametrize("failures", [None, Failures(drop=0.2, partial=0.5)])
@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "scaffold"])
def test_sequential_in_place_rounds_equal_out_of_place_bit_for_bit(name, failures, monkeypatch):
    """Whole runs under the sequential executor, with and without the in-place step (and with
    clients that drop out or stop early: those rounds switch to the out-of-place step at the
    first step a client no longer runs); the kept logs too."""
    kw = {"failures": failures} if failures else {}
    runs = []
    calls = {"inplace": 0}
    mro = type(make_loop(name, {"lr": 0.1}).updater).__mro__
    cls = next(c for c in mro if "client_step_inplace" in c.__dict__)  # FedAvg for FedAvgM
    real = cls.client_step_inplace

    def counted(self, *a):
        calls["inplace"] += 1
        return real(self, *a)

    monkeypatch.setattr(cls, "client_step_inplace", counted)
    for mode in ("in-place", "out-of-place"):
        calls.update(inplace=0)
        if mode == "out-of-place":
            monkeypatch.setattr(cls, "inplace", lambda self: False)
        loop = make_loop(name, {"lr": 0.1}, executor="sequential", rounds=4, **kw)
        loop.run()
        runs.append((flat_server(loop), [
            {k: v for k, v in h.items() if not k.startswith("time")} for h in loop.history
        ]))  # fmt: skip
        assert (calls["inplace"] > 0) == (mode == "in-place")
    assert np.array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


class SummedWeight(torch.nn.Module):
    """A linear layer whose weight is the sum of two parameters: autograd hands both the same
    gradient tensor."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(4, 8, generator=g))
        self.b = torch.nn.Parameter(torch.randn(4, 8, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.flatten(1), self.a + self.b)


def test_fedavg_in_place_step_with_gradients_that_share_memory():
    """Where autograd hands two parameters one gradient tensor (as here), FedAvg's in-place step
    must stay the out-of-place step's."""
    from lit_fedco.core.state import own_storage

    net = SummedWeight()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=g), torch.randint(4, (6,), generator=g)
    batches = {"inner": {"x": x, "y": y}}
    upd = FedAvg(FedAvg.hparams_cls(lr=0.1), net)
    start = {"x": {k: v.detach().clone() for k, v in net.named_parameters()}}
    grads, _ = upd.loss_gradient(start["x"], batches, {})
    assert not own_storage(list(grads.values()))  # the case this test is about
    want, _ = upd.client_step(start, batches, {}, None)  # type: ignore[arg-type]
    state = {"x": {k: v.clone() for k, v in start["x"].items()}}
    upd.client_step_inplace(state, batches, {}, None)  # type: ignore[arg-type]
    for k in want["x"]:
        assert torch.equal(state["x"][k], want["x"][k]), k


def test_own_storage():
    from lit_fedco.core.state import own_storage

    a, b = torch.zeros(3), torch.zeros(2, 3)
    assert own_storage([a, b])
    assert not own_storage([a, a])
    assert not own_storage([b[0], b[1]])  # two views of one tensor
    assert own_storage([b[1:]])  # a view of memory no other holds
    assert not own_storage([b.t()])  # not contiguous: left alone
    assert not own_storage([a], [a.view(1, 3)])
    assert not own_storage([torch.zeros(1).expand(3)])  # one element seen three times


class SummedBias(torch.nn.Module):
    """A linear layer plus a parameter whose gradient is an expanded tensor (``q.sum()`` in the
    output hands ``q`` back the output's gradient broadcast, one element per place)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.q = torch.nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.flatten(1)) + self.q.sum()


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_in_place_steps_with_an_expanded_gradient(name):
    """An in-place step must not write into an expanded gradient (torch refuses; and the step
    must stay the out-of-place one's)."""
    from lit_fedco.updaters import get_updater

    net = SummedBias()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=g), torch.randint(4, (6,), generator=g)
    batches = {"inner": {"x": x, "y": y}}
    cls = get_updater(name)
    upd = cls(cls.hparams_cls(lr=0.1), net)
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    start = {"x": params}
    if name == "scaffold":
        zeros = {k: 0.01 * torch.ones_like(v) for k, v in params.items()}
        start = {"x": params, "c_i": zeros, "c": {k: 2 * v for k, v in zeros.items()}}
    grads, _ = upd.loss_gradient(params, batches, {})
    assert grads["q"].stride() == (0,)  # the case this test is about
    want, _ = upd.client_step(start, batches, {}, None)  # type: ignore[arg-type]
    state = {k: {n: v.clone() for n, v in d.items()} for k, d in start.items()}
    upd.client_step_inplace(state, batches, {}, None)  # type: ignore[arg-type]
    for k in want["x"]:
        assert torch.equal(state["x"][k], want["x"][k]), k


def test_an_in_place_step_that_returns_a_state_is_named():
    class Wrong(FedAvg):
        def client_step(self, state, batches, ctx, step):
            return super().client_step(state, batches, ctx, step)

        def client_step_inplace(self, state, batches, ctx, step):
            return state, {}

    loop = make_loop("fedavg", {"lr": 0.1}, executor="sequential")
    loop.updater = Wrong(FedAvg.hparams_cls(lr=0.1), loop.updater.model, loop.updater.objective)
    with pytest.raises(TypeError, match=r"Wrong.client_step_inplace must return the step's logs"):
        loop.run_round()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_foreach_axpy_is_tree_axpy_bit_for_bit(dtype, monkeypatch):
    """The in-place ``y + α x`` rounds the product before the sum, as the out-of-place one: in
    one pass on the CPU (its ``addcmul_`` keeps the two roundings) and in the fallback."""
    from lit_fedco.core import state as state_mod

    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in [(33, 17), (5,), ()]]
    ys = [torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype) for x in xs]
    want = state_mod.tree_axpy(-0.037, xs, ys)
    cpu = torch.device("cpu")
    assert state_mod._one_pass(cpu, dtype) is not None  # the one pass here
    for one_pass in (True, False):
        one = torch.ones((), dtype=dtype) if one_pass else None
        monkeypatch.setattr(state_mod, "_ONE", {(cpu, dtype): one})
        got = [y.clone() for y in ys]
        state_mod.foreach_axpy_(-0.037, xs, got)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), one_pass


def test_foreach_axpy_falls_back_where_addcmul_rounds_once(monkeypatch):
    """A device whose ``addcmul_`` computes ``y + α x`` with one rounding (a fused multiply-add, a
    wider accumulator) is found out by the probe, and the step takes the two-pass form."""
    from lit_fedco.core import state as state_mod

    real = torch.Tensor.addcmul_

    def rounds_once(self, t1, t2, value=1):
        wide = self.double() + value * t1.double() * t2.double()
        return self.copy_(wide.to(self.dtype))

    cpu = torch.device("cpu")
    monkeypatch.setattr(state_mod, "_ONE", {})
    monkeypatch.setattr(torch.Tensor, "addcmul_", rounds_once)
    assert state_mod._one_pass(cpu, torch.float32) is None
    monkeypatch.setattr(torch.Tensor, "addcmul_", real)
    assert list(state_mod._ONE.items()) == [((cpu, torch.float32), None)]
    x, y = torch.randn(100, generator=torch.Generator().manual_seed(1)), torch.ones(100) / 3
    got = y.clone()
    state_mod.foreach_axpy_(-0.05, [x], [got])
    assert torch.equal(got, y + -0.05 * x)


def test_foreach_axpy_of_mixed_dtypes_takes_two_passes(monkeypatch):
    """Only one device and dtype is probed per call: a float16 tensor beside a float32 one (whose
    ``addcmul_`` would compute in float32 and round once) takes the two-pass form."""
    from lit_fedco.core import state as state_mod

    cpu = torch.device("cpu")
    monkeypatch.setattr(state_mod, "_ONE", {(cpu, torch.float32): torch.ones(())})
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(300, generator=g), torch.randn(300, generator=g).half()]
    ys = [torch.randn(300, generator=g), torch.randn(300, generator=g).half()]
    got = [y.clone() for y in ys]
    state_mod.foreach_axpy_(-0.05, xs, got)
    assert all(torch.equal(a, y + -0.05 * x) for a, x, y in zip(got, xs, ys, strict=True))
    assert (cpu, torch.float16) not in state_mod._ONE  # nothing probed: the pair took two passes


@pytest.mark.parametrize("probes", [False, True])
@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_in_place_rounds_leave_the_server_alone(name, probes, monkeypatch):
    """Steps written into the clients' rows never touch the server state the round began from;
    they give the numbers of out-of-place steps; and a probe in the round context (which reads
    the clients' states before any step) sees every client start from the server's model."""
    from lit_fedco.core.state import tree_clone, tree_leaves

    seen = []

    def run(in_place: bool) -> tuple[np.ndarray, list]:
        loop = make_loop(name, {"lr": 0.1}, executor="sequential", rounds=3)
        loop.executor.fast_steps = in_place
        if probes:
            cls = type(loop.updater)

            class Probing(cls):  # type: ignore[misc, valid-type]
                def round_context(self, server, info, probe):
                    rows = probe(lambda s, b: torch.stack([v.sum() for v in s["x"].values()]))
                    seen.append(rows)
                    return super().round_context(server, info, probe)

            u = loop.updater
            loop.updater = Probing(u.hparams, u.model, u.objective)
        for _ in range(3):
            before = loop.server
            snapshot = tree_clone(before)
            loop.run_round()
            for a, b in zip(tree_leaves(before), tree_leaves(snapshot), strict=True):
                assert torch.equal(a, b)  # the old server state, as it was
        return flat_server(loop), [h["train/loss"] for h in loop.history]

    a = run(True)
    b = run(False)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
    if probes:  # each client's probe saw the server's model, in both runs
        for rows in seen:
            assert torch.equal(rows, rows[:1].expand_as(rows))
        assert all(torch.equal(x, y) for x, y in zip(seen[:3], seen[3:], strict=True))
