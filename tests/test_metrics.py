"""Per-client metrics equal a plain numpy computation (1 vs 2 processes: tests/test_loop.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_fedco.metrics import PerClientClassification


def numpy_reference(logits, target, client, k, c):
    logits, target, client = logits.numpy(), target.numpy(), client.numpy()
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    loss = -logp[np.arange(len(target)), target]
    hit = logits.argmax(1) == target
    acc = np.array([hit[client == i].mean() for i in range(k) if (client == i).any()])
    lss = np.array([loss[client == i].mean() for i in range(k) if (client == i).any()])
    cls = np.array([hit[target == j].mean() for j in range(c) if (target == j).any()])
    return {
        "acc_avg": acc.mean(),
        "acc_worst": acc.min(),
        "acc_best": acc.max(),
        "acc_p10": np.quantile(acc, 0.1),
        "acc_pooled": hit.mean(),
        "loss_avg": lss.mean(),
        "loss_worst": lss.max(),
        "class_acc_worst": cls.min(),
    }


def test_per_client_metrics_equal_numpy():
    g = torch.Generator().manual_seed(0)
    k, c = 7, 4
    metric = PerClientClassification(k, c)
    chunks = []
    for size in (13, 40, 5):  # several updates, unequal client sizes; client 6 never seen
        logits = torch.randn(size, c, generator=g, dtype=torch.float64)
        target = torch.randint(0, c, (size,), generator=g)
        client = torch.randint(0, k - 1, (size,), generator=g)
        metric.update(logits, target, client)
        chunks.append((logits, target, client))
    out = metric.compute()
    ref = numpy_reference(*(torch.cat(t) for t in zip(*chunks, strict=True)), k, c)
    for key, v in ref.items():
        assert float(out[key]) == pytest.approx(v, rel=1e-12), key
    assert torch.isnan(out["acc_per_client"][6])  # no samples: left out of avg and worst
    metric.reset()
    assert float(metric.count.sum()) == 0.0
