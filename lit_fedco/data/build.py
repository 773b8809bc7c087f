"""Builders: from a data spec to :class:`~lit_fedco.data.container.FederatedData`.

The top layer of ``lit_fedco.data`` and the only module that knows every other one: it reads
a source (``sources``, ``cifar``, ``omniglot``), splits it with a partitioner (``partition``)
and gathers the clients' rows into the container (``container``). One builder per kind of
data set, each taking its typed spec (:mod:`lit_fedco.data.specs`):

- :func:`make_partitioned` — a real source split by ``partition`` (ComFedL, FedDRO, the
  binary AUPRC task of FCSG §5.3);
- :func:`make_step_imbalanced` — ``*_st``: a step-imbalanced pool (FedDRO §6);
- :func:`make_invariant_logreg` — synthetic invariant logistic regression (FCSG §5.1);
- :func:`make_task_data` — few-shot classes per client (FCSG §5.2);
- :func:`make_adult` — UCI Adult with its protected groups (FedDRO §6, fairness).

:func:`make_federated` picks the builder from ``data.name`` / ``data.partition``. Every
random draw comes from a generator named by (seed, constant) (:mod:`lit_fedco.core.seeding`),
independent of the training streams, so a data set is a function of its spec alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.seeding import generator as torch_generator
from lit_fedco.core.seeding import numpy_generator
from lit_fedco.data import partition as P
from lit_fedco.data import partition_skews as S
from lit_fedco.data.adult import load_adult
from lit_fedco.data.container import FederatedData, build_federated
from lit_fedco.data.names import FILE_READERS, is_function_ref
from lit_fedco.data.omniglot import load_omniglot, omniglot_split
from lit_fedco.data.partition_classes import assign_classes
from lit_fedco.data.pools import Pools
from lit_fedco.data.readers import read_file_source
from lit_fedco.data.sources import load_digits_arrays, load_source, source_note
from lit_fedco.data.specs import (
    AdultSpec,
    InvariantLogRegSpec,
    PartitionedSpec,
    StepImbalancedSpec,
    TaskSpec,
    data_spec,
)

PARTITION_STREAM = 12345
"""The partition's generator is named (seed, 12345): independent of every training stream."""
HELDOUT_STREAM = 0x7E57
"""``data.heldout=train``: the slice of the training split held out is drawn from (seed, 0x7E57)."""
SYNTHETIC_STREAM = 0x1A7
"""The synthetic data's generator is named (seed, 0x1A7)."""


def make_federated(spec: Any) -> FederatedData:
    """The federated data set ``spec`` describes.

    ``spec`` is any object with the ``data`` config's attributes plus ``seed`` (the runner
    passes ``SimpleNamespace(**data_cfg, seed=seed)``), or a typed spec. It is converted and
    validated by :func:`~lit_fedco.data.specs.data_spec`, which also picks the builder: a
    ``*_st`` name → :func:`make_step_imbalanced`; ``invariant_logreg`` →
    :func:`make_invariant_logreg`; ``adult`` → :func:`make_adult`; ``partition=classes`` →
    :func:`make_task_data`; otherwise :func:`make_partitioned`.
    """
    typed = data_spec(spec)
    if isinstance(typed, AdultSpec):
        return make_adult(typed)
    if isinstance(typed, StepImbalancedSpec):
        return make_step_imbalanced(typed)
    if isinstance(typed, InvariantLogRegSpec):
        return make_invariant_logreg(typed)
    if isinstance(typed, TaskSpec):
        return make_task_data(typed)
    return make_partitioned(typed)


