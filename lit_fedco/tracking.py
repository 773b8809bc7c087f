"""Experiment tracking through Lightning Fabric's logger interface: W&B and CSV.

``tracking`` lists the trackers of a run: ``[wandb, csv]`` (the default of the recipes),
either one, or ``[none]``. Every run records its metrics in its run folder
(``metrics.jsonl`` and ``metrics.csv``, beside ``config.yaml``); ``wandb`` adds a W&B run,
which receives the resolved config before the first metric.

W&B never stops at a login prompt. Its mode is, in this order: ``WANDB_MODE`` when set
(``disabled`` writes nothing at all, not even a ``wandb/`` folder); otherwise ``online`` when
credentials are present (``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE``, or a ``.netrc``
entry for the W&B host, as ``wandb login`` writes it); otherwise ``offline``: the run is
written under ``<out_dir>/wandb/offline-run-*`` and can be uploaded later with ``wandb sync``.
``WANDB_MODE=online`` without credentials is an error before anything starts, rather than an
interactive prompt.

An offline run is one ``run-<id>.wandb`` file: W&B's transaction log of protobuf ``Record``
messages (config, history rows, summary, exit code). :func:`read_wandb_offline_run` reads it
back, so that tests can check what a run logged without a W&B server.
"""

from __future__ import annotations

import dataclasses
import json
import netrc
import os
import struct
import zlib
from argparse import Namespace
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lightning.fabric.loggers import Logger
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, ListConfig, OmegaConf

from lit_fedco.errors import ConfigError

TRACKERS = ("wandb", "csv", "none")

# WANDB_MODE values that wandb accepts, and what they mean here.
_WANDB_MODES = {
    "online": "online",
    "run": "online",
    "shared": "online",
    "offline": "offline",
    "dryrun": "offline",
    "disabled": "disabled",
}
_WANDB_HOST = "https://api.wandb.ai"


def check_tracking(tracking: list[str] | str) -> list[str]:
    """Validate a ``tracking`` list and, with ``wandb`` in it, the W&B mode.

    Called before any process starts, so that bad input fails at once.

    Args:
        tracking: any of ``"wandb"``, ``"csv"``; ``["none"]`` or ``[]`` for no tracking.
            A single name is taken as a list of one.

    Returns:
        The names, as a list.

    Raises:
        ConfigError: for an unknown name, ``none`` together with a tracker, an unknown
            ``WANDB_MODE``, or ``WANDB_MODE=online`` without credentials.
    """
    names = [tracking] if isinstance(tracking, str) else list(tracking)
    for name in names:
        if name not in TRACKERS:
            raise ConfigError.bad_value(
                "tracking", name, "a list of 'wandb', 'csv' or 'none'", "[wandb,csv]"
            )
    if "none" in names and len(set(names)) > 1:
        raise ConfigError.bad_value(
            "tracking", names, "'none' alone, or a list of 'wandb' and 'csv'", "[none]"
        )
    if "wandb" in names:
        wandb_mode()
    return names


def wandb_mode() -> str:
    """The W&B mode of a run started now: ``online``, ``offline`` or ``disabled``.

    ``WANDB_MODE`` when set, else ``online`` when :func:`has_wandb_credentials`, else
    ``offline``.

    Raises:
        ConfigError: for an unknown ``WANDB_MODE``, or ``WANDB_MODE=online`` (``run``,
            ``shared``) without credentials, where wandb would otherwise prompt for a key.
    """
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if not env:
        return "online" if has_wandb_credentials() else "offline"
    if env not in _WANDB_MODES:
        raise ConfigError.bad_value(
            "WANDB_MODE", env, "one of 'online', 'offline', 'disabled' (or unset)", "offline"
        )
    mode = _WANDB_MODES[env]
    if mode == "online" and not has_wandb_credentials():
        raise ConfigError(
            f"WANDB_MODE: got {env!r}, but no W&B credentials were found (WANDB_API_KEY, "
            f"WANDB_IDENTITY_TOKEN_FILE or a .netrc entry for {_wandb_netloc()}); "
            "run `wandb login` first, or unset WANDB_MODE to log offline"
        )
    return mode


