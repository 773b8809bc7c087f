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

Online runs need the W&B server: :func:`check_wandb_server` opens a TCP connection to it (name
resolution included, through ``HTTPS_PROXY`` where one is set) before anything starts, and gives
up after :data:`CONNECT_TIMEOUT` seconds, where wandb itself would wait about 90 s and then fail
halfway through the run. Unreachable, it is an error (exit code 2, one line) when
``WANDB_MODE=online`` asked for it; when the mode was only chosen because credentials were
found, the run logs offline instead with a one-line warning (``WANDB_MODE=offline`` is set for
the run's processes) and can be uploaded later with ``wandb sync``. ``WANDB_BASE_URL`` must be
an http(s) URL, and ``project`` a W&B project name (at most 128 characters, none of
``/\\#?%:``).

A resumed run continues its W&B run (the same run id, kept in the sub-run's ``status.json``) and
logs the rounds of its record (``metrics.jsonl``) that W&B lacks before its next round
(:meth:`WandbTracker.catch_up`). Online, W&B resumes the run and the rows after the last round
the server holds are logged. Offline, a process cannot know what an earlier one got onto the disk
(a killed process loses what W&B still buffered, up to 15 s of rounds), so every process writes
a new ``offline-run-*`` folder for the run id that holds the whole record from round 1, each
round once (``trainer/global_step`` is the round); when the run ends or stops, the older folders
of that id are marked as W&B marks an uploaded run (an empty ``run-<id>.wandb.synced``), so
that ``wandb sync`` skips them (``--include-synced`` does not). ``status.json``'s ``wandb_dir``
names the newest folder.

:func:`read_wandb_offline_run` (:mod:`lit_fedco.report.wandb_read`) reads an offline run back, so
that tests can check what a run logged without a W&B server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import netrc
import os
import socket
import sys
import threading
import urllib.request
from argparse import Namespace
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lightning.fabric.loggers import Logger
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, ListConfig, OmegaConf

from lit_fedco.core.errors import ConfigError
from lit_fedco.report.wandb_read import read_wandb_offline_run as read_wandb_offline_run
from lit_fedco.report.wandb_read import wandb_records as wandb_records

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


def check_tracking(tracking: list[str] | str, project: str | None = None) -> list[str]:
    """Validate a ``tracking`` list and, with ``wandb`` in it, the W&B mode and settings.

    Called before any process starts, so that bad input fails at once.

    Args:
        tracking: any of ``"wandb"``, ``"csv"``; ``["none"]`` or ``[]`` for no tracking.
            A single name is taken as a list of one.
        project: the W&B project, checked when given.

    Returns:
        The names, as a list.

    Raises:
        ConfigError: for an unknown name, ``none`` together with a tracker, an unknown
            ``WANDB_MODE``, ``WANDB_MODE=online`` without credentials, a malformed
            ``WANDB_BASE_URL`` or W&B project name.
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
    if "wandb" in names and wandb_mode() != "disabled":
        _check_wandb_settings(project)
    return names


CONNECT_TIMEOUT = 3.0
"""Seconds to wait for a TCP connection to the W&B server before a run starts."""


def _check_wandb_settings(project: str | None) -> None:
    """``WANDB_BASE_URL`` and ``project`` (module docstring)."""
    url = os.environ.get("WANDB_BASE_URL") or _WANDB_HOST
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError.bad_value(
            "WANDB_BASE_URL", url, "the http(s) URL of a W&B server (or unset)", _WANDB_HOST
        )
    bad = not project or len(project) > 128 or set("/\\#?%:") & set(project)
    if project is not None and bad:
        expected = "a W&B project name: 1 to 128 characters, none of /\\#?%:"
        raise ConfigError.bad_value("project", project, expected, "lit_fedco")


def check_wandb_server() -> None:
    """With W&B online, that its server answers within :data:`CONNECT_TIMEOUT` seconds; if it
    does not, an error for ``WANDB_MODE=online``, else offline logging with a warning (module
    docstring). Called once, before anything starts.

    Raises:
        ConfigError: ``WANDB_MODE`` asks for online logging and the server does not answer.
    """
    url = os.environ.get("WANDB_BASE_URL") or _WANDB_HOST
    if wandb_mode() != "online" or (why := _unreachable(url)) is None:
        return
    where = f"the W&B server {url} cannot be reached within {CONNECT_TIMEOUT:g} s ({why})"
    if os.environ.get("WANDB_MODE", "").strip():
        raise ConfigError(
            f"WANDB_MODE: got {os.environ['WANDB_MODE']!r}, but {where}; check the network or "
            "WANDB_BASE_URL, or set WANDB_MODE=offline and upload later with `wandb sync`",
            key="WANDB_MODE",
        )
    print(f"lit_fedco: {where}; logging offline instead (upload later with `wandb sync`; "
          "WANDB_MODE=online makes this an error)", file=sys.stderr)  # fmt: skip
    os.environ["WANDB_MODE"] = "offline"  # for this process and those Fabric starts


def _unreachable(url: str, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None if a TCP connection to the host of ``url`` (or to the proxy for it) opens within
    ``timeout`` seconds, name resolution included; else why not."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        via = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = via.hostname or host, via.port or 80
    result: list[str | None] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except OSError as err:
            result.append(f"{host}:{port}: {err.strerror or err or type(err).__name__}")

    thread = threading.Thread(target=attempt, daemon=True)  # name resolution has no timeout
    thread.start()
    thread.join(timeout)
    return result[0] if result else f"{host}:{port}: no answer"


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
    if os.environ["WANDB_MODE"] != env:  # ' OFFLINE ': wandb reads it as it was checked
        os.environ["WANDB_MODE"] = env
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
        """End the W&B run: exit code 0 for ``status == "success"``, else 1; offline, mark the
        run's older folders superseded (:func:`supersede_offline_runs`), now that this one's
        files are complete."""
        super().finalize(status)
        run = self._experiment
        if run is not None and hasattr(run, "finish"):
            run.finish(exit_code=0 if status == "success" else 1)
            if self.whole_record and (folder := self.folder) is not None:
                supersede_offline_runs(folder, run.id)
        self._experiment = None

    whole_record = False
    """Whether this W&B run holds its sub-run's whole record from round 1 (set by
    :meth:`catch_up`): offline, or a run the server did not have yet."""

    @property
    def folder(self) -> Path | None:
        """The local folder of the W&B run (``wandb/offline-run-*`` offline), once started."""
        run = self._experiment
        sync_dir = getattr(getattr(run, "settings", None), "sync_dir", None)
        return Path(sync_dir) if sync_dir else None

    @rank_zero_only
    def catch_up(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Log the rows of a sub-run's record (``metrics.jsonl``: dicts with an int ``round``,
        in order) that this W&B run lacks, each at its round (``trainer/global_step``).

        A run the server resumed (online) lacks the rows after the last round it holds (its
        summary's ``trainer/global_step``); any other run (offline, or new to the server) starts
        empty and gets every row, so that its folder alone holds the whole record.
        """
        run = self.experiment
        done = 0
        if getattr(run, "resumed", False):
            last = run.summary.get("trainer/global_step")
            done = int(last) if isinstance(last, (int, float)) and math.isfinite(last) else 0
        self.whole_record = done == 0 and not getattr(run, "resumed", False)
        for row in rows:
            if int(row["round"]) > done:
                self.log_metrics({k: v for k, v in row.items() if k != "round"}, int(row["round"]))


def supersede_offline_runs(folder: Path, run_id: str) -> list[Path]:
    """Mark the other offline folders of W&B run ``run_id`` beside ``folder`` (which holds
    everything they hold, and more) as uploaded: an empty ``run-<id>.wandb.synced`` beside
    their ``run-<id>.wandb``, W&B's own marker, so that ``wandb sync`` skips them. Returns the
    folders newly marked."""
    marked = []
    for other in sorted(folder.parent.glob(f"offline-run-*-{run_id}*")):
        log = other / f"run-{run_id}.wandb"
        mark = log.with_suffix(".wandb.synced")
        if other != folder and log.is_file() and not mark.exists():
            with contextlib.suppress(OSError):  # best effort: a read-only copy stays unmarked
                mark.touch()
                marked.append(other)
    return marked


def make_loggers(
    tracking: list[str] | str,
    wandb_dir: str | Path,
    run_name: str,
    project: str,
    config: Mapping[str, Any] | Namespace | Any,
    wandb_id: str | None = None,
    history: Iterable[Mapping[str, Any]] = (),
) -> list[Logger]:
    """The experiment trackers of ``tracking``, each already holding the resolved ``config``.

    Every run records its metrics in its run folder (``metrics.jsonl`` and ``metrics.csv``,
    :class:`lit_fedco.store.history.History`) whatever ``tracking`` says; ``csv`` asks for
    nothing more, ``wandb`` adds a W&B run.

    Args:
        tracking: any of ``"wandb"``, ``"csv"``; ``["none"]`` or ``[]`` for none.
        wandb_dir: where W&B writes its runs (``wandb/offline-run-*`` offline).
        run_name: the run's name (W&B display name). Its part before the first ``-`` is the
            W&B group, so that a recipe's updaters and seeds group together.
        project: the W&B project.
        config: the resolved config (dict, ``DictConfig``, ``Namespace`` or dataclass).
        wandb_id: the id of the W&B run to continue (a resumed run), or None for a new one.
        history: the sub-run's record so far (``metrics.jsonl`` rows, each with its ``round``),
            of which the W&B run gets what it lacks before anything else
            (:meth:`WandbTracker.catch_up`; module docstring).

    Returns:
        The loggers (for a loop's ``log_metrics`` calls; end them with
        :func:`finalize_loggers`). Empty without W&B, and for ``WANDB_MODE=disabled``.

    Raises:
        ConfigError: as :func:`check_tracking`.
    """
    loggers: list[Logger] = []
    if tracks_to_wandb(tracking):
        loggers.append(_wandb_logger(Path(wandb_dir), run_name, project, wandb_mode(), wandb_id))
    for logger in loggers:
        logger.log_hyperparams(plain_config(config))
        if isinstance(logger, WandbTracker):
            logger.catch_up(history)
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


def tracks_to_wandb(tracking: list[str] | str) -> bool:
    """Whether a run with ``tracking`` logs to W&B: ``wandb`` among its trackers, and W&B not
    disabled (``WANDB_MODE``). Raises :class:`ConfigError` on an unknown tracker."""
    return "wandb" in check_tracking(tracking) and wandb_mode() != "disabled"


def import_wandb(tracking: list[str]) -> None:
    """Where the run tracks to W&B: import what a process's first W&B run imports — ``wandb``,
    and W&B Launch's job inputs, which every ``wandb.init`` reads (0.7 s together on a 2-core
    machine) — so that ``jobs=N`` workers forked afterwards start with them, and the launcher's
    figures run at the end does not wait for them. Starts no thread and no W&B service (a fork
    stays safe); bad ``tracking`` or W&B settings are left to the run's checks."""
    try:
        if not tracks_to_wandb(tracking):
            return
    except ConfigError:
        return
    import importlib

    importlib.import_module("wandb")
    with contextlib.suppress(ImportError):  # where another wandb keeps it elsewhere: imported later
        importlib.import_module("wandb.sdk.launch.inputs.internal")


def share_wandb_service(tracking: list[str]) -> None:
    """Where the run tracks to W&B: start W&B's service in this process (a ``jobs=N``
    launcher, after its workers were forked and its checks passed), so that the workers' W&B runs
    and the figures' run at the end all use one service (``WANDB_SERVICE``, which each task
    carries) instead of one each: on 2 cores, ``ds_feddro``'s ``jobs=2`` took 0.6–0.9 s and
    0.8 s of CPU less. Writes no file."""
    if not tracks_to_wandb(tracking):
        return
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")  # as each run sets it: else W&B warns later
    wandb.setup()


def log_figures(
    tracking: list[str], run_dir: Path, name: str, project: str, pngs: list[Path]
) -> None:
    """Log a run's figures to W&B as images, in a run of their own (``<recipe>-figures``, the
    recipe's group) beside the per-method runs; nothing without W&B tracking."""
    if not tracks_to_wandb(tracking):
        return
    import wandb

    mode = wandb_mode()
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
