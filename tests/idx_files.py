"""Tiny IDX files (the format of MNIST and Fashion-MNIST), written by the tests themselves:
no test reads ../shared. No torch or lightning import."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np


def write_idx(folder: Path, prefix: str, images: np.ndarray, labels: np.ndarray, gz: bool) -> None:
    """Write images [n, 28, 28] uint8 and labels [n] in the IDX format (magic 2051 / 2049)."""
    folder.mkdir(parents=True, exist_ok=True)
    img = struct.pack(">IIII", 2051, len(images), 28, 28) + images.astype(np.uint8).tobytes()
    lab = struct.pack(">II", 2049, len(labels)) + labels.astype(np.uint8).tobytes()
    for name, payload in (
        (f"{prefix}-images-idx3-ubyte", img),
        (f"{prefix}-labels-idx1-ubyte", lab),
    ):
        if gz:
            with gzip.open(folder / f"{name}.gz", "wb") as f:
                f.write(payload)
        else:
            (folder / name).write_bytes(payload)


def make_set(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random 28×28 uint8 images and labels in 0..9."""
    g = np.random.default_rng(seed)
    return g.integers(0, 256, (n, 28, 28), dtype=np.uint8), g.integers(0, 10, n).astype(np.uint8)
