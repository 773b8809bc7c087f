"""Partitioners: pure functions of the labels and an explicit ``numpy.random.Generator``.

Each returns one sorted ``int64`` index array per client (indices into ``labels``), or, for
:func:`step_imbalance`, the sorted indices kept. Being pure, they are tested on small label
arrays without reading any data, and a run's split is fixed by its generator alone.

The splits the field uses (``iid``, ``dirichlet``, ``shards``, ``size_skew``, ``natural``)
are written here by hand rather than taken from Flower Datasets' partitioners
(``flwr-datasets``), although those are the field's reference: they partition a Hugging Face
``datasets.Dataset`` and need ``datasets`` (which imports ``pyarrow`` and ``pandas``, about
250 MB installed and 1.3-1.5 s to import, measured on a 2-core machine) plus ``matplotlib``,
``seaborn`` and ``rich``, and they draw from a seed of their own rather than the run's named
``numpy`` generator, which would change every existing split. Each of ours is a few lines of
``numpy`` over the label (or group) array, seeded by the run's partition generator, and works
on every source alike (a tensor, a file, a user's function).
"""

from __future__ import annotations

import numpy as np

from lit_fedco.core.errors import ConfigError
from lit_fedco.data.names import PARTITIONS as PARTITIONS  # its home: no numpy, no torch


def _check_clients(num_clients: int, n: int) -> None:
    if num_clients < 1:
        raise ConfigError.bad_value("data.num_clients", num_clients, "an int >= 1", "10")
    if num_clients > n:
        raise ConfigError.bad_value(
            "data.num_clients", num_clients, f"at most the {n} samples available", str(min(10, n))
        )


