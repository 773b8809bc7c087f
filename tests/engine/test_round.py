"""The plug-in surface of one round (lit_fedco.engine.round, lit_fedco.updaters.base): what a
researcher's updater is given and what its declarations do, each on a tiny problem whose answer
is known, plus the shape of the engine (one local-steps loop, short functions)."""

from __future__ import annotations

import ast
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from lit_fedco.core.protocol import RoundContext, RoundInfo, StepInfo, Sync
from lit_fedco.core.state import stack, tree_map
from lit_fedco.engine import simulate
from lit_fedco.engine.comm import LocalComm
from lit_fedco.engine.executors import SequentialExecutor, VectorizedExecutor
from lit_fedco.engine.failures import Failures
from lit_fedco.engine.round import federated_round
from lit_fedco.engine.store import make_store
from lit_fedco.objectives import Objective
from lit_fedco.updaters import (
    CompositionalUpdater,
    FedAvg,
    Hparams,
    available_updaters,
    get_updater,
    register,
)
from lit_fedco.updaters.base import _REGISTRY, overridden
from tests.helpers import REPO
from tests.updaters.test_updaters import Scalar, quad_loss

ENGINE = REPO / "lit_fedco" / "engine"

# Three clients ℓ_k(w) = s_k (w − t_k)², one sample each (scale s, target t).
TARGETS = [(1.0, 0.0), (2.0, 1.0), (1.0, 3.0)]


def clients(targets=TARGETS) -> dict:
    rows = [{"x": torch.zeros(1, 1), "y": torch.tensor([t], dtype=torch.float64)} for t in targets]
    return {"inner": stack(rows)}


def build(cls: type[CompositionalUpdater], w0: float = 0.5, **hp) -> CompositionalUpdater:
    model = Scalar(w0)
    return cls(cls.hparams_cls(**hp), model, Objective(model, sample_loss=quad_loss))


def one_round(upd: CompositionalUpdater):  # type: ignore[no-untyped-def]
    """Round 0 of ``upd`` on the three clients, I = 1, full participation, in one process."""
    cohort = torch.arange(3)
    server, info = upd.init_server(upd.params(), 3), RoundInfo(0, 3, cohort, 1, 0)
    return federated_round(upd, server, info, cohort, lambda t: clients(), LocalComm(),
                           SequentialExecutor())  # fmt: skip


@pytest.fixture
def scratch_registry():
    """Updaters registered by a test are removed after it."""
    before = dict(_REGISTRY)
    yield
    _REGISTRY.clear()
    _REGISTRY.update(before)


# ---------------------------------------------------------------------- what hooks receive
class Recorder(FedAvg[Hparams]):
    """FedAvg that records what the round hands its hooks."""

    seen: ClassVar[list] = []

    def client_step(self, state, batches, ctx, step):
        Recorder.seen.append(("step", step))
        return super().client_step(state, batches, ctx, step)

    def client_end(self, state, start, ctx, steps):
        Recorder.seen.append(("end", start, steps))
        return state

    def server_update(self, server, mean, ctx, info):
        Recorder.seen.append(("server", info))
        return super().server_update(server, mean, ctx, info)


def test_client_step_is_told_its_step_the_round_and_i():
    Recorder.seen.clear()
    upd = build(Recorder, lr=0.1)
    simulate.run_rounds(upd, clients(), rounds=2, local_steps=3)
    seen = [s for kind, s in (e[:2] for e in Recorder.seen) if kind == "step"]
    steps = list(dict.fromkeys(seen))  # each client's call of a step: the same StepInfo
    assert len(seen) == 3 * len(steps) == 18
    assert [(s.t, s.round, s.local_steps) for s in steps[:3]] == [(0, 0, 3), (1, 0, 3), (2, 0, 3)]
    assert [s.first for s in steps[:3]] == [True, False, False]
    assert [s.last for s in steps[:3]] == [False, False, True]
    assert steps[3].round == 1 and steps[3].num_clients == 3


