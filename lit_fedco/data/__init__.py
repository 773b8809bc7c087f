"""Data: sources, partitions, samplers, the federated container and its builders.

Layers, each importing only those above it in this list (``tests/test_imports.py`` keeps
them free of cycles):

- ``sources``, ``cifar``, ``omniglot`` — readers of files and of scikit-learn's digits;
- ``partition`` — pure functions of labels and an explicit ``numpy`` generator;
- ``container`` — :class:`FederatedData` and its partition statistics;
- ``samplers`` — which rows a round's minibatches hold, seeded by (seed, client, round);
- ``specs`` — one typed, validated spec per builder;
- ``build`` — the builders and :func:`make_federated`, the only module that knows them all.
"""

from lit_fedco.data.build import make_federated
from lit_fedco.data.container import FederatedData, build_federated, format_partition_stats
from lit_fedco.data.partition import (
    partition_dirichlet,
    partition_dominant_class,
    partition_iid,
    partition_quantity_imbalanced,
    partition_stats,
    validation_like,
)
from lit_fedco.data.samplers import BatchSampler, PositiveSampler, TaskSampler
from lit_fedco.data.sources import load_digits_arrays, load_mnist, load_source
from lit_fedco.data.specs import data_spec

__all__ = [
    "BatchSampler",
    "FederatedData",
    "PositiveSampler",
    "TaskSampler",
    "build_federated",
    "data_spec",
    "format_partition_stats",
    "load_digits_arrays",
    "load_mnist",
    "load_source",
    "make_federated",
    "partition_dirichlet",
    "partition_dominant_class",
    "partition_iid",
    "partition_quantity_imbalanced",
    "partition_stats",
    "validation_like",
]
