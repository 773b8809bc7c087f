"""Figures from recorded runs: the files are written, and what is plotted is the recorded
history (mean over seeds, recomputed here from the sub-runs' metrics.jsonl); two runs overlay
in one figure; the run's results keep every evaluated round."""

from __future__ import annotations

import importlib
import json
import os
import statistics
from pathlib import Path

import pytest

from lit_fedco.cli import run as main
from lit_fedco.recipes.comfedl_dro import DEFAULTS
from lit_fedco.report import plot
from lit_fedco.report.plot import COMM, DEFAULT_COLUMNS, draw, load_run
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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="figures are drawn in forks on Linux only")
def test_figures_drawn_two_at_a_time_are_the_figures_drawn_one_at_a_time(
    runs, tmp_path, monkeypatch
):
    """``processes=2`` (a ``jobs=2`` run's end): a forked child draws some of the figures; the
    files (every PNG byte for byte) and what was plotted are those of one process drawing them
    all."""
    a, _ = runs
    one = draw([load_run(a)], tmp_path / "one")
    save, drawn_by = plot._save, tmp_path / "pids.txt"

    def save_and_say_who(fig, out, name, legend_rows=0):
        with open(drawn_by, "a") as f:
            f.write(f"{name} {os.getpid()}\n")
        return save(fig, out, name, legend_rows)

    monkeypatch.setattr(plot, "_save", save_and_say_who)
    two = draw([load_run(a)], tmp_path / "two", "", 2)
    pids = dict(line.split() for line in drawn_by.read_text().splitlines())
    assert pids["curves"] == pids["clients"] == str(os.getpid())
    assert pids["communication"] == pids["weights"] != str(os.getpid())
    assert [p.name for p in two["files"]] == [p.name for p in one["files"]]
    assert len(one["files"]) == 8 and two["plotted"] == one["plotted"]
    assert list(two["plotted"]) == list(one["plotted"])  # in the same order
    for p in one["files"]:
        if p.suffix == ".png":
            assert (tmp_path / "two" / p.name).read_bytes() == p.read_bytes(), p.name


@pytest.mark.skipif(not hasattr(os, "fork"), reason="figures are drawn in forks on Linux only")
def test_a_figure_that_fails_in_a_child_fails_here_with_its_own_error(runs, tmp_path, monkeypatch):
    """The child drawing ``weights`` fails: its figures are drawn again in this process, so the
    error is this process's own (what the run reports as "no figures (...)")."""
    a, _ = runs

    def broken(*args):
        raise ValueError("no weights today")

    monkeypatch.setattr(plot, "_weights", broken)
    with pytest.raises(ValueError, match="no weights today"):
        draw([load_run(a)], tmp_path, "", 2)
    assert (tmp_path / "communication.png").is_file()  # the child's other figure, drawn


# --- few evaluated points: every series stays visible -----------------------------------------

RECIPES = ["comfedl_dro", "comfedl_maml", "ds_feddro", "feddro", "feddro_fairness", "fcsg_auprc",
           "fcsg_invariant", "fcsg_maml"]  # fmt: skip


def record_at(recipe: str, rounds: int, seeds: int = 3) -> dict:
    """What the recipe's default run at ``rounds`` records, faked: one evaluated row per seed,
    after the last round (``rounds`` below every recipe's ``eval_every``), per method and
    variant; the pre-training's rows at its own evaluations; DRO weights for every method (so
    that each figure kind is drawn)."""
    mod = importlib.import_module(f"lit_fedco.recipes.{recipe}")
    defaults, columns = mod.DEFAULTS, [list(c) for c in getattr(mod, "COLUMNS", DEFAULT_COLUMNS)]
    variants = [" ".join(v) if isinstance(v, list) else v for v in defaults.get("variants", [])]
    methods = (
        [f"{u} [{v}]" for v in variants for u in defaults["updaters"]]
        if variants
        else list(defaults["updaters"])
    )
    pre = defaults.get("pretrain", {}).get("rounds", 0)
    every = defaults.get("eval_every", 10)

    def row(r: int, i: int, s: int) -> dict:
        out = {"round": r, COMM: 1000.0 * r, "val/acc_avg": 0.5 + 0.01 * i + 0.002 * s}
        out.update({k: 0.4 + 0.01 * i + 0.003 * s + 0.001 * r for k, _ in columns if k != COMM})
        out.update({f"dro/weight_client{k}": 0.1 + 0.01 * (k - 2) * s for k in range(5)})
        return out

    history = {
        m: [[row(rounds, i, s)] for s in range(seeds)] for i, m in enumerate(methods)
    }  # fmt: skip
    if pre:
        evals = [*range(every, pre + 1, every), *([pre] if pre % every else [])]
        history = {"pretrain": [[row(r, 9, s) for r in evals] for s in range(seeds)], **history}
    return {
        "name": recipe, "recipe": recipe, "config": {"pretrain": {"rounds": pre}},
        "columns": columns, "evaluated_on": "validation",
        "results": {m: [h[-1] for h in hs] for m, hs in history.items()},
        "history": history,
        "per_client": {m: [[0.5, 0.6, 0.7]] * seeds for m in history},
    }  # fmt: skip


