"""Simulated client failures (``failures.drop``, ``failures.partial``; lit_fedco.engine.failures).

- Probabilities 0 are bit for bit the run without failures (server state, kept state, logs), and
  so is the failure path when no client happens to fail (the counts travel in the collectives).
- A dropped FedAvg client is the same as the client not being sampled (1e-12, float64).
- A round where every client drops leaves the server and the kept state exactly as they were,
  and says so in its logs.
- A client that completed t of its I steps uploads (and keeps) exactly its state after t steps;
  FedDRO's per-step ȳ is the mean over the clients still running (recomputed by hand, 1e-12).
- The fates are a function of (seed, client, round): the same for any sharding, logged per
  round, on 1 and 2 gloo processes (slow; server and kept state to 1e-12, float64).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import lit_fedco.engine.loop
from lit_fedco.cli import run as main
from lit_fedco.config.load import load_config
from lit_fedco.core.errors import ConfigError
from lit_fedco.core.protocol import RoundInfo, Sync
from lit_fedco.core.seeding import sample_cohort
from lit_fedco.core.state import flatten, index, numel, stack, tree_map
from lit_fedco.engine.failures import Failures
from lit_fedco.engine.loop import FederatedLoop
from lit_fedco.experiment.assemble import loop_config
from lit_fedco.recipes.comfedl_dro import DEFAULTS
from tests.helpers import final_checkpoint, flat_server, make_loop, run_recipe, the_run
from tests.updaters.test_registry import TINY

HPARAMS = {
    "fedavg": {"lr": 0.1},
    "feddro": {"lr": 0.05, "beta": 0.3},
    "ds_feddro": {"lr": 0.05, "beta": 0.3, "gamma_x": 1.3, "gamma_y": 1.4},
    "drfl": {"lr": 0.05, "lam_lr": 0.1},
    "ditto": {"lr": 0.1, "personal_lr": 0.1, "lam": 0.5},
    "qfedavg": {"lr": 0.05, "q": 0.5},
}
TOL = 1e-12  # float64; the failure path sums the same rows with zeros in place of the others


@dataclass(frozen=True)
class Forced(Failures):
    """Fates fixed by the test: ``done[i]`` steps for the i-th client of the cohort."""

    done: tuple[int, ...] = ()

    def steps(self, info: RoundInfo, clients: torch.Tensor) -> torch.Tensor:
        at = torch.searchsorted(info.cohort, clients)
        return torch.tensor([self.done[int(i)] for i in at], dtype=torch.int64)


def snapshot(loop: FederatedLoop) -> np.ndarray:
    """Server state and kept client state, one float64 vector."""
    parts = [flatten(loop.server)[0].double()]
    if loop.store.rows:
        parts.append(flatten(loop.store.rows)[0].double())
    return torch.cat(parts).numpy()


def fates(loop: FederatedLoop, fails: Failures, rounds: int) -> list[dict[int, int]]:
    """Client → completed steps, per round, recomputed from the named streams."""
    cfg, k = loop.cfg, loop.data.num_clients
    return [
        {
            int(c): fails.client_steps(cfg.seed, int(c), r, loop.local_steps)
            for c in sample_cohort(cfg.seed, r, k, cfg.cohort)
        }
        for r in range(rounds)
    ]


# ---------------------------------------------------------------------- p = 0
@pytest.mark.parametrize("name", sorted(HPARAMS))
def test_probability_zero_is_bit_identical_to_no_failures(name):
    """``Failures()`` draws nothing; probabilities too small to fire take the failure path
    (counts in every collective, divisions by the summed count) with the same bits."""
    runs = {}
    for key, fails in {
        "none": None,
        "zero": Failures(),
        "never": Failures(drop=1e-300, partial=1e-300),
    }.items():
        loop = make_loop(name, HPARAMS[name], rounds=3, **({"failures": fails} if fails else {}))
        loop.run()
        runs[key] = loop
    base = runs["none"]
    for key in ("zero", "never"):
        np.testing.assert_array_equal(snapshot(runs[key]), snapshot(base))
        assert runs[key].comm_total == base.comm_total
        for a, b in zip(runs[key].history, base.history, strict=True):
            assert {k: v for k, v in a.items() if not k.startswith("failures/")} == b
    assert not any(k.startswith("failures/") for k in runs["zero"].history[0])
    assert [h["failures/dropped"] for h in runs["never"].history] == [0.0] * 3


# ---------------------------------------------------------------------- drop
def test_a_dropped_fedavg_client_equals_it_not_being_sampled(monkeypatch):
    """The failure run (drops in rounds 0, 1, 2) against a run without failures whose cohorts
    are the survivors: same server state to 1e-12 and the same training loss; the uploads
    counted per cohort client are the survivors' share."""
    fails = Failures(drop=0.3)
    hp, kw = HPARAMS["fedavg"], dict(rounds=4, cohort=4, local_steps=3, eval_every=4)
    failed = make_loop("fedavg", hp, failures=fails, **kw)
    done = fates(failed, fails, 4)
    survivors = [torch.tensor(sorted(c for c, t in d.items() if t > 0)) for d in done]
    assert [len(s) for s in survivors] == [3, 3, 2, 4]  # drops in three rounds, never all
    failed.run()

    monkeypatch.setattr(lit_fedco.engine.loop, "sample_cohort", lambda seed, r, k, m: survivors[r])
    reference = make_loop("fedavg", hp, **kw)
    reference.run()
    np.testing.assert_allclose(flat_server(failed), flat_server(reference), rtol=TOL, atol=TOL)
    x = numel(failed.server["x"])
    for r, (a, b) in enumerate(zip(failed.history, reference.history, strict=True)):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=TOL)
        assert a["failures/dropped"] == 4 - len(survivors[r])
        assert a["comm/up_floats_per_client"] == x * len(survivors[r]) / 4
        assert b["comm/up_floats_per_client"] == x
        assert a["comm/down_floats_per_client"] == b["comm/down_floats_per_client"] == x


