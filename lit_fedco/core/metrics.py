"""Per-client metrics as torchmetrics sum states.

Every state is a fixed-shape sum (``[K]`` per client, ``[C]`` per class) reduced with
``dist_reduce_fx="sum"``, so the numbers are the same on 1 or N processes: each process adds
the rows of the samples it evaluates, the sync adds the processes. Counts are ``int64`` (exact
on any number of processes), loss sums ``float64``. Average, worst and percentile client
accuracy are derived from the synced sums by the pure function :func:`per_client_summary`.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric

from lit_fedco.core.errors import ConfigError


def per_client_summary(
    correct: Tensor,
    count: Tensor,
    loss_sum: Tensor,
    *,
    class_correct: Tensor | None = None,
    class_count: Tensor | None = None,
) -> dict[str, Tensor]:
    """Summaries over clients of per-client sums (the functional twin of the metric).

    Per-client accuracy is ``a_k = correct_k / count_k`` and mean loss ``ℓ_k = loss_sum_k /
    count_k``. Clients (and classes) with ``count == 0`` have no accuracy: they are NaN in the
    per-client vectors and left out of every summary. After a distributed sync every client
    evaluated on some process has ``count > 0``; a client that no process evaluated is ignored.
    With no client at all the scalar summaries are NaN.

    Args:
        correct: ``[K]`` correctly classified samples per client.
        count: ``[K]`` samples per client.
        loss_sum: ``[K]`` summed per-sample loss per client.
        class_correct: ``[C]`` correctly classified samples per class (optional).
        class_count: ``[C]`` samples per class (optional, with ``class_correct``).

    Returns:
        float64 tensors: ``acc_avg`` (mean of ``a_k``), ``acc_worst`` (min), ``acc_p10`` (10th
        percentile, linear interpolation as ``torch.quantile``), ``acc_best`` (max),
        ``acc_pooled`` (all samples together: Σ correct / Σ count), ``loss_avg`` (mean of
        ``ℓ_k``), ``loss_worst`` (max of ``ℓ_k``), the vectors ``acc_per_client`` and
        ``loss_per_client`` ``[K]``; with class sums also ``acc_per_class`` ``[C]`` and
        ``class_acc_worst`` (min over classes with samples).
    """
    f64 = torch.float64
    acc = _ratio(correct, count)
    loss = _ratio(loss_sum, count)
    has = count > 0
    a, lo = acc[has], loss[has]
    total = count.sum()
    out = {
        "acc_avg": _reduce(a, torch.mean),
        "acc_worst": _reduce(a, torch.min),
        "acc_p10": _reduce(a, lambda v: torch.quantile(v, 0.1)),
        "acc_best": _reduce(a, torch.max),
        "acc_pooled": torch.where(total > 0, correct.sum().to(f64) / total.clamp_min(1), torch.nan),
        "loss_avg": _reduce(lo, torch.mean),
        "loss_worst": _reduce(lo, torch.max),
        "acc_per_client": acc,
        "loss_per_client": loss,
    }
    if class_correct is not None and class_count is not None:
        per_class = _ratio(class_correct, class_count)
        out["acc_per_class"] = per_class
        out["class_acc_worst"] = _reduce(per_class[class_count > 0], torch.min)
    return out


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` in float64, NaN where ``den == 0``."""
    num, den = num.to(torch.float64), den.to(torch.float64)
    return torch.where(den > 0, num / den.clamp_min(1), torch.nan)


def _nan(like: Tensor) -> Tensor:
    return torch.tensor(torch.nan, dtype=torch.float64, device=like.device)


def _reduce(values: Tensor, fn: Any) -> Tensor:
    """``fn(values)``, or NaN for an empty vector (where min/max/quantile would raise)."""
    return fn(values) if values.numel() else _nan(values)


def _positive_int(key: str, value: Any) -> int:
    """``value`` as an int >= 1 (numpy and 0-d torch integers accepted)."""
    try:
        n = operator.index(value) if not isinstance(value, bool) else 0
    except TypeError:
        n = 0
    if n < 1:
        raise ConfigError.bad_value(key, value, "an int >= 1", "10")
    return n


