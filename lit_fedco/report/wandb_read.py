"""Reading a W&B offline run back, without a W&B server (re-exported by
:mod:`lit_fedco.report.tracking`).

An offline run is one ``run-<id>.wandb`` file: W&B's transaction log of protobuf ``Record``
messages (config, history rows, summary, exit code). :func:`read_wandb_offline_run` reads it
back, so that tests can check what a run logged.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# A .wandb file is a 7-byte header (":W&B", magic 0xBEE1, version) followed by LevelDB's log
# format: 32 KiB blocks of chunks, each with a 7-byte header (CRC-32, length, type), a record
# split over FIRST/MIDDLE/LAST chunks where it crosses a block. The header counts towards the
# first block. The CRC is zlib's CRC-32 of the type byte followed by the payload.
_BLOCK = 32768
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: str | Path) -> Iterator[bytes]:
    """The serialized ``Record`` messages of a ``.wandb`` transaction log, in order.

    A record cut short at the end of the file (a run killed while writing) ends the iteration.

    Raises:
        ValueError: if the file is not a W&B log or a chunk fails its checksum.
    """
    data = Path(path).read_bytes()
    if len(data) < 7 or data[:4] != b":W&B" or data[4:6] != b"\xe1\xbe":
        raise ValueError(f"{path} is not a W&B transaction log (no ':W&B' header)")
    pos, parts = 7, b""
    while pos + _CHUNK_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:  # a block ends in zero padding shorter than a chunk header
            pos += left
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        start, pos = pos + _CHUNK_HEADER, pos + _CHUNK_HEADER + length
        if pos > len(data):
            return
        payload = data[start:pos]
        if kind == 0 and length == 0 and crc == 0:  # zeroed space: skip to the next block
            pos += _BLOCK - pos % _BLOCK if pos % _BLOCK else 0
            continue
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) != crc:
            raise ValueError(f"{path}: bad checksum in the chunk at byte {start - 7}")
        if kind == _FULL:
            yield payload
        elif kind == _FIRST:
            parts = payload
        elif kind == _MIDDLE:
            parts += payload
        elif kind == _LAST:
            yield parts + payload
            parts = b""


def read_wandb_offline_run(run_dir: str | Path, wait: float = 0.0) -> dict[str, Any]:
    """What a W&B run wrote to its ``run-<id>.wandb`` file, read with W&B's own protobuf schema.

    Args:
        run_dir: the run's folder, e.g. ``<out_dir>/wandb/offline-run-<date>-<id>``.
        wait: seconds to keep re-reading until the run's exit record is there. W&B's service
            process writes the file, and ``run.finish()`` can return before its last records
            reach the disk on a busy machine; a run killed mid-way never gets one, so the
            default reads once.

    Returns:
        ``run_id``, ``project``, ``name``; ``config`` (the logged config, without W&B's own
        ``_wandb`` entry); ``history`` (one dict per ``log`` call, W&B's ``_step``,
        ``_runtime`` and ``_timestamp`` included; Lightning adds ``trainer/global_step``);
        ``summary`` (the last value of each key); ``exit_code`` (None if the run never ended).
        Values are decoded from JSON; a nested key reads ``a.b``.
    """
    deadline = time.monotonic() + wait
    while True:
        out = _read_run(run_dir)
        if out["exit_code"] is not None or time.monotonic() >= deadline:
            return out
        time.sleep(0.1)


def _read_run(run_dir: str | Path) -> dict[str, Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    files = sorted(Path(run_dir).glob("run-*.wandb"))
    if len(files) != 1:
        raise FileNotFoundError(
            f"expected one run-*.wandb file in {run_dir}, found {[f.name for f in files]}"
        )
    out: dict[str, Any] = {"run_id": None, "project": None, "name": None, "config": {}}
    out.update(history=[], summary={}, exit_code=None)
    for payload in wandb_records(files[0]):
        rec = pb.Record()  # type: ignore[attr-defined]
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out.update(run_id=rec.run.run_id, project=rec.run.project, name=rec.run.display_name)
            _apply(out["config"], rec.run.config.update, rec.run.config.remove)
        elif kind == "config":
            _apply(out["config"], rec.config.update, rec.config.remove)
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            _apply(out["summary"], rec.summary.update, rec.summary.remove)
        elif kind == "exit":
            out["exit_code"] = rec.exit.exit_code
    for section in ("config", "summary"):
        out[section] = {k: v for k, v in out[section].items() if not k.startswith("_wandb")}
    return out


def _key(item: Any) -> str:
    return item.key or ".".join(item.nested_key)


def _apply(target: dict[str, Any], updates: Any, removes: Any) -> None:
    for item in updates:
        target[_key(item)] = json.loads(item.value_json)
    for item in removes:
        target.pop(_key(item), None)
