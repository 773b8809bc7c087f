"""Partitioners: pure functions of labels and an explicit RNG."""

from __future__ import annotations

import numpy as np
import pytest

from lit_fedco.data.partition import (
    partition_dirichlet,
    partition_dominant_class,
    partition_iid,
    partition_quantity_imbalanced,
    partition_stats,
    validation_like,
)
from lit_fedco.errors import ConfigError

LABELS = np.repeat(np.arange(10), 100)  # 1000 samples, 100 per class


def rng(seed=0):
    return np.random.default_rng(seed)


def disjoint(parts):
    allidx = np.concatenate(parts)
    return len(allidx) == len(set(allidx.tolist()))


def test_iid_covers_everything_once():
    parts = partition_iid(LABELS, 7, rng())
    assert disjoint(parts) and sum(map(len, parts)) == len(LABELS)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_partitions_are_deterministic_in_the_rng_and_vary_with_it():
    a = partition_dirichlet(LABELS, 5, 0.5, rng(1))
    b = partition_dirichlet(LABELS, 5, 0.5, rng(1))
    c = partition_dirichlet(LABELS, 5, 0.5, rng(2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def _mean_max_class_fraction(parts):
    return np.mean([np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts])


def test_dirichlet_small_alpha_is_more_skewed():
    skewed = np.mean(
        [_mean_max_class_fraction(partition_dirichlet(LABELS, 10, 0.1, rng(s))) for s in range(5)]
    )
    flat = np.mean(
        [_mean_max_class_fraction(partition_dirichlet(LABELS, 10, 100.0, rng(s))) for s in range(5)]
    )
    assert skewed > 0.5 > 0.2 > flat
    parts = partition_dirichlet(LABELS, 10, 0.1, rng())
    assert disjoint(parts) and sum(map(len, parts)) == len(LABELS)


def test_quantity_split_sizes_and_small_classes():
    parts = partition_quantity_imbalanced(LABELS, 10, 500, 20, rng(), small_classes=2)
    assert [len(p) for p in parts] == [500] + [20] * 9
    assert disjoint(parts)
    assert len(np.unique(LABELS[parts[0]])) == 10
    for p in parts[1:]:
        assert len(np.unique(LABELS[p])) <= 2


def test_dominant_class_fraction_is_rho():
    parts = partition_dominant_class(LABELS, 10, 0.28, rng(), samples_per_client=50)
    assert disjoint(parts)
    for i, p in enumerate(parts):
        counts = np.bincount(LABELS[p], minlength=10)
        assert len(p) == 50
        assert counts[i] == 14  # 0.28 · 50
        assert all(abs(counts[j] - 0.08 * 50) <= 1 for j in range(10) if j != i)


def test_validation_like_matches_class_proportions():
    parts = partition_quantity_imbalanced(LABELS, 4, 200, 20, rng(), small_classes=2)
    pool = np.repeat(np.arange(10), 30)
    val = validation_like([LABELS[p] for p in parts], pool, 40, rng())
    for p, v in zip(parts, val, strict=True):
        assert len(v) == 40
        train_frac = np.bincount(LABELS[p], minlength=10) / len(p)
        val_frac = np.bincount(pool[v], minlength=10) / len(v)
        assert np.abs(train_frac - val_frac).max() <= 1 / 40 + 1e-12
    stats = partition_stats(LABELS, parts, 10)
    assert stats["sizes"] == [200, 20, 20, 20]


@pytest.mark.parametrize(
    "call,pattern",
    [
        (
            lambda: partition_iid(LABELS, 0, rng()),
            r"data\.num_clients: got 0, expected an int >= 1",
        ),
        (
            lambda: partition_dirichlet(LABELS, 5, -1.0, rng()),
            r"data\.alpha: got -1\.0, expected a float > 0",
        ),
        (
            lambda: partition_quantity_imbalanced(LABELS, 10, 5000, 20, rng()),
            r"data\.big: got 5000",
        ),
        (
            lambda: partition_quantity_imbalanced(LABELS, 10, 100, 20, rng(), 11),
            r"data\.small_classes: got 11",
        ),
        (
            lambda: partition_dominant_class(LABELS, 10, 1.5, rng()),
            r"data\.rho: got 1\.5, expected a float in \(0, 1\)",
        ),
        (lambda: validation_like([LABELS[:5]], LABELS, 0, rng()), r"data\.val_per_client: got 0"),
    ],
)
def test_bad_arguments_raise_config_errors(call, pattern):
    with pytest.raises(ConfigError, match=pattern):
        call()
