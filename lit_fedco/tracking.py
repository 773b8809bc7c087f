"""Experiment tracking through Lightning Fabric's logger interface: W&B and CSV.

W&B runs offline automatically when no credentials are present (no ``WANDB_API_KEY`` and no
``api.wandb.ai`` entry in ``~/.netrc``), so a run never stops at a login prompt;
``WANDB_MODE=disabled`` or ``tracking=[none]`` writes nothing. The resolved config is logged
with every run (W&B config; ``hparams.yaml`` beside the CSV metrics).
"""

from __future__ import annotations

import netrc
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from lightning.fabric.loggers import CSVLogger, Logger

from lit_fedco.errors import ConfigError

TRACKERS = ("wandb", "csv", "none")


def check_tracking(tracking: list[str]) -> None:
    """Raise a :class:`ConfigError` for names other than ``wandb``, ``csv`` and ``none``."""
    for name in tracking:
        if name not in TRACKERS:
            raise ConfigError.bad_value(
                "tracking", name, f"a list of {', '.join(map(repr, TRACKERS))}", "[wandb,csv]"
            )


def wandb_mode() -> str:
    """``disabled``, ``online`` or ``offline``: ``WANDB_MODE`` if set, else online only when
    credentials are present."""
    env = os.environ.get("WANDB_MODE", "").lower()
    if env in ("disabled", "offline", "online"):
        return env
    if env == "dryrun":
        return "offline"
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        auth = netrc.netrc(os.path.expanduser("~/.netrc")).authenticators("api.wandb.ai")
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        auth = None
    return "online" if auth else "offline"


class CSVTracker(CSVLogger):
    """Fabric's CSV logger, which does not implement ``log_hyperparams``, plus a
    ``hparams.yaml`` beside ``metrics.csv`` holding the resolved config."""

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        path = Path(self.log_dir)
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / ".hparams.yaml.part"
        tmp.write_text(yaml.safe_dump(_plain(params), sort_keys=False))
        tmp.replace(path / "hparams.yaml")


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def make_loggers(
    tracking: list[str], out_dir: str | Path, run_name: str, project: str, config: dict[str, Any]
) -> list[Logger]:
    """Loggers for ``tracking`` (any of ``wandb``, ``csv``; ``[none]`` for none), each already
    holding the resolved ``config``."""
    check_tracking(tracking)
    loggers: list[Logger] = []
    if "none" in tracking:
        return loggers
    if "csv" in tracking:
        loggers.append(CSVTracker(root_dir=str(out_dir), name=run_name))
    if "wandb" in tracking and (mode := wandb_mode()) != "disabled":
        from lightning.pytorch.loggers import WandbLogger

        os.environ.setdefault("WANDB_SILENT", "true")
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        loggers.append(
            WandbLogger(
                save_dir=str(out_dir),
                project=project,
                name=run_name,
                group=run_name.split("-")[0],
                offline=mode == "offline",
            )
        )
    for logger in loggers:
        logger.log_hyperparams(config)
    return loggers


def finalize_loggers(loggers: list[Logger]) -> None:
    """Flush and close every logger (ends the W&B run so its files are complete)."""
    for logger in loggers:
        logger.finalize("success")
        if type(logger).__name__ == "WandbLogger":
            import wandb

            wandb.finish()


# --------------------------------------------------------------------------- reading W&B back
_BLOCK = 32768
_HEADER = 7  # ":W&B", 2-byte magic, 1-byte version


def _wandb_records(path: Path) -> Iterator[bytes]:
    """The payloads of a ``.wandb`` transaction log (LevelDB log format: 32 KiB blocks of
    records with a 7-byte header: crc32c, length, type FULL/FIRST/MIDDLE/LAST)."""
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            pos += _BLOCK - pos % _BLOCK if pos % _BLOCK else 0
            continue
        if kind == 1:
            yield payload
        elif kind == 2:
            pending = payload
        elif kind == 3:
            pending += payload
        elif kind == 4:
            yield pending + payload
            pending = b""


def read_wandb_offline_run(run_dir: str | Path) -> dict[str, Any]:
    """What an offline W&B run wrote: ``{"config": {...}, "history": [{...}, ...]}``.

    Reads the run's ``run-<id>.wandb`` file with W&B's own protobuf ``Record`` schema.
    """
    import json

    from wandb.proto import wandb_internal_pb2 as pb

    files = sorted(Path(run_dir).glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no run-*.wandb file in {run_dir}")
    config: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    for payload in _wandb_records(files[0]):
        rec = pb.Record()  # type: ignore[attr-defined]
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "config":
            for item in rec.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "run":
            for item in rec.run.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "history":
            history.append(
                {
                    (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                    for item in rec.history.item
                }
            )
    return {"config": config, "history": history}
