"""Partitioners: pure functions of labels and an explicit RNG."""

from __future__ import annotations

import numpy as np
import pytest

from lit_fedco.core.errors import ConfigError
from lit_fedco.data.partition import (
    partition_dirichlet,
    partition_dominant_class,
    partition_iid,
    partition_quantity_imbalanced,
    partition_stats,
    validation_like,
)
from lit_fedco.data.partition_skews import (
    partition_natural,
    partition_shards,
    partition_size_skew,
    validation_own,
)

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


PARTITIONERS = {
    "iid": lambda g: partition_iid(LABELS, 5, g),
    "dirichlet": lambda g: partition_dirichlet(LABELS, 5, 0.5, g),
    "quantity": lambda g: partition_quantity_imbalanced(LABELS, 5, 300, 20, g, small_classes=3),
    "dominant_class": lambda g: partition_dominant_class(LABELS, 5, 0.28, g),
    "shards": lambda g: partition_shards(LABELS, 5, 2, g),
    "size_skew": lambda g: partition_size_skew(LABELS, 5, 1.0, g),
}


@pytest.mark.parametrize("name", sorted(PARTITIONERS))
def test_partitions_are_deterministic_in_the_rng_and_vary_with_it(name):
    a, b, c = (PARTITIONERS[name](rng(s)) for s in (1, 1, 2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    assert disjoint(a) and len(a) == 5
    for p in a:  # sorted int64 indices into LABELS
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)
        assert p.min() >= 0 and p.max() < len(LABELS)


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


def test_quantity_split_without_small_classes_uses_all_classes():
    for small_classes in (None, 0):
        parts = partition_quantity_imbalanced(LABELS, 3, 600, 200, rng(), small_classes)
        assert [len(p) for p in parts] == [600, 200, 200] and disjoint(parts)
        assert all(len(np.unique(LABELS[p])) == 10 for p in parts)


def test_quantity_split_big_client_is_roughly_uniform():
    parts = partition_quantity_imbalanced(LABELS, 10, 500, 20, rng(), small_classes=2)
    counts = np.bincount(LABELS[parts[0]], minlength=10)
    assert counts.min() >= 30 and counts.max() <= 70  # 50 expected per class


def test_dominant_class_fraction_is_rho():
    parts = partition_dominant_class(LABELS, 10, 0.28, rng(), samples_per_client=50)
    assert disjoint(parts)
    for i, p in enumerate(parts):
        counts = np.bincount(LABELS[p], minlength=10)
        assert len(p) == 50
        assert counts[i] == 14  # 0.28 · 50
        assert all(abs(counts[j] - 0.08 * 50) <= 1 for j in range(10) if j != i)


@pytest.mark.parametrize("num_clients", [2, 3, 7, 11, 13, 17, 23])
@pytest.mark.parametrize("rho", [0.13, 0.28, 0.5, 0.91])
def test_dominant_class_gives_equal_sizes_when_rounding_is_tight(num_clients, rho):
    labels = np.repeat(np.arange(10), np.arange(100, 110))  # uneven classes
    parts = partition_dominant_class(labels, num_clients, rho, rng())
    assert len({len(p) for p in parts}) == 1 and disjoint(parts)
    n = len(parts[0])
    for i, p in enumerate(parts):
        assert abs(np.bincount(labels[p], minlength=10)[i % 10] - rho * n) < 1


def test_dominant_class_default_size_uses_the_data():
    parts = partition_dominant_class(LABELS, 10, 0.28, rng())
    assert [len(p) for p in parts] == [100] * 10  # 0.28 + 9 · 0.08 = 1: every sample is used
    assert disjoint(parts)


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


def test_validation_like_is_without_replacement_within_a_client():
    pool = np.repeat(np.arange(10), 30)
    val = validation_like([LABELS[:100], LABELS[100:300]], pool, 30, rng())
    assert [len(v) for v in val] == [30, 30]
    assert len(set(val[0].tolist())) == 30 and set(pool[val[0]].tolist()) == {0}
    assert np.bincount(pool[val[1]], minlength=10).tolist() == [0, 15, 15] + [0] * 7


def test_validation_like_edge_cases():
    pool = np.repeat(np.arange(3), [2, 50, 50])
    # a class with too few held-out samples: all of them, then the rest with replacement
    (v,) = validation_like([np.zeros(5, dtype=int)], pool, 6, rng())
    assert len(v) == 6 and set(pool[v].tolist()) == {0} and set(v.tolist()) == {0, 1}
    # a client with no labels (or none in the pool) gets the pool's proportions
    empty, alien = validation_like([np.array([], dtype=int), np.array([7, 7])], pool, 51, rng())
    assert np.bincount(pool[empty], minlength=3).tolist() == [1, 25, 25]
    assert len(alien) == 51
    # classes absent from the pool are left out of the proportions
    (mixed,) = validation_like([np.array([1, 1, 7, 7])], pool, 10, rng())
    assert set(pool[mixed].tolist()) == {1} and len(mixed) == 10


def test_partition_stats_counts_classes():
    parts = [np.array([0, 1, 100]), np.array([999])]
    stats = partition_stats(LABELS, parts, 10)
    assert stats["sizes"] == [3, 1]
    assert stats["class_counts"] == [[2, 1] + [0] * 8, [0] * 9 + [1]]


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
        (
            lambda: partition_iid(LABELS[:5], 6, rng()),
            r"data\.num_clients: got 6, expected at most the 5 samples",
        ),
        (
            lambda: partition_dirichlet(LABELS, 0, 0.5, rng()),
            r"data\.num_clients: got 0, expected an int >= 1",
        ),
        (
            lambda: partition_dirichlet(LABELS, 10, 0.5, rng(), min_size=101),
            r"data\.num_clients: got 10, expected num_clients \* min_size <= the 1000 samples",
        ),
        (
            lambda: partition_dirichlet(LABELS, 10, 0.001, rng(), min_size=90, max_tries=3),
            r"data\.alpha: got 0\.001, .*failed 3 draws",
        ),
        (
            lambda: partition_quantity_imbalanced(LABELS, 10, 100, 0, rng()),
            r"data\.small: got 0, expected an int >= 1",
        ),
        (
            lambda: partition_quantity_imbalanced(LABELS, 10, 0, 20, rng()),
            r"data\.big: got 0, expected an int >= 1",
        ),
        (
            lambda: partition_quantity_imbalanced(LABELS, 10, 100, 60, rng(), small_classes=1),
            r"data\.small: got 60",
        ),
        (
            lambda: partition_dominant_class(LABELS, 10, 0.0, rng()),
            r"data\.rho: got 0\.0, expected a float in \(0, 1\)",
        ),
        (
            lambda: partition_dominant_class(LABELS, 10, 0.28, rng(), samples_per_client=101),
            r"data\.samples_per_client: got 101, expected an int in \[1, 100\]",
        ),
        (
            lambda: partition_dominant_class(np.zeros(50, dtype=int), 5, 0.28, rng()),
            r"data\.partition: 'dominant_class' needs labels of >= 2 classes",
        ),
    ],
)
def test_bad_arguments_raise_config_errors(call, pattern):
    with pytest.raises(ConfigError, match=pattern):
        call()


