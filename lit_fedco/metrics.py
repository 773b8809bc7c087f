"""Per-client metrics as torchmetrics sum states.

Every state is a fixed-shape sum (``[K]`` per client, ``[C]`` per class) reduced with
``dist_reduce_fx="sum"``, so the numbers are the same on 1 or N processes: each process adds
the rows of the clients it evaluates, the sync adds the processes. Average, worst and
percentile client accuracy are computed from the synced sums by :func:`per_client_summary`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric


def per_client_summary(
    correct: Tensor,
    count: Tensor,
    loss_sum: Tensor,
    class_correct: Tensor | None = None,
    class_count: Tensor | None = None,
) -> dict[str, Tensor]:
    """Summaries of per-client sums; clients (classes) with no samples are left out.

    Returns:
        ``acc_avg`` (mean over clients of per-client accuracy), ``acc_worst`` (min),
        ``acc_p10`` (10th percentile, linear interpolation), ``acc_best``, ``acc_pooled``
        (all samples together), ``loss_avg``, ``loss_worst`` (max per-client mean loss), the
        vectors ``acc_per_client`` and ``loss_per_client`` (NaN where a client has no samples),
        and with class sums ``acc_per_class`` and ``class_acc_worst``.
    """
    has = count > 0
    acc = torch.where(has, correct / count.clamp_min(1), torch.nan)
    loss = torch.where(has, loss_sum / count.clamp_min(1), torch.nan)
    a, lo = acc[has], loss[has]
    out = {
        "acc_avg": a.mean(),
        "acc_worst": a.min(),
        "acc_p10": torch.quantile(a, 0.1),
        "acc_best": a.max(),
        "acc_pooled": correct.sum() / count.sum(),
        "loss_avg": lo.mean(),
        "loss_worst": lo.max(),
        "acc_per_client": acc,
        "loss_per_client": loss,
    }
    if class_correct is not None and class_count is not None:
        hc = class_count > 0
        ca = torch.where(hc, class_correct / class_count.clamp_min(1), torch.nan)
        out["acc_per_class"] = ca
        out["class_acc_worst"] = ca[hc].min()
    return out


class PerClientClassification(Metric):
    """Per-client (and per-class) accuracy and cross-entropy of a classifier.

    ``update(logits [n, C], target [n], client [n])`` adds each sample to its client's and its
    class's sums. ``compute()`` returns :func:`per_client_summary` of the synced sums.

    Args:
        num_clients: K.
        num_classes: C.
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, num_clients: int, num_classes: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.num_clients, self.num_classes = num_clients, num_classes
        z = torch.float64
        self.add_state("correct", torch.zeros(num_clients, dtype=z), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(num_clients, dtype=z), dist_reduce_fx="sum")
        self.add_state("loss_sum", torch.zeros(num_clients, dtype=z), dist_reduce_fx="sum")
        self.add_state("class_correct", torch.zeros(num_classes, dtype=z), dist_reduce_fx="sum")
        self.add_state("class_count", torch.zeros(num_classes, dtype=z), dist_reduce_fx="sum")

    def update(self, logits: Tensor, target: Tensor, client: Tensor) -> None:  # type: ignore[override]
        hit = (logits.argmax(-1) == target).to(torch.float64)
        loss = F.cross_entropy(logits, target, reduction="none").to(torch.float64)
        ones = torch.ones_like(hit)
        self.correct.index_add_(0, client, hit)  # type: ignore[operator,union-attr]
        self.count.index_add_(0, client, ones)  # type: ignore[operator,union-attr]
        self.loss_sum.index_add_(0, client, loss)  # type: ignore[operator,union-attr]
        self.class_correct.index_add_(0, target, hit)  # type: ignore[operator,union-attr]
        self.class_count.index_add_(0, target, ones)  # type: ignore[operator,union-attr]

    def compute(self) -> dict[str, Tensor]:  # type: ignore[override]
        return per_client_summary(
            self.correct,  # type: ignore[arg-type]
            self.count,  # type: ignore[arg-type]
            self.loss_sum,  # type: ignore[arg-type]
            self.class_correct,  # type: ignore[arg-type]
            self.class_count,  # type: ignore[arg-type]
        )
