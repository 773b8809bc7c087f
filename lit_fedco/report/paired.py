"""Paired tests over seeds: whether one method's final metric differs from another's beyond the
seed-to-seed noise, for the comparison tables.

The methods of a seed share its data, its cohorts and its initialisation, so the per-seed
differences ``d_s = a_s − b_s`` are what to test: the two-sided paired t-test,
``t = mean(d) / (std(d) / √n)`` with ``n − 1`` degrees of freedom. With 3 seeds, a difference
needs ``|t| > 4.30`` to reach p < 0.05; a line that does not is printed as not significant.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

LOWER_IS_BETTER = ("loss", "objective", "obj", "violation", "gap", "time")
"""Metric keys with any of these words rank the smallest value first."""
ALPHA = 0.05
"""The level a line calls significant."""


@dataclass(frozen=True)
class Paired:
    """One paired comparison of ``method`` against ``reference`` on ``metric`` over ``n`` seeds.

    Attributes:
        metric: the metric key (``val/acc_avg``).
        method / reference: the table's row labels.
        n: seeds where both have a value (diverged runs have none).
        mean / std: of the per-seed differences method − reference.
        t / p: the paired t statistic and its two-sided p-value (NaN where undefined: n < 2,
            or every difference equal).
    """

    metric: str
    method: str
    reference: str
    n: int
    mean: float
    std: float
    t: float
    p: float

    def line(self, label: str = "") -> str:
        """``fedavg vs comfedl: Δ = −0.0120 ± 0.0040, paired t p = 0.030 (3 seeds)``."""
        what = label or self.metric
        if math.isnan(self.p):
            verdict = "no test" if self.n < 2 else "identical on every seed"
            return (f"{what}: {self.method} vs {self.reference}: Δ = {self.mean:+.4f} "
                    f"({verdict}, {self.n} seeds)")  # fmt: skip
        sig = "" if self.p < ALPHA else ", not significant"
        return (f"{what}: {self.method} vs {self.reference}: Δ = {self.mean:+.4f} ± "
                f"{self.std:.4f}, paired t p = {self.p:.3g}{sig} ({self.n} seeds)")  # fmt: skip


def t_sf_two_sided(t: float, df: int) -> float:
    """The two-sided p-value ``P(|T| ≥ |t|)`` of Student's t with ``df`` degrees of freedom:
    ``I_{df/(df+t²)}(df/2, 1/2)``, the regularized incomplete beta function."""
    from scipy.special import betainc  # scipy comes with scikit-learn, a dependency

    if math.isinf(t):
        return 0.0
    return float(betainc(df / 2.0, 0.5, df / (df + t * t)))


def paired_t(a: list[float], b: list[float]) -> tuple[int, float, float, float, float]:
    """``(n, mean, std, t, p)`` of the differences ``a − b`` (pairs where either is missing,
    None or NaN, left out); ``std`` with Bessel's correction."""
    d = [x - y for x, y in zip(a, b, strict=True) if _ok(x) and _ok(y)]
    n = len(d)
    if n == 0:
        return 0, math.nan, math.nan, math.nan, math.nan
    mean = sum(d) / n
    if n < 2:
        return n, mean, math.nan, math.nan, math.nan
    std = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    if std == 0.0:
        if mean == 0.0:
            return n, mean, std, math.nan, math.nan
        return n, mean, std, math.copysign(math.inf, mean), 0.0
    t = mean / (std / math.sqrt(n))
    return n, mean, std, t, t_sf_two_sided(t, n - 1)


def _ok(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


def lower_is_better(metric: str) -> bool:
    """Whether ``metric`` ranks its smallest value first (a loss, an objective...)."""
    return any(word in metric.split("/")[-1] for word in LOWER_IS_BETTER)


def against_best(
    rows: list[tuple[str, list[dict[str, float]]]],
    metrics: list[str],
    reference: str = "",
) -> list[Paired]:
    """For each metric, every method against the best one by its mean over seeds (or against
    the row ``reference``), paired seed by seed; nothing for a table of one row or of rows with
    fewer than two seeds. A diverged seed has no value."""
    out: list[Paired] = []
    if len(rows) < 2 or max(len(r) for _, r in rows) < 2:
        return out
    for metric in metrics:
        values = {
            label: [None if "diverged_round" in r else r.get(metric) for r in results]
            for label, results in rows
        }
        means = {k: _mean(v) for k, v in values.items()}
        scored = [k for k, m in means.items() if not math.isnan(m)]
        if len(scored) < 2:
            continue
        if reference and reference in values:
            best = reference
        else:
            sign = -1.0 if lower_is_better(metric) else 1.0
            best = max(scored, key=lambda k: sign * means[k])
        for label in values:
            if label == best or len(values[label]) != len(values[best]):
                continue
            n, mean, std, t, p = paired_t(values[label], values[best])  # type: ignore[arg-type]
            if n == 0:  # diverged on every seed: the table says so, there is nothing to pair
                continue
            out.append(Paired(metric, label, best, n, mean, std, t, p))
    return out


def _mean(values: list[float | None]) -> float:
    ok = [v for v in values if v is not None and not math.isnan(v)]
    return sum(ok) / len(ok) if ok else math.nan


def format_tests(tests: list[Paired], labels: dict[str, str] | None = None) -> str:
    """The lines printed under a table (``labels``: metric key → the table's column label)."""
    if not tests:
        return ""
    head = (f"paired over seeds (Δ = mean ± std of the per-seed differences to the best, or "
            f"the reference; two-sided paired t-test, significant at p < {ALPHA}):")  # fmt: skip
    return "\n".join([head, *(f"  {t.line((labels or {}).get(t.metric, ''))}" for t in tests)])


def as_records(tests: list[Paired]) -> list[dict[str, Any]]:
    """The tests as JSON-ready dicts (NaN and ±inf as None)."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in asdict(t).items()} for t in tests]  # fmt: skip