def drawn_figures(monkeypatch, rec: dict, out: Path) -> dict:
    """``draw`` on ``rec``, keeping the matplotlib figures it saved: {name: Figure}."""
    kept = {}
    save = plot._save

    def keep(fig, folder, name, legend_rows=0):
        kept[name] = fig
        return save(fig, folder, name, legend_rows)

    monkeypatch.setattr(plot, "_save", keep)
    draw([rec], out, rec["recipe"])
    return kept


def hidden_series(figures: dict) -> list[str]:
    """Data lines a reader cannot see or place: one point, or a few, without markers, or a
    single point outside its axes' limits (reference lines, axhline / axvline, are skipped)."""
    bad = []
    for name, fig in figures.items():
        for ax in fig.axes:
            for line in ax.get_lines():
                if line.get_transform() != ax.transData or not line.get_visible():
                    continue
                x, y = list(line.get_xdata()), list(line.get_ydata())
                marker = line.get_marker() not in (None, "None", "none", "", " ")
                what = f"{name}: {line.get_label()!r} ({len(x)} points)"
                if len(x) <= plot.FEW_POINTS and not (marker and line.get_markersize() > 0):
                    bad.append(what)
                (lo, hi), (bot, top) = ax.get_xlim(), ax.get_ylim()
                if len(x) == 1 and not (lo <= x[0] <= hi and bot <= y[0] <= top):
                    bad.append(what + " outside the axes")
    return bad


@pytest.mark.parametrize("recipe", RECIPES)
def test_no_series_of_a_two_round_run_is_invisible(recipe, monkeypatch, tmp_path):
    rec = record_at(recipe, rounds=2)
    figures = drawn_figures(monkeypatch, rec, tmp_path)
    assert {"curves", "communication", "weights"} <= set(figures)
    assert ("clients" in figures) == (recipe != "fcsg_auprc")  # AP: no accuracy per client
    assert hidden_series(figures) == []
    lines = [ln for ax in figures["curves"].axes for ln in ax.get_lines()]
    assert sum(len(ln.get_xdata()) == 1 for ln in lines) >= len(rec["history"]) - 1


def test_a_pre_trained_run_draws_its_methods_after_the_pre_training(monkeypatch, tmp_path):
    rec = record_at("fcsg_auprc", rounds=2, seeds=2)
    done = draw([rec], tmp_path)
    curves = done["plotted"]["curves:val/ap"]
    assert curves["pretrain"]["x"] == [10, 20]  # its own rounds
    assert curves["fedavg"]["x"] == [22]  # 20 rounds of pre-training, then 2
    comm = done["plotted"]["communication:val/ap"]
    assert comm["fedavg"]["x"] == [20000.0 + 2000.0]
    figures = drawn_figures(monkeypatch, rec, tmp_path / "again")
    (ax, *_) = figures["curves"].axes
    assert "pre-training" in ax.get_xlabel() and ax.get_xlim()[0] == 0
    assert figures["curves"].texts[0].get_text() == "fcsg_auprc  (mean ± std over 2 seeds)"


def test_a_run_of_two_rounds_is_evaluated_after_its_last_round(tmp_path, monkeypatch):
    """A real run: ``rounds=2`` with the default ``eval_every`` (20) evaluates once, after round
    2 (the loop evaluates the last round), and that point is drawn with a marker."""
    main("comfedl_dro", DEFAULTS, ["rounds=2", "seeds=[0]", "tracking=[none]", "progress=false",
                                   "data.big=200", "updaters=[comfedl,drfl]",
                                   f"out_dir={tmp_path}", "run_name=two"])  # fmt: skip
    rec = load_run(tmp_path / "comfedl_dro" / "two")
    assert [[r["round"] for r in s] for s in rec["history"]["comfedl"]] == [[2]]
    figures = drawn_figures(monkeypatch, rec, tmp_path / "figs")
    assert hidden_series(figures) == []
    assert figures["curves"].texts[0].get_text() == "comfedl_dro  (1 seed)"


def test_single_points_at_one_round_are_spread_apart_and_longer_series_stay():
    shifts = plot._dodge([[2.0], [2.0], [2.0], [1.0, 2.0], [2.01]])
    assert shifts[3] == 0.0  # a series of two points is not moved
    drawn = [x + dx for x, dx in zip([2.0, 2.0, 2.0, 2.01], shifts[:3] + shifts[4:], strict=True)]
    assert drawn == sorted(drawn) and len(set(drawn)) == 4  # apart, in the order of their x
    assert max(drawn) - min(drawn) <= 0.1 * 2.01 + 1e-12
    assert plot._dodge([[1.0], [2.0]]) == [0.0, 0.0]  # far apart: where they are
