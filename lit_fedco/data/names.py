"""The names ``data.name``, ``data.partition`` and ``data.val_mode`` accept, as plain tuples.

Imports nothing (no numpy, no torch), so that the command line can check a value against
them before anything heavy is imported; the modules that build the data read them from here.
"""

from __future__ import annotations

BUILTIN_SOURCES = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100")
"""Sources read by :mod:`lit_fedco.data.sources` (embedded, or from their own files)."""
FILE_READERS = ("npz", "imagefolder", "hf_disk", "text")
"""Readers of a researcher's own files (:mod:`lit_fedco.data.readers`), each from
``data.data_dir``."""
OTHER_SOURCES = ("digits_st", "cifar10_st", "cifar100_st", "invariant_logreg", "adult", "omniglot")
"""Sources with builders of their own (step-imbalanced, synthetic, Adult, few-shot)."""
PARTITIONS = (
    "quantity",
    "iid",
    "dirichlet",
    "dominant_class",
    "shards",
    "size_skew",
    "natural",
)
"""Splits of a training pool over the clients (:mod:`lit_fedco.data.partition`); the few-shot
``classes`` split is handled by its own builder."""
VAL_MODES = ("client", "all", "own")
"""How each client's validation rows are chosen: ``client`` (the held-out pool drawn with the
client's class proportions), ``all`` (the held-out pool split evenly), ``own`` (the held-out
rows of the client's own group; ``partition=natural`` with test group ids)."""


def is_function_ref(name: str) -> bool:
    """Whether ``data.name`` names a function of the user's own, ``package.module:function``."""
    module, sep, attr = name.partition(":")
    return bool(sep) and all(part.isidentifier() for part in [*module.split("."), attr])
