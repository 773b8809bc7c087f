"""The processes of a run: Fabric's arguments for the config's accelerator, devices, nodes and
strategy, the checks of the launch (before any process starts), and this process's rank when a
launcher outside lit_fedco started it."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins import environments as envs
from lightning.fabric.strategies import DDPStrategy
from omegaconf import DictConfig

from lit_fedco.core.errors import ConfigError
from lit_fedco.engine.schedule import ACCELERATORS, STRATEGIES, STRATEGY_NOTE
from lit_fedco.experiment.rundir import RUN_DIR_ENV
from lit_fedco.process.launch_env import (
    check_launch_env,
    install_lost_peer_hook,
    lost_peer_line,
    rendezvous_timeout,
)


def fabric_settings(cfg: DictConfig) -> dict[str, Any]:
    """The arguments of ``Fabric`` for the config's accelerator, devices, nodes and strategy."""
    strategy: Any = cfg.strategy
    if strategy == "auto" and cfg.devices * cfg.num_nodes > 1:
        strategy = "ddp"  # processes started by Fabric; gloo on CPU, NCCL on GPUs
    timeout = rendezvous_timeout()
    if strategy == "ddp" and timeout is not None:  # how long the processes wait for each other
        strategy = DDPStrategy(timeout=timeout)
    return dict(
        accelerator=cfg.accelerator, devices=cfg.devices, num_nodes=cfg.num_nodes, strategy=strategy
    )


def make_fabric(cfg: DictConfig, callbacks: list[Any] | None = None) -> Fabric:
    """A launched Fabric for the config's accelerator, devices, nodes and strategy.

    ``callbacks`` are objects with any of the loop's hooks (``on_round_start(loop, cohort)``,
    ``on_round_end(loop, logs)``, ``on_eval_end(loop, metrics)``), called through
    ``fabric.call`` on every process."""
    fabric = Fabric(**fabric_settings(cfg), callbacks=callbacks)
    try:
        fabric.launch()
    except Exception as err:  # the processes never met (a node not started): one line
        line = lost_peer_line(err, os.environ.get(RUN_DIR_ENV))
        if line is None:
            raise
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    install_lost_peer_hook()  # a dead peer: one line, not gloo's traceback (launch_env.py)
    return fabric


def check_fabric(cfg: DictConfig) -> None:
    """The Fabric settings, checked without starting anything: known names, a device of the
    kind asked for and enough of them, a multi-node environment for ``num_nodes > 1``, a usable
    ``MASTER_PORT``; then ``Fabric`` itself is built (not launched) and whatever it refuses is
    reported as a :class:`ConfigError` too.

    Raises:
        ConfigError: naming the key (``accelerator``, ``devices``, ``num_nodes``,
            ``strategy``, ``dtype`` or ``MASTER_PORT``).
    """
    for key in ("devices", "num_nodes"):
        if cfg[key] < 1:
            raise ConfigError.bad_value(key, cfg[key], "an int >= 1", "1")
    check_launch_env(cfg)  # NODE_RANK, MASTER_ADDR, ... against devices and num_nodes
    acc = cfg.accelerator
    if acc not in ACCELERATORS:
        raise ConfigError.bad_value("accelerator", acc, f"one of {ACCELERATORS}", "cpu")
    if cfg.strategy not in STRATEGIES:
        raise ConfigError.bad_value(
            "strategy", cfg.strategy, f"one of {STRATEGIES}{STRATEGY_NOTE}", "auto"
        )
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    kind = "cuda" if cuda and acc in ("cuda", "gpu", "auto") else "cpu"
    kind = "mps" if mps and kind == "cpu" and acc in ("mps", "gpu", "auto") else kind
    if acc != "auto" and kind == "cpu" and acc != "cpu":
        probes = {"cuda": "torch.cuda.is_available()", "mps": "torch.backends.mps.is_available()"}
        why = " and ".join(v for k, v in probes.items() if acc in (k, "gpu"))
        raise ConfigError(
            f"accelerator: got {acc!r}, but torch sees no {'GPU' if acc == 'gpu' else acc.upper()}"
            f" device here ({why}: False); set accelerator=cpu (or auto), or run where such a "
            "device is visible",
            key="accelerator",
        )
    count = {"cuda": torch.cuda.device_count(), "mps": 1}.get(kind)
    if count is not None and cfg.devices > count:
        raise ConfigError.bad_value(
            "devices", cfg.devices, f"at most the {count} {kind.upper()} device(s) visible here "
            "(CUDA_VISIBLE_DEVICES)", str(count),
        )  # fmt: skip
    if kind == "mps" and cfg.dtype == "float64":
        raise ConfigError.bad_value("dtype", cfg.dtype, "float32 on MPS (no float64)", "float32")
    if cfg.num_nodes > 1 and not _multi_node_environment():
        raise ConfigError.bad_value(
            "num_nodes", cfg.num_nodes, "1 outside a multi-node environment (SLURM, torchrun, "
            "LSF, MPI, or NODE_RANK and MASTER_ADDR set on every node)", "1",
        )  # fmt: skip
    _check_port_free(cfg)
    settings = fabric_settings(cfg)
    try:
        Fabric(**settings)  # builds the connector and strategy; launches nothing
    except Exception as err:
        shown = ", ".join(f"{k}={v}" for k, v in settings.items())
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ConfigError(
            f"accelerator: Lightning Fabric refuses {shown} ({first}); "
            "change these keys, e.g. accelerator=cpu devices=1 strategy=auto",
            key="accelerator",
        ) from None


def _multi_node_environment() -> bool:
    # the environments Fabric detects by itself (Kubeflow's must be passed in: not here)
    kinds = (envs.SLURMEnvironment, envs.TorchElasticEnvironment, envs.LSFEnvironment,
             envs.MPIEnvironment)  # fmt: skip
    return any(k.detect() for k in kinds) or {"NODE_RANK", "MASTER_ADDR"} <= set(os.environ)


def launch_rank(cfg: DictConfig) -> int | None:
    """This process's global rank when a launcher outside lit_fedco started it as one process
    of several (``torchrun``, ``srun``, or ``NODE_RANK`` per node), else None: then this process
    is the run's only one, or Fabric starts the others itself (what each does with it:
    :mod:`lit_fedco.experiment.role`)."""
    if cfg.devices * cfg.num_nodes == 1:
        return None
    for kind in (envs.TorchElasticEnvironment, envs.SLURMEnvironment):
        if kind.detect():
            return int(kind().global_rank())
    if cfg.num_nodes > 1 and os.environ.get("NODE_RANK", "").isdigit():
        return int(os.environ["NODE_RANK"]) * cfg.devices  # Fabric starts this node's others
    return None


def _check_port_free(cfg: DictConfig) -> None:
    """``MASTER_PORT``, when set for several processes on one node, is free here (that it is a
    port number, :func:`~lit_fedco.process.launch_env.check_launch_env` checked)."""
    value = os.environ.get("MASTER_PORT")
    if value is None or cfg.devices == 1 or cfg.num_nodes > 1:
        return
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's TCPStore
        try:
            sock.bind(("", int(value)))
        except OSError as err:
            raise ConfigError(
                f"MASTER_PORT: got {value!r}, but the port cannot be used here "
                f"({err.strerror or err}; another run?); unset MASTER_PORT to let Fabric "
                "pick a free one, or choose another",
                key="MASTER_PORT",
            ) from None