@pytest.mark.parametrize("name", ["fedavg", "feddro", "drfl", "ditto", "qfedavg"])
def test_a_round_where_every_client_drops_leaves_the_server_unchanged(name):
    loop = make_loop(name, HPARAMS[name], rounds=2, failures=Failures(drop=1.0))
    before = snapshot(loop)
    loop.run()
    np.testing.assert_array_equal(snapshot(loop), before)
    probe = {"feddro": 1, "drfl": 1}.get(name, 0)  # still sent: g_k (sample DRO) or F_k
    for logs in loop.history:
        assert logs["failures/dropped"] == 4.0
        assert logs["failures/partial"] == 0.0
        assert logs["failures/steps_completed_mean"] == 0.0
        assert "train/loss" not in logs  # no step ran
        assert logs["comm/up_floats_per_client"] == probe
        assert all(math.isfinite(v) for v in logs.values())


def test_a_dropped_client_keeps_its_kept_state():
    """Ditto's personal model: the dropped client's row is untouched; the others move."""
    loop = make_loop("ditto", HPARAMS["ditto"], rounds=1, failures=Forced(done=(3, 0, 3, 2)))
    before = tree_map(lambda v: v.clone(), loop.store.rows)
    loop.run()
    cohort = sample_cohort(0, 0, 6, 4).tolist()
    for k in range(6):
        same = torch.equal(flatten(index(loop.store.rows, k))[0], flatten(index(before, k))[0])
        assert same == (k not in cohort or k == cohort[1]), k


# ---------------------------------------------------------------------- partial, by hand
def by_hand(loop: FederatedLoop, done: tuple[int, ...]) -> tuple[dict, dict]:
    """Round 0 of ``loop`` recomputed client by client: client i of the cohort takes
    ``done[i]`` steps; the per-step entries are averaged over the clients still running; the
    server update sees the mean upload of the clients that did not drop. Returns the new server
    state and the kept rows of the clients that finished."""
    upd, cfg, k, steps = loop.updater, loop.cfg, loop.data.num_clients, loop.local_steps
    cohort = sample_cohort(cfg.seed, 0, k, cfg.cohort)
    info = RoundInfo(0, k, cohort, steps, cfg.seed)
    roles = upd.batch_roles
    idx = loop.sampler.sample_round(cohort, 0, steps, roles, cfg.batch_size)
    # the loop gathers into reused buffers: copy each step's batches
    batches = [tree_map(torch.clone, loop._batches(idx, t, roles, [])) for t in range(steps)]
    server = loop.server
    start = {k: server[k] for k in upd.broadcast_keys if k in server}
    start.update(upd.init_client(server, info))
    states = [
        {**start, **{key: index(rows, int(c)) for key, rows in loop.store.rows.items()}}
        for c in cohort
    ]

    def probe(fn):  # every cohort client's value at the broadcast point, in cohort order
        return torch.stack([fn(s, index(batches[0], i)) for i, s in enumerate(states)])

    ctx = upd.round_context(server, info, probe)
    for key, rows in ctx.per_client.items():
        for i, s in enumerate(states):
            s[key] = rows[i]
    step_keys = [key for key, s in upd.client_state.items() if s is Sync.STEP]
    last: dict = {}
    for t in range(steps):
        running = [i for i in range(len(cohort)) if done[i] > t]
        for i in running:
            step = info.step(t)
            states[i], _ = upd.client_step(states[i], index(batches[t], i), ctx.broadcast, step)
        if step_keys and running:
            last = {key: sum(states[i][key] for i in running) / len(running) for key in step_keys}
            for i in running:
                states[i] = {**states[i], **last}
    finished = [i for i in range(len(cohort)) if done[i] > 0]
    for i in finished:
        states[i] = upd.client_end(states[i], start, ctx.broadcast, torch.tensor(float(done[i])))
    rounds = [k for k, s in upd.client_state.items() if s is Sync.ROUND]
    ups = stack([{k: states[i][k] for k in rounds if k in states[i]} for i in finished])
    weights = ctx.weights[finished] if ctx.weights is not None else torch.ones(len(finished))
    w = weights.view(-1).to(torch.float64)
    mean = tree_map(lambda v: (w.view(-1, *[1] * (v.dim() - 1)) * v).sum(0) / w.sum(), ups)
    new = upd.server_update(server, {**last, **mean}, ctx, info)
    kept = {int(cohort[i]): states[i] for i in finished}
    return new, kept


