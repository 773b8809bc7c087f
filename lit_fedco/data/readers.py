"""Readers of a researcher's own files, each from ``data.data_dir``: ``npz``, ``imagefolder``,
``hf_disk`` and ``text``. Each returns :class:`~lit_fedco.data.pools.Pools` (a training and a
held-out pool, optional group ids for ``partition=natural`` and ``val_mode=own``); nothing here
knows about clients.

- ``npz``: ``data_dir`` is an ``.npz`` file holding ``x``, ``y`` and optionally ``group``,
  ``x_test``, ``y_test``, ``group_test`` and ``num_classes``; or a folder holding
  ``train.npz`` (``x``, ``y``, optionally ``group``) and optionally ``test.npz`` (the same
  names). Without test arrays, 20 % of each class is held out (stratified, seed 0).
  ``num_classes`` defaults to the largest label + 1.
- ``imagefolder``: torchvision's ``ImageFolder`` layout, ``data_dir/train/<class>/<file>`` and
  ``data_dir/test/<class>/<file>`` (without ``test/``, 20 % held out as above). Classes are
  the training sub-folders in sorted order. A file named ``<group>_<rest>.<ext>`` (e.g.
  ``writer07_0001.png``) carries the group id ``<group>``: the part before the first
  underscore, where every file of the split has one. Images are read with Pillow, converted to
  grey (1 channel) where every image is grey, else RGB (3), resized to
  ``image_size`` × ``image_size`` where ``data.image_size`` > 0 (else they must all have one
  size), and scaled to [0, 1]: float32 [N, C, H, W].
- ``hf_disk``: a Hugging Face ``datasets`` ``DatasetDict`` saved with ``save_to_disk``, with
  ``train`` and ``test`` splits (without ``test``, 20 % held out); ``data.feature_column``
  (an ``Image`` column, converted as above, or numbers), ``data.label_column`` (ints; a
  ``ClassLabel`` gives the number of classes) and, where set, ``data.group_column``. Needs the
  optional package ``datasets`` (``pip install 'lit_fedco[hf]'``), imported only here.
- ``text``: character-level next-character prediction (LEAF's Shakespeare): ``data_dir`` is a
  text file (each group's text cut 80 / 20 into a training and a held-out part by position),
  or a folder with ``train.txt`` and ``test.txt``. A line ``NAME: words`` starts a passage of
  speaker ``NAME`` (a letter, then up to 39 letters, digits, spaces or ``.'-_``) and the lines
  after it without such a prefix continue it; each speaker is a group. Text before the first
  speaker line is dropped; a file without speaker lines is one text without groups. Every
  window of ``seq_len`` consecutive characters of a speaker's text (every ``seq_stride``-th
  one) is a sample: ``x`` its
  character ids, int64 [N, seq_len], ``y`` the id of the character after it. The vocabulary
  is the sorted set of the file's characters (``stats["vocab"]``); ``num_classes`` is its
  size. Speakers whose text yields no window in either part are dropped (a note says how many).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_fedco.core.errors import ConfigError
from lit_fedco.data.pools import Pools, as_groups, as_inputs, as_labels, check, split_off_test

GREY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "F", "P;L"})
"""Pillow modes read as one channel."""
SPEAKER = re.compile(r"^([^\W\d_][\w .'\-]{0,39}):(?:[ \t]+(.*))?$")
"""A line that starts a speaker's passage in a ``text`` file: ``NAME: words``."""


def _data_dir(data_dir: str, reader: str, expected: str) -> Path:
    if not str(data_dir):
        raise ConfigError(
            f"data.data_dir: empty, but data.name={reader} reads {expected}; set "
            f"data.data_dir=PATH",
            key="data.data_dir",
        )
    path = Path(data_dir).expanduser()
    if not path.exists():
        raise ConfigError(
            f"data.data_dir: got {str(data_dir)!r}, which does not exist; data.name={reader} "
            f"reads {expected}",
            key="data.data_dir",
        )
    return path


def _with_test(
    x: Tensor, y: Tensor, g: np.ndarray | None, test: tuple[Tensor, Tensor, Any] | None,
    num_classes: int, note: str,
) -> Pools:  # fmt: skip
    if test is None:
        x, y, g, x_te, y_te, g_te = split_off_test(x, y, g)
        note += "; no test split there: 20% of each class held out (stratified, seed 0)"
    else:
        x_te, y_te, g_te = test
    return Pools(x, y, x_te, y_te, num_classes, g, g_te, note)


