"""Kept client state held by its owner only: client k's rows live on process k mod N
(:mod:`lit_fedco.engine.store`), the process that runs and evaluates it. Unit checks of the
store, then real 2-process gloo runs of updaters that keep state (SCAFFOLD's control variates,
Ditto's personal models) against one process — with rounds in which a process owns none of the
cohort, with failures, and through a ``kill -9`` and ``resume=auto``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_fedco.core.seeding import sample_cohort
from lit_fedco.core.state import flatten
from lit_fedco.engine.comm import Comm
from lit_fedco.engine.store import ClientStore, _to_client_order, owned_clients
from lit_fedco.store import checkpoint as ckpt
from tests.helpers import REPO, free_port, run_recipe, the_run

K = 10  # comfedl_dro's default digits split
ARGS = [
    "updaters=[scaffold,ditto]", "rounds=6", "eval_every=3", "cohort=2", "local_steps=3",
    "dtype=float64", "data.big=200", "data.val_per_client=30", "failures.drop=0.2",
    "checkpoint_every=1", "threads=0",
]  # fmt: skip


def _store(rank: int, world: int) -> ClientStore:
    return ClientStore({"c": {"w": torch.zeros(3)}}, 5, rank, world)


def test_each_process_holds_the_rows_of_the_clients_it_owns():
    """Of K = 5 clients, process 0 of 2 holds clients 0, 2, 4 and process 1 clients 1, 3; one
    process holds all five; a write lands in its own row, in place."""
    assert _store(0, 2).owned.tolist() == [0, 2, 4]
    assert _store(1, 2).owned.tolist() == [1, 3]
    assert _store(0, 1).owned.tolist() == [0, 1, 2, 3, 4]
    assert _store(0, 2).nbytes() + _store(1, 2).nbytes() == _store(0, 1).nbytes()
    store = _store(1, 2)
    rows = store.rows["c"]["w"]
    store.write(torch.tensor([3]), {"c": {"w": torch.full((1, 3), 7.0)}})
    assert store.rows["c"]["w"] is rows  # in place
    assert rows.tolist() == [[0.0] * 3, [7.0] * 3]
    assert store.read(torch.tensor([1, 3]))["c"]["w"][:, 0].tolist() == [0.0, 7.0]


def test_a_client_of_another_process_is_refused():
    with pytest.raises(ValueError, match=r"process 0 of 2 does not hold .* clients \[3\]"):
        _store(0, 2).read(torch.tensor([2, 3]))
    with pytest.raises(ValueError, match=r"clients \[0\]"):
        _store(1, 2).write(torch.tensor([0]), {"c": {"w": torch.ones(1, 3)}})


def test_a_checkpoints_rows_are_shared_out_by_owner():
    """A checkpoint holds every client's rows; a resumed process keeps its own."""
    full = {"c": {"w": torch.arange(15.0).view(5, 3)}}
    one, two = _store(1, 2), _store(0, 1)
    one.load(full)
    two.load(full)
    assert one.rows["c"]["w"][:, 0].tolist() == [3.0, 9.0]
    assert torch.equal(two.rows["c"]["w"], full["c"]["w"])
    assert owned_clients(torch.tensor([1, 4, 5, 8]), 1, 2).tolist() == [1, 5]


class _GatherComm(Comm):
    """Process ``rank`` of two, with the other process's buffer in hand: process 1 sends
    (records its buffer, gets None); process 0 receives both, in process order."""

    def __init__(self, rank: int, sent: list[torch.Tensor]) -> None:
        super().__init__(torch.float64)
        self.rank, self.sent = rank, sent

    def gather_to_first(self, buf: torch.Tensor) -> torch.Tensor | None:
        if self.rank == 1:
            self.sent.append(buf.clone())
            return None
        self.got = torch.stack([buf, *self.sent])
        return self.got


