"""The shared starting point (``lit_fedco.experiment.pretrain``): the pre-training writes its model,
every method of a seed starts from it, ``init_from=`` reads it back; the same seed pre-trains to the
same model; a pre-training stopped halfway resumes to the same result; bad ``init_from`` and
``pretrain`` values end with exit code 2 and one line before anything is written."""

from __future__ import annotations

import json
import re
import signal

import pytest
import torch

from lit_fedco.cli import run as main
from lit_fedco.experiment import pretrain
from lit_fedco.process import stops
from lit_fedco.recipes.fcsg_auprc import COLUMNS, DEFAULTS
from tests.helpers import LastLoops, override, the_run

TINY = ["rounds=2", "local_steps=2", "cohort=4", "eval_every=2", "tracking=[none]",
        "progress=false", "threads=1", "updaters=[fedavg,fcsg]", "checkpoint_every=1",
        "pretrain.rounds=0"]  # fmt: skip


class Starts:
    """A loop callback keeping, in order, every sub-run's server model at round 0."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, dict[str, torch.Tensor]]] = []

    def on_round_start(self, loop, cohort) -> None:  # type: ignore[no-untyped-def]
        if loop.round == 0:
            x = {k: v.detach().clone() for k, v in loop.server["x"].items()}
            self.starts.append((loop.updater.name, x))


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def run(out, *argv: str, callbacks=None):  # type: ignore[no-untyped-def]
    return main(
        "fcsg_auprc",
        DEFAULTS,
        override([*TINY, f"out_dir={out}"], argv),
        columns=COLUMNS,
        callbacks=callbacks,
    )


def test_pretraining_is_shared_by_every_method_and_init_from_reads_it_back(tmp_path):
    starts, last = Starts(), LastLoops()
    rows = run(tmp_path / "a", "pretrain.rounds=3", "pretrain.lr=0.1", callbacks=[starts, last])
    assert [name for name, _ in rows] == ["pretrain", "fedavg", "fcsg"]
    run_dir = the_run(tmp_path / "a", "fcsg_auprc")
    saved = run_dir / "pretrain-seed0" / pretrain.PRETRAINED
    model = pretrain.load_params(saved)
    pre_loop = last.loops[0]
    assert pre_loop.round == 3 and pre_loop.updater.name == "fedavg"
    assert pre_loop.updater.hparams.lr == 0.1  # pretrain.lr, not fedavg.lr
    assert equal(model, pre_loop.server["x"])  # the file holds the pre-training's final model
    # the pre-training started from the seeded model; every method from the pre-trained one
    (_, seeded), *methods = starts.starts
    assert [name for name, _ in methods] == ["fedavg", "fcsg"]
    assert not equal(seeded, model)
    for name, x in methods:
        assert equal(x, model), name
        status = json.loads((run_dir / f"{name}-seed0" / "status.json").read_text())
        assert status["init"] == pretrain.describe("pretrain-seed0/pretrained.ckpt", model)
    # its rounds and communication are its own row, not the methods'
    (pre,) = dict(rows)["pretrain"]
    (fcsg,) = dict(rows)["fcsg"]
    assert pre["comm/total_floats_per_client"] > 0
    rounds = [json.loads(line)["round"] for line in
              (run_dir / "fcsg-seed0" / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    assert rounds == [1, 2]
    config = (run_dir / "config.yaml").read_text()
    assert "rounds: 3" in config and "lr: 0.1" in config  # what ran is recorded
    assert "executor: vectorized" in config  # executor=auto's choice for the cnn, recorded

    # init_from: a run without pre-training starts from the file and ends where fcsg did
    starts_b = Starts()
    rows_b = run(tmp_path / "b", "updater=fcsg", f"init_from={saved}", callbacks=[starts_b])
    ((name, x),) = starts_b.starts
    assert name == "fcsg" and equal(x, model)
    ((_, (again,)),) = rows_b
    assert {k: v for k, v in again.items() if k != "time_s"} == {
        k: v for k, v in fcsg.items() if k != "time_s"
    }


def test_the_same_seed_pretrains_to_the_same_model(tmp_path):
    run(tmp_path / "a", "seeds=[0,1]", "pretrain.rounds=2", "updater=fcsg")
    run(tmp_path / "b", "seed=0", "pretrain.rounds=2", "updater=fcsg")
    a = the_run(tmp_path / "a", "fcsg_auprc")
    b = the_run(tmp_path / "b", "fcsg_auprc")
    a0 = pretrain.load_params(a / "pretrain-seed0" / pretrain.PRETRAINED)
    a1 = pretrain.load_params(a / "pretrain-seed1" / pretrain.PRETRAINED)
    b0 = pretrain.load_params(b / "pretrain-seed0" / pretrain.PRETRAINED)
    assert equal(a0, b0)
    assert not equal(a0, a1)
    status = json.loads((a / "fcsg-seed1" / "status.json").read_text())
    assert status["init"] == pretrain.describe("pretrain-seed1/pretrained.ckpt", a1)


class StopAt:
    """Asks the run to stop (as SIGTERM would) after round ``at`` of the first sub-run."""

    def __init__(self, at: int) -> None:
        self.at, self.first = at, None

    def on_round_end(self, loop, logs) -> None:  # type: ignore[no-untyped-def]
        self.first = self.first or loop
        if loop is self.first and loop.round == self.at:
            stops.request_stop(signal.SIGTERM)


def test_a_pretraining_stopped_halfway_resumes_to_the_same_result(tmp_path):
    args = ["pretrain.rounds=4", "run_name=r"]
    straight = run(tmp_path / "straight", *args)
    with pytest.raises(SystemExit) as exc:
        run(tmp_path / "stopped", *args, callbacks=[StopAt(2)])
    assert exc.value.code == 128 + signal.SIGTERM
    run_dir = tmp_path / "stopped" / "fcsg_auprc" / "r"
    assert not (run_dir / "pretrain-seed0" / pretrain.PRETRAINED).exists()
    assert not (run_dir / "fedavg-seed0").exists()  # no method started from half a pre-training
    resumed = run(tmp_path / "stopped", *args, "resume=auto")
    strip = [(n, [{k: v for k, v in r.items() if k != "time_s"} for r in rs]) for n, rs in straight]
    assert [
        (n, [{k: v for k, v in r.items() if k != "time_s"} for r in rs]) for n, rs in resumed
    ] == strip
    rounds = [json.loads(line)["round"] for line in
              (run_dir / "pretrain-seed0" / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    assert rounds == [1, 2, 3, 4]
    # resumed again, complete: the pre-training is read back, nothing runs
    again = run(tmp_path / "stopped", *args, "resume=auto")
    assert [n for n, _ in again] == ["pretrain", "fedavg", "fcsg"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("pretrained")
    run(out, "pretrain.rounds=1", "updater=fedavg", "rounds=1", "eval_every=1")
    return str(the_run(out, "fcsg_auprc") / "pretrain-seed0" / pretrain.PRETRAINED)


MISSING = r"init_from: cannot read /nope/pretrained\.ckpt .*init_from=RUN/pretrain-seed0/"
HIDDEN = (
    r"init_from: .*pretrained\.ckpt holds another model than this run's \(model\.name=cnn, "
    r"model\.hidden=8, .*first difference: fc1\.weight:\(64, \d+\) there, "
    r"fc1\.weight:\(8, \d+\) here\)"
)
NOT_OURS = r"pretrain\.updater: got 'comfedl', which cannot pre-train this run's model \(objective"
BAD = [
    (["init_from=/nope/pretrained.ckpt"], MISSING),
    (["init_from={ckpt}", "model.hidden=8"], HIDDEN),
    (["init_from={ckpt}", "model.name=mlp"], r"init_from: .*holds another model .*model\.name=mlp"),
    (["init_from={dir}/config.yaml"], r"init_from: .*config\.yaml is not a lit_fedco checkpoint"),
    (["pretrain.rounds=-1"], r"pretrain\.rounds: got -1, expected an int >= 0"),
    (["pretrain.rounds=2", "pretrain.lr=0"], r"pretrain\.lr: got 0\.0, expected a float > 0"),
    (["pretrain.rounds=2", "pretrain.updater=fedprox"], r"pretrain\.updater: got 'fedprox', "),
    (["pretrain.rounds=2", "pretrain.updater=comfedl"], NOT_OURS),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "pattern"), BAD, ids=[
    "missing", "hidden", "model", "not-a-checkpoint", "rounds", "lr", "updater", "objective"
])  # fmt: skip
def test_bad_init_from_and_pretrain_exit_2_with_one_line(
    argv, pattern, pretrained, tmp_path, capsys
):
    out = tmp_path / "out"
    folder = str(the_dir(pretrained))
    argv = [a.replace("{ckpt}", pretrained).replace("{dir}", folder) for a in argv]
    with pytest.raises(SystemExit) as exc:
        run(out, *argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert re.match(r"lit_fedco: " + pattern, lines[0]), lines[0]
    assert not out.exists()


def the_dir(ckpt_path: str):  # type: ignore[no-untyped-def]
    """The run folder of the fixture's pre-training (it holds a config.yaml)."""
    from pathlib import Path

    return Path(ckpt_path).parent.parent
