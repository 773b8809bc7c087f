"""A researcher's own data: the readers ``npz``, ``imagefolder``, ``hf_disk`` and ``text`` (each
from ``data.data_dir``), a data function ``data.name=MODULE:FUNCTION`` with its ``Params``,
``val_mode=own``, and the checks of what they give. Every file is written here, under
``tmp_path``, and loaded through the run's own path (:func:`lit_fedco.config.load.load_config`,
then :func:`lit_fedco.experiment.assemble.build_data`); the npz reader and a data function also
run a recipe end to end as a real process."""

# ruff: noqa: E501  (tables of cases, one per line)

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lit_fedco.config.load import load_config
from lit_fedco.core.errors import ConfigError
from lit_fedco.data.partition_skews import partition_natural
from lit_fedco.data.readers import speaker_texts
from lit_fedco.data.samplers import BatchSampler
from lit_fedco.experiment.assemble import build_data
from lit_fedco.recipes.comfedl_dro import DEFAULTS
from tests.helpers import REPO


@pytest.fixture(autouse=True)
def own_keys(monkeypatch):
    """A data function's parameters become ``data.*`` keys for the process: for one test only."""
    from lit_fedco.config import catalog

    monkeypatch.setattr(catalog, "NODE_PARAMS", dict(catalog.NODE_PARAMS))


def build(*argv: str, seed: int = 0):
    """The data set a comfedl_dro command line builds."""
    return build_data(load_config(list(argv), DEFAULTS), seed)


def rows_of(data, split="train"):
    x, y, off = data.arrays(split)
    return [(x[off[k] : off[k + 1]], y[off[k] : off[k + 1]]) for k in range(data.num_clients)]


# ------------------------------------------------------------------------------------ npz
def write_npz(path: Path, n=240, n_test=60, groups=6, test=True, seed=0) -> dict:
    g = np.random.default_rng(seed)
    arrays = {
        "x": g.normal(size=(n, 3, 4)).astype(np.float32),
        "y": g.integers(0, 4, n),
        "group": np.array([f"w{i % groups}" for i in range(n)]),
    }
    if test:
        arrays.update(
            x_test=g.normal(size=(n_test, 3, 4)),
            y_test=g.integers(0, 4, n_test),
            group_test=np.array([f"w{i % groups}" for i in range(n_test)]),
        )
    np.savez(path, **arrays)
    return arrays


def test_npz_file_is_read_whole_and_partitioned(tmp_path):
    arrays = write_npz(tmp_path / "d.npz")
    data = build("data.name=npz", f"data.data_dir={tmp_path / 'd.npz'}", "data.partition=iid",
                 "data.num_clients=4", "data.val_mode=all")  # fmt: skip
    assert data.num_classes == 4 and data.x_train.dtype == torch.float32
    assert data.x_train.shape == (240, 3, 4) and data.x_val.shape == (60, 3, 4)
    # every training row once, as written (rows of one client keep their order)
    got = sorted(map(tuple, data.x_train.reshape(240, -1).tolist()))
    assert got == sorted(map(tuple, torch.from_numpy(arrays["x"]).reshape(240, -1).tolist()))
    assert "npz" in data.partition_stats()["source"]


def test_npz_natural_partition_and_own_validation(tmp_path):
    arrays = write_npz(tmp_path / "d.npz")
    data = build("data.name=npz", f"data.data_dir={tmp_path / 'd.npz'}",
                 "data.partition=natural", "data.num_clients=6", "data.val_mode=own")  # fmt: skip
    assert data.stats["client_groups"] == [f"w{i}" for i in range(6)]
    parts = partition_natural(arrays["group"], 6)
    x_test = torch.from_numpy(arrays["x_test"]).float()
    for k, (x, y) in enumerate(rows_of(data)):
        assert torch.equal(x, torch.from_numpy(arrays["x"][parts[k]]))
        assert torch.equal(y, torch.from_numpy(arrays["y"][parts[k]]))
    for k, (x, _) in enumerate(rows_of(data, "val")):  # the test rows of group w{k}, all of them
        assert torch.equal(x, x_test[arrays["group_test"] == f"w{k}"])