# ---------------------------------------------------------------------- partitioned sources
def binarize(y: Tensor, num_classes: int) -> Tensor:
    """Labels ``1(y >= C/2)``: the first half of the classes negative, the rest positive."""
    return (y >= num_classes // 2).long()


def drop_positives(y: Tensor, fraction: float, rng: np.random.Generator) -> Tensor:
    """Sorted indices of the rows kept after removing ``fraction`` of the positives (y = 1).

    This makes the binary task imbalanced the way FCSG §5.3 does (0.8 of the positives
    removed), which is where AUPRC and accuracy disagree.
    """
    if not 0.0 <= fraction < 1.0:
        raise ConfigError.bad_value("data.drop_positive", fraction, "a float in [0, 1)", "0.8")
    labels = y.numpy()
    pos = np.flatnonzero(labels == 1)
    drop = rng.choice(pos, size=round(fraction * len(pos)), replace=False)
    keep = np.setdiff1d(np.arange(len(labels)), drop)
    return torch.from_numpy(keep.astype(np.int64))


def hold_out_training(
    x: Tensor, y: Tensor, x_te: Tensor, y_te: Tensor, heldout: str, seed: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The training and held-out pools: as the source gives them (``heldout="test"``), or
    (``"train"``) a seeded slice of the training split as the held-out pool, as many rows as
    the test split has but at most a fifth of the training rows, and the rest to train on, so
    that a tuning run selects without ever seeing the test split."""
    if heldout == "test":
        return x, y, x_te, y_te
    keep, held = heldout_rows(len(y), len(y_te), seed)
    return x[keep], y[keep], x[held], y[held]


def heldout_rows(n_train: int, n_test: int, seed: int) -> tuple[Tensor, Tensor]:
    """The training rows kept and the rows held out (sorted) by ``data.heldout=train``
    (:func:`hold_out_training`)."""
    order = torch.from_numpy(numpy_generator(seed, HELDOUT_STREAM).permutation(n_train))
    n = min(n_test, n_train // 5)
    return order[n:].sort().values, order[:n].sort().values


def _partition(
    spec: PartitionedSpec,
    labels: np.ndarray,
    rng: np.random.Generator,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """The training pool's split over the clients by ``spec.partition``."""
    k = spec.num_clients
    if spec.partition == "shards":
        return S.partition_shards(labels, k, spec.shards_per_client, rng)
    if spec.partition == "size_skew":
        return S.partition_size_skew(labels, k, spec.size_sigma, rng)
    if spec.partition == "natural":
        if groups is None:
            raise ConfigError(
                f"data.partition: got 'natural' (a client per group id), but data.name="
                f"{spec.name} gives no group ids; use a source with them (npz: a group array; "
                "imagefolder: files named <group>_<rest>; hf_disk: data.group_column; text: "
                "NAME: lines) or another partition, e.g. data.partition=dirichlet",
                key="data.partition",
            )
        if len(groups) != len(labels):
            raise ConfigError(
                f"data.partition: got 'natural', but data.name={spec.name} gives "
                f"{len(groups)} group ids for {len(labels)} training rows; give one per row",
                key="data.partition",
            )
        return S.partition_natural(groups, k)
    if spec.partition == "quantity":
        return P.partition_quantity_imbalanced(
            labels, k, spec.big, spec.small, rng, spec.small_classes or None
        )
    if spec.partition == "iid":
        return P.partition_iid(labels, k, rng)
    if spec.partition == "dirichlet":
        return P.partition_dirichlet(labels, k, spec.alpha, rng)
    return P.partition_dominant_class(labels, k, spec.rho, rng)  # the spec allows no other


def make_partitioned(spec: PartitionedSpec) -> FederatedData:
    """Load the source, split its training pool over the clients, and give each client a
    validation set from the held-out pool.

    ``partition`` is ``quantity`` (client 0 holds ``big`` samples, the others ``small``, each
    from ``small_classes`` classes, 0 meaning all), ``iid``, ``dirichlet`` (``alpha``),
    ``dominant_class`` (``rho``), ``shards`` (``shards_per_client``), ``size_skew``
    (``size_sigma``) or ``natural`` (a client per group id; ``stats["client_groups"]`` names
    them). Validation (``val_mode``): ``client`` draws
    ``val_per_client`` held-out samples with the client's class proportions, so that a client
    with 20 training images is still evaluated on its own distribution; ``all`` splits the
    whole held-out set evenly (the paper's test accuracy, pooled); ``own`` gives each natural
    client the held-out rows of its own group. With ``binary`` the labels
    are binarised and ``drop_positive`` of the training positives removed (FCSG §5.3); the
    held-out pool keeps all its positives, like the paper's test set.

    A source read from files records which in ``stats["source"]``
    (:func:`~lit_fedco.data.sources.source_note`: MNIST's standard split, or its test files
    alone split 80 / 20), which the run prints with its partition.

    Args:
        spec: the spec, or any object with its attributes (converted by
            :meth:`PartitionedSpec.of`).
    """
    spec = PartitionedSpec.of(spec)
    pools = load_pools(spec)
    x, y, x_te, y_te, num_classes = pools.x, pools.y, pools.x_test, pools.y_test, pools.num_classes
    note, groups, groups_te = pools.note, pools.groups, pools.groups_test
    if spec.heldout == "train" and groups is not None:  # the group ids follow their rows
        keep, held = heldout_rows(len(y), len(y_te), spec.seed)
        groups, groups_te = groups[keep.numpy()], groups[held.numpy()]
    x, y, x_te, y_te = hold_out_training(x, y, x_te, y_te, spec.heldout, spec.seed)
    if spec.heldout == "train":
        note = f"{note}; " if note else ""
        note += f"data.heldout=train: {len(y_te)} rows of the training pool held out instead"
    rng = numpy_generator(spec.seed, PARTITION_STREAM)
    if spec.binary:
        y, y_te, num_classes = binarize(y, num_classes), binarize(y_te, num_classes), 2
        keep = drop_positives(y, spec.drop_positive, rng)
        x, y = x[keep], y[keep]
        groups = groups[keep.numpy()] if groups is not None else None
    labels = y.numpy()
    parts = _partition(spec, labels, rng, groups)
    if spec.val_mode == "all":
        val = P.partition_iid(y_te.numpy(), spec.num_clients, rng)
    elif spec.val_mode == "own":
        val = _own_validation(spec, groups, groups_te, len(y_te))
    else:
        val = P.validation_like([labels[p] for p in parts], y_te.numpy(), spec.val_per_client, rng)
    data = build_federated(x, y, x_te, y_te, parts, val, num_classes, spec.name)
    if note:
        data.stats["source"] = note
    if spec.partition == "natural" and groups is not None:
        data.stats["client_groups"] = [str(g) for g in S.group_ids(groups)[0]]
    data.stats.update(pools.extra or {})
    return data


def load_pools(spec: PartitionedSpec) -> Pools:
    """The training and held-out pools of ``spec.name``: a built-in source
    (:func:`~lit_fedco.data.sources.load_source`), a reader of one's own files
    (:mod:`lit_fedco.data.readers`) or a data function (:mod:`lit_fedco.data.user`)."""
    if spec.name in FILE_READERS:
        return read_file_source(spec)
    if is_function_ref(spec.name):
        from lit_fedco.data.user import call_function, function_pools

        result = call_function(spec.name, spec.params, spec.data_dir, spec.seed)
        return function_pools(spec.name, result)
    x, y, x_te, y_te, num_classes = load_source(spec.name, spec.data_dir)
    return Pools(x, y, x_te, y_te, num_classes,
                 note=source_note(spec.name, spec.data_dir, len(y), len(y_te)))  # fmt: skip


def _own_validation(
    spec: PartitionedSpec, groups: np.ndarray | None, groups_te: np.ndarray | None, n_te: int
) -> list[np.ndarray]:
    """``val_mode=own``: each natural client's own held-out rows."""
    if groups_te is None or groups is None:
        raise ConfigError(
            f"data.val_mode: got 'own', but the test split of data.name={spec.name} has no "
            "group ids (each client is evaluated on the test rows of its own group); give the "
            "test split group ids, or set data.val_mode=client",
            key="data.val_mode",
        )
    if len(groups_te) != n_te:
        raise ConfigError(
            f"data.val_mode: got 'own', but data.name={spec.name} gives {len(groups_te)} test "
            f"group ids for {n_te} held-out rows; give one per row",
            key="data.val_mode",
        )
    return S.validation_own(groups, groups_te)


# ---------------------------------------------------------------------- UCI Adult
def make_adult(spec: AdultSpec) -> FederatedData:
    """UCI Adult (:mod:`lit_fedco.data.adult`): the training file's rows split over the clients
    ``iid`` (the FedDRO paper's equal split) or ``dirichlet`` on the label (``alpha``), and
    the test file's rows, all of them, split evenly over the clients as their validation
    rows, so that pooled validation metrics are the test set's.

    Targets are ``[n, 2]``: the label (income > 50K) and the protected group (``protected``);
    ``stats["groups"]`` names the groups and ``stats["features"]`` the feature columns.

    Args:
        spec: the spec, or any object with its attributes.
    """
    spec = AdultSpec.of(spec)
    table = load_adult(spec.data_dir, spec.protected)
    rng = numpy_generator(spec.seed, PARTITION_STREAM)
    labels = table.y_train[:, 0].numpy()
    if spec.partition == "iid":
        parts = P.partition_iid(labels, spec.num_clients, rng)
    else:
        parts = P.partition_dirichlet(labels, spec.num_clients, spec.alpha, rng)
    val = P.partition_iid(table.y_test[:, 0].numpy(), spec.num_clients, rng)
    data = build_federated(
        table.x_train, table.y_train, table.x_test, table.y_test, parts, val, 2, "adult"
    )
    data.stats.update(
        protected=spec.protected, groups=list(table.groups), features=list(table.features)
    )
    return data


# ---------------------------------------------------------------------- step-imbalanced
def make_step_imbalanced(spec: StepImbalancedSpec) -> FederatedData:
    """CIFAR10-ST, CIFAR100-ST (FedDRO §6) or digits-ST: a step-imbalanced training pool
    (:func:`~lit_fedco.data.partition.step_imbalance`, ratio ``imbalance_ratio``) split over
    the clients ``iid`` (the paper's "split the (unbalanced) dataset equally") or
    ``dirichlet``, with class-**balanced** validation
    (:func:`~lit_fedco.data.partition.balanced_validation`) like the CIFAR test set the paper
    reports on, so that worst-class accuracy shows how the minority classes are learnt.

    The imbalance and the split are drawn from one generator named (seed, 12345).

    Args:
        spec: the spec, or any object with its attributes.
    """
    spec = StepImbalancedSpec.of(spec)
    x, y, x_te, y_te, num_classes = load_source(spec.name.removesuffix("_st"), spec.data_dir)
    x, y, x_te, y_te = hold_out_training(x, y, x_te, y_te, spec.heldout, spec.seed)
    rng = numpy_generator(spec.seed, PARTITION_STREAM)
    kept = torch.from_numpy(P.step_imbalance(y.numpy(), spec.imbalance_ratio, rng))
    x, y = x[kept], y[kept]
    labels = y.numpy()
    k = spec.num_clients
    if spec.partition == "iid":
        parts = P.partition_iid(labels, k, rng)
    else:
        parts = P.partition_dirichlet(labels, k, spec.alpha, rng)
    val = P.balanced_validation(y_te.numpy(), k, spec.val_per_client, rng)
    data = build_federated(x, y, x_te, y_te, parts, val, num_classes, spec.name)
    data.stats["imbalance_ratio"] = spec.imbalance_ratio
    return data


# ---------------------------------------------------------------------- synthetic
def invariant_logreg_samples(
    n: int, x_star: Tensor, sigma1: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``n`` outer samples: ``a ~ N(0, σ₁² I)`` [n, d] and labels ``y = 1(aᵀx* > 0)`` [n]."""
    a = sigma1 * torch.randn(n, len(x_star), generator=generator)
    return a, (a @ x_star > 0).long()


def make_invariant_logreg(spec: InvariantLogRegSpec) -> FederatedData:
    """The federated invariant logistic regression data (FCSG §5.1, after Hu et al. 2020).

    Outer samples ξ = (a, b): ``a ~ N(0, σ₁² I_d)`` and ``b = sign(aᵀx*)`` for a ground
    truth x* ~ N(0, I_d) drawn once per seed. The inner samples ``η ~ N(a, σ₂² I_d)`` are
    drawn at every step by the objective
    (:class:`~lit_fedco.objectives.conditional.InvariantLogReg`), so the data hold only ξ;
    labels are stored as ``y = (b + 1) / 2 ∈ {0, 1}``. Every client draws from the same
    distribution; the validation split is ``K × val_per_client`` fresh samples split evenly,
    so the pooled validation accuracy is the paper's test accuracy (50000 = 16 × 3125).

    x* and every sample come from one generator named (seed, 0x1A7); ``stats["x_star"]``
    records x*.

    Args:
        spec: the spec, or any object with its attributes.
    """
    spec = InvariantLogRegSpec.of(spec)
    k, n, n_val = spec.num_clients, spec.train_per_client, spec.val_per_client
    g = torch_generator(spec.seed, SYNTHETIC_STREAM)
    x_star = torch.randn(spec.dim, generator=g)
    a, y = invariant_logreg_samples(k * n, x_star, spec.sigma1, g)
    a_te, y_te = invariant_logreg_samples(k * n_val, x_star, spec.sigma1, g)
    off = torch.arange(k + 1, dtype=torch.int64)
    return FederatedData(
        a,
        y,
        off * n,
        a_te,
        y_te,
        off * n_val,
        num_classes=2,
        name="invariant_logreg",
        stats={"x_star": x_star.tolist()},
    )


# ---------------------------------------------------------------------- few-shot tasks
def with_rotations(x: Tensor, y: Tensor, rotations: int) -> tuple[Tensor, Tensor]:
    """Images [n, C, H, W] and, for r < ``rotations``, copies rotated by r · 90° labelled
    ``y · rotations + r`` (each rotation a class of its own, as in MAML's Omniglot)."""
    if rotations not in (1, 2, 3, 4):
        raise ConfigError.bad_value("data.rotations", rotations, "1, 2, 3 or 4", "4")
    xs = [torch.rot90(x, r, dims=(2, 3)) for r in range(rotations)]
    ys = [y * rotations + r for r in range(rotations)]
    order = torch.arange(len(y) * rotations).view(rotations, -1).t().reshape(-1)
    return torch.cat(xs)[order], torch.cat(ys)[order]


def make_task_data(spec: TaskSpec) -> FederatedData:
    """Few-shot data: each client's training rows are whole meta-training classes, its
    validation rows whole held-out classes (tasks are drawn from them at evaluation by
    :class:`~lit_fedco.data.samplers.TaskSampler`).

    - ``digits``: the 1797 digits; ``heldout_classes`` base digits (a fixed choice) and their
      rotations are held out.
    - ``omniglot``: the 1623 characters in a fixed random order split 1028/172/423
      (:func:`~lit_fedco.data.omniglot.omniglot_split`); clients train on the 1028 and are
      evaluated on the 423 (the 172 validation characters are unused).

    Classes are dealt by :func:`~lit_fedco.data.partition_classes.assign_classes`
    (``classes_per_client``) with a generator named (seed, 12345); the class split itself is
    fixed (seed 0), the same for every run, so runs with different seeds are evaluated on
    the same held-out classes.

    Args:
        spec: the spec, or any object with its attributes.
    """
    spec = TaskSpec.of(spec)
    if spec.name == "digits":
        x, base = load_digits_arrays()
        bases = np.random.default_rng(0).permutation(10)
        h = spec.heldout_classes
        train_bases, test_bases = bases[h:], bases[:h]
    else:
        x, base = load_omniglot(spec.data_dir)
        chars = np.random.default_rng(0).permutation(int(base.max()) + 1)
        n_tr, n_va = omniglot_split(len(chars))[:2]
        train_bases, test_bases = chars[:n_tr], chars[n_tr + n_va :]
    x, y = with_rotations(x, base, spec.rotations)
    r = spec.rotations
    train_classes = np.concatenate([train_bases * r + i for i in range(r)])
    test_classes = np.concatenate([test_bases * r + i for i in range(r)])
    rng = numpy_generator(spec.seed, PARTITION_STREAM)
    labels = y.numpy()
    k, per = spec.num_clients, spec.classes_per_client
    for classes, what in ((train_classes, "training"), (test_classes, "held-out")):
        if per == 0 and len(classes) < k:
            raise ConfigError.bad_value(
                "data.classes_per_client",
                per,
                f"an int >= 1: the {len(classes)} {what} classes cannot be shared out "
                f"disjointly over {k} clients",
                "6",
            )
    parts = assign_classes(labels, train_classes, k, per, rng)
    val = assign_classes(labels, test_classes, k, per, rng)
    return build_federated(x, y, x, y, parts, val, int(y.max()) + 1, f"{spec.name}_tasks")