def partition_iid(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """A shuffled split into ``num_clients`` parts of (nearly) equal size."""
    _check_clients(num_clients, len(labels))
    perm = rng.permutation(len(labels))
    return [np.sort(p).astype(np.int64) for p in np.array_split(perm, num_clients)]


def partition_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Label skew: for each class, the shares of the clients are drawn from Dir(α·1).

    Small α gives each client few classes; large α tends to IID. Every sample goes to exactly
    one client. Draws again (at most ``max_tries`` times) until every client holds at least
    ``min_size`` samples.

    Args:
        labels: int class labels [N].
        num_clients: K.
        alpha: the Dirichlet concentration α > 0.
        rng: the only source of randomness.
        min_size: the fewest samples a client may hold.
        max_tries: draws before giving up.

    Raises:
        ConfigError: a bad argument, or no draw in ``max_tries`` met ``min_size``.
    """
    _check_clients(num_clients, len(labels))
    if not alpha > 0:
        raise ConfigError.bad_value(
            "data.alpha", alpha, "a float > 0 (smaller is more heterogeneous)", "0.5"
        )
    if min_size < 0 or num_clients * min_size > len(labels):
        raise ConfigError.bad_value(
            "data.num_clients",
            num_clients,
            f"num_clients * min_size <= the {len(labels)} samples (min_size = {min_size})",
            str(max(1, len(labels) // max(min_size, 1))),
        )
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ConfigError.bad_value(
        "data.alpha",
        alpha,
        f"a value for which every one of {num_clients} clients gets >= {min_size} samples "
        f"(failed {max_tries} draws)",
        "1.0 or fewer clients",
    )


def partition_quantity_imbalanced(
    labels: np.ndarray,
    num_clients: int,
    big: int,
    small: int,
    rng: np.random.Generator,
    small_classes: int | None = None,
) -> list[np.ndarray]:
    """The ComFedL paper's split (§5.1): client 0 holds ``big`` samples of all classes,
    clients 1..K−1 hold ``small`` samples each.

    With ``small_classes`` set, each small client draws only from that many classes (chosen by
    ``rng``), adding label imbalance to the quantity imbalance; ``None`` or 0 means all classes.
    Clients are disjoint. The small clients are drawn first so that their classes are not used
    up by the big client, which then draws uniformly from what is left.

    Raises:
        ConfigError: a bad argument, or too few samples (left in a small client's classes).
    """
    _check_clients(num_clients, len(labels))
    if big < 1:
        raise ConfigError.bad_value("data.big", big, "an int >= 1", "1000")
    if small < 1:
        raise ConfigError.bad_value("data.small", small, "an int >= 1", "20")
    need = big + (num_clients - 1) * small
    if need > len(labels):
        raise ConfigError.bad_value(
            "data.big",
            big,
            f"big + (num_clients − 1)·small <= {len(labels)} samples (got {need})",
            str(max(1, len(labels) - (num_clients - 1) * small)),
        )
    classes = np.unique(labels)
    small_classes = small_classes or None
    if small_classes is not None and not 1 <= small_classes <= len(classes):
        raise ConfigError.bad_value(
            "data.small_classes", small_classes, f"an int in [1, {len(classes)}] or 0 (all)", "2"
        )
    free = np.ones(len(labels), dtype=bool)
    parts: list[np.ndarray] = []
    # Small clients first, so that their classes are not exhausted by the big client.
    for _ in range(1, num_clients):
        pool_classes = (
            rng.choice(classes, size=small_classes, replace=False) if small_classes else classes
        )
        pool = np.flatnonzero(free & np.isin(labels, pool_classes))
        if len(pool) < small:
            raise ConfigError.bad_value(
                "data.small", small, f"at most {len(pool)} (left in the chosen classes)", "20"
            )
        take = rng.choice(pool, size=small, replace=False)
        free[take] = False
        parts.append(np.sort(take).astype(np.int64))
    big_part = rng.choice(np.flatnonzero(free), size=big, replace=False)
    return [np.sort(big_part).astype(np.int64), *parts]


def partition_dominant_class(
    labels: np.ndarray,
    num_clients: int,
    rho: float,
    rng: np.random.Generator,
    samples_per_client: int | None = None,
) -> list[np.ndarray]:
    """ComFedL's personalised-FL split: client i holds a fraction ρ of its samples from class
    i mod C and (1 − ρ)/(C − 1) from each other class (paper §5.2, ρ = 0.28).

    Every client holds the same number n of samples, its class counts rounded from ρ·n and
    (1 − ρ)/(C − 1)·n by the largest-remainder rule. Clients are disjoint.

    Args:
        labels: int class labels [N] (C >= 2 classes; the i-th smallest label is class i).
        num_clients: K.
        rho: ρ in (0, 1).
        rng: the only source of randomness.
        samples_per_client: n; ``None`` (or 0) takes the largest n the data allow.

    Raises:
        ConfigError: a bad argument, or ``samples_per_client`` larger than the data allow.
    """
    _check_clients(num_clients, len(labels))
    if not 0 < rho < 1:
        raise ConfigError.bad_value("data.rho", rho, "a float in (0, 1)", "0.28")
    classes = np.unique(labels)
    c = len(classes)
    if c < 2:
        raise ConfigError(
            f"data.partition: 'dominant_class' needs labels of >= 2 classes, got {c}; "
            "use data.partition=iid"
        )
    counts = np.array([(labels == cl).sum() for cl in classes])
    largest = _most_per_client(counts, num_clients, rho)
    n = samples_per_client or largest
    if n < 1 or n > largest:
        raise ConfigError.bad_value(
            "data.samples_per_client",
            n,
            f"an int in [1, {largest}] for these data and {num_clients} clients",
            str(max(largest, 1)),
        )
    table = _dominant_counts(num_clients, c, rho, n)
    pools = [rng.permutation(np.flatnonzero(labels == cl)) for cl in classes]
    return _deal_rows(pools, table)


def _dominant_counts(num_clients: int, c: int, rho: float, n: int) -> np.ndarray:
    """Class counts [K, C] of every client for n samples each: a share ρ of class i mod C and
    (1 − ρ)/(C − 1) of each other class, rounded by the largest-remainder rule."""
    rows = []
    for i in range(num_clients):
        shares = np.full(c, (1 - rho) / (c - 1))
        shares[i % c] = rho
        rows.append(_largest_remainder(shares * n, n))
    return np.stack(rows)


def _most_per_client(counts: np.ndarray, num_clients: int, rho: float) -> int:
    """The largest n for which the class counts of :func:`_dominant_counts` fit in the classes'
    ``counts`` (0 when none does)."""
    c = len(counts)
    # Without rounding, n is bounded by count_j / (demand of class j per unit of n).
    dominant = np.bincount(np.arange(num_clients) % c, minlength=c)
    demand = rho * dominant + (1 - rho) / (c - 1) * (num_clients - dominant)
    largest = int(np.floor((counts / demand).min()))
    while largest >= 1 and (_dominant_counts(num_clients, c, rho, largest).sum(0) > counts).any():
        largest -= 1  # rounding up may ask a class for a few more than it has
    return largest


def _deal_rows(pools: list[np.ndarray], table: np.ndarray) -> list[np.ndarray]:
    """Client i's rows: the next ``table[i, j]`` rows of each class's shuffled pool
    ``pools[j]``, so that clients are disjoint."""
    used = np.zeros(len(pools), dtype=int)
    parts = []
    for i in range(len(table)):
        chosen = []
        for j in range(len(pools)):
            chosen.append(pools[j][used[j] : used[j] + table[i, j]])
            used[j] += table[i, j]
        parts.append(np.sort(np.concatenate(chosen)).astype(np.int64))
    return parts


def _largest_remainder(quotas: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to ``total`` that round ``quotas`` by the largest-remainder rule."""
    base = np.floor(quotas).astype(int)
    rest = total - base.sum()
    order = np.argsort(-(quotas - base), kind="stable")
    base[order[:rest]] += 1
    return base


def validation_like(
    train_labels_per_client: list[np.ndarray],
    pool_labels: np.ndarray,
    per_client: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """For each client, ``per_client`` held-out indices with the client's class proportions.

    A client with 20 training images still gets a validation set of its own distribution.
    The class counts are rounded by the largest-remainder rule. Samples are drawn without
    replacement within a client (clients may share held-out samples); where a class of the pool
    has fewer samples than a client wants, the client takes all of them and draws the rest
    with replacement. Classes absent from the pool are left out of the proportions; a client
    none of whose classes is in the pool gets the pool's own proportions.

    Args:
        train_labels_per_client: each client's training labels.
        pool_labels: labels of the held-out pool.
        per_client: validation samples per client.
        rng: the only source of randomness.

    Returns:
        One sorted int64 index array into ``pool_labels`` per client.

    Raises:
        ConfigError: ``per_client`` < 1 or an empty pool.
    """
    if per_client < 1:
        raise ConfigError.bad_value("data.val_per_client", per_client, "an int >= 1", "100")
    if len(pool_labels) == 0:
        raise ConfigError("data.val_per_client: the held-out pool is empty; set data.name")
    classes, pool_counts = np.unique(pool_labels, return_counts=True)
    by_class = [np.flatnonzero(pool_labels == c) for c in classes]
    out = []
    for labels in train_labels_per_client:
        counts = np.array([(labels == c).sum() for c in classes], dtype=float)
        if counts.sum() == 0:
            counts = pool_counts.astype(float)
        want = _largest_remainder(counts / counts.sum() * per_client, per_client)
        chosen = []
        for pool, w in zip(by_class, want, strict=True):
            if w <= len(pool):
                chosen.append(rng.choice(pool, size=w, replace=False))
            else:
                chosen += [rng.permutation(pool), rng.choice(pool, size=w - len(pool))]
        out.append(np.sort(np.concatenate(chosen)).astype(np.int64))
    return out


def partition_stats(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> dict:
    """Sizes and per-class counts of each part (reported with every run)."""
    return {
        "sizes": [len(p) for p in parts],
        "class_counts": [np.bincount(labels[p], minlength=num_classes).tolist() for p in parts],
    }


def step_imbalance(labels: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices kept by the step imbalance of ratio ρ (Buda et al. 2018; Cao et al. 2019).

    The FedDRO paper's CIFAR10-ST / CIFAR100-ST (§6) do not state their construction; they
    follow this one. Classes ``0 .. C − ⌊C/2⌋ − 1`` (the majority) keep all their samples;
    each of the last ⌊C/2⌋ classes (the minority) keeps ``max(1, ⌊n_c/ρ⌋)`` of its ``n_c``,
    drawn uniformly without replacement. ρ = 1 keeps everything; CIFAR10-ST with ρ = 100
    keeps 5000 images of each of the classes 0-4 and 50 of each of 5-9.

    Args:
        labels: int class labels ``[N]`` (classes are ``0 .. C − 1``, C = max + 1).
        ratio: ρ ≥ 1; each of the last ⌊C/2⌋ classes keeps ``max(1, ⌊n_c/ρ⌋)`` samples.
        rng: draws which minority samples are kept.
    """
    if not ratio >= 1:
        raise ConfigError.bad_value(
            "data.imbalance_ratio", ratio, "a float >= 1 (n_majority / n_minority)", "100"
        )
    c = int(labels.max()) + 1
    first_minority = c - c // 2
    keep = []
    for k in range(c):
        idx = np.flatnonzero(labels == k)
        if k >= first_minority and len(idx):
            n = max(1, int(len(idx) // ratio))
            idx = rng.choice(idx, size=n, replace=False)
        keep.append(idx)
    return np.sort(np.concatenate(keep)).astype(np.int64)


def balanced_validation(
    labels: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """For each client ``per_client`` held-out indices with (nearly) equal counts per class.

    Class-balanced like the CIFAR test set the FedDRO paper reports on, so that average,
    worst-client and worst-class accuracy measure how well the minority classes of a
    step-imbalanced training set are learnt. Remainders go to different classes for different
    clients. Within a class, clients take consecutive slices of one shuffled order, so they
    are disjoint while the class lasts and wrap around (reusing samples) beyond.
    """
    if per_client < 1:
        raise ConfigError.bad_value("data.val_per_client", per_client, "an int >= 1", "100")
    classes = np.unique(labels)
    c = len(classes)
    order = {k: rng.permutation(np.flatnonzero(labels == k)) for k in classes}
    used = dict.fromkeys(classes, 0)
    out = []
    for client in range(num_clients):
        base, extra = divmod(per_client, c)
        chosen = []
        for j, k in enumerate(classes):
            n = base + (1 if (j - client) % c < extra else 0)
            pool = order[k]
            take = pool[(used[k] + np.arange(n)) % len(pool)]
            used[k] += n
            chosen.append(take)
        out.append(np.sort(np.concatenate(chosen)).astype(np.int64))
    return out


# ---------------------------------------------------------------------- the field's other splits