class PerClientClassification(Metric):
    """Per-client (and per-class) accuracy and cross-entropy of a classifier.

    ``update(logits [n, C], target [n], client [n])`` adds each sample to its client's and its
    class's sums; ``compute()`` syncs the sums over processes and returns
    :func:`per_client_summary` of them. A process may see any subset of clients and samples;
    the result is the same as if one process had seen them all.

    Args:
        num_clients: K, the number of clients (length of the per-client states).
        num_classes: C, the number of classes (width of the logits).
        validate_args: check shapes and the range of ``target`` and ``client`` in ``update``.
            The range check reads four numbers back from the device (one CPU-GPU sync per call);
            pass ``False`` in a hot loop once the caller is known to be right. An out-of-range
            index on a GPU otherwise ends in a device-side assert rather than an error message.
        **kwargs: passed to :class:`torchmetrics.Metric` (e.g. ``sync_on_compute``).

    Raises:
        ConfigError: if ``num_clients`` or ``num_classes`` is not a positive int.
    """

    full_state_update = False
    higher_is_better = None  # a dict of accuracies (higher is better) and losses (lower)
    is_differentiable = False

    correct: Tensor
    count: Tensor
    loss_sum: Tensor
    class_correct: Tensor
    class_count: Tensor

    def __init__(
        self, num_clients: int, num_classes: int, validate_args: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.num_clients = _positive_int("num_clients", num_clients)
        self.num_classes = _positive_int("num_classes", num_classes)
        self.validate_args = validate_args
        i64, f64 = torch.int64, torch.float64
        num_clients, num_classes = self.num_clients, self.num_classes
        self.add_state("correct", torch.zeros(num_clients, dtype=i64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(num_clients, dtype=i64), dist_reduce_fx="sum")
        self.add_state("loss_sum", torch.zeros(num_clients, dtype=f64), dist_reduce_fx="sum")
        self.add_state("class_correct", torch.zeros(num_classes, dtype=i64), dist_reduce_fx="sum")
        self.add_state("class_count", torch.zeros(num_classes, dtype=i64), dist_reduce_fx="sum")

    def update(self, logits: Tensor, target: Tensor, client: Tensor) -> None:  # type: ignore[override]
        """Add a batch of samples to the sums of their clients and classes.

        Args:
            logits: ``[n, C]`` unnormalized scores. The loss is computed in their dtype.
            target: ``[n]`` class index of each sample (int64).
            client: ``[n]`` client index of each sample (int64), in ``[0, K)``.
        """
        if self.validate_args:
            self._check(logits, target, client)
        hit = (logits.argmax(-1) == target).to(torch.int64)
        loss = F.cross_entropy(logits, target, reduction="none").to(torch.float64)
        ones = torch.ones_like(hit)
        self.correct.index_add_(0, client, hit)
        self.count.index_add_(0, client, ones)
        self.loss_sum.index_add_(0, client, loss)
        self.class_correct.index_add_(0, target, hit)
        self.class_count.index_add_(0, target, ones)

    def compute(self) -> dict[str, Tensor]:  # type: ignore[override]
        """:func:`per_client_summary` of the (synced) sums."""
        return per_client_summary(
            self.correct,
            self.count,
            self.loss_sum,
            class_correct=self.class_correct,
            class_count=self.class_count,
        )

    def _check(self, logits: Tensor, target: Tensor, client: Tensor) -> None:
        n = target.shape[0] if target.dim() == 1 else -1
        if logits.dim() != 2 or logits.shape != (n, self.num_classes) or client.shape != (n,):
            raise ValueError(
                f"PerClientClassification.update: expected logits [n, {self.num_classes}], "
                f"target [n] and client [n]; got {tuple(logits.shape)}, {tuple(target.shape)} "
                f"and {tuple(client.shape)}"
            )
        if n == 0:
            return
        bounds = torch.stack([*torch.aminmax(target), *torch.aminmax(client.to(target.dtype))])
        t_lo, t_hi, c_lo, c_hi = bounds.tolist()  # the CPU-GPU sync
        for name, lo, hi, size in (
            ("target", t_lo, t_hi, self.num_classes),
            ("client", c_lo, c_hi, self.num_clients),
        ):
            if lo < 0 or hi >= size:
                raise ValueError(
                    f"PerClientClassification.update: {name} indices must lie in [0, {size}); "
                    f"got values in [{lo}, {hi}]"
                )


class PooledScores(Metric):
    """Base of the metrics of a binary scorer over all evaluated rows, gathered from every
    process: ``update(logits [n, 2], target [n], client [n])`` keeps the score
    ``logits[:, 1] − logits[:, 0]`` (class 1 positive) and the target of every row; the
    subclass computes a scalar of all of them (independent of the order of the rows)."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.add_state("scores", [], dist_reduce_fx="cat")
        self.add_state("targets", [], dist_reduce_fx="cat")

    def update(self, logits: Tensor, target: Tensor, client: Tensor) -> None:  # type: ignore[override]
        self.scores.append((logits[:, 1] - logits[:, 0]).detach().to(torch.float64))  # type: ignore[union-attr,operator]
        self.targets.append(target.detach().long())  # type: ignore[union-attr,operator]

    def gathered(self) -> tuple[Tensor, Tensor]:
        """Every row's score (float64) and target, from every process."""
        from torchmetrics.utilities import dim_zero_cat

        return dim_zero_cat(self.scores), dim_zero_cat(self.targets)  # type: ignore[arg-type]


class PooledAveragePrecision(PooledScores):
    """Average precision of a binary scorer over all evaluated rows (FCSG §5.3's metric):
    torchmetrics' exact :class:`~torchmetrics.classification.BinaryAveragePrecision` of all
    rows (:class:`PooledScores`)."""

    def compute(self) -> Tensor:  # type: ignore[override]
        from torchmetrics.functional.classification import binary_average_precision

        scores, targets = self.gathered()
        # Scores mapped into [0, 1] by a monotone affine map: torchmetrics would apply a sigmoid
        # to scores outside [0, 1], which ties large scores (sigmoid(40) == 1 in float64).
        lo, span = scores.min(), (scores.max() - scores.min()).clamp_min(1e-300)
        return binary_average_precision((scores - lo) / span, targets)


def tpr_violation(tp: Tensor, pos: Tensor) -> Tensor:
    """``max_a |TPR − TPR_a|`` from per-group true positives and positives ``[G]`` (the
    functional twin of :class:`TPRGapViolation`): ``TPR = Σ tp / Σ pos`` over all groups,
    ``TPR_a = tp_a / pos_a``; groups without positives are left out; NaN with no positive."""
    tp, pos = tp.to(torch.float64), pos.to(torch.float64)
    has = pos > 0
    if not bool(has.any()):
        return _nan(tp)
    overall = tp.sum() / pos.sum()
    return (overall - tp[has] / pos[has]).abs().max()


class TPRGapViolation(Metric):
    """Equality-of-opportunity violation of a binary classifier: the largest gap between the
    overall true positive rate and a protected group's (FedDRO §6, after Haddadpour et al.
    2022), with hard predictions ``ŷ = 1(logit₁ > logit₀)``.

    ``update(logits [n, 2], target [n, 2], client [n])`` reads the label from ``target[:, 0]``
    and the group from ``target[:, 1]`` and adds each positive row to its group's sums
    (``tp``: predicted positive, ``pos``: all); ``compute()`` is :func:`tpr_violation` of the
    synced sums.

    Args:
        num_groups: G.
    """

    full_state_update = False
    higher_is_better = False
    is_differentiable = False

    tp: Tensor
    pos: Tensor

    def __init__(self, num_groups: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_groups = _positive_int("num_groups", num_groups)
        i64 = torch.int64
        self.add_state("tp", torch.zeros(self.num_groups, dtype=i64), dist_reduce_fx="sum")
        self.add_state("pos", torch.zeros(self.num_groups, dtype=i64), dist_reduce_fx="sum")

    def update(self, logits: Tensor, target: Tensor, client: Tensor) -> None:  # type: ignore[override]
        if target.dim() != 2 or target.shape[1] < 2:
            raise ValueError(
                "TPRGapViolation.update: expected targets [n, 2] (label, protected group), got "
                f"{tuple(target.shape)}; run it on data whose targets carry the group "
                "(data.name=adult)"
            )
        positive = target[:, 0] == 1
        group = target[positive, 1]
        hit = (logits[positive, 1] > logits[positive, 0]).to(torch.int64)
        self.tp.index_add_(0, group, hit)
        self.pos.index_add_(0, group, torch.ones_like(hit))

    def compute(self) -> Tensor:  # type: ignore[override]
        return tpr_violation(self.tp, self.pos)


def accuracy_at_prior(scores: Tensor, targets: Tensor) -> Tensor:
    """Accuracy of a scorer cut at the prior-matched threshold: with P positives among the n
    rows, the threshold τ is the P-th largest score and a row is predicted positive when its
    score is ≥ τ (rows tied at τ all positive; P = 0: every row negative).

    A ranking loss (AP, AUC) fixes the order of the scores, not their offset, so accuracy at
    the score 0 can be that of a constant predictor for a good ranking; at τ as many rows are
    predicted positive as there are positives (without ties precision = recall there, the
    break-even point or R-precision), which depends on the ranking alone. Without ties it is
    ``1 − 2 FN / n``.
    """
    targets = targets.long()
    p = int((targets == 1).sum())
    if p == 0:
        return (targets == 0).double().mean()
    tau = torch.topk(scores, p).values[-1]
    return ((scores >= tau).long() == targets).double().mean()


class PooledAccuracyAtPrior(PooledScores):
    """:func:`accuracy_at_prior` over all evaluated rows (:class:`PooledScores`): the
    threshold matches the number of positives of the evaluated split itself (on the AUPRC
    task's test split, half of it)."""

    def compute(self) -> Tensor:  # type: ignore[override]
        scores, targets = self.gathered()
        return accuracy_at_prior(scores, targets)