@pytest.mark.parametrize("name", ["fedavg", "ditto", "qfedavg", "drfl", "feddro", "ds_feddro"])
def test_a_partial_client_uploads_its_state_after_its_steps(name):
    """Cohort fates (1, 3, 0, 2) of I = 3: one partial client at t = 1, one full, one dropped,
    one at t = 2. Server state (and Ditto's kept rows) equal the round recomputed client by
    client to 1e-12; FedDRO's ȳ is the mean over 3, then 2, then 1 running clients."""
    done = (1, 3, 0, 2)
    loop = make_loop(name, HPARAMS[name], rounds=1, local_steps=3, failures=Forced(done=done))
    expected, kept = by_hand(loop, done)
    logs = loop.run_round()
    np.testing.assert_allclose(
        flatten(loop.server)[0].numpy(), flatten(expected)[0].numpy(), rtol=TOL, atol=TOL
    )
    for c, state in kept.items():
        for key, rows in loop.store.rows.items():
            for a, b in zip(flatten(index(rows, c))[0], flatten(state[key])[0], strict=True):
                assert float(a) == pytest.approx(float(b), rel=TOL, abs=TOL)
    assert (logs["failures/dropped"], logs["failures/partial"]) == (1.0, 2.0)
    assert logs["failures/steps_completed_mean"] == 6 / 4
    if name == "feddro":  # ȳ: p floats up and down per running client per step (3 + 2 + 1)
        p, x = numel(loop.server["y"]), numel(loop.server["x"])
        full = make_loop(name, HPARAMS[name], rounds=1, local_steps=3).run_round()
        up, down = full["comm/up_floats_per_client"], full["comm/down_floats_per_client"]
        assert logs["comm/up_floats_per_client"] == up - 3 * p - x + (6 * p + 3 * x) / 4
        assert logs["comm/down_floats_per_client"] == down - 3 * p + 6 * p / 4


def test_a_single_partial_client_equals_a_round_of_its_steps():
    """One client per round, every client partial: its round is the round of I = t steps,
    bit for bit (the stopped steps are computed and discarded)."""
    fails = Failures(partial=1.0)
    loop = make_loop("fedavg", HPARAMS["fedavg"], rounds=1, cohort=1, local_steps=4,
                     failures=fails)  # fmt: skip
    (t,) = fates(loop, fails, 1)[0].values()
    assert 1 <= t < 4
    loop.run()
    reference = make_loop("fedavg", HPARAMS["fedavg"], rounds=1, cohort=1, local_steps=t)
    reference.run()
    np.testing.assert_array_equal(flat_server(loop), flat_server(reference))


# ---------------------------------------------------------------------- draws and logs
def test_fates_depend_only_on_seed_client_and_round():
    fails = Failures(drop=0.3, partial=0.5)
    cohort = torch.arange(40)
    info = RoundInfo(7, 40, cohort, 5, 3)
    whole = fails.steps(info, cohort)
    assert whole is not None
    for world in (2, 3):  # any sharding draws the same fates
        for rank in range(world):
            part = fails.steps(info, cohort[rank::world])
            assert part is not None and torch.equal(part, whole[rank::world])
    assert set(whole.tolist()) <= set(range(6)) and 0 in whole.tolist()
    assert not torch.equal(whole, fails.steps(RoundInfo(8, 40, cohort, 5, 3), cohort))
    assert not torch.equal(whole, fails.steps(RoundInfo(7, 40, cohort, 5, 4), cohort))
    # coupled across probabilities: every drop at 0.1 is a drop at 0.3
    low = Failures(drop=0.1).steps(info, cohort)
    assert low is not None and bool(((low == 0) <= (whole == 0)).all())
    assert Failures().steps(info, cohort) is None


def test_failures_are_logged_every_round():
    fails = Failures(drop=0.3, partial=0.5)
    loop = make_loop("fedavg", HPARAMS["fedavg"], rounds=4, failures=fails)
    loop.run()
    for d, logs in zip(fates(loop, fails, 4), loop.history, strict=True):
        t = list(d.values())
        assert logs["failures/dropped"] == sum(s == 0 for s in t)
        assert logs["failures/partial"] == sum(0 < s < 3 for s in t)
        assert logs["failures/steps_completed_mean"] == sum(t) / 4
    assert sum(logs["failures/partial"] for logs in loop.history) > 0


