"""Checkpoints that survive crashes: atomic, checksummed, self-describing.

A checkpoint file is ``MAGIC`` (one line), the SHA-256 of the payload (64 hex digits and a
newline), then the payload: ``torch.save`` of a dict of tensors and plain values (loaded back
with ``weights_only=True``). It holds everything to continue a run — the round, the server
state, the state clients keep, the communication count — and what it belongs to: the recipe
and run, the updater and its hyperparameters, the resolved config, a fingerprint of the data
partition and of the model, and the library version.

Writing is atomic on any filesystem: a temporary file in the destination folder, ``fsync``,
``os.replace``, ``fsync`` of the folder. A crash, a full disk or ``kill -9`` at any moment
leaves either the old file or the new one, and no temporary file behind (a failed write
removes its own; one left by ``kill -9`` starts with ``.`` and is ignored and swept).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_fedco.core.errors import ConfigError
from lit_fedco.store.files import atomic_write

if TYPE_CHECKING:
    from lit_fedco.data import FederatedData

MAGIC = b"lit_fedco checkpoint v1\n"
SUFFIX = ".ckpt"


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: unreadable, corrupted, or of another run."""


# ---------------------------------------------------------------------- fingerprints
def fingerprint(tensors: list[Tensor]) -> str:
    """SHA-256 over the shapes, dtypes and bytes of ``tensors`` (first 16 hex digits)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)}{t.dtype};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def data_fingerprint(data: FederatedData) -> str:
    """:func:`fingerprint` of a run's data (every split's inputs, targets and offsets): a
    checkpoint's ``data``; of the whole data set also for a copy holding some clients' rows
    (it keeps the whole's, computed before)."""
    if data.whole is not None:
        return data.whole.fingerprint
    return fingerprint([data.x_train, data.y_train, data.train_offsets,
                        data.x_val, data.y_val, data.val_offsets])  # fmt: skip


def model_signature(params: dict[str, Tensor]) -> list[str]:
    """The model's parameters as ``name:shape`` strings (what a checkpoint must match)."""
    return [f"{k}:{tuple(v.shape)}" for k, v in params.items()]


# ---------------------------------------------------------------------- writing
def encode(content: dict[str, Any]) -> bytes:
    """The file bytes of a checkpoint holding ``content``."""
    buf = io.BytesIO()
    torch.save(content, buf)
    payload = buf.getvalue()
    return MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def save(path: Path, content: dict[str, Any]) -> None:
    """Write a checkpoint atomically (:func:`atomic_write`)."""
    atomic_write(path, encode(content), "checkpoint_written")


# ---------------------------------------------------------------------- reading
def load(path: Path, key: str = "resume") -> dict[str, Any]:
    """Read and verify a checkpoint; errors name the config ``key`` that gave ``path``.

    Raises:
        CheckpointError: a missing or unreadable file, one that is not a lit_fedco checkpoint,
            one cut short or altered (its checksum fails), or one that does not unpickle.
    """
    try:
        data = read_regular(Path(path), key)
    except OSError as err:
        example = f"(e.g. {key}=RUN/pretrain-seed0/pretrained.ckpt)"
        fix = "or resume=auto" if key == "resume" else example
        raise CheckpointError(
            f"{key}: cannot read {path} ({err.strerror or err}); give an existing checkpoint "
            f"file {fix}",
            key=key,
        ) from None
    head = len(MAGIC) + 65
    if not data.startswith(MAGIC) or len(data) < head or data[head - 1 : head] != b"\n":
        raise CheckpointError(
            f"{key}: {path} is not a lit_fedco checkpoint (or is truncated before its header); "
            "give a .ckpt file written by a lit_fedco run",
            key=key,
        )
    digest, payload = data[len(MAGIC) : head - 1].decode(errors="replace"), data[head:]
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(
            f"{key}: {path} fails its checksum (truncated or corrupted, {len(payload)} bytes of "
            "payload); use an earlier checkpoint of the run",
            key=key,
        )
    try:
        content = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as err:  # a valid checksum over bytes that do not unpickle
        raise CheckpointError(
            f"{key}: {path} does not load ({type(err).__name__}); use an earlier checkpoint",
            key=key,
        ) from None
    if not isinstance(content, dict) or "loop" not in content:
        raise CheckpointError(f"{key}: {path} holds no run state", key=key)
    check_state(content["loop"], path, key)
    return content


MAX_BYTES = 1 << 36
"""The largest checkpoint read (64 GiB): a file claiming more is refused, not read into memory."""


def read_regular(path: Path, key: str, limit: int = MAX_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes: a device
    (``/dev/zero``), a FIFO (whose open would wait for a writer) or a folder is refused before
    it is opened.

    Raises:
        CheckpointError: not a regular file, or larger than ``limit``.
        OSError: it cannot be read.
    """
    import stat

    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, FIFO "
        kind += "" if stat.S_ISDIR(st.st_mode) else "or socket)"
        raise CheckpointError(
            f"{key}: {path} is {kind}, expected a checkpoint file; give a .ckpt file written "
            "by a lit_fedco run",
            key=key,
        )
    if st.st_size > limit:
        raise CheckpointError(
            f"{key}: {path} holds {st.st_size} bytes, expected a checkpoint of at most {limit} "
            "bytes; give a .ckpt file written by a lit_fedco run",
            key=key,
        )
    with open(path, "rb") as f:  # a file that is no checkpoint is not read past its start
        head = f.read(len(MAGIC))
        return head + f.read() if head == MAGIC else head


def check_state(loop: Any, path: Path, key: str = "resume") -> None:
    """The loop state of a checkpoint is what a run writes: a dict whose ``round`` is an int
    >= 0 and whose tensors are dense, real and hold their values (not ``meta``).

    Raises:
        CheckpointError: naming the first entry that is not.
    """

    def refuse(where: str, got: str, expected: str) -> None:
        raise CheckpointError(
            f"{key}: {path} holds {where} = {got}, expected {expected} as lit_fedco writes it; "
            "use another checkpoint of the run",
            key=key,
        )

    if not isinstance(loop, dict):
        refuse("loop", type(loop).__name__, "a dict")
    r = loop.get("round", 0)
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        refuse("loop.round", repr(r), "an int >= 0")

    def walk(x: Any, where: str) -> None:
        if isinstance(x, Tensor):
            if x.is_meta or x.layout != torch.strided or x.is_complex():
                refuse(where, f"a {x.layout} {x.dtype} tensor on {x.device}", "a dense real "
                       "tensor holding its values")  # fmt: skip
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{where}.{k}")
        elif isinstance(x, list | tuple):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")

    walk(loop, "loop")


def check_params(loop: dict[str, Any], names: set[str], path: Path, key: str = "resume") -> None:
    """Every entry of the loop state named like one of the model's parameters (``names``) is
    a floating-point tensor (a crafted integer weight is refused, not cast and trained).

    Raises:
        CheckpointError: naming the entry.
    """

    def walk(x: Any, where: str) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k in names and isinstance(v, Tensor) and not v.is_floating_point():
                    raise CheckpointError(
                        f"{key}: {path} holds {where}.{k} as a {v.dtype} tensor, expected the "
                        "floating-point parameter lit_fedco writes; use another checkpoint of "
                        "the run",
                        key=key,
                    )
                walk(v, f"{where}.{k}")

    walk(loop, "loop")


# ---------------------------------------------------------------------- a folder of them
def name_of(round_idx: int) -> str:
    """The file name of the checkpoint after round ``round_idx``."""
    return f"round-{round_idx:07d}{SUFFIX}"


def listing(folder: Path) -> list[Path]:
    """The checkpoints in ``folder``, oldest first (by round)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(f"round-*{SUFFIX}") if p.is_file())


def newest_valid(folder: Path) -> tuple[Path, dict[str, Any], list[str]] | None:
    """The newest checkpoint of ``folder`` that loads and verifies, with the reasons the
    newer ones were skipped; None when there is none."""
    skipped: list[str] = []
    for path in reversed(listing(folder)):
        try:
            return path, load(path), skipped
        except CheckpointError as err:
            skipped.append(str(err))
    return None


def prune(folder: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` checkpoints, and temporary files left by a kill."""
    for path in listing(folder)[:-keep] if keep > 0 else []:
        path.unlink(missing_ok=True)
    for tmp in folder.glob(f".round-*{SUFFIX}.tmp*"):
        if not tmp.name.endswith(f".tmp{os.getpid()}"):
            tmp.unlink(missing_ok=True)
