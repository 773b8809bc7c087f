"""lit_fedco's first-order ``grad_and_value``: ``torch.autograd.grad`` outside transforms, the
same numbers as ``torch.func.grad_and_value`` bit for bit, and ``torch.func`` under ``vmap``,
nested in another gradient, or under an outer ``torch.autograd``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad_and_value as func_gv
from torch.func import vmap

from lit_fedco.core import autodiff
from lit_fedco.core.autodiff import grad_and_value, transformed
from lit_fedco.core.models import build_model, call


def _problem(dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    net = build_model("mlp", (8,), 3, 0, hidden=5)
    params = {k: v.detach().to(dtype) for k, v in net.named_parameters()}
    x = torch.randn(6, 8, generator=g, dtype=dtype)
    y = torch.randint(3, (6,), generator=g)

    def loss(p, x, y):
        return F.cross_entropy(call(net, p, x), y)

    return params, x, y, loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_outside_transforms_equals_torch_func_bit_for_bit(dtype, monkeypatch):
    params, x, y, loss = _problem(dtype)
    want_g, want_v = func_gv(loss)(params, x, y)
    # the fast path runs: torch.func's is not called outside a transform
    monkeypatch.setattr(autodiff, "func_grad_and_value", None)
    assert not transformed()
    got_g, got_v = grad_and_value(loss)(params, x, y)
    assert torch.equal(got_v, want_v) and not got_v.requires_grad
    for k in params:
        assert torch.equal(got_g[k], want_g[k]) and not got_g[k].requires_grad


def test_under_vmap_it_is_torch_func():
    params, x, y, loss = _problem(torch.float64)
    stacked = {k: torch.stack([v, 2 * v]) for k, v in params.items()}
    xs, ys = torch.stack([x, x.flip(0)]), torch.stack([y, y.flip(0)])
    got = vmap(grad_and_value(loss))(stacked, xs, ys)
    want = vmap(func_gv(loss))(stacked, xs, ys)
    assert torch.equal(got[1], want[1])
    assert all(torch.equal(got[0][k], want[0][k]) for k in params)


def test_second_order_through_it_matches_torch_func():
    """A gradient of a function of the gradient (MAML's shape), with lit_fedco's helper as the
    outer, the inner or both: the same as torch.func nested, to rounding."""
    params, x, y, loss = _problem(torch.float64)

    def outer(gv):
        def h(p, x, y):
            g, _ = gv(loss)(p, x, y)
            adapted = {k: p[k] - 0.1 * g[k] for k in p}
            return loss(adapted, x, y)

        return h

    want_g, want_v = func_gv(outer(func_gv))(params, x, y)
    for gv_out, gv_in in ((grad_and_value, func_gv), (func_gv, grad_and_value),
                          (grad_and_value, grad_and_value)):  # fmt: skip
        got_g, got_v = gv_out(outer(gv_in))(params, x, y)
        torch.testing.assert_close(got_v, want_v, rtol=1e-14, atol=0)
        for k in params:
            torch.testing.assert_close(got_g[k], want_g[k], rtol=1e-12, atol=1e-15)


def test_an_unused_input_gets_zeros_and_an_outer_autograd_sees_through():
    w = torch.tensor([1.0, 2.0], dtype=torch.float64)
    g, v = grad_and_value(lambda p: (p["w"] ** 3).sum())({"w": w, "unused": torch.ones(3)})
    assert g["w"].tolist() == [3.0, 12.0] and g["unused"].tolist() == [0.0] * 3
    assert float(v) == 9.0
    q = w.clone().requires_grad_()
    g, _ = grad_and_value(lambda p: (p["w"] ** 3).sum())({"w": q})
    (second,) = torch.autograd.grad(g["w"].sum(), q)
    assert second.tolist() == [6.0, 12.0]


@pytest.mark.parametrize(
    ("name", "shape"),
    [("logreg", (1, 8, 8)), ("linear", (12,)), ("mlp", (1, 8, 8)), ("cnn", (1, 8, 8))],
)
def test_stateless_forwards_equal_the_modules_bit_for_bit(name, shape):
    """The small models' forwards over a parameter dict give their modules' outputs exactly,
    and their gradients too; a subclass (which may change ``forward``) uses functional_call."""
    from torch.func import functional_call

    from lit_fedco.core.models import STATELESS

    net = build_model(name, shape, 3, 0, hidden=6)
    assert type(net) in STATELESS
    params = {k: v.detach().double() for k, v in net.named_parameters()}
    x = torch.randn(5, *shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.equal(call(net, params, x), functional_call(net.double(), params, (x,)))
    g_fast = func_gv(lambda p: call(net, p, x).square().sum())(params)[0]
    g_module = func_gv(lambda p: functional_call(net, p, (x,)).square().sum())(params)[0]
    assert all(torch.equal(g_fast[k], g_module[k]) for k in params)

    class Doubled(type(net)):  # type: ignore[misc, valid-type]
        def forward(self, x):
            return 2 * super().forward(x)

    sub = Doubled.__new__(Doubled)
    sub.__dict__.update(net.__dict__)
    assert torch.equal(call(sub, params, x), 2 * call(net, params, x))


@pytest.mark.parametrize("name,shape", [("resnet20", (3, 16, 16)), ("conv4", (1, 28, 28))])
def test_a_modules_call_equals_functional_call_bit_for_bit(name, shape):
    """Other models run their own ``forward`` with the dict's tensors swapped in (their places
    found once per model): the outputs and gradients of ``functional_call``, under ``vmap`` and
    nested gradients too, and the module's own parameters put back after each call."""
    from torch.func import functional_call

    net = build_model(name, shape, 3, 0, hidden=6).double()
    own = dict(net.named_parameters())
    g = torch.Generator().manual_seed(2)
    params = {k: v.detach() + 0.1 * torch.randn(v.shape, generator=g, dtype=v.dtype)
              for k, v in own.items()}  # fmt: skip
    x = torch.randn(3, *shape, generator=g, dtype=torch.float64)
    assert torch.equal(call(net, params, x), functional_call(net, params, (x,)))
    g_call = func_gv(lambda p: call(net, p, x).square().sum())(params)[0]
    g_func = func_gv(lambda p: functional_call(net, p, (x,)).square().sum())(params)[0]
    assert all(torch.equal(g_call[k], g_func[k]) for k in params)
    stacked = {k: torch.stack([v, 2 * v]) for k, v in params.items()}
    xs = torch.stack([x, x])
    got = vmap(lambda p, v: call(net, p, v))(stacked, xs)
    assert torch.equal(got, vmap(lambda p, v: functional_call(net, p, (v,)))(stacked, xs))
    assert dict(net.named_parameters()) == own  # the module's own Parameters, put back
    assert all(type(v) is torch.nn.Parameter for v in net.parameters())
    part = {k: params[k] for k in list(params)[:2]}  # some tensors: the rest stay the module's
    assert torch.equal(call(net, part, x), functional_call(net, part, (x,)))


