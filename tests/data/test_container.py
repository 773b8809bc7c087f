"""The container's partition statistics, checked against counts taken from the labels."""

from __future__ import annotations

import itertools
import json
import statistics
from types import SimpleNamespace

import numpy as np

from lit_fedco.data import FederatedData, format_partition_stats, make_federated


def data_set(**kw) -> FederatedData:
    cfg = dict(
        name="digits",
        data_dir="",
        partition="quantity",
        num_clients=6,
        big=200,
        small=20,
        small_classes=2,
        alpha=0.5,
        rho=0.28,
        val_per_client=30,
        seed=0,
    )
    cfg.update(kw)
    return make_federated(SimpleNamespace(**cfg))


def counts_from_labels(y: np.ndarray, offsets: np.ndarray, c: int) -> list[list[int]]:
    """Per-client class counts, one bincount per client slice (the definition)."""
    return [np.bincount(y[lo:hi], minlength=c).tolist() for lo, hi in itertools.pairwise(offsets)]


def test_partition_stats_match_the_labels():
    data = data_set()
    stats = data.partition_stats()
    assert stats["name"] == "digits" and stats["num_clients"] == 6 and stats["num_classes"] == 10
    assert stats["train_sizes"] == [200] + [20] * 5
    assert stats["val_sizes"] == [30] * 6
    for split in ("train", "val"):
        _, y, off = data.arrays(split)
        expected = counts_from_labels(y.numpy(), off.numpy(), 10)
        assert stats[f"{split}_class_counts"] == expected
        assert [sum(row) for row in expected] == stats[f"{split}_sizes"]
        # the builder's own record agrees with the labels
        assert data.stats[split]["class_counts"] == expected
    # the small clients draw from 2 classes each (data.small_classes = 2)
    assert all(sum(n > 0 for n in row) <= 2 for row in stats["train_class_counts"][1:])
    json.dumps(stats)  # plain values, ready for a log


def test_partition_stats_of_a_synthetic_source_come_from_its_labels():
    spec = SimpleNamespace(
        name="invariant_logreg",
        num_clients=3,
        dim=4,
        sigma1=1.0,
        train_per_client=50,
        val_per_client=20,
        seed=1,
    )
    data = make_federated(spec)
    stats = data.partition_stats()
    assert stats["train_sizes"] == [50] * 3 and stats["val_sizes"] == [20] * 3
    y, off = data.y_train.numpy(), data.train_offsets.numpy()
    assert stats["train_class_counts"] == counts_from_labels(y, off, 2)


def test_format_partition_stats_is_short_for_many_clients():
    data = data_set(partition="iid", num_clients=100, val_per_client=5)
    stats = data.partition_stats()
    text = format_partition_stats(stats, max_clients=3)
    lines = text.splitlines()
    assert len(lines) == 4 + 3 + 1
    sizes = stats["train_sizes"]
    assert lines[0].startswith(f"digits: 100 clients, 10 classes, {sum(sizes)} training")
    assert f"min {min(sizes)}, median {statistics.median(sizes):g}, max {max(sizes)}" in lines[1]
    assert "min 5, median 5, max 5" in lines[2]
    row = stats["train_class_counts"][0]
    mix = " ".join(f"{c}:{n}" for c, n in enumerate(row) if n)
    assert lines[4] == f"  client 0: {sizes[0]} train, 5 val; classes {mix}"
    assert lines[-1] == "  ... 97 more clients"


def test_format_partition_stats_shortens_a_wide_class_mix():
    data = make_federated(
        SimpleNamespace(
            name="digits",
            data_dir="",
            partition="classes",
            num_clients=2,
            rotations=4,
            classes_per_client=0,
            heldout_classes=3,
            seed=0,
        )
    )
    stats = data.partition_stats()
    held = sum(n > 0 for n in stats["train_class_counts"][0])
    assert held == 14  # 7 training digits × 4 rotations, shared out over 2 clients
    text = format_partition_stats(stats)
    assert f"(+{held - 10} more)" in text.splitlines()[4]
    assert len(text.splitlines()) == 4 + 2
