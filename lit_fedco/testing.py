"""The plug-in contract, as checks an updater of one's own can run: :func:`check_updater`.

Every built-in updater passes these checks (``tests/updaters/test_registry.py`` runs them over the
registry's table of tiny configurations); an updater written outside lit_fedco passes them
the same way::

    from my_scaffold import MyScaffold

    from lit_fedco.testing import check_updater

    check_updater(MyScaffold, {"lr": 0.1})

The checks, each on a small float64 run (3 rounds of 4 of 6 clients of the embedded digits,
logistic regression, I = 3, unless a ``build`` says otherwise):

- **resume**: 2 rounds, a state-dict round trip into a fresh loop, 2 more rounds equal 4
  rounds straight, bit for bit (server state, kept client rows, counted traffic).
- **executors**: the vectorized and the sequential executor give the same server state and
  kept rows (1e-10) and the same logs (rel 1e-9).
- **traffic**: every round's logged floats per client, up and down, equal the payload the
  updater's declarations and its state say it sends (:func:`declared_traffic`), exactly.
- **failures**: with clients that drop out and clients that stop early, every state stays
  finite and both executors still agree.
- **processes**: the vectorized run in this process and on 2 gloo processes (a subprocess)
  agree to 1e-12; the class must then be importable by its module's name.

A failed check raises :class:`ContractError` (an ``AssertionError``) naming the check.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from lightning.fabric import Fabric

import lit_fedco.engine.loop as loop_module
from lit_fedco.core.models import build_model
from lit_fedco.core.protocol import Sync
from lit_fedco.core.state import flatten, tree_leaves
from lit_fedco.data import FederatedData, make_federated
from lit_fedco.engine.executors import make_executor
from lit_fedco.engine.failures import Failures
from lit_fedco.engine.loop import FederatedLoop, LoopConfig
from lit_fedco.problems import Classification, get_problem
from lit_fedco.updaters.base import CompositionalUpdater, check_declarations, get_updater

Build = Callable[..., FederatedLoop]
"""``build(executor="vectorized", fabric=None, **loop_kw)``: a fresh float64 loop of the updater
under test (``loop_kw`` override :class:`LoopConfig`'s fields: ``rounds``, ``failures``, ...)."""

CHECKS = ("resume", "executors", "traffic", "failures", "processes")
"""The checks :func:`check_updater` runs, in order."""

ROUNDS = 3
EXECUTOR_TOL = 1e-10  # float64; the executors differ only in the order of batched sums
PROCESS_TOL = 1e-12
FAILURES = Failures(drop=0.3, partial=0.4)


class ContractError(AssertionError):
    """An updater broke the plug-in contract: the message names the check and what differed."""


def _fail(check: str, what: str) -> ContractError:
    return ContractError(f"{check}: {what}")


# ---------------------------------------------------------------------- building a tiny run
def digits_data(num_clients: int = 6, seed: int = 0, **kw: Any) -> FederatedData:
    """Real digits (the embedded data), quantity- and label-imbalanced, small."""
    cfg: dict[str, Any] = dict(
        name="digits", data_dir="", partition="quantity", num_clients=num_clients, big=200,
        small=20, small_classes=2, alpha=0.5, rho=0.28, val_per_client=30, seed=seed,
    )  # fmt: skip
    cfg.update(kw)
    return make_federated(SimpleNamespace(**cfg))


def _updater_class(updater: str | type[CompositionalUpdater]) -> type[CompositionalUpdater]:
    if isinstance(updater, str):
        return get_updater(updater)
    if not (isinstance(updater, type) and issubclass(updater, CompositionalUpdater)):
        raise TypeError(f"expected a CompositionalUpdater subclass or a name, got {updater!r}")
    return updater


def make_updater(
    updater: str | type[CompositionalUpdater],
    hparams: dict[str, Any] | None,
    net: torch.nn.Module,
    data: FederatedData,
    problem: dict[str, Any] | None = None,
) -> tuple[CompositionalUpdater, Any]:
    """The updater (a class or a registered name) on its default problem with parameters
    ``problem``, as the runner builds it; and the problem."""
    cls = _updater_class(updater)
    prob_cls = get_problem(cls.default_problem) if cls.default_problem else Classification
    prob = prob_cls(prob_cls.params_cls(**(problem or {})), data)
    made = cls(cls.hparams_cls(**(hparams or {})), net, prob.objective_for(cls.compositions, net))
    return made, prob


def digits_loop(
    updater: str | type[CompositionalUpdater] = "comfedl",
    hparams: dict[str, Any] | None = None,
    executor: str = "vectorized",
    dtype: torch.dtype = torch.float64,
    fabric: Fabric | None = None,
    data: FederatedData | None = None,
    model: str = "logreg",
    problem: dict[str, Any] | None = None,
    **loop_kw: Any,
) -> FederatedLoop:
    """A :class:`FederatedLoop` of ``updater`` on small digits data (6 clients, cohort 4, I = 3,
    batch 8, 3 rounds) with a fresh 1-process CPU Fabric unless one is given."""
    fabric = fabric or Fabric(accelerator="cpu", devices=1)
    data = data or digits_data()
    net = build_model(model, tuple(data.x_train.shape[1:]), data.num_classes, seed=0, hidden=16)
    made, prob = make_updater(updater, hparams, net, data, problem)
    cfg: dict[str, Any] = dict(rounds=3, local_steps=3, cohort=4, batch_size=8, eval_every=1,
                               progress=False)  # fmt: skip
    cfg.update(loop_kw)
    return FederatedLoop(
        fabric, made, data, LoopConfig(**cfg), make_executor(executor), dtype, prob
    )


def snapshot(loop: FederatedLoop) -> np.ndarray:
    """The loop's server state followed by its kept client rows, as one float64 vector."""
    return np.concatenate(
        [flatten(loop.server)[0].double().numpy(), flatten(loop.store.rows)[0].double().numpy()]
    )


# ---------------------------------------------------------------------- resume
def check_resume(build: Build) -> None:
    """2 rounds, a state-dict round trip into a fresh loop, 2 more rounds = 4 rounds straight,
    bit for bit (server state, kept rows and counted traffic)."""
    straight = build(rounds=4)
    straight.run()
    first = build(rounds=2)
    first.run()
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = build(rounds=4)
    resumed.load_state_dict(torch.load(buf, weights_only=False))
    resumed.run()
    if np.array_equal(snapshot(first), snapshot(straight)):
        raise _fail("resume", "rounds 3 and 4 left the state unchanged: nothing to compare")
    if not np.array_equal(snapshot(resumed), snapshot(straight)):
        gap = float(np.abs(snapshot(resumed) - snapshot(straight)).max())
        raise _fail("resume", f"2 rounds, save, load, 2 rounds differ from 4 rounds by {gap:.3g}"
                              " (state held outside the server state or store?)")  # fmt: skip
    if resumed.comm_total != straight.comm_total:
        raise _fail("resume", f"counted traffic {resumed.comm_total} != {straight.comm_total}")


# ---------------------------------------------------------------------- traffic
def _floats(tree: Any, distinct: bool = False) -> int:
    """Floats in the tensors of ``tree``; with ``distinct``, a tensor under two keys once."""
    leaves = tree_leaves(tree)
    if distinct:
        leaves = list({id(t): t for t in leaves}.values())
    return sum(t.numel() for t in leaves)


class RoundRecorder:
    """What every round of a loop saw: the server state it started from, its ``RoundInfo`` and
    ``RoundContext``, the probes gathered, and (sequential executor: one client at a time, real
    tensors) the last client's state after its last local step (``state``) and after
    ``client_end`` (``end``). Installed by :func:`record_rounds`, which wraps the updater's
    methods and the loop's ``federated_round``; nothing of the round is re-implemented."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, Any]] = []


@contextlib.contextmanager
def record_rounds(loop: FederatedLoop) -> Iterator[RoundRecorder]:
    """Record the rounds ``loop`` runs inside the ``with`` block (:class:`RoundRecorder`)."""
    rec = RoundRecorder()
    upd = loop.updater
    step, context, end = upd.client_step, upd.round_context, upd.client_end
    real_round = loop_module.federated_round

    def client_step(state, batches, ctx, t):  # type: ignore[no-untyped-def]
        new, logs = step(state, batches, ctx, t)
        rec.rounds[-1]["state"] = rec.rounds[-1]["end"] = new
        return new, logs

    def client_end(state, start, ctx, steps):  # type: ignore[no-untyped-def]
        out = end(state, start, ctx, steps)
        rec.rounds[-1]["end"] = out
        return out

    def round_context(server, info, probe):  # type: ignore[no-untyped-def]
        def recording(fn):  # type: ignore[no-untyped-def]
            rows = probe(fn)
            rec.rounds[-1]["probes"].append(rows)
            return rows

        return context(server, info, recording)

    def federated_round(updater, server, info, *args, **kw):  # type: ignore[no-untyped-def]
        rec.rounds.append({"server": server, "info": info, "probes": []})
        res = real_round(updater, server, info, *args, **kw)
        rec.rounds[-1]["context"] = res.context
        return res

    patched = {"client_step": client_step, "client_end": client_end,
               "round_context": round_context}  # fmt: skip
    own = {name: upd.__dict__[name] for name in patched if name in upd.__dict__}
    for name, fn in patched.items():
        setattr(upd, name, fn)
    loop_module.federated_round = federated_round  # type: ignore[assignment]
    try:
        yield rec
    finally:
        for name in patched:
            if name in own:
                setattr(upd, name, own[name])
            else:
                delattr(upd, name)  # the class's method again
        loop_module.federated_round = real_round  # type: ignore[assignment]


def declared_traffic(upd: CompositionalUpdater, rec: dict[str, Any]) -> tuple[int, int]:
    """Floats one client sends and receives in a recorded round, from the updater's
    declarations and its state (the documentation's "Declared state and traffic")::

        down = distinct floats of the broadcast (the server's broadcast_keys entries and
               init_client's) except the KEEP entries
             + floats of ctx.broadcast + one row of each ctx.per_client entry
             + I × floats of the STEP entries (each step's cohort mean)
        up   = one row of every probe gathered + I × floats of the STEP entries
             + floats of the ROUND entries after client_end (the upload)
    """
    sync, info, ctx, server = upd.client_state, rec["info"], rec["context"], rec["server"]
    steps = info.local_steps
    step_floats = _floats([rec["state"][k] for k, s in sync.items() if s is Sync.STEP])
    start = {k: server[k] for k in upd.broadcast_keys if k in server}
    start.update(upd.init_client(server, info))
    down = _floats([v for k, v in start.items() if sync.get(k) is not Sync.KEEP], distinct=True)
    down += _floats(ctx.broadcast) + sum(v[0].numel() for v in ctx.per_client.values())
    down += steps * step_floats
    up = sum(rows[0].numel() for rows in rec["probes"])
    upload = [v for k, v in rec["end"].items() if sync.get(k) is Sync.ROUND]
    up += steps * step_floats + _floats(upload)
    return up, down


def recorded_run(build: Build, rounds: int = ROUNDS) -> tuple[FederatedLoop, RoundRecorder]:
    """A sequential run of ``rounds`` rounds (evaluated after the last), recorded."""
    loop = build(executor="sequential", rounds=rounds, eval_every=rounds)
    with record_rounds(loop) as rec:
        loop.run()
    return loop, rec


def check_traffic(loop: FederatedLoop, rec: RoundRecorder) -> None:
    """Every recorded round's logged ``comm/up_floats_per_client`` and
    ``comm/down_floats_per_client`` equal :func:`declared_traffic`, exactly."""
    if len(rec.rounds) != len(loop.history):
        raise _fail("traffic", f"{len(rec.rounds)} rounds recorded, {len(loop.history)} logged")
    for r, (seen, logs) in enumerate(zip(rec.rounds, loop.history, strict=True)):
        if "state" not in seen:
            raise _fail("traffic", f"round {r}: no client step was recorded")
        up, down = declared_traffic(loop.updater, seen)
        counted = (logs["comm/up_floats_per_client"], logs["comm/down_floats_per_client"])
        if counted != (up, down):
            raise _fail("traffic", f"round {r}: counted (up, down) floats per client {counted}, "
                                   f"declared {(up, down)}")  # fmt: skip


# ---------------------------------------------------------------------- executors
def compare_runs(check: str, a: FederatedLoop, b: FederatedLoop, tol: float) -> None:
    """Two finished runs of the same rounds: states to ``tol`` (absolute and relative), the
    last round's logs to rel ``tol * 10`` (accuracies and traffic among them)."""
    sa, sb = snapshot(a), snapshot(b)
    if sa.shape != sb.shape or not np.allclose(sa, sb, rtol=tol, atol=tol):
        gap = float(np.abs(sa - sb).max()) if sa.shape == sb.shape else float("inf")
        raise _fail(check, f"server state and kept rows differ by {gap:.3g} (tolerance {tol})")
    la, lb = a.history[-1], b.history[-1]
    if sorted(la) != sorted(lb):
        raise _fail(check, f"the last round logs different keys: {sorted(set(la) ^ set(lb))}")
    for key, v in la.items():
        if not np.isclose(v, lb[key], rtol=max(tol * 10, 1e-9), atol=1e-12, equal_nan=True):
            raise _fail(check, f"the last round's {key}: {v} against {lb[key]}")


def check_executors(vectorized: FederatedLoop, sequential: FederatedLoop) -> None:
    """The same rounds under both executors (float64): states to 1e-10, logs to rel 1e-9."""
    compare_runs("executors", vectorized, sequential, EXECUTOR_TOL)


def check_failures(build: Build, rounds: int = 4) -> None:
    """Clients that drop out (``failures.drop``) and stop early (``failures.partial``): every
    server state and kept row stays finite, the rounds really had failures, and both
    executors agree."""
    runs = {}
    for executor in ("vectorized", "sequential"):
        loop = build(executor=executor, rounds=rounds, eval_every=rounds, failures=FAILURES)
        loop.run()
        if not np.isfinite(snapshot(loop)).all():
            raise _fail("failures", f"a non-finite state under {executor} with dropped clients "
                                    "(client_end runs for them with steps = 0: its result is "
                                    "discarded, but nothing else may divide by it)")  # fmt: skip
        runs[executor] = loop
    vec = runs["vectorized"]
    dropped = sum(h.get("failures/dropped", 0) for h in vec.history)
    partial = sum(h.get("failures/partial", 0) for h in vec.history)
    if not dropped or (vec.local_steps > 1 and not partial):  # I = 1: no client stops early
        raise _fail("failures", "the run had no dropped or no stopped client: nothing checked")
    compare_runs("failures", runs["vectorized"], runs["sequential"], EXECUTOR_TOL)


# ---------------------------------------------------------------------- processes
def _importable(cls: type[CompositionalUpdater]) -> tuple[str, str]:
    """The ``module:Class`` spelling of ``cls`` and the folder its module's top package is in."""
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if cls.__module__ == "__main__" or file is None or "<locals>" in cls.__qualname__:
        raise ValueError(
            f"processes: {cls.__qualname__} is not importable by module name (defined in "
            f"{cls.__module__}); put it in a module, or pass processes=False"
        )
    root = Path(file).resolve().parent
    for _ in range(cls.__module__.count(".") + (Path(file).name == "__init__.py")):
        root = root.parent
    return f"{cls.__module__}:{cls.__qualname__}", str(root)


def _gathered(loop: FederatedLoop) -> dict[str, Any] | None:
    """The finished loop's server state and every client's kept rows (gathered on process 0,
    as a checkpoint does) as one float64 vector, with its last logs; None on other processes."""
    clients = loop.state_dict()["clients"]
    if loop.fabric.global_rank != 0:
        return None
    rows = flatten(clients)[0].double().cpu() if clients is not None else torch.zeros(0)
    state = torch.cat([flatten(loop.server)[0].double().cpu(), rows]).numpy()
    return {"state": state, "logs": dict(loop.history[-1])}


def check_processes(
    cls: type[CompositionalUpdater], hparams: dict[str, Any] | None, rounds: int = ROUNDS
) -> None:
    """The vectorized run in this process and on 2 CPU processes (gloo, a subprocess:
    ``python -m lit_fedco.testing``): states to 1e-12, accuracies and traffic exactly."""
    spec, root = _importable(cls)
    loop = digits_loop(cls, hparams, rounds=rounds, eval_every=rounds)
    loop.run()
    one = _gathered(loop)
    assert one is not None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "devices2.pt"
        path = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
        proc = subprocess.run(
            [sys.executable, "-m", "lit_fedco.testing", spec, "--devices=2",
             f"--hparams={json.dumps(hparams or {})}", f"--rounds={rounds}", f"--out={out}"],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path}, timeout=600,
        )  # fmt: skip
        if proc.returncode != 0:
            raise _fail("processes", f"the 2-process run failed:\n{proc.stderr[-3000:]}")
        two = torch.load(out, weights_only=False)
    if one["state"].shape != two["state"].shape or not np.allclose(
        one["state"], two["state"], rtol=PROCESS_TOL, atol=PROCESS_TOL
    ):
        raise _fail("processes", "1 and 2 processes end in different states (tolerance 1e-12)")
    for key, v in one["logs"].items():
        w = two["logs"].get(key)
        exact = key.startswith("comm/") or "acc" in key
        if w is None or (w != v if exact else not np.isclose(v, w, rtol=PROCESS_TOL, atol=1e-12)):
            raise _fail("processes", f"the last round's {key}: {v} on 1 process, {w} on 2")


def _process_main(argv: list[str] | None = None) -> None:
    """``python -m lit_fedco.testing MODULE:CLASS --devices N --out FILE``: one launched Fabric
    runs the updater's tiny digits loop; rank 0 writes its state and last logs to ``FILE``."""
    parser = argparse.ArgumentParser(prog="python -m lit_fedco.testing", description=__doc__)
    parser.add_argument("updater", help="MODULE:CLASS")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--hparams", default="{}")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    module, _, name = args.updater.partition(":")
    cls: Any = functools.reduce(getattr, name.split("."), importlib.import_module(module))
    torch.set_num_threads(1)
    strategy = "ddp" if args.devices > 1 else "auto"
    fabric = Fabric(accelerator="cpu", devices=args.devices, strategy=strategy)
    fabric.launch()
    loop = digits_loop(cls, json.loads(args.hparams), fabric=fabric, rounds=args.rounds,
                       eval_every=args.rounds)  # fmt: skip
    loop.run()
    result = _gathered(loop)
    if result is not None:
        torch.save(result, args.out)
    fabric.barrier()


# ---------------------------------------------------------------------- the whole contract
def check_updater(
    updater: str | type[CompositionalUpdater],
    hparams: dict[str, Any] | None = None,
    *,
    build: Build | None = None,
    checks: tuple[str, ...] = CHECKS,
    processes: bool = True,
) -> None:
    """Run the plug-in contract's checks on an updater (module docstring).

    Args:
        updater: the updater class (registered or not) or a registered name.
        hparams: its hyperparameters (e.g. ``{"lr": 0.1}``); the dataclass's defaults if None.
        build: builds the tiny run (:data:`Build`); default: :func:`digits_loop` of the updater
            (6 digits clients, logistic regression, on the updater's default problem).
        checks: which of :data:`CHECKS` to run.
        processes: False skips the 2-process check (its subprocesses take a few seconds; it
            needs the class importable by its module's name, and the default ``build``).

    Raises:
        ContractError: the first check that fails, by name (an ``AssertionError``).
        ValueError: an unknown check, or a class the 2-process check cannot import.
    """
    unknown = sorted(set(checks) - set(CHECKS))
    if unknown:
        raise ValueError(f"checks: unknown {unknown}; choose from {list(CHECKS)}")
    cls = _updater_class(updater)
    check_declarations(cls)
    label = cls.__qualname__
    run = build or functools.partial(digits_loop, cls, hparams)
    try:
        if "resume" in checks:
            check_resume(run)
        if "executors" in checks or "traffic" in checks:
            seq, rec = recorded_run(run)
            if "traffic" in checks:
                check_traffic(seq, rec)
            if "executors" in checks:
                vec = run(executor="vectorized", rounds=ROUNDS, eval_every=ROUNDS)
                vec.run()
                check_executors(vec, seq)
        if "failures" in checks:
            check_failures(run)
        if "processes" in checks and processes:
            if build is not None:
                raise ValueError("processes: the 2-process check runs the default build only; "
                                 "pass processes=False with a build of your own")  # fmt: skip
            check_processes(cls, hparams)
    except ContractError as err:
        raise ContractError(f"check_updater({label}): {err}") from None


if __name__ == "__main__":
    _process_main()