def test_natural_clients_tune_on_their_own_rows_held_out_of_training(tmp_path):
    """``data.heldout=train`` (a tuning run): the group ids follow the rows held out, so each
    natural client is validated on its own group's held-out training rows."""
    arrays = write_npz(tmp_path / "d.npz")
    data = build("data.name=npz", f"data.data_dir={tmp_path / 'd.npz'}", "data.heldout=train",
                 "data.partition=natural", "data.num_clients=6", "data.val_mode=own")  # fmt: skip
    assert int(data.sizes("train").sum()) == 192 and int(data.sizes("val").sum()) == 48
    x = torch.from_numpy(arrays["x"])
    for k, ((x_tr, _), (x_va, _)) in enumerate(
        zip(rows_of(data), rows_of(data, "val"), strict=True)
    ):
        mine = x[torch.from_numpy(arrays["group"] == f"w{k}")]
        assert len(x_tr) + len(x_va) == len(mine)  # the group's rows, split between the two
        assert all(any(torch.equal(r, m) for m in mine) for r in torch.cat([x_tr, x_va]))


def test_npz_folder_without_test_split_holds_out_a_fifth(tmp_path):
    write_npz(tmp_path / "train.npz", test=False)
    data = build("data.name=npz", f"data.data_dir={tmp_path}", "data.partition=dirichlet",
                 "data.num_clients=3")  # fmt: skip
    counts = np.bincount(np.load(tmp_path / "train.npz")["y"])
    held = sum(round(0.2 * n) for n in counts)  # a stratified fifth of each class
    assert int(data.sizes("train").sum()) == 240 - held
    assert "held out" in data.stats["source"]
    write_npz(tmp_path / "test.npz", n=30, test=False)  # test.npz: x, y, group as well
    data = build("data.name=npz", f"data.data_dir={tmp_path}", "data.partition=iid",
                 "data.num_clients=3", "data.val_mode=all")  # fmt: skip
    assert int(data.sizes("train").sum()) == 240 and int(data.sizes("val").sum()) == 30


def test_npz_token_ids_stay_int64_through_the_pipeline(tmp_path):
    g = np.random.default_rng(0)
    np.savez(tmp_path / "t.npz", x=g.integers(0, 50, (100, 7)), y=g.integers(0, 5, 100),
             x_test=g.integers(0, 50, (20, 7)), y_test=g.integers(0, 5, 20))  # fmt: skip
    data = build("data.name=npz", f"data.data_dir={tmp_path / 't.npz'}", "data.partition=iid",
                 "data.num_clients=4", "data.val_per_client=5")  # fmt: skip
    assert data.x_train.dtype == torch.int64 and data.x_val.dtype == torch.int64
    moved = data.to("cpu", torch.float64)  # the loop's cast: floating inputs only
    assert moved.x_train.dtype == torch.int64
    sampler = BatchSampler(moved, seed=0)
    idx = sampler.sample_round(torch.tensor([0, 1]), 0, 1, ("inner",), 8)
    x, _ = sampler.gather(idx[0, 0])
    assert x.dtype == torch.int64 and x.shape == (2, 8, 7) and int(x.max()) < 50


# ------------------------------------------------------------------------------------ images
def write_images(root: Path, classes=("cat", "dog", "eel"), writers=3, per=2, size=(12, 10),
                 mode="L", test=True) -> None:  # fmt: skip
    from PIL import Image

    g = np.random.default_rng(0)
    for split in ("train", "test") if test else ("train",):
        for c in classes:
            folder = root / split / c
            folder.mkdir(parents=True)
            for w in range(writers):
                for i in range(per if split == "train" else 1):
                    shape = (size[1], size[0]) + ((3,) if mode == "RGB" else ())
                    pixels = g.integers(0, 256, shape, dtype=np.uint8)
                    Image.fromarray(pixels, mode).save(folder / f"writer{w}_{i}.png")


