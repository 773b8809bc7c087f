"""The UCI Adult ("Census Income") data set, read from its original files (FedDRO paper §6:
fairness-constrained classification; Becker & Kohavi 1996, UCI Machine Learning Repository,
CC BY 4.0).

The two files are comma-separated text, optionally gzipped: ``adult.data`` (32,561 training
rows) and ``adult.test`` (16,281 test rows, whose first line is a header comment,
``|1x3 Cross validator``, and whose labels end with a period, ``>50K.``). Missing values are
written ``?``. A copy of both files ships with the package (``lit_fedco/data/files/adult/``,
with its attribution), so ``data.name=adult`` works offline with no ``data.data_dir``.

Encoding (:func:`encode_adult`), fitted on the training file only:

- the label is ``income > 50K`` (1) or not (0);
- the six continuous columns are standardised with the **training** mean and standard
  deviation (a test row is scaled with the training statistics);
- the eight categorical columns are one-hot over the values the **training** file holds,
  sorted; a missing value ``?`` is a category of its own (rows are kept, not dropped: the
  split stays the original 32,561 / 16,281, and missingness is informative in Adult — most
  ``?`` rows have no occupation because they have no job). A test value the training file
  never holds encodes as all zeros in its column's block;
- the protected attribute (``sex``: Female 0, Male 1; or ``race``: the five values in sorted
  order) is kept **as a feature** too (the classifier may use it; equality of opportunity
  constrains its true positive rates, not its inputs) and as a second target column.

Targets are ``[n, 2]`` int64: column 0 the class label, column 1 the protected group. Samplers
gather the rows as they are, the objectives read column 0 as the label
(:func:`lit_fedco.objectives.base.class_labels`) and the fairness problem reads column 1
(:mod:`lit_fedco.problems.fairness`).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lit_fedco.core.errors import ConfigError

COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country", "income",
)  # fmt: skip
"""The 15 fields of a row, in file order (``adult.names``)."""
CONTINUOUS = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
CATEGORICAL = tuple(c for c in COLUMNS[:-1] if c not in CONTINUOUS)
PROTECTED = ("sex", "race")
"""Protected attributes the fairness literature uses on Adult (``data.protected``)."""
MISSING = "?"
EMBEDDED = Path(__file__).resolve().parent / "files" / "adult"
"""The copy of the two files shipped with the package."""


@dataclass(frozen=True)
class AdultTable:
    """The encoded training and test rows.

    Attributes:
        x_train, x_test: float32 features ``[n, d]``.
        y_train, y_test: int64 ``[n, 2]``: label (income > 50K) and protected group.
        features: the name of each of the d feature columns (``age``, ``sex=Female``...).
        groups: the protected attribute's values, in group-index order.
    """

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    features: tuple[str, ...]
    groups: tuple[str, ...]


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def read_rows(path: Path) -> list[list[str]]:
    """The rows of one Adult file as lists of 15 stripped strings.

    Blank lines and comment lines (starting with ``|``: the test file's header) are skipped;
    a label's trailing period (the test file's ``>50K.``) is removed.

    Raises:
        ConfigError: a row without 15 fields (naming the file and line).
    """
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as fh:  # type: ignore[operator]
        for lineno, line in enumerate(fh, 1):
            text = line.strip()
            if not text or text.startswith("|"):
                continue
            fields = [f.strip() for f in text.split(",")]
            if len(fields) != len(COLUMNS):
                raise ConfigError(
                    f"data.data_dir: {path} line {lineno} has {len(fields)} comma-separated "
                    f"fields, expected {len(COLUMNS)} (the UCI Adult format: {', '.join(COLUMNS)})",
                    key="data.data_dir",
                )
            fields[-1] = fields[-1].rstrip(".")
            rows.append(fields)
    if not rows:
        raise ConfigError(f"data.data_dir: {path} holds no data rows", key="data.data_dir")
    return rows


def adult_files(data_dir: str | Path = "") -> tuple[Path, Path]:
    """``adult.data[.gz]`` and ``adult.test[.gz]`` in ``data_dir``, or the embedded copy when
    ``data_dir`` is empty.

    Raises:
        ConfigError: a file is missing (naming both files and the folder).
    """
    folder = Path(data_dir).expanduser() if str(data_dir) else EMBEDDED
    found = [_find(folder, stem) for stem in ("adult.data", "adult.test")]
    if found[0] is None or found[1] is None:
        raise ConfigError(
            f"data.data_dir: got {str(folder)!r}, expected the UCI Adult files adult.data[.gz] "
            "and adult.test[.gz] in it; leave data.data_dir empty for the copy shipped with "
            "lit_fedco",
            key="data.data_dir",
        )
    return found[0], found[1]


def _label(value: str, path: str) -> int:
    if value == ">50K":
        return 1
    if value == "<=50K":
        return 0
    raise ConfigError(
        f"data.data_dir: {path} has the income label {value!r}, expected '>50K' or '<=50K' "
        "(the test file's may end with '.')",
        key="data.data_dir",
    )


def encode_adult(
    train: list[list[str]], test: list[list[str]], protected: str = "sex"
) -> AdultTable:
    """One-hot / standardised features, labels and groups (module docstring), fitted on
    ``train``.

    Args:
        train, test: rows from :func:`read_rows`.
        protected: ``"sex"`` or ``"race"``.

    Raises:
        ConfigError: an unknown ``protected``, a continuous value that is not a number, or a
            test row whose protected value the training rows never hold.
    """
    if protected not in PROTECTED:
        raise ConfigError.bad_value("data.protected", protected, f"one of {PROTECTED}", "sex")
    idx = {c: i for i, c in enumerate(COLUMNS)}
    blocks_tr, blocks_te, names = _encode_columns(train, test, idx)
    groups = tuple(sorted({r[idx[protected]] for r in train} - {MISSING}))
    return AdultTable(
        _features(blocks_tr),
        _targets(train, "adult.data", idx[protected], protected, groups),
        _features(blocks_te),
        _targets(test, "adult.test", idx[protected], protected, groups),
        tuple(names),
        groups,
    )


def _numeric(rows: list[list[str]], col: str, i: int) -> np.ndarray:
    """Continuous column ``col`` (index ``i``) of ``rows`` as float64.

    Raises:
        ConfigError: a value that is not a number.
    """
    try:
        return np.array([float(r[i]) for r in rows], dtype=np.float64)
    except ValueError as err:
        raise ConfigError(
            f"data.data_dir: the Adult column {col!r} holds a value that is not a number "
            f"({err}); missing values are allowed only in categorical columns",
            key="data.data_dir",
        ) from err


def _encode_columns(
    train: list[list[str]], test: list[list[str]], idx: dict[str, int]
) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
    """The feature blocks of ``train`` and ``test`` (a column each for a continuous column,
    standardised by the training rows' mean and deviation; a one-hot block for a categorical
    one, over the training rows' values) and the features' names."""
    blocks_tr, blocks_te, names = [], [], []
    for col in COLUMNS[:-1]:
        if col in CONTINUOUS:
            a, b = _numeric(train, col, idx[col]), _numeric(test, col, idx[col])
            mean, std = a.mean(), a.std()
            std = std if std > 0 else 1.0  # a constant column stays 0
            blocks_tr.append(((a - mean) / std)[:, None])
            blocks_te.append(((b - mean) / std)[:, None])
            names.append(col)
            continue
        values = sorted({r[idx[col]] for r in train})
        pos = {v: j for j, v in enumerate(values)}
        for rows, out in ((train, blocks_tr), (test, blocks_te)):
            onehot = np.zeros((len(rows), len(values)))
            for i, r in enumerate(rows):
                j = pos.get(r[idx[col]])
                if j is not None:
                    onehot[i, j] = 1.0
            out.append(onehot)
        names.extend(f"{col}={v}" for v in values)
    return blocks_tr, blocks_te, names


def _targets(
    rows: list[list[str]], what: str, col: int, protected: str, groups: tuple[str, ...]
) -> Tensor:
    """``[n, 2]`` int64: each row's label and the index of its protected value (column
    ``col``) among ``groups``.

    Raises:
        ConfigError: a row whose protected value is not among ``groups``.
    """
    gpos = {v: j for j, v in enumerate(groups)}
    out = np.empty((len(rows), 2), dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, 0] = _label(r[-1], what)
        group = gpos.get(r[col])
        if group is None:
            raise ConfigError(
                f"data.data_dir: {what} row {i} has {protected}={r[col]!r}, "
                f"which is not among the training file's values {list(groups)}",
                key="data.data_dir",
            )
        out[i, 1] = group
    return torch.from_numpy(out)


def _features(blocks: list[np.ndarray]) -> Tensor:
    """The feature blocks side by side, as float32."""
    return torch.from_numpy(np.concatenate(blocks, axis=1)).to(torch.float32)


def load_adult(data_dir: str | Path = "", protected: str = "sex") -> AdultTable:
    """The encoded Adult data from ``data_dir`` (empty: the embedded copy); see the module
    docstring for the encoding."""
    train_path, test_path = adult_files(data_dir)
    return encode_adult(read_rows(train_path), read_rows(test_path), protected)
