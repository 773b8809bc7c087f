"""Per-client metrics: equal to a plain numpy computation, and the same on 1 or 2 processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.metrics import PerClientClassification, per_client_summary
from tests.helpers import REPO, free_port

K, C = 7, 4


def random_batches(sizes=(13, 40, 5), seed=0, dtype=torch.float64):
    """Batches with unequal client sizes; client K-1 never appears."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for size in sizes:
        logits = torch.randn(size, C, generator=g, dtype=dtype)
        target = torch.randint(0, C, (size,), generator=g)
        client = torch.randint(0, K - 1, (size,), generator=g)
        out.append((logits, target, client))
    return out


def numpy_reference(logits, target, client, k, c):
    logits, target, client = (t.double().numpy() for t in (logits, target, client))
    target, client = target.astype(int), client.astype(int)
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    loss = -logp[np.arange(len(target)), target]
    hit = logits.argmax(1) == target
    nan = float("nan")
    acc_k = np.array([hit[client == i].mean() if (client == i).any() else nan for i in range(k)])
    loss_k = np.array([loss[client == i].mean() if (client == i).any() else nan for i in range(k)])
    acc_c = np.array([hit[target == j].mean() if (target == j).any() else nan for j in range(c)])
    acc, lss = acc_k[~np.isnan(acc_k)], loss_k[~np.isnan(loss_k)]
    return {
        "acc_avg": acc.mean(),
        "acc_worst": acc.min(),
        "acc_best": acc.max(),
        "acc_p10": np.quantile(acc, 0.1),
        "acc_pooled": hit.mean(),
        "loss_avg": lss.mean(),
        "loss_worst": lss.max(),
        "class_acc_worst": np.nanmin(acc_c),
        "acc_per_client": acc_k,
        "loss_per_client": loss_k,
        "acc_per_class": acc_c,
    }


def assert_matches(out, ref, rel=1e-12):
    assert set(out) == set(ref)
    for key, want in ref.items():
        got = out[key].cpu().numpy()
        assert got.dtype == np.float64, key
        np.testing.assert_allclose(got, want, rtol=rel, atol=0, equal_nan=True, err_msg=key)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_per_client_metrics_equal_numpy(dtype):
    metric = PerClientClassification(K, C)
    batches = random_batches(dtype=dtype)
    for batch in batches:  # several updates
        metric.update(*batch)
    out = metric.compute()
    ref = numpy_reference(*(torch.cat(t) for t in zip(*batches, strict=True)), K, C)
    assert_matches(out, ref, rel=1e-12 if dtype == torch.float64 else 1e-6)
    assert math.isnan(out["acc_per_client"][K - 1])  # no samples: left out of avg and worst
    assert metric.count.dtype == torch.int64 and int(metric.count.sum()) == 58
    metric.reset()
    assert int(metric.count.sum()) == 0 and float(metric.loss_sum.abs().sum()) == 0.0


def test_summary_by_hand():
    """Three clients, one empty: accuracies 1/2 and 3/4; p10 interpolates between them."""
    out = per_client_summary(
        torch.tensor([1, 0, 3]),
        torch.tensor([2, 0, 4]),
        torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64),
        class_correct=torch.tensor([4, 0]),
        class_count=torch.tensor([5, 1]),
    )
    assert float(out["acc_avg"]) == 0.625 and float(out["acc_worst"]) == 0.5
    assert float(out["acc_best"]) == 0.75
    assert float(out["acc_p10"]) == pytest.approx(0.525, rel=1e-15)
    assert float(out["acc_pooled"]) == 4 / 6
    assert float(out["loss_avg"]) == 0.5 and float(out["loss_worst"]) == 0.5
    assert out["acc_per_class"].tolist() == [0.8, 0.0] and float(out["class_acc_worst"]) == 0.0
    assert "acc_per_class" not in per_client_summary(*(torch.ones(2),) * 3)


def test_no_samples_gives_nan_not_an_error():
    with pytest.warns(UserWarning, match="called before the ``update``"):
        out = PerClientClassification(3, 2).compute()
    assert all(torch.isnan(v).all() for v in out.values())