def test_the_end_hook_sees_the_broadcast_and_the_steps_each_client_completed():
    """Client fates (3, 0, 1) of I = 3: the end hook is told 3 and 1 for the clients that
    finished (a dropped client's result is discarded), and the server how many uploaded."""
    Recorder.seen.clear()
    upd = build(Recorder, lr=0.1)

    class Forced(Failures):
        def steps(self, info, clients):
            return torch.tensor([3, 0, 1])[clients]

    server = upd.init_server(upd.params(), 3)
    cohort = torch.arange(3)
    info = RoundInfo(0, 3, cohort, 3, 0, sizes=torch.tensor([10, 20, 30]))
    federated_round(upd, server, info, cohort, lambda t: clients(), LocalComm(),
                    SequentialExecutor(), failures=Forced(drop=0.5))  # fmt: skip
    ends = [e for e in Recorder.seen if e[0] == "end"]
    assert [float(e[2]) for e in ends] == [3.0, 0.0, 1.0]
    assert torch.equal(ends[0][1]["x"]["w"], server["x"]["w"])  # the broadcast model
    (srv,) = [e[1] for e in Recorder.seen if e[0] == "server"]
    assert (srv.participants, srv.participant_samples) == (2, 40.0)


# ---------------------------------------------------------------------- aggregation
@pytest.mark.parametrize("executor", [SequentialExecutor(), VectorizedExecutor()])
def test_aggregation_by_sample_count_is_the_weighted_mean(executor, scratch_registry):
    """One local step of size 1/4 per client from w = 0.5; the server's model is
    Σ n_k w_k / Σ n_k with n = (10, 20, 30), not the plain mean."""

    class BySize(FedAvg[Hparams]):
        """FedAvg, weighted by client size."""

        aggregation: ClassVar[str] = "samples"

    upd = build(BySize, lr=0.25)
    server = upd.init_server(upd.params(), 3)
    cohort, n = torch.arange(3), torch.tensor([10.0, 20.0, 30.0], dtype=torch.float64)
    info = RoundInfo(0, 3, cohort, 1, 0, sizes=n)
    res = federated_round(upd, server, info, cohort, lambda t: clients(), LocalComm(), executor)
    w = torch.tensor([0.5 - 0.25 * 2 * s * (0.5 - t) for s, t in TARGETS], dtype=torch.float64)
    expected = (n * w).sum() / n.sum()
    assert float(res.server["x"]["w"]) == pytest.approx(float(expected), rel=1e-14)
    uniform = federated_round(build(FedAvg, lr=0.25), server, info, cohort,
                              lambda t: clients(), LocalComm(), executor)  # fmt: skip
    assert float(uniform.server["x"]["w"]) == pytest.approx(float(w.mean()), rel=1e-14)


def test_round_context_weights_replace_the_declared_aggregation_and_cost_no_traffic():
    class Weighted(FedAvg[Hparams]):
        """FedAvg with the server's own weights (1, 0, 3)."""

        def round_context(self, server, info, probe):
            return RoundContext(weights=torch.tensor([1.0, 0.0, 3.0], dtype=torch.float64))

    res = one_round(build(Weighted, lr=0.25))
    w = [0.5 - 0.25 * 2 * s * (0.5 - t) for s, t in TARGETS]
    assert float(res.server["x"]["w"]) == pytest.approx((w[0] + 3 * w[2]) / 4, rel=1e-14)
    assert (res.traffic.up, res.traffic.down) == (1.0, 1.0)  # w up, w down: nothing else


def test_what_the_round_context_only_logs_is_logged_by_name():
    class Logging(FedAvg[Hparams]):
        """FedAvg whose context carries DRO weights and a scalar, only logged."""

        def round_context(self, server, info, probe):
            w = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
            return RoundContext(cohort_weights=w, logged={"temperature": torch.tensor(2.0)})

    res = one_round(build(Logging, lr=0.25))
    assert res.logs["dro/cohort_weight_max"] == 0.5
    entropy = -(0.5 * math.log(0.5) + 0.5 * math.log(0.25))
    assert res.logs["dro/cohort_weight_entropy"] == pytest.approx(entropy)
    assert res.logs["round/temperature"] == 2.0
    assert res.traffic.up == 1.0  # nothing of it is sent