def test_a_checkpoint_gathers_every_clients_rows_on_process_0_alone():
    """Of K = 5 clients with kept rows of two entries (shapes [2, 2] and [3]), process 1 sends
    its 2 rows padded to ceil(5/2) = 3 and gets nothing back (it never holds all K rows);
    process 0 gets all five rows in client order, in the summing dtype, and a store loaded from
    them holds its own rows again."""
    initial = {"c": {"w": torch.zeros(2, 2)}, "d": torch.zeros(3)}
    stores = [ClientStore(initial, 5, rank, 2) for rank in (0, 1)]
    for store in stores:  # client k's rows: k everywhere, 10 k in "d"
        k = store.owned.float()
        store.rows["c"]["w"] = k.view(-1, 1, 1).expand(-1, 2, 2).float().clone()
        store.rows["d"] = (10 * k).view(-1, 1).expand(-1, 3).float().clone()
    sent: list[torch.Tensor] = []
    assert stores[1].gather(_GatherComm(1, sent)) is None
    assert sent[0].shape == (3, 7) and sent[0].dtype == torch.float64
    assert sent[0][2].abs().sum() == 0  # the padding row
    first = _GatherComm(0, sent)
    full = stores[0].gather(first)
    assert full["c"]["w"].shape == (5, 2, 2) and full["d"].shape == (5, 3)
    assert full["c"]["w"][:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert full["d"][:, 2].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    # reordered in place: the result is the gathered rows themselves, held once
    for leaf in (full["c"]["w"], full["d"]):
        assert leaf.untyped_storage().data_ptr() == first.got.untyped_storage().data_ptr()
    again = ClientStore(initial, 5, 1, 2)
    again.load(full)
    assert again.rows["d"][:, 0].tolist() == [10.0, 30.0]
    whole = ClientStore(initial, 5)  # one process resuming it: its own contiguous rows
    whole.load(full)
    assert whole.rows["d"].is_contiguous() and whole.rows["d"][:, 0].tolist() == [0, 10, 20, 30, 40]
    # one client, two processes: process 1 owns none and sends a row of padding
    lone = [ClientStore(initial, 1, rank, 2) for rank in (0, 1)]
    lone[0].rows["d"] = torch.full((1, 3), 7.0)
    sent = []
    assert lone[1].gather(_GatherComm(1, sent)) is None and sent[0].shape == (1, 7)
    assert lone[0].gather(_GatherComm(0, sent))["d"].tolist() == [[7.0, 7.0, 7.0]]


@pytest.mark.parametrize("world", [2, 3, 4, 7])
def test_gathered_rows_are_put_in_client_order_in_place(world):
    """Every K with N processes (cap = ceil(K/N) rows each, the last ones padding): process r's
    j-th row is client j·N + r; after the in-place transposition row k is client k's, and the
    padding comes last."""
    for k in (1, 2, 5, 11, 97, 400):
        cap = -(-k // world)
        got = torch.full((world, cap, 3), -1.0)
        for c in range(k):
            got[c % world, c // world] = float(c)
        out = _to_client_order(got)
        assert out.data_ptr() == got.data_ptr()
        assert out[:k, 0].tolist() == [float(c) for c in range(k)]
        assert (out[k:] == -1.0).all()


def _empty_rounds(seeds: list[int]) -> int:
    """Rounds in which one of two processes owns no client of the cohort."""
    return sum(
        len({int(k) % 2 for k in sample_cohort(s, r, K, 2)}) == 1 for s in seeds for r in range(6)
    )


def _state(sub_dir: Path) -> torch.Tensor:
    found = ckpt.load(ckpt.listing(sub_dir / "checkpoints")[-1])["loop"]
    assert found["round"] == 6
    return torch.cat([flatten(found["server"])[0], flatten(found["clients"])[0]]).double()


def _metrics(sub_dir: Path) -> list[dict]:
    lines = (sub_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time")}
            for line in lines]  # fmt: skip


@pytest.mark.slow
def test_kept_state_on_two_processes_equals_one_process(tmp_path):
    """SCAFFOLD and Ditto (kept control variates and personal models), cohort 2 of 10 with
    clients dropping out, 3 seeds, float64: 2 gloo processes (each running and keeping only the
    clients it owns) give the server state and every client's kept rows of one process to
    rtol = atol = 1e-12, every logged number to rel 1e-12 and the same table — including the
    rounds in which one process runs no client (it still takes part in every collective)."""
    one, _ = run_recipe("comfedl_dro", tmp_path / "one", 1, *ARGS)
    two, _ = run_recipe("comfedl_dro", tmp_path / "two", 2, *ARGS)
    seeds = [0, 1, 2]  # the recipe's default seeds
    assert _empty_rounds(seeds) >= 3  # the case is exercised
    a_dir = the_run(tmp_path / "one", "comfedl_dro")
    b_dir = the_run(tmp_path / "two", "comfedl_dro")
    for name in ("scaffold", "ditto"):
        for seed in seeds:
            sub = f"{name}-seed{seed}"
            torch.testing.assert_close(_state(b_dir / sub), _state(a_dir / sub), rtol=1e-12,
                                       atol=1e-12)  # fmt: skip
            for la, lb in zip(_metrics(a_dir / sub), _metrics(b_dir / sub), strict=True):
                assert la.keys() == lb.keys()
                for key, v in la.items():
                    assert lb[key] == pytest.approx(v, rel=1e-12, abs=1e-12), (sub, key)
    assert (a_dir / "table.txt").read_text() == (b_dir / "table.txt").read_text()
    assert one["results"].keys() == two["results"].keys()
    # threads=0: the cores shared out among the processes (at most torch's default in a fresh
    # process, which this test process may have changed), recorded per sub-run
    cores = len(os.sched_getaffinity(0))
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    default = int(fresh.stdout)
    for run_dir, processes in ((a_dir, 1), (b_dir, 2)):
        status = json.loads((run_dir / "scaffold-seed0" / "status.json").read_text())
        assert status["processes"] == processes
        assert status["threads"] == max(1, min(default, cores // processes))


def _kill_9_then_resume(tmp_path: Path, updater: str, *extra: str) -> None:
    """Both processes of a 2-process ``updater`` run killed (``SIGKILL``) in its second
    evaluation, then ``resume=auto`` on two processes: the run ends bit-identical to one never
    stopped, every round logged once."""
    args = [a for a in ARGS if not a.startswith("updaters=")] + [f"updaters=[{updater}]"]
    args = [a for a in args if not a.startswith("rounds=")] + ["rounds=6", "seeds=[0]", *extra]

    def command(name: str, *more: str) -> list[str]:
        return [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", "devices=2",
                "tracking=[none]", "progress=false", f"out_dir={tmp_path}", f"run_name={name}",
                *args, *more]  # fmt: skip

    def env(**more: str) -> dict[str, str]:
        return {**os.environ, "MASTER_PORT": str(free_port()), "WANDB_MODE": "disabled", **more}

    def run(name: str, *more: str, **env_more: str) -> subprocess.CompletedProcess:
        return subprocess.run(command(name, *more), capture_output=True, text=True, cwd=REPO,
                              env=env(**env_more), timeout=300)  # fmt: skip

    straight = run("straight")
    assert straight.returncode == 0, straight.stderr[-2000:]
    killed = run("killed", LIT_FEDCO_KILL_AT="evaluation:2")
    assert killed.returncode != 0
    sub = tmp_path / "comfedl_dro" / "killed" / f"{updater}-seed0"
    assert ckpt.listing(sub / "checkpoints"), "no checkpoint before the kill"
    resumed = run("killed", "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    ref = tmp_path / "comfedl_dro" / "straight" / f"{updater}-seed0"
    assert torch.equal(_state(sub), _state(ref))
    assert _metrics(sub) == _metrics(ref)
    assert [line["round"] for line in _metrics(sub)] == list(range(1, 7))


@pytest.mark.slow
def test_kill_9_of_two_processes_keeping_state_then_resume_is_bit_identical(tmp_path):
    """SCAFFOLD: the checkpoint gathered every client's rows from their owners on process 0 and
    each process took its own back (:func:`_kill_9_then_resume`)."""
    _kill_9_then_resume(tmp_path, "scaffold")


@pytest.mark.slow
def test_kill_9_of_two_processes_holding_their_clients_data_then_resume_is_bit_identical(
    tmp_path,
):
    """FedAvg with ``shard_data=true``: each process, started again, cuts its own clients' rows
    out of the data again and goes on from the checkpoint (:func:`_kill_9_then_resume`)."""
    _kill_9_then_resume(tmp_path, "fedavg", "shard_data=true")


# ---------------------------------------------------------------------- data held by owner
def _digits(**kw):
    from tests.helpers import digits_data

    return digits_data(**kw)


def test_a_copy_holding_some_clients_rows_answers_for_the_whole():
    """``held_by``: the held clients' rows are the same values (new tensors), the others' are
    empty ranges; sizes, class counts, partition statistics and the fingerprint are the whole
    data set's; a second cut and a client out of range are refused."""
    from lit_fedco.data.samplers import BatchSampler

    data = _digits()
    k = data.num_clients
    owned = torch.arange(1, k, 2)
    part = data.held_by(owned, "f" * 16)
    assert part.holds() == owned.tolist() and data.holds() == list(range(k))
    assert len(part.x_train) == int(data.sizes("train")[owned].sum())
    assert len(part.x_val) == int(data.sizes("val")[owned].sum())
    assert 0 < part.nbytes() < data.nbytes()
    for c in range(k):
        for split in ("train", "val"):
            x, y = part.client_slice(c, split)
            if c % 2:
                assert torch.equal(x, data.client_slice(c, split)[0])
                assert torch.equal(y, data.client_slice(c, split)[1])
            else:
                assert len(x) == 0
    assert x.data_ptr() != data.x_train.data_ptr()  # the whole's tensors can go
    assert torch.equal(part.sizes("train"), data.sizes("train"))
    assert torch.equal(part.class_counts("val"), data.class_counts("val"))
    assert part.partition_stats() == data.partition_stats()
    assert ckpt.data_fingerprint(part) == "f" * 16
    # a held client's minibatches: the same rows as from the whole
    whole_s, part_s = BatchSampler(data, 3), BatchSampler(part, 3)
    clients = owned[:2]
    i_w = whole_s.sample_round(clients, 5, 2, ("inner",), 4)
    i_p = part_s.sample_round(clients, 5, 2, ("inner",), 4)
    assert torch.equal(data.x_train[i_w], part.x_train[i_p])
    with pytest.raises(ValueError, match="already holds only some"):
        part.held_by(owned, "")
    with pytest.raises(IndexError, match=r"clients must be in \[0, "):
        data.held_by(torch.tensor([k]), "")


def test_a_loop_refuses_rows_of_another_process_clients():
    """A loop on process 0 of 1 given the rows of clients 1, 3, ... says which it holds and
    which it runs."""
    from tests.helpers import make_loop

    data = _digits()
    with pytest.raises(ValueError, match=r"process 0 of 1 runs clients k with k mod 1 = 0"):
        make_loop("fedavg", {"lr": 0.1}, data=data.held_by(torch.arange(1, 4, 2), ""))


SHARD_ARGS = [
    "updaters=[fedavg,qfedavg]", "rounds=4", "eval_every=2", "cohort=3", "local_steps=2",
    "dtype=float64", "seeds=[0]", "checkpoint_every=2", "run_name=held",
]  # fmt: skip


@pytest.mark.slow
def test_data_held_by_owner_on_two_processes_equals_one_process_and_resumes_anywhere(tmp_path):
    """``shard_data=true``: 2 processes, each holding and running only its own clients' rows
    (random cohorts of 3 of 10), give one process's numbers (rel 1e-12, float64), table and
    partition statistics; their checkpoints name the whole data set's fingerprint, so one
    process without ``shard_data`` resumes them (2 rounds more) to the numbers of a run that
    never stopped."""
    run_recipe("comfedl_dro", tmp_path / "one", 1, *SHARD_ARGS)
    run_recipe("comfedl_dro", tmp_path / "two", 2, *SHARD_ARGS, "shard_data=true")
    a_dir = the_run(tmp_path / "one", "comfedl_dro")
    b_dir = the_run(tmp_path / "two", "comfedl_dro")
    assert (a_dir / "table.txt").read_text() == (b_dir / "table.txt").read_text()
    for sub in ("fedavg-seed0", "qfedavg-seed0"):
        assert (a_dir / sub / "partition.json").read_text() == (
            b_dir / sub / "partition.json"
        ).read_text()
        for la, lb in zip(_metrics(a_dir / sub), _metrics(b_dir / sub), strict=True):
            assert la.keys() == lb.keys()
            for key, v in la.items():
                assert lb[key] == pytest.approx(v, rel=1e-12, abs=1e-12), (sub, key)
        a_ck = ckpt.load(ckpt.listing(a_dir / sub / "checkpoints")[-1])
        b_ck = ckpt.load(ckpt.listing(b_dir / sub / "checkpoints")[-1])
        assert a_ck["data"] == b_ck["data"]
    longer = [a for a in SHARD_ARGS if not a.startswith("rounds=")] + ["rounds=6"]
    run_recipe("comfedl_dro", tmp_path / "two", 1, *longer, "resume=auto")
    run_recipe("comfedl_dro", tmp_path / "straight", 1, *longer)
    c_dir = the_run(tmp_path / "straight", "comfedl_dro")
    for sub in ("fedavg-seed0", "qfedavg-seed0"):
        for la, lb in zip(_metrics(c_dir / sub), _metrics(b_dir / sub), strict=True):
            for key, v in la.items():
                assert lb[key] == pytest.approx(v, rel=1e-12, abs=1e-12), (sub, key)