def test_imagefolder_grey_images_natural_partition_by_filename_prefix(tmp_path):
    write_images(tmp_path)
    data = build("data.name=imagefolder", f"data.data_dir={tmp_path}", "data.partition=natural",
                 "data.num_clients=3", "data.val_mode=own")  # fmt: skip
    assert data.num_classes == 3 and data.x_train.shape[1:] == (1, 10, 12)
    assert data.stats["client_groups"] == ["writer0", "writer1", "writer2"]
    assert data.sizes("train").tolist() == [6, 6, 6] and data.sizes("val").tolist() == [3, 3, 3]
    assert float(data.x_train.min()) >= 0.0 and float(data.x_train.max()) <= 1.0
    assert data.class_counts("train").tolist() == [[2, 2, 2]] * 3


def test_imagefolder_rgb_resized(tmp_path):
    write_images(tmp_path, mode="RGB", size=(9, 7))
    data = build("data.name=imagefolder", f"data.data_dir={tmp_path}", "data.image_size=8",
                 "data.partition=shards", "data.num_clients=3", "data.shards_per_client=1")  # fmt: skip
    assert data.x_train.shape == (18, 3, 8, 8) and data.x_train.dtype == torch.float32
    assert all(len(np.unique(y.numpy())) == 1 for _, y in rows_of(data))


def test_imagefolder_of_mixed_sizes_asks_for_image_size(tmp_path):
    write_images(tmp_path, test=False)
    write_images(tmp_path / "more", classes=("cat",), size=(5, 5), test=False)
    (tmp_path / "more" / "train" / "cat" / "writer0_0.png").rename(
        tmp_path / "train" / "cat" / "writer9_0.png"
    )
    with pytest.raises(ConfigError, match=r"^data\.image_size: got 0 .*have sizes .*set e\.g\."):
        build("data.name=imagefolder", f"data.data_dir={tmp_path}", "data.partition=iid")


# ------------------------------------------------------------------------------------ hf_disk
def write_hf(root: Path, image=True) -> None:
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Sequence, Value
    from datasets import Image as HFImage
    from PIL import Image

    g = np.random.default_rng(0)

    def split(n: int) -> Dataset:
        if image:
            col = [Image.fromarray(g.integers(0, 256, (6, 6), dtype=np.uint8)) for _ in range(n)]
            feature = HFImage()
        else:
            col = g.normal(size=(n, 5)).astype(np.float32).tolist()
            feature = Sequence(Value("float32"))
        values = {"img": col, "label": g.integers(0, 3, n).tolist(),
                  "user": [f"u{i % 4}" for i in range(n)]}  # fmt: skip
        features = {"img": feature, "label": ClassLabel(num_classes=3), "user": Value("string")}
        return Dataset.from_dict(values, features=Features(features))

    DatasetDict(train=split(48), test=split(16)).save_to_disk(str(root))


def test_hf_disk_images_with_a_group_column(tmp_path):
    pytest.importorskip("datasets")
    write_hf(tmp_path / "hf")
    data = build("data.name=hf_disk", f"data.data_dir={tmp_path / 'hf'}",
                 "data.feature_column=img", "data.group_column=user", "data.partition=natural",
                 "data.num_clients=4", "data.val_mode=own")  # fmt: skip
    assert data.x_train.shape == (48, 1, 6, 6) and data.num_classes == 3
    assert data.sizes("train").tolist() == [12] * 4 and data.sizes("val").tolist() == [4] * 4


def test_hf_disk_numeric_features_and_a_missing_column(tmp_path):
    pytest.importorskip("datasets")
    write_hf(tmp_path / "hf", image=False)
    data = build("data.name=hf_disk", f"data.data_dir={tmp_path / 'hf'}",
                 "data.feature_column=img", "data.partition=size_skew", "data.num_clients=5")  # fmt: skip
    assert data.x_train.shape == (48, 5) and data.x_train.dtype == torch.float32
    with pytest.raises(ConfigError, match=r"^data\.feature_column: got 'image', but .* has the "
                       r"columns \['img', 'label', 'user'\]"):  # fmt: skip
        build("data.name=hf_disk", f"data.data_dir={tmp_path / 'hf'}")


# ------------------------------------------------------------------------------------ text
PLAY = """\
THE TRAGEDY (a header, before any speaker: dropped)
HAMLET: To be, or not to be, that is the question:
Whether 'tis nobler in the mind to suffer
OPHELIA: Good my lord, how does your honour for this many a day?
HAMLET: I humbly thank you; well, well, well.
KING: Now, our sister, how fares it with our cousin Hamlet and his friends today?
"""


