"""Partitions beyond the label-based ones of :mod:`lit_fedco.data.partition`: McMahan et al.'s
shards (each client a few classes), quantity skew (log-normal client sizes), and the natural
split by a group id the data carries (a writer, a speaker, a user), with each client's own
held-out rows.

Every function takes its randomness from the one ``rng`` it is given, and refuses an impossible
split with a :class:`~lit_fedco.core.errors.ConfigError` naming the key."""

from __future__ import annotations

import numpy as np

from lit_fedco.core.errors import ConfigError
from lit_fedco.data.partition import _check_clients, _largest_remainder


def partition_shards(
    labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """The pathological non-IID split of McMahan et al. (2017): the samples are cut into
    ``num_clients × shards_per_client`` shards of (nearly) one size and each client gets
    ``shards_per_client`` of them at random, so it holds at most that many classes.

    Unlike the paper's cut of the label-sorted pool into equal slices, which may cross a class
    boundary, every shard here lies within one class: each class is cut into a number of
    shards proportional to its size (at least one, by the largest-remainder rule, at most one
    per sample), so a client holds at most ``shards_per_client`` classes, exactly as stated.
    Every sample goes to exactly one client.

    Args:
        labels: int class labels [N].
        num_clients: K.
        shards_per_client: k, the shards (and at most the classes) per client.
        rng: the only source of randomness (the order of each class, the dealing of shards).

    Raises:
        ConfigError: ``k < 1``, more shards than samples, or fewer shards than classes (a
            class would have no shard, its samples no client).
    """
    _check_clients(num_clients, len(labels))
    k = shards_per_client
    if k < 1:
        raise ConfigError.bad_value("data.shards_per_client", k, "an int >= 1", "2")
    total = num_clients * k
    classes, counts = np.unique(labels, return_counts=True)
    _check_shard_total(total, len(labels), len(classes), num_clients, k)
    per = _shards_per_class(counts, total)
    shards = []
    for c, n in zip(classes, per, strict=True):
        rows = rng.permutation(np.flatnonzero(labels == c))
        shards.extend(np.array_split(rows, int(n)))
    order = rng.permutation(total)
    return [
        np.sort(np.concatenate([shards[i] for i in order[j * k : (j + 1) * k]])).astype(np.int64)
        for j in range(num_clients)
    ]


def _check_shard_total(total: int, n: int, n_classes: int, num_clients: int, k: int) -> None:
    """Refuse ``total`` shards that would leave a shard without a sample (more shards than the
    ``n`` samples) or a class without a shard (fewer shards than classes).

    Raises:
        ConfigError: naming ``data.shards_per_client`` (``k``).
    """
    if total > n:
        raise ConfigError.bad_value(
            "data.shards_per_client",
            k,
            f"num_clients * shards_per_client <= the {n} samples ({num_clients} "
            f"clients), so that every shard holds a sample",
            str(max(1, n // num_clients)),
        )
    if total < n_classes:
        need = -(-n_classes // num_clients)
        raise ConfigError.bad_value(
            "data.shards_per_client",
            k,
            f"at least {need}, so that each of the {n_classes} classes lies in a shard of one "
            f"of the {num_clients} clients",
            str(need),
        )


def _shards_per_class(counts: np.ndarray, total: int) -> np.ndarray:
    """How many of the ``total`` shards each class (of ``counts`` samples) is cut into: one
    each, the rest in proportion to the class sizes (largest remainder), at most one per
    sample."""
    extra = total - len(counts)
    per = 1 + _largest_remainder(counts / counts.sum() * extra, extra)
    per = np.minimum(per, counts)  # no empty shard
    while per.sum() < total:  # what the cap took, to the classes with samples to spare
        spare = counts - per
        per[int(np.argmax(spare / per))] += 1
    return per


def partition_size_skew(
    labels: np.ndarray, num_clients: int, sigma: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Quantity skew: client sizes proportional to draws ``w_k ~ LogNormal(0, σ²)`` (the
    unbalanced split of FedLab and of Li et al. 2022's benchmark), the samples otherwise drawn
    uniformly, so each client's label mix follows the pool's.

    Every client holds at least one sample; the rest are shared by the largest-remainder rule in
    proportion to ``w``, so the sizes follow the draws' order. σ = 0 gives equal sizes (an IID
    split); larger σ, a heavier tail. Every sample goes to exactly one client.

    Args:
        labels: int class labels [N] (only their number is used).
        num_clients: K.
        sigma: σ >= 0 of the log-normal.
        rng: the only source of randomness (the K draws first, then the shuffle).

    Raises:
        ConfigError: ``sigma < 0``, or more clients than samples.
    """
    _check_clients(num_clients, len(labels))
    if not sigma >= 0:
        raise ConfigError.bad_value(
            "data.size_sigma", sigma, "a float >= 0 (0: equal sizes; larger: more skew)", "1.0"
        )
    n = len(labels)
    weights = rng.lognormal(0.0, sigma, num_clients)
    rest = n - num_clients
    sizes = 1 + _largest_remainder(weights / weights.sum() * rest, rest)
    perm = rng.permutation(n)
    return [np.sort(p).astype(np.int64) for p in np.split(perm, np.cumsum(sizes)[:-1])]


def group_ids(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct group ids (sorted) and, per row, the index of its group among them."""
    ids, inverse = np.unique(groups, return_inverse=True)
    return ids, inverse.reshape(-1)


def _rows_by_index(inverse: np.ndarray, count: int) -> list[np.ndarray]:
    """For each of ``count`` indices, the sorted rows where ``inverse`` holds it."""
    order = np.argsort(inverse, kind="stable")
    sizes = np.bincount(inverse, minlength=count)
    return [p.astype(np.int64) for p in np.split(order, np.cumsum(sizes)[:-1])]


def partition_natural(groups: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """One client per group id (a writer, a speaker; Flower's ``NaturalIdPartitioner``): client
    k holds the rows of the k-th smallest group id.

    The split has no randomness: the data decide it. ``num_clients`` must equal the number of
    distinct group ids (the error says how many there are), so that the run's recorded config
    states its K.

    Args:
        groups: a group id per training row [N] (ints or strings).
        num_clients: K.

    Raises:
        ConfigError: ``num_clients`` differs from the number of group ids.
    """
    ids, inverse = group_ids(groups)
    if num_clients != len(ids):
        raise ConfigError.bad_value(
            "data.num_clients",
            num_clients,
            f"the {len(ids)} group ids of the training data (data.partition=natural gives each "
            "group a client of its own)",
            str(len(ids)),
        )
    return _rows_by_index(inverse, len(ids))


def validation_own(train_groups: np.ndarray, test_groups: np.ndarray) -> list[np.ndarray]:
    """Each natural client's own held-out rows: client k (the k-th smallest training group id)
    is evaluated on the held-out rows of its group (``data.val_mode=own``). Held-out rows of a
    group no client holds are left out.

    Args:
        train_groups: the training rows' group ids (they define the clients, as in
            :func:`partition_natural`).
        test_groups: the held-out rows' group ids.

    Raises:
        ConfigError: ids of different kinds (ints and strings), or a client whose group has no
            held-out row.
    """
    ids, _ = group_ids(train_groups)
    if len(test_groups) and ids.dtype.kind != np.asarray(test_groups).dtype.kind:
        raise ConfigError(
            "data.val_mode: got 'own', but the training group ids are "
            f"{'strings' if ids.dtype.kind == 'U' else 'ints'} and the test split's are not; "
            "give both splits group ids of one kind, or set data.val_mode=client",
            key="data.val_mode",
        )
    pos = np.searchsorted(ids, test_groups)
    pos = np.minimum(pos, len(ids) - 1)
    known = ids[pos] == test_groups
    inverse = np.where(known, pos, len(ids))  # rows of unknown groups go to a last bin
    parts = _rows_by_index(inverse, len(ids) + 1)[: len(ids)]
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ConfigError(
            f"data.val_mode: got 'own', but {len(empty)} of the {len(ids)} clients have no "
            f"held-out row of their own (client {empty[0]}, group {ids[empty[0]].item()!r}, has "
            "none in the test split); give every group test rows, or set data.val_mode=client",
            key="data.val_mode",
        )
    return parts
