"""The launcher's environment of a run of several processes, checked before anything is
written, and a process that lost its peer told in one line.

:func:`check_launch_env` refuses, in one line naming the variable, what the processes of a run
would otherwise hang on or misread: ``NODE_RANK`` outside ``[0, num_nodes)`` (``NODE_RANK=1``
on one node made a rank 2 of 2 wait for ever), a ``MASTER_ADDR`` that does not resolve, a
``MASTER_PORT`` that is not a port, ``WORLD_SIZE``, ``RANK`` or ``LOCAL_RANK`` that do not fit
``devices`` and ``num_nodes``.

:func:`install_lost_peer_hook` makes a process whose peer died (``kill -9`` of one rank: gloo's
``Connection closed by peer``) or whose peers never came (a rendezvous that timed out) end with
one line saying so and how to go on (``resume=auto``), exit code 1, instead of a traceback.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import types
from datetime import timedelta
from typing import Any

from lit_fedco.core.errors import ConfigError

RESOLVE_TIMEOUT_ENV = "LIT_FEDCO_RESOLVE_TIMEOUT"
"""Seconds :func:`check_launch_env` waits for ``MASTER_ADDR`` to resolve (default 10)."""
RENDEZVOUS_TIMEOUT_ENV = "LIT_FEDCO_RENDEZVOUS_TIMEOUT"
"""Seconds the processes of a run wait for each other to start (:func:`rendezvous_timeout`)."""
LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
        "Connection refused", "clients joined", "Socket Timeout")  # fmt: skip
"""What torch.distributed's errors say when a peer died or never came."""


def _fix(name: str, value: str, expected: str, how: str) -> ConfigError:
    return ConfigError(f"{name}: got {value!r}, expected {expected}; {how}", key=name)


def _int_in(name: str, low: int, high: int, what: str, how: str) -> None:
    """Environment variable ``name``, when set: an int in ``[low, high)``."""
    value = os.environ.get(name)
    if value is None:
        return
    if not value.strip().isdigit() or not low <= int(value) < high:
        raise _fix(name, value, f"an int in [{low}, {high}) ({what})", how)


def check_launch_env(cfg: Any) -> None:
    """``LIT_FEDCO_RENDEZVOUS_TIMEOUT`` is seconds > 0, and the launcher's variables fit the
    run's ``devices`` and ``num_nodes`` (not checked for a run of one process, which meets no
    other).

    Raises:
        ConfigError: naming the variable, its value, what is expected and how to fix it.
    """
    wait = os.environ.get(RENDEZVOUS_TIMEOUT_ENV)
    if wait is not None and not _positive(wait):  # read for any run with strategy=ddp
        expected = "seconds > 0 (how long the processes wait for each other)"
        raise _fix(RENDEZVOUS_TIMEOUT_ENV, wait, expected,
                   f"set e.g. {RENDEZVOUS_TIMEOUT_ENV}=600, or unset it")  # fmt: skip
    devices, nodes = int(cfg.devices), int(cfg.num_nodes)
    world = devices * nodes
    if world <= 1:
        return
    one = "unset NODE_RANK on a single node (or set num_nodes)"
    many = "set NODE_RANK to this node's index (0 on the first), or num_nodes to the nodes started"
    _int_in("NODE_RANK", 0, nodes, f"num_nodes={nodes}", many if nodes > 1 else one)
    fabric_sets = "unset LOCAL_RANK (Fabric sets it for the processes it starts), or set devices"
    _int_in("LOCAL_RANK", 0, devices, f"devices={devices} per node", fabric_sets)
    _int_in("RANK", 0, world, f"devices × num_nodes = {world} processes",
            "unset RANK, or set devices and num_nodes to the launcher's")  # fmt: skip
    size = os.environ.get("WORLD_SIZE")
    if size is not None and size.strip() != str(world):
        raise _fix("WORLD_SIZE", size, f"{world} (devices={devices} × num_nodes={nodes})",
                   "unset WORLD_SIZE, or set devices and num_nodes to the launcher's")  # fmt: skip
    port = os.environ.get("MASTER_PORT")
    if port is not None and (not port.strip().isdigit() or not 1 <= int(port) <= 65535):
        raise ConfigError.bad_value("MASTER_PORT", port, "a TCP port in [1, 65535]", "29500")
    addr = os.environ.get("MASTER_ADDR")
    if addr is not None:
        _check_resolves(addr)