def test_a_modules_call_follows_a_model_changed_after_its_first_call():
    from torch.func import functional_call

    net = build_model("resnet20", (3, 8, 8), 3, 0).double()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    call(net, {k: v.detach() for k, v in net.named_parameters()}, x)
    net.fc = torch.nn.Linear(64, 3).double()  # a new layer: new parameters in new places
    params = {k: 2 * v.detach() for k, v in net.named_parameters()}
    for _ in range(2):  # the first call finds the change, the second the places found again
        assert torch.equal(call(net, params, x), functional_call(net, params, (x,)))
    assert net.fc.weight is dict(net.named_parameters())["fc.weight"]


def test_a_modules_call_puts_its_parameters_back_after_an_error():
    class Failing(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            raise RuntimeError("broken forward")

    net = Failing()
    weight = net.lin.weight
    with pytest.raises(RuntimeError, match="broken forward"):
        call(net, {"lin.weight": torch.zeros(2, 2)}, torch.zeros(1, 2))
    assert net.lin.weight is weight


def test_tied_weights_and_unknown_names_take_functional_call():
    from torch.func import functional_call

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = torch.nn.Linear(3, 3, bias=False)
            self.dec = torch.nn.Linear(3, 3, bias=False)
            self.dec.weight = self.enc.weight

        def forward(self, x):
            return self.dec(self.enc(x))

    net = Tied()
    w = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    x = torch.ones(2, 3)
    assert torch.equal(call(net, {"enc.weight": w}, x), x @ w.T @ w.T)  # untied as functional_call
    want = functional_call(net, {"enc.weight": w}, (x,))
    assert torch.equal(call(net, {"enc.weight": w}, x), want)
    with pytest.raises(Exception) as ours:
        call(net, {"nope.weight": w}, x)
    with pytest.raises(Exception) as theirs:
        functional_call(net, {"nope.weight": w}, (x,))
    assert type(ours.value) is type(theirs.value)


def test_a_modules_call_follows_parameters_of_its_own_and_replaced_ones():
    """A parameter on the model itself, one on an empty container, and a parameter replaced
    after the first call: each call equals ``functional_call``'s."""
    from torch.func import functional_call

    class Own(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(2.0))
            self.box = torch.nn.ModuleList()  # empty, so falsy, yet it holds a parameter
            self.box.register_parameter("shift", torch.nn.Parameter(torch.tensor(1.0)))
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.scale * self.lin(x) + self.box.shift

    net = Own()
    x = torch.ones(3, 2)
    params = {k: 3 * v.detach() for k, v in net.named_parameters()}
    assert torch.equal(call(net, params, x), functional_call(net, params, (x,)))
    net.lin.weight = torch.nn.Parameter(torch.zeros(2, 2))  # replaced: the same name, new object
    for _ in range(2):
        assert torch.equal(call(net, params, x), functional_call(net, params, (x,)))
    assert net.lin.weight is dict(net.named_parameters())["lin.weight"]
    assert net.box.shift is dict(net.named_parameters())["box.shift"]
