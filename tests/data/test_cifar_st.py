"""The step-imbalanced CIFAR-ST and digits-ST builders, on small CIFAR-format files."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.func import functional_call, vmap

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.models import build_model
from lit_fedco.data import make_federated
from lit_fedco.data.cifar import load_cifar
from lit_fedco.data.partition import balanced_validation, step_imbalance


def write_cifar(root: Path, kind: str, per_class_train: int, per_class_test: int, c: int) -> None:
    """A CIFAR-10 (5 train batches + test) or CIFAR-100 (train + test) folder of random images,
    in the python pickle format torchvision reads; pixel (0, 0, 0) of image i holds i % 256."""
    rng = np.random.default_rng(0)

    def make(n_per_class: int) -> dict:
        labels = np.repeat(np.arange(c), n_per_class)
        rng.shuffle(labels)
        data = rng.integers(0, 256, size=(len(labels), 3072), dtype=np.uint8)
        data[:, 0] = np.arange(len(labels)) % 256
        key = "labels" if kind == "cifar10" else "fine_labels"
        return {"data": data, key: labels.tolist()}

    if kind == "cifar10":
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True)
        train = make(per_class_train)
        chunks = np.array_split(np.arange(len(train["labels"])), 5)
        for i, idx in enumerate(chunks, 1):
            part = {"data": train["data"][idx], "labels": [train["labels"][j] for j in idx]}
            (folder / f"data_batch_{i}").write_bytes(pickle.dumps(part))
        (folder / "test_batch").write_bytes(pickle.dumps(make(per_class_test)))
    else:
        folder = root / "cifar-100-python"
        folder.mkdir(parents=True)
        (folder / "train").write_bytes(pickle.dumps(make(per_class_train)))
        (folder / "test").write_bytes(pickle.dumps(make(per_class_test)))


def spec(name: str, data_dir: str = "", **kw) -> SimpleNamespace:
    cfg = dict(
        name=name,
        data_dir=data_dir,
        partition="iid",
        num_clients=4,
        big=0,
        small=0,
        small_classes=0,
        alpha=0.5,
        rho=0.28,
        val_per_client=20,
        seed=0,
        imbalance_ratio=10.0,
    )
    cfg.update(kw)
    return SimpleNamespace(**cfg)


def test_step_imbalance_keeps_majority_and_one_over_rho_of_minority():
    labels = np.repeat(np.arange(10), 100)
    kept = step_imbalance(labels, 20.0, np.random.default_rng(0))
    counts = np.bincount(labels[kept], minlength=10)
    assert counts.tolist() == [100] * 5 + [5] * 5
    assert len(np.unique(kept)) == len(kept)
    # odd C: the last ⌊C/2⌋ classes are the minority; at least one sample survives
    labels = np.repeat(np.arange(5), 10)
    counts = np.bincount(labels[step_imbalance(labels, 100.0, np.random.default_rng(0))])
    assert counts.tolist() == [10, 10, 10, 1, 1]
    assert np.array_equal(step_imbalance(labels, 1.0, np.random.default_rng(0)), np.arange(50))
    with pytest.raises(ConfigError, match=r"data\.imbalance_ratio: got 0\.5"):
        step_imbalance(labels, 0.5, np.random.default_rng(0))


def test_balanced_validation_is_balanced_and_disjoint_while_it_lasts():
    labels = np.repeat(np.arange(4), 10)
    parts = balanced_validation(labels, 3, 9, np.random.default_rng(0))
    per_client = [np.bincount(labels[p], minlength=4) for p in parts]
    assert all(c.sum() == 9 and c.max() - c.min() <= 1 for c in per_client)
    assert sum(per_client).tolist() == [7, 7, 7, 6]  # remainders rotate over classes
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat)  # 27 of 40: no reuse


def test_cifar10_st_builder_on_a_small_cifar_format_folder(tmp_path):
    write_cifar(tmp_path, "cifar10", per_class_train=40, per_class_test=12, c=10)
    data = make_federated(spec("cifar10_st", str(tmp_path), imbalance_ratio=8.0))
    assert data.num_classes == 10 and data.num_clients == 4
    assert tuple(data.x_train.shape[1:]) == (3, 32, 32) and data.x_train.dtype == torch.float32
    counts = torch.bincount(data.y_train, minlength=10).tolist()
    assert counts == [40] * 5 + [5] * 5  # classes 5-9 keep ⌊40/8⌋
    sizes = data.sizes().tolist()
    assert sum(sizes) == 225 and max(sizes) - min(sizes) <= 1  # equal split
    val = torch.bincount(data.y_val, minlength=10).tolist()
    assert sum(val) == 80 and max(val) - min(val) <= 1  # class-balanced validation
    # standardised per channel with the training split's statistics
    assert data.x_train.mean().abs() < 0.2 and 0.8 < data.x_train.std() < 1.2
    # images are the file's images: the raw pixel (0, 0, 0) survives the standardisation
    raw_x, _ = load_cifar("cifar10", tmp_path, train=True)
    assert raw_x.shape == (400, 3, 32, 32) and raw_x.dtype == torch.uint8
    ref = raw_x.double() / 255
    mean, std = ref.mean(dim=(0, 2, 3)), ref.std(dim=(0, 2, 3))
    pix = (data.x_train[:, 0, 0, 0].double() * std[0] + mean[0]) * 255
    assert torch.allclose(pix, pix.round(), atol=1e-3)


def test_cifar100_st_reads_fine_labels(tmp_path):
    write_cifar(tmp_path, "cifar100", per_class_train=4, per_class_test=2, c=100)
    data = make_federated(spec("cifar100_st", str(tmp_path), imbalance_ratio=4.0))
    assert data.num_classes == 100
    counts = torch.bincount(data.y_train, minlength=100).tolist()
    assert counts == [4] * 50 + [1] * 50


def test_missing_or_bad_cifar_files_raise_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cifar-10-batches-py"):
        make_federated(spec("cifar10_st", str(tmp_path)))
    with pytest.raises(ConfigError, match=r"data\.data_dir: empty"):
        make_federated(spec("cifar10_st", ""))
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    (folder / "train").write_bytes(b"not a pickle")
    (folder / "test").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="python-format files"):
        make_federated(spec("cifar100_st", str(tmp_path)))
    with pytest.raises(ConfigError, match=r"data\.partition: got 'quantity'"):
        make_federated(spec("digits_st", partition="quantity"))


def test_digits_st_is_the_embedded_default():
    data = make_federated(spec("digits_st", num_clients=8, val_per_client=60))
    counts = torch.bincount(data.y_train, minlength=10)
    assert (counts[:5] >= 120).all() and (counts[5:] <= 13).all() and (counts[5:] >= 12).all()
    assert data.sizes().max() - data.sizes().min() <= 1
    val = torch.bincount(data.y_val, minlength=10)
    assert val.tolist() == [48] * 10


def test_resnet20_is_a_pure_function_of_its_parameters_under_vmap():
    model = build_model("resnet20", (3, 32, 32), 10, seed=0)
    assert sum(p.numel() for p in model.parameters()) == 269722 and not list(model.buffers())
    params = {k: v.detach().expand(2, *v.shape) for k, v in model.named_parameters()}
    x = torch.randn(2, 4, 3, 32, 32)
    out = vmap(lambda p, xb: functional_call(model, p, (xb,)))(params, x)
    assert out.shape == (2, 4, 10)
    torch.testing.assert_close(out[1], model(x[1]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,c", [("cifar10", 10), ("cifar100", 100)])
def test_cifar_st_presets_resolve_and_pass_the_run_checks(tmp_path, kind, c):
    """The paper's settings (§6): 8 equal clients, batch 16, ResNet20, η/10 after 90 rounds,
    γ_x = 1.3, γ_y = 1.4; every key validates against the schema and the data builds."""
    from lit_fedco.config.load import load_config
    from lit_fedco.experiment.checks import check_run
    from lit_fedco.recipes.ds_feddro import DEFAULTS

    write_cifar(tmp_path, kind, per_class_train=4, per_class_test=2, c=c)
    argv = [f"preset=ds_feddro_{kind}_st", f"data.data_dir={tmp_path}", "data.val_per_client=20"]
    cfg = load_config(argv, DEFAULTS)
    check_run(cfg)
    assert (cfg.data.name, cfg.data.num_clients, cfg.batch_size) == (f"{kind}_st", 8, 16)
    assert cfg.model.name == "resnet20" and cfg.cohort == 8
    assert (cfg.ds_feddro.gamma_x, cfg.ds_feddro.gamma_y) == (1.3, 1.4)
    for name in cfg.updaters:
        assert (cfg[name].lr_decay_round, cfg[name].lr_decay) == (90, 0.1)
        assert cfg[name].lr in (0.001, 0.01, 0.05, 0.1)


def test_plain_cifar10_source_reads_both_splits(tmp_path):
    from lit_fedco.data.sources import load_source

    write_cifar(tmp_path, "cifar10", per_class_train=3, per_class_test=2, c=10)
    x, y, xt, _, c = load_source("cifar10", tmp_path)
    assert x.shape == (30, 3, 32, 32) and xt.shape == (20, 3, 32, 32) and c == 10
    assert sorted(y.tolist()) == sorted(list(range(10)) * 3)
    assert abs(float(x.mean())) < 1e-5  # standardised with the training statistics