@pytest.mark.parametrize("name", ["fedavg", "ditto", "feddro"])
def test_a_resumed_run_draws_the_same_fates(name):
    fails = Failures(drop=0.3, partial=0.5)
    straight = make_loop(name, HPARAMS[name], rounds=4, failures=fails)
    straight.run()
    first = make_loop(name, HPARAMS[name], rounds=2, failures=fails)
    first.run()
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = make_loop(name, HPARAMS[name], rounds=4, failures=fails)
    resumed.load_state_dict(torch.load(buf, weights_only=False))
    resumed.run()
    np.testing.assert_array_equal(snapshot(resumed), snapshot(straight))
    assert resumed.history == straight.history[2:]


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_updater_runs_with_failures(name):
    build, hp = TINY[name]
    loop = build(name, hp, rounds=3, failures=Failures(drop=0.3, partial=0.5))
    loop.run()
    assert bool(torch.isfinite(flatten(loop.server)[0]).all())
    assert all("failures/dropped" in logs for logs in loop.history)


# ---------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["failures.drop=1.5"],
            "failures.drop: got 1.5, expected a float in [0, 1]; set e.g. failures.drop=0.1",
        ),
        (
            ["failures.partial=-0.1"],
            "failures.partial: got -0.1, expected a float in [0, 1]; set e.g. failures.partial=0.1",
        ),
        (["failures.drop=nan"], "failures.drop: got nan, expected a finite number"),
    ],
)
def test_bad_failure_probabilities_are_rejected(argv, message):
    with pytest.raises(ConfigError) as err:
        loop_config(load_config(argv, DEFAULTS), 0)
    assert str(err.value).startswith(message)


def test_failures_config_reaches_the_loop():
    cfg = load_config(["failures.drop=0.2", "failures.partial=0.1"], DEFAULTS)
    assert loop_config(cfg, 0).failures == Failures(drop=0.2, partial=0.1)
    assert loop_config(load_config([], DEFAULTS), 0).failures == Failures()
    with pytest.raises(ConfigError, match=r"did you mean 'failures\.drop'"):
        load_config(["failures.dorp=0.2"], DEFAULTS)
    with pytest.raises(ConfigError, match=r"failures\.drop: got True"):
        Failures(drop=True)


def test_the_recipe_exits_2_on_a_bad_probability(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main("comfedl_dro", DEFAULTS, ["failures.drop=2", f"out_dir={tmp_path / 'o'}"])
    assert exc.value.code == 2
    assert "failures.drop: got 2.0, expected a float in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------- 1 and 2 processes
@pytest.mark.slow
def test_two_processes_draw_the_same_fates(tmp_path):
    """drop = partial = 0.3 on 2 gloo processes (3 of the 6 cohort clients each; the feddro
    recipe's 8 clients) equals 1 process: FedDRO (per-step ȳ over the running clients), DRFL
    (probes, weights) and Ditto (kept rows written back for the clients that finished); server
    state and kept state to 1e-12 (float64), the last round's failure logs exactly."""
    args = [
        "updaters=[feddro,drfl,ditto]", "rounds=3", "eval_every=3", "cohort=6", "local_steps=3",
        "dtype=float64", "failures.drop=0.3", "failures.partial=0.3",
    ]  # fmt: skip
    one = run_recipe("feddro", tmp_path / "one", 1, *args)[0]
    two = run_recipe("feddro", tmp_path / "two", 2, *args)[0]
    fails = Failures(drop=0.3, partial=0.3)
    done = [[fails.client_steps(0, int(c), r, 3) for c in sample_cohort(0, r, 8, 6)]
            for r in range(3)]  # fmt: skip
    assert any(0 in d for d in done) and any(0 < t < 3 for d in done for t in d)
    for name in ("feddro", "drfl", "ditto"):
        a = final_checkpoint(the_run(tmp_path / "one", "feddro") / f"{name}-seed0")
        b = final_checkpoint(the_run(tmp_path / "two", "feddro") / f"{name}-seed0")
        for part in ("server", "clients"):
            fa, fb = flatten(a["loop"][part])[0], flatten(b["loop"][part])[0]
            torch.testing.assert_close(fb, fa, rtol=TOL, atol=TOL)
        ra, rb = one["results"][name][0], two["results"][name][0]
        assert ra["failures/dropped"] == rb["failures/dropped"] == sum(t == 0 for t in done[2])
        assert ra["failures/partial"] == rb["failures/partial"]
        assert ra["comm/total_floats_per_client"] == rb["comm/total_floats_per_client"]