# ---------------------------------------------------------------------- shards, size_skew, natural
UNEVEN = np.repeat(np.arange(7), [5, 40, 90, 13, 200, 61, 3])  # 412 samples, uneven classes


def covers_once(parts, n):
    allidx = np.concatenate(parts)
    return sorted(allidx.tolist()) == list(range(n))


@pytest.mark.parametrize("labels", [LABELS, UNEVEN], ids=["even", "uneven"])
@pytest.mark.parametrize(("k", "per"), [(5, 2), (20, 2), (10, 1), (7, 3), (50, 4)])
def test_shards_give_each_client_at_most_k_classes_and_every_sample_once(labels, k, per):
    parts = partition_shards(labels, k, per, rng(3))
    assert len(parts) == k and covers_once(parts, len(labels))
    assert all(len(p) > 0 and len(np.unique(labels[p])) <= per for p in parts)
    if labels is LABELS and k * per % 10 == 0:  # shards of one size: clients of one size
        assert max(map(len, parts)) - min(map(len, parts)) <= per


def test_shards_of_one_class_per_client_are_whole_class_slices():
    parts = partition_shards(LABELS, 10, 1, rng())
    assert sorted(int(np.unique(LABELS[p])[0]) for p in parts) == list(range(10))
    assert [len(p) for p in parts] == [100] * 10


