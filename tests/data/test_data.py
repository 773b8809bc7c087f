"""Data sources (torchvision on small IDX files written here), the container and the sampler."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lit_fedco.core.errors import ConfigError
from lit_fedco.data import (
    BatchSampler,
    FederatedData,
    build_federated,
    format_partition_stats,
    make_federated,
)
from lit_fedco.data.sources import load_digits_arrays, load_mnist, load_source
from tests.idx_files import make_set, write_idx


def digits(**kw) -> FederatedData:
    """Real digits, quantity- and label-imbalanced, small (no lightning import)."""
    cfg = dict(
        name="digits",
        data_dir="",
        partition="quantity",
        num_clients=6,
        big=200,
        small=20,
        small_classes=2,
        alpha=0.5,
        rho=0.28,
        val_per_client=30,
        seed=0,
    )
    cfg.update(kw)
    return make_federated(SimpleNamespace(**cfg))


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    """Decompressed IDX files go to a per-test cache, never to ~/.cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache / "lit_fedco" / "idx"


# --- sources ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout,gz", [("torchvision", False), ("torchvision", True), ("flat", True), ("flat", False)]
)
@pytest.mark.parametrize("fashion", [False, True])
def test_torchvision_loaders_read_idx_files(tmp_path, cache_in_tmp, layout, gz, fashion):
    root = tmp_path / "data"
    folder = (
        root / ("FashionMNIST" if fashion else "MNIST") / "raw" if layout == "torchvision" else root
    )
    tr, te = make_set(30, 1), make_set(10, 2)
    write_idx(folder, "train", *tr, gz=gz)
    write_idx(folder, "t10k", *te, gz=gz)
    x, y = load_mnist(root, train=True, fashion=fashion)
    assert x.shape == (30, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    np.testing.assert_allclose(x.squeeze(1).numpy(), tr[0] / 255.0, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(y.numpy(), tr[1])
    x, y = load_mnist(root, train=False, fashion=fashion)
    np.testing.assert_allclose(x.squeeze(1).numpy(), te[0] / 255.0, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(y.numpy(), te[1])
    # Plain files are read in place; only .gz files are decompressed into the cache.
    assert cache_in_tmp.exists() == gz
    assert not any(p.name.startswith(".") for p in root.rglob("*"))  # data folder untouched


def test_gz_cache_is_reused_and_follows_changed_files(tmp_path, cache_in_tmp):
    data = tmp_path / "data"
    write_idx(data, "t10k", *make_set(10, 2), gz=True)
    load_mnist(data, train=False)
    load_mnist(data, train=False)
    assert len(list(cache_in_tmp.iterdir())) == 1
    new = make_set(12, 5)
    write_idx(data, "t10k", *new[:1], new[1][:11], gz=True)  # 12 images, 11 labels
    with pytest.raises(ConfigError, match=r"holds 12 images but .* holds 11 labels"):
        load_mnist(data, train=False)
    write_idx(data, "t10k", *new, gz=True)
    _, y = load_mnist(data, train=False)
    np.testing.assert_array_equal(y.numpy(), new[1])
    assert len(list(cache_in_tmp.iterdir())) >= 2


def test_gz_cache_falls_back_to_the_temp_folder(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")  # mkdir under a file fails, even for root
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    write_idx(tmp_path / "data", "t10k", *make_set(10, 2), gz=True)
    load_mnist(tmp_path / "data", train=False)
    assert len(list((tmp_path / "tmp" / "lit_fedco-idx").iterdir())) == 1


def test_only_the_test_split_is_split_80_20(tmp_path):
    write_idx(tmp_path, "t10k", *make_set(50, 3), gz=True)
    with pytest.warns(UserWarning, match="only the mnist test split"):
        _, y, _, yt, c = load_source("mnist", tmp_path)
    assert len(y) + len(yt) == 50 and len(yt) == pytest.approx(10, abs=3) and c == 10
    with pytest.raises(ConfigError, match=r"train-images-idx3-ubyte.*only the test split is there"):
        load_mnist(tmp_path, train=True)


def marked_set(n: int, seed: int, mark: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_set`` with every image's first pixel set to ``mark``: where a row came from."""
    images, labels = make_set(n, seed)
    images[:, 0, 0] = mark
    return images, labels


def idx_spec(root: Path, name: str, **kw) -> SimpleNamespace:
    cfg = dict(name=name, data_dir=str(root), partition="iid", num_clients=4, big=0, small=0,
               small_classes=0, alpha=0.5, rho=0.28, val_per_client=3, seed=0)  # fmt: skip
    cfg.update(kw)
    return SimpleNamespace(**cfg)


@pytest.mark.parametrize(
    "layout,gz", [("torchvision", True), ("torchvision", False), ("flat", True), ("flat", False)]
)
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_a_folder_with_the_training_files_gives_the_standard_split(tmp_path, layout, gz, name):
    """train-* are the training pool, t10k-* the held-out pool (the papers' split), and the run
    says so; without train-* the test files alone are split 80/20, with a warning."""
    root = tmp_path / "data"
    sub = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}[name]
    folder = root / sub / "raw" if layout == "torchvision" else root
    train, test = marked_set(40, 1, mark=11), marked_set(20, 2, mark=222)
    write_idx(folder, "train", *train, gz=gz)
    write_idx(folder, "t10k", *test, gz=gz)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the standard split is no warning
        x, y, x_te, y_te, c = load_source(name, root)
    assert (len(y), len(y_te), c) == (40, 20, 10)
    np.testing.assert_allclose(x.squeeze(1).numpy(), train[0] / 255.0, rtol=0, atol=1e-7)
    np.testing.assert_allclose(x_te.squeeze(1).numpy(), test[0] / 255.0, rtol=0, atol=1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = make_federated(idx_spec(root, name))
    first = (data.x_train[:, 0, 0, 0] * 255).round()
    assert data.sizes("train").sum() == 40 and bool((first == 11).all())
    held = (data.x_val[:, 0, 0, 0] * 255).round()
    assert data.sizes("val").sum() == 12 and bool((held == 222).all())  # rows of t10k only
    stats = data.partition_stats()
    assert stats["source"].startswith(f"{name}'s standard split from {root}")
    assert "train-*, 40 images" in stats["source"] and "t10k-*, 20" in stats["source"]
    assert format_partition_stats(stats).splitlines()[-1] == f"  data: {stats['source']}"

    # the same folder without the training files: t10k's 20 images split 80/20 (by class)
    for f in folder.glob("train-*"):
        f.unlink()
    with pytest.warns(UserWarning, match=f"only the {name} test split"):
        data = make_federated(idx_spec(root, name, val_per_client=1))
    assert bool(((data.x_train[:, 0, 0, 0] * 255).round() == 222).all())
    assert bool(((data.x_val[:, 0, 0, 0] * 255).round() == 222).all())
    source = data.partition_stats()["source"]
    assert source.startswith(f"{name}'s test files (t10k-*) alone from {root}, split 80/20")
    n_train = int(data.sizes("train").sum())
    assert n_train in (15, 16, 17) and f"{n_train} training and {20 - n_train} held-out" in source


def test_the_binary_task_tests_on_the_whole_test_file(tmp_path):
    """FCSG §5.3's AUPRC data (val_mode=all): every t10k row is a validation row, once; the
    training rows are the train-* file's less the dropped positives."""
    train, test = marked_set(40, 3, mark=11), marked_set(20, 4, mark=222)
    write_idx(tmp_path, "train", *train, gz=True)
    write_idx(tmp_path, "t10k", *test, gz=False)
    data = make_federated(idx_spec(tmp_path, "mnist", binary=True, drop_positive=0.5,
                                   val_mode="all"))  # fmt: skip
    assert data.num_classes == 2 and data.sizes("val").sum() == 20
    assert sorted(data.y_val.tolist()) == sorted((test[1] >= 5).astype(int).tolist())
    positives = int((train[1] >= 5).sum())
    assert data.sizes("train").sum() == 40 - round(0.5 * positives)
    assert bool(((data.x_train[:, 0, 0, 0] * 255).round() == 11).all())
    assert "standard split" in data.partition_stats()["source"]


def test_the_embedded_digits_record_no_source():
    assert "source" not in digits().partition_stats()


def test_missing_files_say_where_and_how(tmp_path):
    where = str(tmp_path / "nothing")
    with pytest.raises(ConfigError) as err:
        load_mnist(where, train=False, fashion=True)
    msg = str(err.value)
    assert msg.startswith("data.data_dir: ") and where in msg
    assert "t10k-images-idx3-ubyte" in msg and "t10k-labels-idx1-ubyte" in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    with pytest.raises(ConfigError, match=r"data\.data_dir: .*MNIST/raw/"):
        load_mnist(tmp_path, train=True)
    with pytest.raises(ConfigError, match=r"data\.data_dir: .*MNIST/raw"):
        load_source("mnist", tmp_path)
    with pytest.raises(ConfigError, match=r"data\.data_dir: empty"):
        load_mnist("", train=True)
    with pytest.raises(ConfigError, match=r"data\.name: got 'cifar7', expected one of .*digits"):
        load_source("cifar7")


def test_unreadable_files_are_config_errors(tmp_path):
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03garbage")
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"nope")
    with pytest.raises(ConfigError, match="could not be read as IDX"):
        load_mnist(tmp_path, train=False)
    (tmp_path / "t10k-images-idx3-ubyte").unlink()
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(ConfigError, match="could not be read as IDX"):
        load_mnist(tmp_path, train=False)


def test_digits_source_is_real_stratified_and_fixed():
    x, y = load_digits_arrays()
    assert x.shape == (1797, 1, 8, 8) and float(x.min()) == 0.0 and float(x.max()) == 1.0
    a, b = load_source("digits"), load_source("digits")
    assert len(a[1]) + len(a[3]) == 1797 and a[4] == 10
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    frac = torch.bincount(a[3], minlength=10) / torch.bincount(y, minlength=10)
    assert bool(((frac - 0.3).abs() < 0.01).all())


# --- the container ---------------------------------------------------------------------------


def test_make_federated_digits_quantity_split_sizes_and_validation():
    data = digits(num_clients=10, big=300, small=20, val_per_client=25)
    assert data.num_clients == 10 and data.num_classes == 10 and data.name == "digits"
    assert data.sizes("train").tolist() == [300] + [20] * 9
    assert data.sizes("val").tolist() == [25] * 10
    assert data.stats["train"]["sizes"] == [300] + [20] * 9
    for k in range(10):
        _, ytr = data.client_slice(k, "train")
        _, yva = data.client_slice(k, "val")
        assert set(yva.tolist()) <= set(ytr.tolist())
        if k:
            assert len(set(ytr.tolist())) <= 2
    table = data.describe()
    assert "client" in table and "n_train" in table and len(table.splitlines()) == 12
    again = digits(num_clients=10, big=300, small=20, val_per_client=25)
    assert torch.equal(data.y_train, again.y_train) and torch.equal(data.x_val, again.x_val)
    other = digits(num_clients=10, big=300, small=20, val_per_client=25, seed=1)
    assert not torch.equal(data.y_train, other.y_train)


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "dominant_class"])
def test_make_federated_other_partitions(partition):
    data = digits(partition=partition, num_clients=5, small_classes=0)
    pool = len(load_source("digits")[1])
    assert data.num_clients == 5 and int(data.sizes().min()) >= 1
    if partition == "dominant_class":  # equal sizes, as many as the classes allow
        assert len(set(data.sizes().tolist())) == 1 and int(data.sizes().sum()) <= pool
    else:  # every pooled sample is used once
        assert int(data.sizes().sum()) == pool
        assert len(set(data.y_train.tolist())) == 10


def test_make_federated_rejects_bad_names():
    with pytest.raises(ConfigError, match=r"data\.partition: got 'zipf', expected one of"):
        digits(partition="zipf")
    with pytest.raises(ConfigError, match=r"data\.val_per_client: got 0"):
        digits(val_per_client=0)


def test_build_federated_stores_clients_contiguously():
    x = torch.arange(20, dtype=torch.float32).view(20, 1)
    y = torch.arange(20) % 3
    parts = [np.array([3, 7]), np.array([0, 1, 2]), np.array([19])]
    val = [np.array([5]), np.array([6, 8]), np.array([9, 9])]
    data = build_federated(x, y, x, y, parts, val, 3, "toy")
    assert data.train_offsets.tolist() == [0, 2, 5, 6]
    for k, p in enumerate(parts):
        xk, yk = data.client_slice(k)
        assert xk.view(-1).tolist() == p.tolist() and torch.equal(yk, y[p])
    assert data.client_slice(2, "val")[0].view(-1).tolist() == [9.0, 9.0]
    assert data.stats["val"]["class_counts"][1] == [1, 0, 1]
    moved = data.to("cpu", torch.float64)
    assert moved.x_train.dtype == torch.float64 and moved.y_train.dtype == torch.int64
    with pytest.raises(ValueError, match="split"):
        data.sizes("test")
    with pytest.raises(IndexError):
        data.client_slice(3)


# --- the sampler -----------------------------------------------------------------------------


def test_sampler_is_invariant_to_sharding_and_stays_in_range():
    data = digits()
    s = BatchSampler(data, seed=3)
    roles = ("inner", "outer")
    everyone = s.sample_round(torch.arange(6), 4, 3, roles, 8)
    some = s.sample_round(torch.tensor([4, 1]), 4, 3, roles, 8)
    assert everyone.shape == (3, 2, 6, 8) and everyone.dtype == torch.int64
    assert torch.equal(everyone[:, :, [4, 1]], some)
    off = data.train_offsets
    for k in range(6):
        rows = everyone[:, :, k]
        assert bool(((rows >= off[k]) & (rows < off[k + 1])).all())
        if data.sizes()[k] >= 8:  # without replacement within a draw
            assert all(len(set(r.tolist())) == 8 for r in rows.reshape(-1, 8))
    assert torch.equal(
        everyone, BatchSampler(data, seed=3).sample_round(torch.arange(6), 4, 3, roles, 8)
    )
    assert not torch.equal(everyone, s.sample_round(torch.arange(6), 5, 3, roles, 8))
    assert not torch.equal(
        everyone, BatchSampler(data, 4).sample_round(torch.arange(6), 4, 3, roles, 8)
    )


def test_sampler_follows_the_documented_seeding():
    data = digits()
    k, r, seed = 2, 7, 11
    words = np.random.SeedSequence([seed, k, r]).generate_state(2)
    g = torch.Generator().manual_seed(int(words[0]) << 32 | int(words[1]))
    n_k, base = int(data.sizes()[k]), int(data.train_offsets[k])
    expected = torch.stack([torch.randperm(n_k, generator=g)[:5] for _ in range(2)]) + base
    got = BatchSampler(data, seed).sample_round(torch.tensor([k]), r, 2, ("inner",), 5)
    assert torch.equal(got[:, 0, 0], expected)


def test_small_clients_draw_with_replacement():
    data = digits()  # clients 1..5 hold 20 samples
    idx = BatchSampler(data, 0).sample_round(torch.tensor([1]), 0, 2, ("inner",), 64)
    lo, hi = int(data.train_offsets[1]), int(data.train_offsets[2])
    assert idx.shape == (2, 1, 1, 64) and bool(((idx >= lo) & (idx < hi)).all())


def test_gather_equals_indexing_and_reuses_its_buffers():
    data = digits()
    s = BatchSampler(data, seed=0)
    idx = s.sample_round(torch.arange(6), 0, 2, ("inner", "outer"), 4)
    x0, y0 = s.gather(idx[0, 0], role="inner")
    assert x0.shape == (6, 4, 1, 8, 8) and y0.shape == (6, 4)
    assert torch.equal(x0, data.x_train[idx[0, 0]]) and torch.equal(y0, data.y_train[idx[0, 0]])
    ptr = x0.data_ptr()
    x_out, _ = s.gather(idx[0, 1], role="outer")
    assert x_out.data_ptr() != ptr  # one buffer per role
    x1, y1 = s.gather(idx[1, 0], role="inner")
    assert x1.data_ptr() == ptr  # reused across steps
    assert torch.equal(x1, data.x_train[idx[1, 0]]) and torch.equal(y1, data.y_train[idx[1, 0]])
    x2, _ = s.gather(idx[1, 0, :3, :2], role="inner")  # shape change: a new buffer
    assert x2.shape == (3, 2, 1, 8, 8) and torch.equal(x2, data.x_train[idx[1, 0, :3, :2]])
    rows = data.val_offsets[:2]
    xv, yv = s.gather(rows.view(1, 2), split="val")
    assert torch.equal(xv[0], data.x_val[rows]) and torch.equal(yv[0], data.y_val[rows])
