"""Data: sources, partitioners and the federated container."""

from lit_fedco.data.federated import BatchSampler, FederatedData, build_federated, make_federated
from lit_fedco.data.partition import (
    partition_dirichlet,
    partition_dominant_class,
    partition_iid,
    partition_quantity_imbalanced,
    partition_stats,
    validation_like,
)
from lit_fedco.data.sources import load_digits_arrays, load_mnist, load_source

__all__ = [
    "BatchSampler",
    "FederatedData",
    "build_federated",
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