def test_size_skew_sizes_follow_the_lognormal_draws():
    for sigma in (0.5, 1.0, 2.0):
        parts = partition_size_skew(LABELS, 12, sigma, rng(7))
        assert covers_once(parts, len(LABELS)) and min(map(len, parts)) >= 1
        weights = rng(7).lognormal(0.0, sigma, 12)  # the partitioner's first draws
        sizes = np.array([len(p) for p in parts])
        # sizes are 1 + the largest-remainder rounding of (N - K) * w / sum(w)
        assert np.all(np.abs(sizes - 1 - weights / weights.sum() * (1000 - 12)) < 1)
        order = np.argsort(weights)
        assert np.all(np.diff(sizes[order]) >= 0)  # larger draws, larger clients


def test_size_skew_sigma_zero_is_equal_and_larger_sigma_more_skewed():
    equal = partition_size_skew(LABELS, 8, 0.0, rng())
    assert {len(p) for p in equal} == {125}

    def spread(sigma):  # coefficient of variation of the sizes, over seeds
        sizes = [[len(p) for p in partition_size_skew(LABELS, 20, sigma, rng(s))] for s in range(5)]
        return float(np.mean([np.std(z) / np.mean(z) for z in sizes]))

    assert spread(0.3) < spread(1.0) < spread(2.0)


def test_natural_gives_each_group_its_own_client():
    groups = np.array(["w3", "w1", "w2", "w1", "w3", "w3", "w2", "w1", "w9"])
    parts = partition_natural(groups, 4)
    assert [groups[p].tolist() for p in parts] == [["w1"] * 3, ["w2"] * 2, ["w3"] * 3, ["w9"]]
    assert covers_once(parts, len(groups))
    ints = partition_natural(np.array([5, 2, 5, 2, 7]), 3)
    assert [p.tolist() for p in ints] == [[1, 3], [0, 2], [4]]
    assert all(p.dtype == np.int64 for p in ints)


def test_validation_own_gives_each_client_its_groups_held_out_rows():
    train = np.array(["b", "a", "c", "a"])
    test = np.array(["c", "a", "zz", "b", "a", "c"])
    val = validation_own(train, test)  # clients a, b, c; the row of zz is nobody's
    assert [test[v].tolist() for v in val] == [["a", "a"], ["b"], ["c", "c"]]
    with pytest.raises(ConfigError, match=r"data\.val_mode: got 'own', but 1 of the 3 clients have "
                       r"no held-out row of their own \(client 1, group 'b'"):  # fmt: skip
        validation_own(train, np.array(["a", "c"]))
    with pytest.raises(ConfigError, match=r"training group ids are strings and the test split's"):
        validation_own(train, np.array([1, 2]))


@pytest.mark.parametrize(
    "call,pattern",
    [
        (lambda: partition_shards(LABELS, 5, 0, rng()), r"data\.shards_per_client: got 0, expected an int >= 1"),  # noqa: E501
        (lambda: partition_shards(LABELS, 4, 2, rng()), r"data\.shards_per_client: got 2, expected at least 3, so that each of the 10 classes"),  # noqa: E501
        (lambda: partition_shards(LABELS[:30], 10, 4, rng()), r"data\.shards_per_client: got 4, expected num_clients \* shards_per_client <= the 30 samples"),  # noqa: E501
        (lambda: partition_shards(LABELS[:5], 6, 1, rng()), r"data\.num_clients: got 6, expected at most the 5 samples"),  # noqa: E501
        (lambda: partition_size_skew(LABELS, 5, -0.1, rng()), r"data\.size_sigma: got -0\.1, expected a float >= 0"),  # noqa: E501
        (lambda: partition_size_skew(LABELS[:3], 4, 1.0, rng()), r"data\.num_clients: got 4, expected at most the 3 samples"),  # noqa: E501
        (lambda: partition_natural(np.array([1, 2, 2]), 3), r"data\.num_clients: got 3, expected the 2 group ids of the training data .*; set e\.g\. data\.num_clients=2"),  # noqa: E501
    ],
)  # fmt: skip
def test_new_partitions_refuse_bad_arguments(call, pattern):
    with pytest.raises(ConfigError, match=pattern):
        call()
