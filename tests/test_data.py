"""Data sources (torchvision on small IDX files written here), the container and the sampler."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_fedco.data.federated import BatchSampler
from lit_fedco.data.sources import load_mnist, load_source
from lit_fedco.errors import ConfigError
from tests.helpers import digits_data


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


def make_set(n: int, seed: int):
    g = np.random.default_rng(seed)
    return g.integers(0, 256, (n, 28, 28), dtype=np.uint8), g.integers(0, 10, n).astype(np.uint8)


@pytest.mark.parametrize(
    "layout,gz", [("torchvision", False), ("torchvision", True), ("flat", True), ("flat", False)]
)
@pytest.mark.parametrize("fashion", [False, True])
def test_torchvision_loaders_read_idx_files(tmp_path, layout, gz, fashion):
    root = tmp_path / "data"
    folder = (
        root / ("FashionMNIST" if fashion else "MNIST") / "raw" if layout == "torchvision" else root
    )
    tr, te = make_set(30, 1), make_set(10, 2)
    write_idx(folder, "train", *tr, gz=gz)
    write_idx(folder, "t10k", *te, gz=gz)
    x, y = load_mnist(root, train=True, fashion=fashion)
    assert x.shape == (30, 1, 28, 28) and x.dtype == torch.float32
    np.testing.assert_allclose(x.squeeze(1).numpy(), tr[0] / 255.0, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(y.numpy(), tr[1])
    x, y = load_mnist(root, train=False, fashion=fashion)
    np.testing.assert_array_equal(y.numpy(), te[1])


def test_only_the_test_split_is_split_80_20(tmp_path):
    write_idx(tmp_path, "t10k", *make_set(50, 3), gz=True)
    _, y, _, yt, c = load_source("mnist", tmp_path)
    assert len(y) + len(yt) == 50 and len(yt) == pytest.approx(10, abs=3) and c == 10


def test_missing_files_say_where_and_how(tmp_path):
    with pytest.raises(
        ConfigError, match=r"data\.data_dir: .*t10k-images-idx3-ubyte.*dataset-fashion-mnist"
    ):
        load_mnist(tmp_path / "nothing", train=False, fashion=True)
    with pytest.raises(ConfigError, match=r"data\.data_dir: .*MNIST/raw"):
        load_mnist(tmp_path, train=True)
    with pytest.raises(ConfigError, match=r"data\.data_dir: empty"):
        load_mnist("", train=True)
    with pytest.raises(ConfigError, match=r"data\.name: got 'cifar7'"):
        load_source("cifar7")


def test_digits_quantity_split_sizes_and_validation():
    data = digits_data(num_clients=10, big=300, small=20, val_per_client=25)
    assert data.sizes("train").tolist() == [300] + [20] * 9
    assert data.sizes("val").tolist() == [25] * 10
    for k in range(10):
        _, ytr = data.client_slice(k, "train")
        _, yva = data.client_slice(k, "val")
        assert set(yva.tolist()) <= set(ytr.tolist())
    assert "client" in data.describe()


def test_sampler_is_invariant_to_sharding_and_stays_in_range():
    data = digits_data(num_clients=6)
    s = BatchSampler(data, seed=3)
    everyone = s.sample_round(torch.arange(6), 4, 3, ("inner", "outer"), 8)
    some = s.sample_round(torch.tensor([1, 4]), 4, 3, ("inner", "outer"), 8)
    assert everyone.shape == (3, 2, 6, 8)
    assert torch.equal(everyone[:, :, [1, 4]], some)
    off = data.train_offsets
    for k in range(6):
        rows = everyone[:, :, k]
        assert bool(((rows >= off[k]) & (rows < off[k + 1])).all())
        if data.sizes()[k] >= 8:  # without replacement within a draw
            assert all(len(set(r.tolist())) == 8 for r in rows.reshape(-1, 8))
    x, y = s.gather(everyone[0, 0])
    assert torch.equal(x, data.x_train[everyone[0, 0]]) and torch.equal(
        y, data.y_train[everyone[0, 0]]
    )
    assert not torch.equal(everyone, s.sample_round(torch.arange(6), 5, 3, ("inner", "outer"), 8))
