"""Data: sources, partitions, samplers, the federated container and its builders.

Layers, each importing only those above it in this list (``tests/test_imports.py`` keeps
them free of cycles):

- ``names`` — the names ``data.name`` / ``data.partition`` / ``data.val_mode`` accept, plain
  tuples (no numpy, no torch), for checks before anything heavy is imported; ``config`` — the
  run's ``data`` config node, :class:`DataConfig`, where every ``data.*`` key is described;
- ``sources``, ``cifar``, ``omniglot``, ``adult`` — readers of the built-in data sets;
  ``pools``, ``readers``, ``user`` — readers of one's own files (``npz``, ``imagefolder``,
  ``hf_disk``, ``text``) and data functions (``data.name=MODULE:FUNCTION``);
- ``partition``, ``partition_classes`` — pure functions of labels (or group ids) and an
  explicit ``numpy`` generator;
- ``container`` — :class:`FederatedData` and its partition statistics;
- ``samplers`` — which rows a round's minibatches hold, seeded by (seed, client, round);
- ``specs`` — one typed, validated spec per builder;
- ``build`` — the builders and :func:`make_federated`, the only module that knows them all.

The names below are imported on first use (PEP 562), so that importing
``lit_fedco.data.names`` (or ``lit_fedco.data.user`` to read a data function's parameters)
does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lit_fedco.data.build import make_federated
    from lit_fedco.data.config import DataConfig
    from lit_fedco.data.container import (
        FederatedData,
        build_federated,
        format_partition_stats,
    )
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
    from lit_fedco.data.samplers import BatchSampler, PositiveSampler, TaskSampler
    from lit_fedco.data.sources import load_digits_arrays, load_mnist, load_source
    from lit_fedco.data.specs import data_spec
    from lit_fedco.data.user import UserData

_LAZY = {
    "make_federated": "lit_fedco.data.build",
    "DataConfig": "lit_fedco.data.config",
    "FederatedData": "lit_fedco.data.container",
    "build_federated": "lit_fedco.data.container",
    "format_partition_stats": "lit_fedco.data.container",
    "partition_dirichlet": "lit_fedco.data.partition",
    "partition_dominant_class": "lit_fedco.data.partition",
    "partition_iid": "lit_fedco.data.partition",
    "partition_natural": "lit_fedco.data.partition_skews",
    "partition_quantity_imbalanced": "lit_fedco.data.partition",
    "partition_shards": "lit_fedco.data.partition_skews",
    "partition_size_skew": "lit_fedco.data.partition_skews",
    "partition_stats": "lit_fedco.data.partition",
    "validation_like": "lit_fedco.data.partition",
    "validation_own": "lit_fedco.data.partition_skews",
    "BatchSampler": "lit_fedco.data.samplers",
    "PositiveSampler": "lit_fedco.data.samplers",
    "TaskSampler": "lit_fedco.data.samplers",
    "load_digits_arrays": "lit_fedco.data.sources",
    "load_mnist": "lit_fedco.data.sources",
    "load_source": "lit_fedco.data.sources",
    "data_spec": "lit_fedco.data.specs",
    "UserData": "lit_fedco.data.user",
}

__all__ = [
    "BatchSampler",
    "DataConfig",
    "FederatedData",
    "PositiveSampler",
    "TaskSampler",
    "UserData",
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
    "partition_natural",
    "partition_quantity_imbalanced",
    "partition_shards",
    "partition_size_skew",
    "partition_stats",
    "validation_like",
    "validation_own",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lit_fedco.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