# ---------------------------------------------------------------------- npz
NPZ_EXPECTED = (
    "an .npz file with arrays x, y (optionally group, x_test, y_test, group_test, num_classes), "
    "or a folder with train.npz (x, y, optionally group) and optionally test.npz"
)


def _npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as err:  # not a zip, a pickled object array, a truncated file
        first = (str(err).splitlines() or [""])[0][:160]
        raise ConfigError(
            f"data.data_dir: {str(path)!r} could not be read as .npz ({type(err).__name__}: "
            f"{first}); write it with numpy.savez (numbers, or strings for group ids)",
            key="data.data_dir",
        ) from None


def read_npz(data_dir: str) -> Pools:
    """The ``npz`` reader (see the module's docstring)."""
    path = _data_dir(data_dir, "npz", NPZ_EXPECTED)
    key = "data.data_dir"
    if path.is_file():
        arrays = _npz(path)
        test_names = ("x_test", "y_test", "group_test")
        where = str(path)
    elif (path / "train.npz").is_file():
        arrays = _npz(path / "train.npz")
        if (path / "test.npz").is_file():
            arrays.update({f"{k}_test": v for k, v in _npz(path / "test.npz").items()
                           if k in ("x", "y", "group")})  # fmt: skip
        test_names = ("x_test", "y_test", "group_test")
        where = f"{path}/train.npz, test.npz"
    else:
        raise ConfigError(f"data.data_dir: got {str(data_dir)!r}, expected {NPZ_EXPECTED}",
                          key=key)  # fmt: skip
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise ConfigError(
            f"data.data_dir: {where} has arrays {sorted(arrays)}, expected x and y (and "
            "optionally group, x_test, y_test, group_test, num_classes)",
            key=key,
        )
    src = f"npz {where}"
    x = as_inputs(arrays["x"], f"{src}: x", key)
    y = as_labels(arrays["y"], f"{src}: y", key)
    g = as_groups(arrays.get("group"), f"{src}: group", key)
    test = None
    if test_names[0] in arrays or test_names[1] in arrays:
        if not (test_names[0] in arrays and test_names[1] in arrays):
            raise ConfigError(f"data.data_dir: {where} has only one of x_test and y_test, "
                              "expected both or neither", key=key)  # fmt: skip
        test = (
            as_inputs(arrays["x_test"], f"{src}: x_test", key),
            as_labels(arrays["y_test"], f"{src}: y_test", key),
            as_groups(arrays.get("group_test"), f"{src}: group_test", key),
        )
    if "num_classes" in arrays:
        num_classes = int(np.asarray(arrays["num_classes"]).reshape(-1)[0])
    else:
        top = [int(y.max())] + ([int(test[1].max())] if test is not None and len(test[1]) else [])
        num_classes = max(top) + 1 if len(y) else 1
    pools = _with_test(x, y, g, test, num_classes, f"npz: {where}, {len(y)} rows")
    return check(pools, key, f"npz {where}")