def test_per_client_rows_reach_their_own_client_only():
    """A context row per client (its own step size) is in that client's state alone."""

    class OwnRate(FedAvg[Hparams]):
        """Local SGD at a step size the server picks per client."""

        def round_context(self, server, info, probe):
            rates = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)[info.cohort]
            return RoundContext(per_client={"rate": rates})

        def client_step(self, state, batches, ctx, step):
            g = torch.func.grad(lambda p: self.objective.value(p, batches, ctx))(state["x"])
            return {**state, "x": tree_map(lambda x, d: x - state["rate"] * d, state["x"], g)}, {}

    upd = build(OwnRate, lr=0.1)
    server = upd.init_server(upd.params(), 3)
    cohort = torch.tensor([0, 2])
    info = RoundInfo(0, 3, cohort, 1, 0)
    mine = {"inner": {k: v[cohort] for k, v in clients()["inner"].items()}}
    res = federated_round(upd, server, info, cohort, lambda t: mine, LocalComm(),
                          VectorizedExecutor())  # fmt: skip
    pairs = zip((0.1, 0.3), (TARGETS[0], TARGETS[2]), strict=True)
    w = [0.5 - r * 2 * s * (0.5 - t) for r, (s, t) in pairs]
    assert float(res.server["x"]["w"]) == pytest.approx(sum(w) / 2, rel=1e-14)
    assert res.traffic.down == 2.0  # the model and one row


def test_probes_are_gathered_only_when_the_context_asks():
    seen = {}

    class Probing(FedAvg[Hparams]):
        """FedAvg whose server reads every client's loss at the broadcast point."""

        def round_context(self, server, info, probe):
            seen["losses"] = probe(lambda s, b: self.objective.value(s["x"], b, {}))
            return RoundContext()

    for cls, probed in ((Probing, True), (FedAvg, False)):
        seen.clear()
        res = one_round(build(cls, lr=0.1))
        assert ("losses" in seen) is probed
        assert res.traffic.up == (2.0 if probed else 1.0)
    upd = build(Probing, lr=0.1)
    one_round(upd)
    expected = [s * (0.5 - t) ** 2 for s, t in TARGETS]
    assert seen["losses"].tolist() == pytest.approx(expected, rel=1e-14)


# ---------------------------------------------------------------------- declarations
def test_kept_entries_start_at_zero_unless_init_client_gives_them():
    class Counter(FedAvg[Hparams]):
        """FedAvg that counts, per client, the rounds it took part in (a kept entry)."""

        client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND, "rounds": Sync.KEEP}

        def client_end(self, state, start, ctx, steps):
            return {**state, "rounds": tree_map(lambda v: v + 1, state["rounds"])}

    upd = build(Counter, lr=0.1)
    store = make_store(upd, upd.init_server(upd.params(), 3), 3)
    assert float(store.rows["rounds"]["w"].abs().sum()) == 0.0  # zeros shaped like the model
    simulate.run_rounds(upd, clients(), rounds=4, local_steps=1, store=store)
    assert store.rows["rounds"]["w"].flatten().tolist() == [4.0, 4.0, 4.0]


def test_hparams_cls_follows_the_generic_parameter(scratch_registry):
    @dataclass(frozen=True)
    class ProxHparams(Hparams):
        """Prox.

        Attributes:
            mu: μ.
        """

        mu: float = 0.1

    class Prox(CompositionalUpdater[ProxHparams]):
        """FedProx-like."""

    class Child(FedAvg[ProxHparams]):
        """A FedAvg subclass naming its hyperparameters."""

    assert Prox.hparams_cls is ProxHparams and Child.hparams_cls is ProxHparams
    assert FedAvg.hparams_cls is Hparams  # generic in a TypeVar: the base's