def test_bad_arguments():
    with pytest.raises(ConfigError, match=r"num_clients: got 0, expected an int >= 1"):
        PerClientClassification(0, 2)
    metric = PerClientClassification(3, 2)
    logits, target = torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"client indices must lie in \[0, 3\); got .* \[0, 3\]"):
        metric.update(logits, target, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"expected logits \[n, 2\]"):
        metric.update(torch.zeros(4, 3), target, torch.zeros(4, dtype=torch.int64))


# ------------------------------------------------------------------ 1 vs 2 processes
TWO_PROCESS_SCRIPT = """
import datetime, json, os, sys
import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy
from lit_fedco.core.metrics import PerClientClassification

# a dead peer fails the job in 60 s instead of gloo's default 30 min
strategy = DDPStrategy(timeout=datetime.timedelta(seconds=60))
fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
fabric.launch()  # LOCAL_RANK is set: the processes were started outside, as torchrun does
rank, world = fabric.global_rank, fabric.world_size
logits, target, client = torch.load(sys.argv[1])
by_client = PerClientClassification({k}, {c})  # each rank holds its clients, as the loop shards
mine = client % world == rank
by_client.update(logits[mine], target[mine], client[mine])
by_sample = PerClientClassification({k}, {c})  # each rank holds half of every client's samples
by_sample.update(logits[rank::world], target[rank::world], client[rank::world])
out = {{"world": world}}
for name, metric in (("by_client", by_client), ("by_sample", by_sample)):
    out[name] = {{key: v.tolist() for key, v in metric.compute().items()}}  # compute() syncs
    with metric.sync_context():  # the raw sums, synced
        out[name]["count"] = metric.count.tolist()
if rank == 0:
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
torch.distributed.destroy_process_group()
os._exit(0)  # skip the interpreter's teardown of torch: seconds on a small machine
"""


def run_two_processes(args: list[str], cwd: Path, timeout: float = 120) -> None:
    """Start both ranks at once, as ``torchrun`` does (Fabric sees ``LOCAL_RANK`` and does not
    re-launch): the two imports of torch and Lightning overlap instead of running one after the
    other, which halves the wall time of this test on a small machine."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),  # parallel test runs do not collide
        "NODE_RANK": "0",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            args, cwd=cwd, env={**env, "LOCAL_RANK": str(r)}, stderr=subprocess.PIPE, text=True
        )
        for r in range(2)
    ]
    try:
        errs = [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:  # a rank that failed leaves its peer waiting: end it
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, err) in enumerate(zip(procs, errs, strict=True)):
        assert p.returncode == 0, f"rank {r}: {err[-3000:]}"


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
    """A real 2-process gloo job (Fabric ddp): synced sums give the 1-process result."""
    batches = random_batches(sizes=(50, 31, 17), seed=1)
    logits, target, client = (torch.cat(t) for t in zip(*batches, strict=True))
    torch.save((logits, target, client), tmp_path / "data.pt")
    script = tmp_path / "two_process_metrics.py"
    script.write_text(textwrap.dedent(TWO_PROCESS_SCRIPT.format(k=K, c=C)))
    run_two_processes(
        [sys.executable, str(script), str(tmp_path / "data.pt"), str(tmp_path / "out.json")],
        cwd=tmp_path,
    )
    two = json.loads((tmp_path / "out.json").read_text())
    assert two["world"] == 2

    one = PerClientClassification(K, C)
    one.update(logits, target, client)
    ref = {key: v.numpy() for key, v in one.compute().items()}
    for name in ("by_client", "by_sample"):
        assert two[name].pop("count") == one.count.tolist()  # counts exactly
        got = {key: np.array(v, dtype=np.float64) for key, v in two[name].items()}
        assert_matches({k: torch.from_numpy(v) for k, v in got.items()}, ref, rel=1e-12)
    for key in ("acc_avg", "acc_worst", "acc_p10", "acc_pooled", "class_acc_worst"):
        assert two["by_sample"][key] == float(ref[key]), key  # ratios of exact counts
