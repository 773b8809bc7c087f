"""The run's ``data`` config node: every ``data.*`` key a data set may read, with its default and
its description (the catalog ``lit_fedco/config/schema.json`` and ``--help`` are generated from
this docstring). Each builder reads only its share of the keys, through its typed spec
(:mod:`lit_fedco.data.specs`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    """The data set and its federated split (``lit_fedco.data``).

    Attributes:
        name: ``digits`` (embedded, scikit-learn), ``mnist`` or ``fashion_mnist`` (local files),
            a step-imbalanced ``digits_st``, ``cifar10_st``, ``cifar100_st``, ``adult``
            (UCI Adult, embedded; targets carry the protected group, ``protected``); your own
            files from ``data_dir``: ``npz`` (arrays ``x``, ``y``, optionally ``group``,
            ``x_test``, ``y_test``, ``group_test``), ``imagefolder`` (``train/<class>/`` and
            ``test/<class>/`` image folders; files ``<group>_<rest>`` carry group ids),
            ``hf_disk`` (a Hugging Face ``DatasetDict`` saved with ``save_to_disk``; needs
            ``datasets``), ``text`` (next-character prediction; ``NAME:`` lines start a
            speaker's passage, a group); or ``MODULE:FUNCTION``, a function of your own
            returning the data (``lit_fedco.data.user``), whose ``Params`` dataclass fields
            are further ``data.*`` keys.
        data_dir: folder with the IDX files for mnist / fashion_mnist, or with
            ``cifar-10-batches-py/`` / ``cifar-100-python/`` for CIFAR, or with
            ``adult.data[.gz]`` and ``adult.test[.gz]`` for adult (empty: the embedded copy);
            the file or folder of ``npz``, ``imagefolder``, ``hf_disk`` or ``text``; passed to a
            data function as ``data_dir``.
        partition: ``quantity`` (ComFedL: one big client, K−1 small ones), ``iid``,
            ``dirichlet`` (label skew, ``alpha``), ``dominant_class``, ``shards`` (each client
            ``shards_per_client`` single-class shards: McMahan et al. 2017), ``size_skew``
            (log-normal client sizes, ``size_sigma``) or ``natural`` (a client per group id;
            ``num_clients`` must equal their number) (``*_st`` and ``adult``: ``iid`` or
            ``dirichlet``).
        num_clients: K.
        big: training samples of the big client (quantity split; the paper: 5000).
        small: training samples of each small client (the paper: 20).
        small_classes: classes each small client draws from (0: all; label imbalance).
        alpha: Dirichlet concentration (dirichlet split).
        rho: fraction of a client's data from its dominant class (dominant_class split).
        val_per_client: validation samples per client, drawn with its class proportions
            (class-balanced for the step-imbalanced ``*_st`` sources).
        imbalance_ratio: ρ ≥ 1 of the step-imbalanced sources ``digits_st``, ``cifar10_st``,
            ``cifar100_st`` (``lit_fedco.data.cifar``): the last half of the classes keep
            1/ρ of their training images; ignored by the other sources.
        val_mode: ``client`` (``val_per_client`` samples drawn with the client's class
            proportions), ``all`` (the whole held-out set, unchanged, split evenly) or ``own``
            (``partition=natural``: each client's own group's test rows).
        binary: relabel classes [0, C/2) as 0 (negative) and [C/2, C) as 1 (FCSG §5.3).
        drop_positive: fraction of training positives removed (binary; FCSG §5.3: 0.8).
        dim: d, features of the synthetic ``invariant_logreg`` source (FCSG §5.1: 10).
        sigma1: σ₁, the scale of a ~ N(0, σ₁² I) in ``invariant_logreg``.
        train_per_client: outer samples ξ = (a, b) per client in ``invariant_logreg``.
        rotations: few-shot sources (partition ``classes``): copies of each class rotated by
            multiples of 90° count as new classes (MAML's Omniglot augmentation).
        classes_per_client: partition ``classes``: classes each client draws its tasks from
            (0: a disjoint share of the training classes).
        heldout_classes: partition ``classes`` on ``digits``: base classes kept for the
            evaluation tasks (Omniglot uses its 1028/172/423 split).
        protected: ``adult``'s protected attribute, ``sex`` (2 groups) or ``race`` (5).
        shards_per_client: ``partition=shards``: shards, and at most classes, per client.
        size_sigma: ``partition=size_skew``: σ of the log-normal client sizes (0: equal).
        image_size: ``imagefolder`` / ``hf_disk`` images resized to this side (0: as read,
            all of one size).
        seq_len: ``text``: characters per sample (the next one is its label; LEAF: 80).
        seq_stride: ``text``: characters between the starts of consecutive samples (1: every
            window, as LEAF; larger: fewer samples, for a long text).
        feature_column: ``hf_disk``: the input column (an image or numbers).
        label_column: ``hf_disk``: the label column (ints).
        group_column: ``hf_disk``: the group id column for ``partition=natural`` (empty: none).
        heldout: where the validation rows come from: ``test`` (the source's test split) or
            ``train`` (a seeded slice of its training split, the rest trains; what a tuning
            run selects on, ``tune.heldout``). Partitioned and ``*_st`` sources.
    """

    name: str = "digits"
    data_dir: str = ""
    partition: str = "quantity"
    num_clients: int = 10
    big: int = 1000
    small: int = 20
    small_classes: int = 0
    alpha: float = 0.5
    rho: float = 0.28
    val_per_client: int = 100
    imbalance_ratio: float = 10.0
    val_mode: str = "client"
    binary: bool = False
    drop_positive: float = 0.0
    dim: int = 10
    sigma1: float = 1.0
    train_per_client: int = 5000
    rotations: int = 1
    classes_per_client: int = 0
    heldout_classes: int = 3
    protected: str = "sex"
    shards_per_client: int = 2
    size_sigma: float = 1.0
    image_size: int = 0
    seq_len: int = 80
    seq_stride: int = 1
    feature_column: str = "image"
    label_column: str = "label"
    group_column: str = ""
    heldout: str = "test"