def test_speaker_texts_follow_the_name_colon_convention():
    texts = speaker_texts(PLAY)
    assert list(texts) == ["HAMLET", "OPHELIA", "KING"]
    assert texts["HAMLET"] == (
        "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
        "I humbly thank you; well, well, well."
    )
    assert speaker_texts("no speaker here\njust text\n") is None


def test_text_windows_are_next_character_samples_per_speaker(tmp_path):
    (tmp_path / "play.txt").write_text(PLAY)
    seq = 8
    data = build("data.name=text", f"data.data_dir={tmp_path / 'play.txt'}",
                 f"data.seq_len={seq}", "data.partition=natural", "data.num_clients=3",
                 "data.val_mode=own")  # fmt: skip
    vocab = data.stats["vocab"]
    assert vocab == "".join(sorted(set(PLAY))) and data.num_classes == len(vocab)
    assert data.x_train.dtype == torch.int64 and data.x_train.shape[1] == seq
    assert data.stats["client_groups"] == ["HAMLET", "KING", "OPHELIA"]
    hamlet = speaker_texts(PLAY)["HAMLET"]
    train_part = hamlet[: int(0.8 * len(hamlet))]
    x, y = rows_of(data)[0]
    assert len(y) == len(train_part) - seq
    decoded = ["".join(vocab[i] for i in row) for row in x.tolist()]
    assert sorted(zip(decoded, (vocab[i] for i in y.tolist()), strict=True)) == sorted(
        (train_part[i : i + seq], train_part[i + seq]) for i in range(len(train_part) - seq)
    )
    x_val, _ = rows_of(data, "val")[0]  # HAMLET's last fifth
    assert "".join(vocab[i] for i in x_val[0].tolist()) == hamlet[len(train_part) :][:seq]


def test_text_folder_of_train_and_test_files(tmp_path):
    (tmp_path / "train.txt").write_text("abcdefghij" * 5)
    (tmp_path / "test.txt").write_text("jihgfedcba" * 2)
    data = build("data.name=text", f"data.data_dir={tmp_path}", "data.seq_len=5",
                 "data.partition=iid", "data.num_clients=3", "data.val_mode=all")  # fmt: skip
    assert data.num_classes == 10 and int(data.sizes("train").sum()) == 45
    assert int(data.sizes("val").sum()) == 15
    strided = build("data.name=text", f"data.data_dir={tmp_path}", "data.seq_len=5",
                    "data.seq_stride=4", "data.partition=iid", "data.num_clients=3",
                    "data.val_mode=all")  # fmt: skip
    assert int(strided.sizes("train").sum()) == 12  # windows 0, 4, ..., 44 of the 45
    vocab, text = strided.stats["vocab"], "abcdefghij" * 5
    got = sorted("".join(vocab[i] for i in row) for row in strided.x_train.tolist())
    assert got == sorted(text[i : i + 5] for i in range(0, 45, 4))