def _positive(text: str) -> bool:
    """``text`` is a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        return False
    return 0 < value < float("inf")


def _check_resolves(addr: str) -> None:
    """``MASTER_ADDR`` resolves within :data:`RESOLVE_TIMEOUT_ENV` seconds.

    Raises:
        ConfigError: it does not, or not in time.
    """
    limit = float(os.environ.get(RESOLVE_TIMEOUT_ENV, "10"))
    found: list[str] = []

    def resolve() -> None:
        try:
            socket.getaddrinfo(addr, None)
            found.append("")
        except (OSError, UnicodeError) as err:
            found.append(str(getattr(err, "strerror", None) or err))

    worker = threading.Thread(target=resolve, daemon=True)  # getaddrinfo takes no timeout
    worker.start()
    worker.join(limit)
    if found and not found[0]:
        return
    why = found[0] if found else f"no answer in {limit:g} s"
    raise _fix("MASTER_ADDR", addr, f"a host name or address that resolves here ({why})",
               "set it to the first node's address (e.g. MASTER_ADDR=127.0.0.1 on one machine), "
               "or unset it on a single node")  # fmt: skip


def rendezvous_timeout() -> timedelta | None:
    """How long the processes of a run wait for each other, to start and at each collective:
    ``LIT_FEDCO_RENDEZVOUS_TIMEOUT`` seconds when set (the ``ddp`` strategy's ``timeout``), else
    None (torch's default, 30 minutes)."""
    value = os.environ.get(RENDEZVOUS_TIMEOUT_ENV)
    return timedelta(seconds=float(value)) if value is not None and _positive(value) else None


def lost_peer_line(err: BaseException, run_dir: str | None = None) -> str | None:
    """The one line for ``err`` when it says that a peer of this process died or never came
    (else None); with the run folder ``run_dir``, how to continue the run."""
    text = str(err)
    ours = type(err).__module__.startswith("torch") or any(
        w in text for w in ("gloo", "c10d", "TCPStore", "NCCL"))  # fmt: skip
    if not ours or not any(mark in text for mark in LOST):
        return None
    first = text.split("] ", 1)[-1].splitlines()[0].split(". This is")[0]  # no C++ file path
    if "clients joined" in text:
        what = (f"the run's processes did not all start ({first}); start every process of the "
                f"run with the same MASTER_ADDR and MASTER_PORT, or raise "
                f"{RENDEZVOUS_TIMEOUT_ENV}")  # fmt: skip
    else:
        what = (f"another process of this run died or was killed ({first}); this one stopped "
                "too")  # fmt: skip
    again = ""
    if run_dir:
        parent, name = os.path.split(run_dir.rstrip("/"))
        how = (
            "then run it again" if "clients joined" in text else "continue from its last checkpoint"
        )
        again = (f"; {how} with: resume=auto run_name={name} "
                 f"out_dir={os.path.dirname(parent)}")  # fmt: skip
    return f"lit_fedco: {what}{again}"


def install_lost_peer_hook() -> None:
    """From now on, an uncaught error saying this process lost its peer is one line on stderr
    (:func:`lost_peer_line`) and exit code 1; any other error is told as before. Called once
    the processes have met (after torch's own hook, which prefixes each line with the rank), in
    a run whose folder is set (``LIT_FEDCO_RUN_DIR``) for the line's ``resume=auto``."""
    previous = sys.excepthook
    run_dir = os.environ.get("LIT_FEDCO_RUN_DIR")  # the run removes it before the error is told

    def hook(kind: type[BaseException], err: BaseException, tb: types.TracebackType | None) -> None:
        line = lost_peer_line(err, run_dir)
        if line is None:
            previous(kind, err, tb)
            return
        print(line, file=sys.stderr, flush=True)

    sys.excepthook = hook