# ---------------------------------------------------------------------- images
def _open(item: Any) -> Any:
    """A context manager holding the PIL image ``item`` is (kept open by its owner) or names
    (a path: opened now, closed on exit)."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(item, str | Path):
        return contextlib.nullcontext(item)
    try:
        return Image.open(item)
    except (UnidentifiedImageError, OSError) as err:
        raise ConfigError(f"data.data_dir: {item} could not be read as an image ({err})",
                          key="data.data_dir") from None  # fmt: skip


def _images(images: Sequence[Any], image_size: int, where: str) -> Tensor:
    """Images (PIL images, or paths opened one at a time, so that no more than one file is
    open) as float32 [N, C, H, W] in [0, 1]: grey where every image is, else RGB."""
    from PIL import Image

    if not images:
        return torch.zeros(0, 1, max(image_size, 1), max(image_size, 1))
    modes, sizes = set(), set()
    for item in images:  # headers only: the pixels are decoded below
        with _open(item) as im:
            modes.add(im.mode)
            sizes.add(im.size)
    grey = modes <= GREY_MODES
    if image_size == 0 and len(sizes) > 1:
        a, b = sorted(sizes)[:2]
        raise ConfigError(
            f"data.image_size: got 0 (the size as read), but the images of {where} have sizes "
            f"{a} and {b} (width, height) among others; set e.g. data.image_size={max(a[1], b[1])}",
            key="data.image_size",
        )
    w, h = (image_size, image_size) if image_size else next(iter(sizes))
    mode = "L" if grey else "RGB"
    out = np.empty((len(images), h, w) + (() if grey else (3,)), dtype=np.uint8)
    for i, item in enumerate(images):
        with _open(item) as im:
            im = im.convert(mode)
            if im.size != (w, h):
                im = im.resize((w, h), Image.Resampling.BILINEAR)
            out[i] = np.asarray(im, dtype=np.uint8)
    stacked = out[:, None] if grey else out.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(stacked)).to(torch.float32) / 255.0


def _group_of(paths: list[Path]) -> np.ndarray | None:
    """The group ids of files named ``<group>_<rest>``, or None where a file has no ``_``."""
    stems = [p.stem for p in paths]
    if not stems or not all("_" in s and not s.startswith("_") for s in stems):
        return None
    return np.asarray([s.split("_", 1)[0] for s in stems]).astype(str)


def _image_split(
    folder: Path, class_to_idx: dict[str, int] | None, image_size: int
) -> tuple[Tensor, Tensor, np.ndarray | None, dict[str, int]]:
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    try:
        classes, found = find_classes(str(folder))
    except (FileNotFoundError, OSError) as err:
        raise ConfigError(
            f"data.data_dir: {str(folder)!r} holds no class folders ({err}); expected "
            "<class>/<image> files (ImageFolder's layout)",
            key="data.data_dir",
        ) from None
    if class_to_idx is not None:
        extra = [c for c in classes if c not in class_to_idx]
        if extra:
            raise ConfigError(
                f"data.data_dir: {str(folder)!r} has the class folder {extra[0]!r}, which the "
                f"training split does not have (its classes: {sorted(class_to_idx)[:10]}); "
                "give both splits the same class folders",
                key="data.data_dir",
            )
        found = {c: class_to_idx[c] for c in classes}
    try:
        samples = make_dataset(str(folder), found, IMG_EXTENSIONS, allow_empty=True)
    except (FileNotFoundError, OSError) as err:
        raise ConfigError(f"data.data_dir: {str(folder)!r}: {err}", key="data.data_dir") from None
    if not samples:
        raise ConfigError(
            f"data.data_dir: {str(folder)!r} holds no images ({', '.join(IMG_EXTENSIONS)}) in "
            "its class folders; expected <class>/<image> files",
            key="data.data_dir",
        )
    x = _images([Path(p) for p, _ in samples], image_size, str(folder))
    y = torch.tensor([c for _, c in samples], dtype=torch.int64)
    return x, y, _group_of([Path(p) for p, _ in samples]), (class_to_idx or found)


def read_imagefolder(data_dir: str, image_size: int = 0) -> Pools:
    """The ``imagefolder`` reader (see the module's docstring)."""
    layout = "an ImageFolder tree: DIR/train/<class>/<image> (and DIR/test/<class>/...)"
    root = _data_dir(data_dir, "imagefolder", layout)
    if not (root / "train").is_dir():
        raise ConfigError(
            f"data.data_dir: got {str(data_dir)!r}, which has no train/ folder; expected "
            "DIR/train/<class>/<image> and DIR/test/<class>/<image> (ImageFolder's layout)",
            key="data.data_dir",
        )
    x, y, g, classes = _image_split(root / "train", None, image_size)
    test = None
    if (root / "test").is_dir():
        x_te, y_te, g_te, _ = _image_split(root / "test", classes, image_size or 0)
        if x_te.shape[1:] != x.shape[1:] and not image_size:
            raise ConfigError(
                f"data.image_size: got 0, but the training images are {list(x.shape[1:])} and "
                f"the test images {list(x_te.shape[1:])}; set e.g. data.image_size={x.shape[-1]}",
                key="data.image_size",
            )
        if x_te.shape[1] != x.shape[1]:  # grey in one split, colour in the other
            x_te = x_te.expand(-1, 3, -1, -1).contiguous() if x_te.shape[1] == 1 else x_te
            x = x.expand(-1, 3, -1, -1).contiguous() if x.shape[1] == 1 else x
        test = (x_te, y_te, g_te)
    note = f"imagefolder: {root}, {len(y)} training images of {len(classes)} classes"
    pools = _with_test(x, y, g, test, len(classes), note)
    return check(pools, "data.data_dir", f"imagefolder {root}")


# ---------------------------------------------------------------------- Hugging Face datasets
def _load_from_disk(path: Path) -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "data.name: got 'hf_disk', which needs the package datasets; install it with "
            "pip install 'lit_fedco[hf]' (or pip install datasets)",
            key="data.name",
        ) from None
    try:
        return datasets.load_from_disk(str(path))
    except Exception as err:  # not a saved dataset
        first = (str(err).splitlines() or [""])[0][:160]
        raise ConfigError(
            f"data.data_dir: {str(path)!r} could not be read by datasets.load_from_disk "
            f"({type(err).__name__}: {first}); save the data set with "
            "DatasetDict.save_to_disk(DIR)",
            key="data.data_dir",
        ) from None


