"""The few-shot split of whole classes (FCSG §5.2): each client's rows are all the rows of its
classes (:func:`assign_classes`), a pure function of the labels and an explicit
``numpy.random.Generator`` like the partitioners of :mod:`lit_fedco.data.partition`."""

from __future__ import annotations

import numpy as np

from lit_fedco.core.errors import ConfigError


def assign_classes(
    labels: np.ndarray,
    classes: np.ndarray,
    num_clients: int,
    per_client: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Each client's rows as whole classes: the few-shot split of FCSG §5.2, where a client's
    tasks are N of its own classes, so clients differ in *which* classes they can learn.

    With ``per_client`` = 0 each client gets a disjoint share of ``classes``; otherwise
    ``per_client`` classes each, dealt round-robin from a shuffled list so that every class
    goes to about equally many clients, its rows split evenly among them.

    Args:
        labels: int class labels [N].
        classes: the classes to deal out (e.g. the meta-training classes).
        num_clients: K.
        per_client: classes per client (0: a disjoint share).
        rng: the only source of randomness.

    Raises:
        ConfigError: ``per_client`` exceeds the number of classes, leaves a class without a
            client (``per_client × K`` below the number of classes), or (``per_client`` = 0)
            there are more clients than classes to share.
    """
    classes = rng.permutation(classes)
    _check_class_share(len(classes), num_clients, per_client)
    if per_client == 0:
        holders = {
            int(c): [k] for k, part in enumerate(np.array_split(classes, num_clients)) for c in part
        }
    else:
        holders = _deal_classes(classes, num_clients, per_client)
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c, ks in holders.items():
        rows = rng.permutation(np.flatnonzero(labels == c))
        for k, share in zip(ks, np.array_split(rows, len(ks)), strict=True):
            parts[k].extend(share.tolist())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _check_class_share(n_classes: int, num_clients: int, per_client: int) -> None:
    """Refuse a deal of ``n_classes`` whole classes that leaves a client or a class out.

    Raises:
        ConfigError: (``per_client`` = 0) more clients than classes, or ``per_client × K``
            below the number of classes.
    """
    if per_client == 0 and num_clients > n_classes:
        raise ConfigError.bad_value(
            "data.num_clients",
            num_clients,
            f"at most the {n_classes} classes for a disjoint share of whole classes "
            "(data.classes_per_client=0); or give each client data.classes_per_client >= 1",
            str(n_classes),
        )
    if per_client > 0 and per_client * num_clients < n_classes:
        need = -(-n_classes // num_clients)
        raise ConfigError.bad_value(
            "data.classes_per_client",
            per_client,
            f"at least {need}, so that each of the {n_classes} classes has a client "
            f"({num_clients} clients)",
            str(need),
        )


def _deal_classes(classes: np.ndarray, num_clients: int, per_client: int) -> dict[int, list[int]]:
    """The clients holding each class when every client takes ``per_client`` distinct classes,
    dealt round-robin from ``classes`` (already shuffled) repeated.

    Raises:
        ConfigError: ``per_client`` exceeds the number of classes.
    """
    if per_client > len(classes):
        raise ConfigError.bad_value(
            "data.classes_per_client",
            per_client,
            f"at most the {len(classes)} classes",
            str(len(classes)),
        )
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    deck = np.concatenate([classes] * (num_clients * per_client // len(classes) + 1))
    pos = 0
    for k in range(num_clients):
        mine: set[int] = set()
        while len(mine) < per_client:
            c = int(deck[pos % len(deck)])
            pos += 1
            if c not in mine:
                mine.add(c)
                holders[c].append(k)
    return holders