# ------------------------------------------------------------------------------ data functions
MODULE = '''
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import TensorDataset

import lit_fedco.data


@dataclass(frozen=True)
class Blobs:
    """Gaussian blobs.

    Attributes:
        per_class: training samples per class.
        spread: the noise's scale.
    """

    per_class: int = 30
    spread: float = 1.0


def blobs(params: Blobs, seed: int):
    g = np.random.default_rng(seed)

    def draw(n):
        y = np.repeat(np.arange(3), n)
        return (g.normal(size=(3 * n, 4)) * params.spread + y[:, None]).astype(np.float32), y

    x, y = draw(params.per_class)
    x_te, y_te = draw(10)
    return x, y, x_te, y_te, 3


def as_dict(data_dir):
    x = torch.arange(40.0).view(20, 2)
    return {"x_train": x, "y_train": torch.arange(20) % 2, "x_test": x[:6],
            "y_test": torch.arange(6) % 2, "num_classes": 2,
            "group_train": np.arange(20) % 4, "group_test": np.arange(6) % 4}


def as_userdata():
    x = np.ones((12, 3))
    return lit_fedco.data.UserData(x, np.arange(12) % 3, x[:3], np.arange(3), 3)


def as_datasets():
    x = torch.randn(16, 2)
    return TensorDataset(x, torch.arange(16) % 2), TensorDataset(x[:4], torch.arange(4) % 2), 2


def counted(seed):
    counted.calls = getattr(counted, "calls", 0) + 1
    return blobs(Blobs(), seed)


def attribute_params(params):
    return blobs(params, 0)


attribute_params.Params = Blobs


def wrong_type():
    return "data"


def wrong_x():
    return "x", np.arange(4), np.zeros((2, 1)), np.arange(2), 4


def short_labels():
    return np.zeros((5, 2)), np.arange(4), np.zeros((2, 2)), np.arange(2), 4


def label_out_of_range():
    return np.zeros((4, 2)), np.array([0, 1, 2, 7]), np.zeros((2, 2)), np.arange(2), 4


def float_labels():
    return np.zeros((4, 2)), np.zeros(4), np.zeros((2, 2)), np.arange(2), 4


def shapes_differ():
    return np.zeros((4, 2)), np.arange(4), np.zeros((2, 3)), np.arange(2), 4


def raises():
    raise RuntimeError("no network here")


def needs(path):
    return None


@dataclass(frozen=True)
class Clash:
    """Attributes:
    alpha: clashes with data.alpha.
    """

    alpha: float = 1.0


def clashing(params: Clash):
    return blobs(Blobs(), 0)


@dataclass(frozen=True)
class Odd:
    """Attributes:
    names: a tuple, which no config key holds.
    """

    names: tuple = ("a",)


def odd(params: Odd):
    return blobs(Blobs(), 0)
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of data functions on sys.path, as ``my_lab_data``."""
    (tmp_path / "my_lab_data.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_lab_data", None)
    yield "my_lab_data"
    sys.modules.pop("my_lab_data", None)


def test_data_function_with_params_from_the_command_line(user_module):
    data = build(f"data.name={user_module}:blobs", "data.per_class=20", "data.spread=0.5",
                 "data.partition=iid", "data.num_clients=5", "data.val_mode=all")  # fmt: skip
    assert data.name == f"{user_module}:blobs" and data.num_classes == 3
    assert int(data.sizes("train").sum()) == 60 and int(data.sizes("val").sum()) == 30
    again = build(f"data.name={user_module}:blobs", "data.per_class=20", "data.spread=0.5",
                  "data.partition=iid", "data.num_clients=5", "data.val_mode=all")  # fmt: skip
    assert torch.equal(data.x_train, again.x_train)
    other = build(f"data.name={user_module}:blobs", "data.per_class=20", "data.spread=0.5",
                  "data.partition=iid", "data.num_clients=5", "data.val_mode=all", seed=1)  # fmt: skip
    assert not torch.equal(data.x_train, other.x_train)


def test_data_function_params_declared_as_an_attribute(user_module):
    data = build(f"data.name={user_module}:attribute_params", "data.per_class=7",
                 "data.partition=iid", "data.num_clients=3")  # fmt: skip
    assert int(data.sizes("train").sum()) == 21


@pytest.mark.parametrize(
    ("fn", "argv", "train", "classes"),
    [
        ("as_dict", ["data.partition=natural", "data.num_clients=4", "data.val_mode=own"], 20, 2),
        ("as_userdata", ["data.partition=iid", "data.num_clients=3"], 12, 3),
        ("as_datasets", ["data.partition=iid", "data.num_clients=2"], 16, 2),
    ],
)
def test_data_function_return_forms(user_module, fn, argv, train, classes):
    data = build(f"data.name={user_module}:{fn}", *argv)
    assert int(data.sizes("train").sum()) == train and data.num_classes == classes
    if fn == "as_dict":  # groups 0..3, own test rows: rows 0 and 4 of the test split are group 0
        assert data.sizes("val").tolist() == [2, 2, 1, 1]


BAD_FUNCTIONS = [
    ("wrong_type", r"data\.name: 'my_lab_data:wrong_type' returned a str, expected a lit_fedco\.data\.UserData"),
    ("wrong_x", r"data\.name: 'my_lab_data:wrong_x' returned x_train that is a str, expected a torch tensor or a numpy array"),
    ("short_labels", r"data\.name: my_lab_data:short_labels gives 5 training inputs and 4 labels, expected as many labels as inputs"),
    ("label_out_of_range", r"data\.name: my_lab_data:label_out_of_range's training labels include 7 \(row 3, 1 such rows\), expected class labels in \[0, 4\)"),
    ("float_labels", r"data\.name: 'my_lab_data:float_labels' returned y_train that has dtype float64 and shape \[4\], expected integer class labels"),
    ("shapes_differ", r"data\.name: my_lab_data:shapes_differ gives training inputs torch\.float32 \[2\] and test inputs torch\.float32 \[3\]"),
    ("raises", r"data\.name: calling 'my_lab_data:raises' failed \(RuntimeError: no network here at .*my_lab_data\.py:\d+\)"),
    ("needs", r"data\.name: 'my_lab_data:needs' requires the argument 'path', expected only arguments among \('params', 'data_dir', 'seed'\)"),
    ("clashing", r"data\.name: 'my_lab_data:clashing' has a parameter 'alpha', which is a data key of lit_fedco's own"),
    ("odd", r"data\.name: the parameter 'names' of 'my_lab_data:odd' has the type tuple, expected one a config key can hold"),
    ("nope", r"data\.name: module 'my_lab_data' has no function 'nope' \(its functions: .*as_dict.*\); name one"),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "pattern"), BAD_FUNCTIONS, ids=[f for f, _ in BAD_FUNCTIONS])
def test_bad_data_functions_are_one_line_config_errors(user_module, fn, pattern):
    with pytest.raises(ConfigError) as err:
        build(f"data.name={user_module}:{fn}", "data.partition=iid", "data.num_clients=2")
    assert re.match(pattern, str(err.value)) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("argv", "pattern"),
    [
        (["data.name=npz"], r"data\.data_dir: empty, but data\.name=npz reads an \.npz file"),
        (["data.name=npz", "data.data_dir={d}/nothing"], r"data\.data_dir: got '.*nothing', which does not exist"),
        (["data.name=npz", "data.data_dir={d}/d.npz", "data.partition=natural", "data.num_clients=5"], r"data\.num_clients: got 5, expected the 6 group ids"),
        (["data.name=npz", "data.data_dir={d}/d.npz", "data.partition=iid", "data.num_clients=500"], r"data\.num_clients: got 500, expected at most the 240 samples"),
        (["data.name=npz", "data.data_dir={d}/d.npz", "data.val_mode=own", "data.partition=iid"], r"data\.val_mode: got 'own', which needs data\.partition=natural"),
        (["data.partition=natural", "data.num_clients=3"], r"data\.partition: got 'natural' \(a client per group id\), but data\.name=digits gives no group ids"),
        (["data.name=imagefolder", "data.data_dir={d}"], r"data\.data_dir: got '.*', which has no train/ folder"),
        (["data.name=text", "data.data_dir={d}/d.npz"], r"data\.data_dir: '.*d\.npz' could not be read as UTF-8 text"),
        (["data.name=hf_disk", "data.data_dir={d}"], r"data\.data_dir: '.*' could not be read by datasets\.load_from_disk"),
    ],
)  # fmt: skip
def test_bad_reader_input_is_one_config_error(tmp_path, argv, pattern):
    write_npz(tmp_path / "d.npz")
    if "hf_disk" in argv[0]:
        pytest.importorskip("datasets")
    with pytest.raises(ConfigError) as err:
        build(*(a.replace("{d}", str(tmp_path)) for a in argv))
    assert re.match(pattern, str(err.value)) and "\n" not in str(err.value), str(err.value)


def test_help_lists_the_partitions_readers_and_a_data_functions_keys(user_module, capsys):
    from lit_fedco.cli import run

    run("comfedl_dro", DEFAULTS, [f"data.name={user_module}:blobs", "--help-all"])
    out = " ".join(capsys.readouterr().out.split())
    for word in ("shards", "size_skew", "natural", "npz", "imagefolder", "hf_disk", "text",
                 "MODULE:FUNCTION", "data.shards_per_client=2", "data.size_sigma=1.0",
                 "data.seq_len=80", "data.per_class=30 training samples per class",
                 "data.spread=1.0 the noise's scale"):  # fmt: skip
        assert word in out, word


# ------------------------------------------------------------------------ a recipe, end to end
def recipe(tmp_path: Path, *argv: str, run_name: str = "r") -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "lit_fedco.recipes.comfedl_dro", *argv, "rounds=2", "seeds=[0]",
           "progress=false", "tracking=[csv]", "updaters=[fedavg,comfedl]", "eval_every=1",
           f"out_dir={tmp_path / 'runs'}", f"run_name={run_name}"]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


@pytest.mark.slow
def test_npz_natural_own_runs_a_recipe_end_to_end(tmp_path):
    write_npz(tmp_path / "d.npz")
    proc = recipe(tmp_path, "data.name=npz", "data.data_dir=d.npz", "data.partition=natural",
                  "data.num_clients=6", "data.val_mode=own", "cohort=3")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "npz: 6 clients, 4 classes, 240 training and 60 validation samples" in proc.stdout
    assert re.search(r"client 0 \(w0\): 40 train, 10 val", proc.stdout), proc.stdout
    run = tmp_path / "runs" / "comfedl_dro" / "r"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["name"] == "npz" and config["data"]["val_mode"] == "own"
    stats = json.loads((run / "fedavg-seed0" / "partition.json").read_text())
    assert stats["client_groups"] == [f"w{i}" for i in range(6)]
    assert (run / "comfedl-seed0" / "metrics.csv").is_file()


@pytest.mark.slow
def test_data_function_runs_a_recipe_and_records_its_params(tmp_path):
    (tmp_path / "my_lab_data.py").write_text(textwrap.dedent(MODULE))
    proc = recipe(tmp_path, "data.name=my_lab_data:blobs", "data.per_class=25",
                  "data.partition=shards", "data.num_clients=6", "data.shards_per_client=1",
                  "cohort=3")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "75 training" in proc.stdout
    config = yaml.safe_load((tmp_path / "runs" / "comfedl_dro" / "r" / "config.yaml").read_text())
    assert config["data"]["name"] == "my_lab_data:blobs" and config["data"]["per_class"] == 25


@pytest.mark.slow
def test_a_text_file_runs_a_recipe_with_an_lstm_and_a_saved_dataset_runs_one_too(tmp_path):
    (tmp_path / "play.txt").write_text(PLAY * 3)  # three of each speaker's passages
    proc = recipe(tmp_path, "data.name=text", "data.data_dir=play.txt", "data.seq_len=10",
                  "data.seq_stride=2", "data.partition=natural", "data.num_clients=3",
                  "data.val_mode=own", "model.name=char_lstm", "model.hidden=16", "cohort=3")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"text: 3 clients, \d+ classes", proc.stdout), proc.stdout
    pytest.importorskip("datasets")
    write_hf(tmp_path / "hf")
    proc = recipe(tmp_path, "data.name=hf_disk", "data.data_dir=hf", "data.feature_column=img",
                  "data.group_column=user", "data.partition=natural", "data.num_clients=4",
                  "data.val_mode=own", "cohort=2", run_name="hf")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "hf_disk: 4 clients, 3 classes, 48 training and 16 validation samples" in proc.stdout


def test_a_nodes_parameters_of_a_type_no_key_holds_are_refused_before_they_are_added():
    import dataclasses

    from lit_fedco.config import catalog

    @dataclasses.dataclass(frozen=True)
    class Params:
        widths: tuple = (8,)

    before = dict(catalog.NODE_PARAMS)
    with pytest.raises(ConfigError, match=r"^model\.name: the parameter 'widths' of .*Params has "
                       r"the type tuple, expected one a config key can hold: int, float"):  # fmt: skip
        catalog.extend_node("model", Params)
    assert before == catalog.NODE_PARAMS


def test_hf_disk_without_the_datasets_package_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError
    with pytest.raises(ConfigError, match=r"^data\.name: got 'hf_disk', which needs the package "
                       r"datasets; install it with pip install 'lit_fedco\[hf\]'"):  # fmt: skip
        build("data.name=hf_disk", f"data.data_dir={tmp_path}")
