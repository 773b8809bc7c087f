"""Paired tests over seeds (issue 30): the t statistic and p-value on numbers worked by hand and
against scipy's ``ttest_rel``; each method against the best of the table, per metric."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from lit_fedco.report.paired import against_best, as_records, format_tests, paired_t


def test_paired_t_on_numbers_worked_by_hand():
    # d = (1, 2, 3): mean 2, std 1, t = 2 / (1/√3) = 2√3 ≈ 3.4641, 2 degrees of freedom:
    # P(|T| > 2√3) = 1 − 2√3/√(2 + 12) ... the closed form for 2 dof: 1 − t/√(2 + t²)
    n, mean, std, t, p = paired_t([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert (n, mean, std) == (3, 2.0, 1.0)
    assert t == pytest.approx(2 * math.sqrt(3), rel=1e-12)
    assert p == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-10)  # 0.0742
    assert p == pytest.approx(0.07418, abs=1e-5)
    # 1 degree of freedom: P(|T| > t) = 1 − 2·atan(t)/π; d = (1, 3): t = 2 / (√2/√2) = 2
    n, mean, std, t, p = paired_t([1.0, 3.0], [0.0, 0.0])
    assert t == pytest.approx(2.0) and p == pytest.approx(1 - 2 * math.atan(2.0) / math.pi)


def test_paired_t_agrees_with_scipy():
    a = [0.851, 0.822, 0.840, 0.861, 0.835]
    b = [0.886, 0.863, 0.870, 0.872, 0.869]
    n, mean, _, t, p = paired_t(a, b)
    ref = stats.ttest_rel(a, b)
    assert n == 5 and mean == pytest.approx(-0.0302)
    assert t == pytest.approx(ref.statistic, rel=1e-12) and p == pytest.approx(ref.pvalue, rel=1e-9)


def test_missing_and_degenerate_pairs():
    assert paired_t([1.0, math.nan, 3.0], [0.5, 1.0, 2.0])[0] == 2  # a diverged seed drops out
    n, mean, std, t, p = paired_t([1.0, 2.0], [1.0, 2.0])
    assert (n, mean, std) == (2, 0.0, 0.0) and math.isnan(t) and math.isnan(p)
    n, mean, std, t, p = paired_t([2.0, 3.0], [1.0, 2.0])  # the same gain on every seed
    assert std == 0.0 and p == 0.0


def test_each_method_against_the_best_and_loss_ranks_lowest_first():
    def seeds(*pairs):
        return [{"val/acc_avg": acc, "val/loss_avg": loss} for acc, loss in pairs]

    rows = [
        ("comfedl", seeds((0.85, 0.5), (0.82, 0.6), (0.84, 0.55))),
        ("drfl", seeds((0.88, 0.4), (0.86, 0.45), (0.87, 0.42))),
        ("fedavg", [{"diverged_round": 3}, *seeds((0.5, 2.0), (0.6, 1.5))]),
    ]
    tests = against_best(rows, ["val/acc_avg", "val/loss_avg"])
    assert [(t.metric, t.method, t.reference, t.n) for t in tests] == [
        ("val/acc_avg", "comfedl", "drfl", 3),
        ("val/acc_avg", "fedavg", "drfl", 2),
        ("val/loss_avg", "comfedl", "drfl", 3),
        ("val/loss_avg", "fedavg", "drfl", 2),
    ]
    first = tests[0]
    assert first.mean == pytest.approx(-0.1 / 3) and first.p < 0.05
    text = format_tests(tests, {"val/acc_avg": "val avg acc"})
    assert "val avg acc: comfedl vs drfl: Δ = -0.0333" in text and "(3 seeds)" in text
    named = against_best(rows, ["val/acc_avg"], reference="comfedl")
    assert {t.reference for t in named} == {"comfedl"}
    assert as_records(tests)[0]["method"] == "comfedl"
    # a method that diverged on every seed has nothing to pair: no line
    gone = [*rows, ("qfedavg", [{"diverged_round": 1}] * 3)]
    assert "qfedavg" not in {t.method for t in against_best(gone, ["val/acc_avg"])}
    # one seed each: no test
    assert against_best([("a", [{"m": 1.0}]), ("b", [{"m": 2.0}])], ["m"]) == []


def test_a_difference_within_the_noise_is_written_as_not_significant():
    rows = [
        ("a", [{"m": 0.80}, {"m": 0.90}, {"m": 0.70}]),
        ("b", [{"m": 0.82}, {"m": 0.85}, {"m": 0.74}]),
    ]
    (test,) = against_best(rows, ["m"])
    assert test.p > 0.05 and "not significant" in test.line()