def _hf_split(ds: Any, feature: str, label: str, group: str, image_size: int, where: str) -> Any:
    from datasets import Image as HFImage

    key = "data.data_dir"
    for what, col in (("feature_column", feature), ("label_column", label),
                      ("group_column", group)):  # fmt: skip
        if col and col not in ds.column_names:
            raise ConfigError(
                f"data.{what}: got {col!r}, but {where} has the columns {ds.column_names}; set "
                f"data.{what} to one of them",
                key=f"data.{what}",
            )
    if isinstance(ds.features[feature], HFImage):
        x = _images(list(ds.with_format(None)[feature]), image_size, where)
    else:
        x = as_inputs(np.asarray(ds.with_format("numpy")[feature]), f"{where}: {feature}", key)
    y = as_labels(np.asarray(ds.with_format("numpy")[label]), f"{where}: {label}", key)
    g = None
    if group:
        g = as_groups(np.asarray(ds.with_format(None)[group]), f"{where}: {group}", key)
    return x, y, g


def read_hf_disk(
    data_dir: str, feature_column: str, label_column: str, group_column: str, image_size: int = 0
) -> Pools:
    """The ``hf_disk`` reader (see the module's docstring)."""
    path = _data_dir(data_dir, "hf_disk", "a datasets DatasetDict saved with save_to_disk")
    dd = _load_from_disk(path)
    splits = list(dd.keys()) if hasattr(dd, "keys") else []
    if "train" not in splits:
        held = f"the splits {splits}" if splits else "a single Dataset"
        raise ConfigError(
            f"data.data_dir: {str(path)!r} holds {held}, "
            "expected a DatasetDict with a train split (and a test split); save "
            "DatasetDict(train=..., test=...)",
            key="data.data_dir",
        )
    args = (feature_column, label_column, group_column, image_size)
    x, y, g = _hf_split(dd["train"], *args, f"{path} (train)")
    test = _hf_split(dd["test"], *args, f"{path} (test)") if "test" in splits else None
    names = getattr(dd["train"].features[label_column], "num_classes", None)
    if names is None:
        top = [int(y.max())] + ([int(test[1].max())] if test is not None else [])
        names = max(top) + 1
    note = f"hf_disk: {path}, {len(y)} training rows"
    return check(_with_test(x, y, g, test, int(names), note), "data.data_dir", f"hf_disk {path}")


