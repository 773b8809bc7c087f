"""Figures from recorded runs: the files are written, and what is plotted is the recorded
history (mean over seeds, recomputed here from the sub-runs' metrics.jsonl); two runs overlay
in one figure; the run's results keep every evaluated round."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from lit_fedco.cli import run as main
from lit_fedco.recipes.comfedl_dro import DEFAULTS
from lit_fedco.report.plot import draw, load_run
from lit_fedco.report.plot import main as plot_main
from tests.helpers import override

ARGS = ["rounds=4", "eval_every=2", "seeds=[0,1]", "tracking=[none]", "progress=false",
        "data.big=200", "updaters=[comfedl,drfl]"]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("runs")
    main("comfedl_dro", DEFAULTS, [*ARGS, f"out_dir={out}", "run_name=a"])
    main("comfedl_dro", DEFAULTS, [*ARGS, f"out_dir={out}", "run_name=b", "comfedl.lr=0.1"])
    return out / "comfedl_dro" / "a", out / "comfedl_dro" / "b"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_leaves_its_figures_and_its_history(runs):
    a, _ = runs
    names = sorted(p.name for p in (a / "figures").iterdir())
    figures = ("curves", "communication", "clients", "weights")
    assert names == sorted(f"{f}.{ext}" for f in figures for ext in ("png", "pdf"))
    for p in (a / "figures").iterdir():
        head = p.read_bytes()[:8]
        assert head.startswith(b"\x89PNG") if p.suffix == ".png" else head.startswith(b"%PDF")
    rec = json.loads((a / "results.json").read_text())
    for method in ("comfedl", "drfl"):
        assert len(rec["history"][method]) == 2  # seeds
        for seed, rows in enumerate(rec["history"][method]):
            recorded = [r for r in jsonl(a / f"{method}-seed{seed}" / "metrics.jsonl")
                        if "val/acc_avg" in r]  # fmt: skip
            assert rows == recorded and [r["round"] for r in rows] == [2, 4]
        assert all(len(pc) == 10 for pc in rec["per_client"][method])
        # the per-client accuracies are the ones the averages were made of
        for final, pc in zip(rec["results"][method], rec["per_client"][method], strict=True):
            assert statistics.fmean(pc) == pytest.approx(final["val/acc_avg"], abs=1e-12)
            assert min(pc) == pytest.approx(final["val/acc_worst"], abs=1e-12)


def test_plotted_series_equal_the_recorded_history(runs, tmp_path):
    a, _ = runs
    done = draw([load_run(a)], tmp_path)
    for key in ("val/acc_avg", "val/acc_worst"):
        curves = done["plotted"][f"curves:{key}"]
        comm = done["plotted"][f"communication:{key}"]
        for method in ("comfedl", "drfl"):
            seeds = [jsonl(a / f"{method}-seed{s}" / "metrics.jsonl") for s in (0, 1)]
            evals = [[r for r in rows if "val/acc_avg" in r] for rows in seeds]
            mean = [statistics.fmean(e[i][key] for e in evals) for i in range(2)]
            assert curves[method] == {"x": [2, 4], "y": pytest.approx(mean, abs=1e-15)}
            floats = [r["comm/total_floats_per_client"] for r in evals[0]]
            assert comm[method]["x"] == floats and comm[method]["y"] == pytest.approx(mean)
    lam = done["plotted"]["weights:drfl"]
    drfl0 = [r for r in jsonl(a / "drfl-seed0" / "metrics.jsonl") if "val/acc_avg" in r]
    assert lam["client3"]["y"] == [r["dro/weight_client3"] for r in drfl0]


def test_plot_overlays_two_runs_and_writes_a_summary(runs, tmp_path, capsys):
    a, b = runs
    plot_main([str(a), str(b), "--out", str(tmp_path)])
    files = capsys.readouterr().out.split()
    assert str(tmp_path / "curves.png") in files and str(tmp_path / "summary.md") in files
    done = draw([load_run(a), load_run(b)], tmp_path / "again")
    assert set(done["plotted"]["curves:val/acc_avg"]) == {
        "comfedl (a)", "drfl (a)", "comfedl (b)", "drfl (b)"
    }  # fmt: skip
    # run b changed ComFedL's step size only: its ComFedL curve differs, its DRFL curve does not
    c = done["plotted"]["curves:val/acc_avg"]
    assert c["drfl (a)"] == c["drfl (b)"] and c["comfedl (a)"] != c["comfedl (b)"]
    table = (tmp_path / "summary.md").read_text().splitlines()
    assert table[0].startswith("| method | val avg acc | val worst acc")
    finals = json.loads((a / "results.json").read_text())["results"]["drfl"]
    avg = statistics.fmean(f["val/acc_avg"] for f in finals)
    row = next(line for line in table if line.startswith("| DRFL (a)"))
    assert f"{avg:.4f} ± " in row


def test_a_recipe_evaluated_on_a_test_set_says_so(runs, tmp_path, capsys):
    """fcsg_invariant's held-out data is a test set: its table title, results and the
    ``clients`` figure say "test"; every other run (and a run recorded before) "validation"."""
    a, _ = runs
    assert draw([load_run(a)], tmp_path / "val")["labels"]["clients"] == (
        "final validation accuracy per client"
    )
    capsys.readouterr()
    argv = override(ARGS, ["seeds=[0]", f"out_dir={tmp_path}", "run_name=t"])
    main("comfedl_dro", DEFAULTS, argv, evaluated_on="test")
    assert "comfedl_dro: final metrics per method (test, mean over clients)" in (
        capsys.readouterr().out
    )
    t = tmp_path / "comfedl_dro" / "t"
    assert json.loads((t / "results.json").read_text())["evaluated_on"] == "test"
    assert draw([load_run(t)], tmp_path / "test")["labels"]["clients"] == (
        "final test accuracy per client"
    )
