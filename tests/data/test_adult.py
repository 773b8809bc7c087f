"""The UCI Adult reader on tiny files written in its original format (never the shipped copy
of the real files, except for its row counts in one test)."""

from __future__ import annotations

import gzip
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lit_fedco.core.errors import ConfigError
from lit_fedco.data import make_federated
from lit_fedco.data.adult import EMBEDDED, encode_adult, load_adult, read_rows

# age, workclass, fnlwgt, education, education-num, marital-status, occupation, relationship,
# race, sex, capital-gain, capital-loss, hours-per-week, native-country, income
TRAIN_ROWS = [
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K",
    "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, White, Male, 0, 0, 13, United-States, >50K",
    "38, Private, 215646, HS-grad, 9, Divorced, Handlers-cleaners, Not-in-family, Black, Female, 0, 0, 40, ?, <=50K",
    "53, ?, 234721, 11th, 7, Married-civ-spouse, ?, Husband, Black, Male, 0, 0, 40, United-States, >50K",
    "28, Private, 338409, Bachelors, 13, Married-civ-spouse, Prof-specialty, Wife, Black, Female, 0, 0, 40, Cuba, >50K",
    "37, Private, 284582, Masters, 14, Married-civ-spouse, Exec-managerial, Wife, White, Female, 0, 0, 40, United-States, <=50K",
]  # fmt: skip
TEST_ROWS = [
    "25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Black, Male, 0, 0, 40, United-States, <=50K.",
    "38, Private, 89814, HS-grad, 9, Married-civ-spouse, Farming-fishing, Husband, White, Male, 0, 0, 50, United-States, >50K.",
    "44, ?, 160323, Some-college, 10, Married-civ-spouse, ?, Husband, White, Female, 7688, 0, 40, Peru, >50K.",
]  # fmt: skip


def write_adult(folder: Path, gz: bool = False, train=TRAIN_ROWS, test=TEST_ROWS) -> Path:
    """adult.data and adult.test (header comment line, trailing periods) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = {
        "adult.data": "\n".join(train) + "\n\n",
        "adult.test": "|1x3 Cross validator\n" + "\n".join(test) + "\n",
    }
    for name, text in texts.items():
        if gz:
            with gzip.open(folder / f"{name}.gz", "wt") as fh:
                fh.write(text)
        else:
            (folder / name).write_text(text)
    return folder


def test_read_rows_skips_the_header_and_strips_the_trailing_period(tmp_path):
    folder = write_adult(tmp_path)
    train, test = read_rows(folder / "adult.data"), read_rows(folder / "adult.test")
    assert len(train) == 6 and len(test) == 3  # the blank line and the header are skipped
    assert [r[-1] for r in test] == ["<=50K", ">50K", ">50K"]
    assert train[2][13] == "?" and train[0][1] == "State-gov"  # fields are stripped


@pytest.mark.parametrize("gz", [False, True])
def test_encoding_matches_a_hand_computation(tmp_path, gz):
    table = load_adult(write_adult(tmp_path, gz=gz), "sex")
    # labels and groups (Female 0, Male 1)
    assert table.y_train.tolist() == [[0, 1], [1, 1], [0, 0], [1, 1], [1, 0], [0, 0]]
    assert table.y_test.tolist() == [[0, 1], [1, 1], [1, 0]]
    assert table.groups == ("Female", "Male")
    names = list(table.features)
    # continuous columns standardised with the TRAINING mean and (population) std
    ages = np.array([39, 50, 38, 53, 28, 37], dtype=float)
    col = names.index("age")
    np.testing.assert_allclose(table.x_train[:, col], (ages - ages.mean()) / ages.std(), rtol=1e-6)
    np.testing.assert_allclose(
        table.x_test[:, col], (np.array([25, 38, 44]) - ages.mean()) / ages.std(), rtol=1e-6
    )
    # one-hot over the training values, sorted; '?' is a category of its own
    work = [n for n in names if n.startswith("workclass=")]
    assert work == ["workclass=?", "workclass=Private", "workclass=Self-emp-not-inc",
                    "workclass=State-gov"]  # fmt: skip
    assert table.x_test[2, names.index("workclass=?")] == 1
    # a test value the training rows never hold (Peru, Some-college) is all zeros in its block
    country = [names.index(n) for n in names if n.startswith("native-country=")]
    assert table.x_test[2, country].sum() == 0
    assert table.x_test[0, country].sum() == 1  # United-States
    assert (
        table.x_train.shape[1]
        == len(names)
        == 6 + sum(len({r.split(", ")[i] for r in TRAIN_ROWS}) for i in (1, 3, 5, 6, 7, 8, 9, 13))
    )
    # every row has exactly one 1 in each categorical block it knows
    sex = [names.index("sex=Female"), names.index("sex=Male")]
    assert torch.equal(table.x_train[:, sex].sum(1), torch.ones(6))


def test_race_groups(tmp_path):
    table = load_adult(write_adult(tmp_path), "race")
    assert table.groups == ("Black", "White")
    assert table.y_train[:, 1].tolist() == [1, 1, 0, 0, 0, 1]


def test_bad_files_are_refused_with_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"adult\.data\[\.gz\] and adult\.test"):
        load_adult(tmp_path / "missing")
    bad = write_adult(tmp_path / "short", train=[*TRAIN_ROWS, "39, Private, 1"])
    with pytest.raises(ConfigError, match="line 7 has 3 comma-separated fields"):
        load_adult(bad)
    label = write_adult(tmp_path / "label", test=[TEST_ROWS[0].replace("<=50K.", "rich")])
    with pytest.raises(ConfigError, match="income label 'rich'"):
        load_adult(label)
    with pytest.raises(ConfigError, match=r"data\.protected"):
        encode_adult(read_rows(bad / "adult.test"), read_rows(bad / "adult.test"), "age")


def test_federated_adult_splits_train_rows_and_uses_the_test_rows_for_validation(tmp_path):
    folder = write_adult(tmp_path)
    spec = SimpleNamespace(
        name="adult", data_dir=str(folder), partition="iid", num_clients=2, alpha=0.5, seed=0
    )
    data = make_federated(spec)
    assert data.num_clients == 2 and data.num_classes == 2
    assert data.sizes("train").tolist() == [3, 3] and data.sizes("val").tolist() == [2, 1]
    table = load_adult(folder)
    # the same rows, regrouped by client
    rows = {tuple(r) for r in torch.cat([table.x_train, table.y_train.float()], 1).tolist()}
    got = {tuple(r) for r in torch.cat([data.x_train, data.y_train.float()], 1).tolist()}
    assert rows == got
    assert data.class_counts().sum(0).tolist() == [3, 3]  # label column, not the group
    assert data.stats["groups"] == ["Female", "Male"]
    with pytest.raises(ConfigError, match=r"data\.partition"):
        make_federated(SimpleNamespace(**{**vars(spec), "partition": "quantity"}))


def test_the_embedded_copy_is_the_original_split():
    assert sorted(p.name for p in EMBEDDED.iterdir()) == [
        "ATTRIBUTION.md",
        "adult.data.gz",
        "adult.test.gz",
    ]
    assert "CC BY 4.0" in (EMBEDDED / "ATTRIBUTION.md").read_text()
    with gzip.open(EMBEDDED / "adult.data.gz", "rt") as fh:
        assert sum(1 for line in fh if line.strip()) == 32561
    with gzip.open(EMBEDDED / "adult.test.gz", "rt") as fh:
        assert sum(1 for line in fh if line.strip() and not line.startswith("|")) == 16281