# ---------------------------------------------------------------------- text
def speaker_texts(text: str) -> dict[str, str] | None:
    """Each speaker's text (its passages joined by newlines), in order of appearance; None
    where no line starts a speaker's passage (``NAME: words``)."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        m = SPEAKER.match(line)
        if m:
            current = m.group(1).strip()
            out.setdefault(current, []).append(m.group(2) or "")
        elif current is not None:
            out[current].append(line)
    if not out:
        return None
    return {k: "\n".join(v) for k, v in out.items()}


def _windows(ids: np.ndarray, seq_len: int, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    if len(ids) <= seq_len:
        return np.zeros((0, seq_len), np.int64), np.zeros(0, np.int64)
    w = np.lib.stride_tricks.sliding_window_view(ids, seq_len + 1)[::stride]
    return np.ascontiguousarray(w[:, :seq_len]), np.ascontiguousarray(w[:, seq_len])


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"data.data_dir: {str(path)!r} could not be read as UTF-8 text "
                          f"({err})", key="data.data_dir") from None  # fmt: skip


def read_text(data_dir: str, seq_len: int, stride: int = 1) -> Pools:
    """The ``text`` reader (see the module's docstring)."""
    path = _data_dir(data_dir, "text", "a text file, or a folder with train.txt and test.txt")
    parts, chars, where = _text_parts(path, data_dir)
    vocab = sorted(set(chars))
    codes = np.array([ord(c) for c in vocab], dtype=np.uint32)  # sorted: str order is ord order
    rows, dropped = _text_windows(parts, codes, seq_len, stride, path.is_file())
    if not rows["train"] or not any(len(r[1]) for r in rows["test"]):
        raise ConfigError(
            f"data.seq_len: got {seq_len}, but no text of {where} is longer than that in both "
            f"the training and the held-out part; set a smaller data.seq_len, e.g. "
            f"data.seq_len={max(1, min(len(a) for a, _ in parts.values()) // 2)}",
            key="data.seq_len",
        )
    x, y, g = _stack_windows(rows["train"])
    x_te, y_te, g_te = _stack_windows(rows["test"])
    has_groups = list(parts) != [""]
    note = (f"text: {where}, {len(vocab)} characters, {len(y)} training windows of "
            f"{seq_len}")  # fmt: skip
    if has_groups:
        note += f", {len(parts) - dropped} speakers"
        note += f" ({dropped} dropped: too little text for a window)" if dropped else ""
    pools = Pools(x, y, x_te, y_te, len(vocab), g if has_groups else None,
                  g_te if has_groups else None, note, {"vocab": "".join(vocab)})  # fmt: skip
    return check(pools, "data.data_dir", f"text {where}")


def _text_parts(path: Path, data_dir: str) -> tuple[dict[str, tuple[str, str]], str, str]:
    """Each speaker's (training, held-out) text (one speaker ``""`` without speaker lines),
    every character read (the vocabulary's source) and where they were read: a single file
    split 80/20 per speaker, or a folder's ``train.txt`` and ``test.txt``.

    Raises:
        ConfigError: ``path`` is neither.
    """
    if path.is_file():
        whole = _read_text(path)
        groups = speaker_texts(whole) or {"": whole}
        parts = {k: (t[: int(0.8 * len(t))], t[int(0.8 * len(t)) :]) for k, t in groups.items()}
        return parts, whole, str(path)
    if (path / "train.txt").is_file() and (path / "test.txt").is_file():
        train, test = _read_text(path / "train.txt"), _read_text(path / "test.txt")
        tr, te = speaker_texts(train) or {"": train}, speaker_texts(test) or {"": test}
        parts = {k: (tr.get(k, ""), te.get(k, "")) for k in dict.fromkeys([*tr, *te])}
        return parts, train + test, f"{path}/train.txt, test.txt"
    raise ConfigError(
        f"data.data_dir: got {str(data_dir)!r}, expected a text file, or a folder with "
        "train.txt and test.txt",
        key="data.data_dir",
    )


_Windows = list[tuple[np.ndarray, np.ndarray, np.ndarray]]
"""A split's windows, per speaker: (inputs, next characters, the speaker of each)."""


def _text_windows(
    parts: dict[str, tuple[str, str]], codes: np.ndarray, seq_len: int, stride: int, one_file: bool
) -> tuple[dict[str, _Windows], int]:
    """Each split's windows of every speaker's text (as ids of ``codes``, the sorted code
    points), and how many speakers were dropped: those without a training window, or (from one
    file) without a held-out one."""

    def ids(text: str) -> np.ndarray:
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        return np.searchsorted(codes, points).astype(np.int64)

    rows: dict[str, _Windows] = {"train": [], "test": []}
    dropped = 0
    for name, (a, b) in parts.items():
        w_tr = _windows(ids(a), seq_len, stride)
        w_te = _windows(ids(b), seq_len, stride)
        if len(w_tr[1]) == 0 or (len(w_te[1]) == 0 and one_file):
            dropped += 1
            continue
        for split, (wx, wy) in (("train", w_tr), ("test", w_te)):
            rows[split].append((wx, wy, np.full(len(wy), name)))
    return rows, dropped


def _stack_windows(rows: _Windows) -> tuple[Tensor, Tensor, np.ndarray]:
    """One split's windows of every speaker, stacked: inputs, targets, speakers."""
    xs, ys, gs = zip(*rows, strict=True)
    return (torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)),
            np.concatenate(gs).astype(str))  # fmt: skip


def read_file_source(spec: Any) -> Pools:
    """The pools of reader ``spec.name`` (one of :data:`~lit_fedco.data.names.FILE_READERS`)."""
    if spec.name == "npz":
        return read_npz(spec.data_dir)
    if spec.name == "imagefolder":
        return read_imagefolder(spec.data_dir, spec.image_size)
    if spec.name == "hf_disk":
        return read_hf_disk(spec.data_dir, spec.feature_column, spec.label_column,
                            spec.group_column, spec.image_size)  # fmt: skip
    return read_text(spec.data_dir, spec.seq_len, spec.seq_stride)