def has_wandb_credentials() -> bool:
    """Whether W&B finds credentials without asking: the checks of ``wandb`` 0.31's
    ``wbauth`` (environment, then ``$NETRC`` / ``~/.netrc`` / ``~/_netrc`` for the host of
    ``WANDB_BASE_URL``), read here without importing or starting wandb."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    if env_path := os.environ.get("NETRC"):
        path = Path(env_path).expanduser()
    else:
        candidates = [Path("~/.netrc").expanduser(), Path("~/_netrc").expanduser()]
        path = next((p for p in candidates if p.exists()), candidates[0])
    try:
        auth = netrc.netrc(str(path)).authenticators(_wandb_netloc())
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def _wandb_netloc() -> str:
    return urlsplit(os.environ.get("WANDB_BASE_URL") or _WANDB_HOST).netloc


# --------------------------------------------------------------------------- loggers
class WandbTracker(WandbLogger):
    """Lightning's W&B logger, whose ``finalize`` also ends the W&B run.

    Ending the run flushes an offline run's files and lets the next logger in the same process
    start a new run (Lightning's logger otherwise attaches to a run still in progress).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Lightning always passes anonymous=None, on which wandb >= 0.2x prints a warning.
        init = getattr(self, "_wandb_init", None)
        if isinstance(init, dict) and init.get("anonymous") is None:
            init.pop("anonymous", None)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """End the W&B run: exit code 0 for ``status == "success"``, else 1."""
        super().finalize(status)
        run = self._experiment
        if run is not None and hasattr(run, "finish"):
            run.finish(exit_code=0 if status == "success" else 1)
        self._experiment = None


def make_loggers(
    tracking: list[str] | str,
    wandb_dir: str | Path,
    run_name: str,
    project: str,
    config: Mapping[str, Any] | Namespace | Any,
    wandb_id: str | None = None,
) -> list[Logger]:
    """The experiment trackers of ``tracking``, each already holding the resolved ``config``.

    Every run records its metrics in its run folder (``metrics.jsonl`` and ``metrics.csv``,
    :class:`lit_fedco.rundir.History`) whatever ``tracking`` says; ``csv`` asks for nothing
    more, ``wandb`` adds a W&B run.

    Args:
        tracking: any of ``"wandb"``, ``"csv"``; ``["none"]`` or ``[]`` for none.
        wandb_dir: where W&B writes its runs (``wandb/offline-run-*`` offline).
        run_name: the run's name (W&B display name). Its part before the first ``-`` is the
            W&B group, so that a recipe's updaters and seeds group together.
        project: the W&B project.
        config: the resolved config (dict, ``DictConfig``, ``Namespace`` or dataclass).
        wandb_id: the id of the W&B run to continue (a resumed run), or None for a new one.

    Returns:
        The loggers (for a loop's ``log_metrics`` calls; end them with
        :func:`finalize_loggers`). Empty without W&B, and for ``WANDB_MODE=disabled``.

    Raises:
        ConfigError: as :func:`check_tracking`.
    """
    names = check_tracking(tracking)
    loggers: list[Logger] = []
    if "wandb" in names and (mode := wandb_mode()) != "disabled":
        loggers.append(_wandb_logger(Path(wandb_dir), run_name, project, mode, wandb_id))
    for logger in loggers:
        logger.log_hyperparams(plain_config(config))
    return loggers


def _wandb_logger(
    out_dir: Path, run_name: str, project: str, mode: str, run_id: str | None
) -> WandbTracker:
    import wandb

    # wandb falls back to a temporary folder when ``dir`` does not exist
    if getattr(rank_zero_only, "rank", 0) == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    # Keep the lines that say where the run is saved, drop the sparkline summary at the end,
    # unless the user chose otherwise through the environment.
    quiet = not any(k in os.environ for k in ("WANDB_QUIET", "WANDB_SILENT"))
    return WandbTracker(
        save_dir=str(out_dir),
        project=project,
        name=run_name,
        group=run_name.split("-")[0],
        mode=mode,  # passed to wandb.init, instead of offline=True which sets WANDB_MODE
        settings=wandb.Settings(quiet=True) if quiet else None,
        id=run_id,  # a resumed run continues its W&B run
        resume="allow" if run_id else None,
    )


def log_figures(
    tracking: list[str], run_dir: Path, name: str, project: str, pngs: list[Path]
) -> None:
    """Log a run's figures to W&B as images, in a run of their own (``<recipe>-figures``, the
    recipe's group) beside the per-method runs; nothing without W&B tracking."""
    names = check_tracking(tracking)
    if "wandb" not in names or (mode := wandb_mode()) == "disabled":
        return
    import wandb

    run = wandb.init(
        dir=str(run_dir),
        project=project,
        name=name,
        group=name.split("-")[0],
        mode=mode,  # type: ignore[arg-type]
        settings=wandb.Settings(quiet=True),
    )
    run.log({p.stem: wandb.Image(str(p)) for p in pngs})
    run.finish()


def finalize_loggers(loggers: list[Logger], status: str = "success") -> None:
    """Flush and close every logger: the CSV file is written, the W&B run ended (its offline
    files complete). ``status`` is ``"success"`` or e.g. ``"failed"``."""
    for logger in loggers:
        logger.finalize(status)


def plain_config(config: Any) -> Any:
    """``config`` as plain YAML/JSON data: dicts, lists, str, int, float, bool, None.

    ``DictConfig`` is resolved, ``Namespace`` and dataclasses become dicts, numpy and torch
    scalars numbers, anything else its ``str``.
    """
    if isinstance(config, (DictConfig, ListConfig)):
        config = OmegaConf.to_container(config, resolve=True)
    if isinstance(config, Namespace):
        config = vars(config)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return {str(k): plain_config(v) for k, v in config.items()}
    if isinstance(config, (list, tuple, set, frozenset)):
        return [plain_config(v) for v in config]
    if config is None or isinstance(config, str):
        return config
    for kind in (bool, int, float):  # bool first: it is an int; numpy floats are floats
        if isinstance(config, kind):
            return kind(config)
    item = getattr(config, "item", None)  # numpy and torch scalars
    if callable(item) and getattr(config, "ndim", None) == 0:
        return plain_config(item())
    return str(config)


# --------------------------------------------------------------------------- reading W&B back
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


def read_wandb_offline_run(run_dir: str | Path) -> dict[str, Any]:
    """What a W&B run wrote to its ``run-<id>.wandb`` file, read with W&B's own protobuf schema.

    Args:
        run_dir: the run's folder, e.g. ``<out_dir>/wandb/offline-run-<date>-<id>``.

    Returns:
        ``run_id``, ``project``, ``name``; ``config`` (the logged config, without W&B's own
        ``_wandb`` entry); ``history`` (one dict per ``log`` call, W&B's ``_step``,
        ``_runtime`` and ``_timestamp`` included; Lightning adds ``trainer/global_step``);
        ``summary`` (the last value of each key); ``exit_code`` (None if the run never ended).
        Values are decoded from JSON; a nested key reads ``a.b``.
    """
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