@pytest.mark.parametrize(
    "attrs,message",
    [
        ({"personal_key": "p"}, r"personal_key = 'p' must name a Sync.KEEP entry"),
        (
            {"personal_key": "p", "client_state": {"x": Sync.ROUND, "p": Sync.KEEP},
             "eval_params": lambda self, server: server["x"]},
            r"declares personal_key = 'p' and overrides eval_params, which is then never called",
        ),
        ({"aggregation": "median"}, r"aggregation = 'median': expected one of"),
        ({"server_optimizer": "adam"}, r"server_optimizer = 'adam' but its hyperparameters"),
        ({"client_state": {"x": "round"}}, r"are not Sync values"),
        ({"broadcast_keys": ("c",)}, r"the model entry 'x' is not in broadcast_keys"),
    ],
)  # fmt: skip
def test_register_refuses_a_declaration_that_cannot_hold(attrs, message, scratch_registry):
    cls = type("Bad", (FedAvg,), {"__doc__": "A bad one.", **attrs})
    with pytest.raises(TypeError, match=message):
        register("bad_updater")(cls)
    assert "bad_updater" not in available_updaters()


def test_override_counts_over_the_registry():
    """An updater overrides few hooks: median ≤ 2, at most 4 (a registered ancestor's
    overrides are that updater's, reused; shared unregistered bases count)."""
    counts = {name: len(overridden(get_updater(name))) for name in available_updaters()}
    assert statistics.median(counts.values()) <= 2, counts
    assert max(counts.values()) <= 4, counts


def test_step_info_of_a_round():
    info = RoundInfo(4, 10, torch.arange(3), 5, 0)
    assert info.step(4) == StepInfo(4, 5, 4, 10) and info.step(4).last and not info.step(4).first


# ---------------------------------------------------------------------- the engine's shape
def _functions(path: Path):
    tree = ast.parse(path.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_no_engine_function_is_over_60_lines():
    long = [
        f"{path.name}:{fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
        for path in sorted(ENGINE.glob("*.py"))
        for fn in _functions(path)
        if fn.end_lineno - fn.lineno + 1 > 60
    ]
    assert not long, long
    (rnd,) = [f for f in _functions(ENGINE / "round.py") if f.name == "federated_round"]
    assert rnd.end_lineno - rnd.lineno + 1 <= 60


def test_the_engine_has_one_local_steps_loop():
    """One ``for t in range(... local_steps)`` in the whole engine: the round's."""
    loops = []
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            it = node.iter if isinstance(node, ast.For) else None
            if (
                isinstance(it, ast.Call)
                and ast.unparse(it.func) == "range"
                and ("local_steps" in ast.unparse(it))
            ):
                loops.append(f"{path.name}:{node.lineno}")
    assert len(loops) == 1, loops


def test_the_engine_knows_no_entry_by_name():
    """No magic keys: the engine reads the model and personal entries through the updater's
    declarations (``model_key``, ``personal_key``), never by spelling them."""
    found = []
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
                key = node.left.value
            if key in ("x", "personal", "v"):
                found.append(f"{path.name}:{node.lineno} {key!r}")
    assert not found, found


def test_a_state_value_stays_unbatched_in_the_end_hook():
    """The end hook gets one client's state: a 0-d steps tensor and unbatched leaves."""
    shapes = {}

    class Shapes(FedAvg[Hparams]):
        """Records shapes in the end hook."""

        def client_end(self, state, start, ctx, steps):
            shapes["steps"], shapes["x"] = tuple(steps.shape), tuple(state["x"]["w"].shape)
            return state

    upd = build(Shapes, lr=0.1)
    simulate.run_rounds(upd, clients(), 1, 2, executor=VectorizedExecutor())
    assert shapes == {"steps": (), "x": (1,)}
