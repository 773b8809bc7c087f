"""One (updater, seed) of a run, made to survive: periodic checkpoints, exact resume, clean
stops on SIGTERM / SIGINT, and refusals of checkpoints that belong elsewhere.

A sub-run writes into ``<run_dir>/<sub>/`` (:mod:`lit_fedco.experiment.rundir`). After every
``checkpoint_every`` rounds, after the last round, and when the process is asked to stop, rank
0 writes a checkpoint (:mod:`lit_fedco.experiment.checkpoint`) of everything needed to continue: the
loop state, and what the state belongs to. Minibatches, cohorts and conditional samples are
functions
of (seed, client, round), so a run resumed from round r ends bit-identical to one never
stopped. A diverged run (non-finite loss or state) writes no checkpoint: the last good one
stays.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from tqdm.auto import tqdm

from lit_fedco.core.state import tree_leaves
from lit_fedco.core.version import VERSION
from lit_fedco.data import FederatedData, format_partition_stats
from lit_fedco.engine.comm import Comm
from lit_fedco.engine.executors import make_executor
from lit_fedco.engine.loop import FederatedLoop
from lit_fedco.experiment import checkpoint as ckpt
from lit_fedco.experiment import pretrain
from lit_fedco.experiment.assemble import (
    DTYPES,
    RESUMABLE_CHANGES,
    Assembly,
    loop_config,
    partition_summary,
    relevant_config,
    run_executor,
)
from lit_fedco.experiment.rundir import History, read_json, sweep, write_json
from lit_fedco.report.tracking import finalize_loggers, make_loggers


class Diverged(FloatingPointError):
    """The training loss became NaN or infinite (the same round on every process)."""

    def __init__(self, round_idx: int, message: str) -> None:
        super().__init__(message)
        self.round = round_idx


class Stopped(Exception):
    """The run was asked to stop (SIGTERM, SIGINT) and saved a checkpoint first."""

    def __init__(self, signum: int, round_idx: int, saved: Path | None) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} after round {round_idx}")
        self.signum, self.round, self.saved = signum, round_idx, saved


# ---------------------------------------------------------------------- stop requests
_REQUESTED: list[int] = []


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGINT ask the run to stop after the current round (the
    sub-run saves a checkpoint and raises :class:`Stopped`) instead of killing it mid-write."""
    if not hasattr(signal, "SIGTERM"):
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def request(signum: int, frame: Any) -> None:
        _REQUESTED.append(signum)

    try:
        for s in previous:
            signal.signal(s, request)
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _REQUESTED.clear()


SIGNALS = 65
"""Signal numbers a stop request can carry (0: none; Linux's are 1–64)."""


def stop_request() -> Tensor:
    """This process's stop request as a one-hot vector over signal numbers (all zero: none):
    summed over processes, the highest signal any of them received is the last non-zero."""
    flags = torch.zeros(SIGNALS)
    if _REQUESTED:
        flags[min(_REQUESTED[0], SIGNALS - 1)] = 1.0
    return flags


def stop_requested(fabric: Fabric, comm: Comm) -> int:
    """The signal asking every process to stop, or 0, the same on every process so that all
    of them stop after the same round: the requests that travelled in the round's aggregation
    (:meth:`~lit_fedco.engine.round.Comm.carry`, given :func:`stop_request` before the round), with
    no collective of their own; one collective only if no collective took them."""
    mine = _REQUESTED[0] if _REQUESTED else 0
    if fabric.world_size == 1:
        return mine
    if comm.carried is not None:
        hits = torch.nonzero(comm.carried.cpu() > 0.5).flatten()
        return int(hits[-1]) if len(hits) else 0
    got = fabric.all_reduce(torch.tensor([float(mine)]), reduce_op="max")
    return int(got.item())  # type: ignore[union-attr]


# ---------------------------------------------------------------------- checkpoints
def content(loop: FederatedLoop, identity: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's content: the loop's state and what it belongs to."""
    return {
        **identity,
        "lit_fedco": VERSION,
        "rounds_scheduled": loop.cfg.rounds,
        "loop": loop.state_dict(),
    }


def finite(loop: FederatedLoop) -> bool:
    """Whether every entry of the server state and of the clients' kept state is finite."""
    leaves = tree_leaves({"s": loop.server, "c": loop.store.rows})
    return all(bool(torch.isfinite(t).all()) for t in leaves if t.is_floating_point())


def verify(found: dict[str, Any], identity: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint of another recipe, updater, seed, data partition, model or setting,
    with one line saying which and how to fix it.

    Raises:
        ckpt.CheckpointError: the first mismatch.
    """
    labels = {
        "recipe": "recipe",
        "updater": "updater",
        "data": "data partition (fingerprint)",
        "model": "model (parameter shapes)",
    }
    for key, label in labels.items():
        if found.get(key) != identity[key]:
            raise ckpt.CheckpointError(
                f"resume: {path} is a checkpoint of another {label}: {found.get(key)!r}, this "
                f"run has {identity[key]!r}; resume it with the settings it was made with",
                key="resume",
            )
    old, new = _flat(found.get("config", {})), _flat(identity["config"])
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            raise ckpt.CheckpointError(
                f"resume: {path} was made with {key}={old.get(key)!r}, this run has "
                f"{key}={new.get(key)!r}; resume with the settings it was made with (only "
                f"{', '.join(RESUMABLE_CHANGES[:3])} and how the run executes may change)",
                key="resume",
            )


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def identity_of(
    recipe: str, cfg: DictConfig, name: str, seed: int, data: FederatedData, params: dict
) -> dict[str, Any]:
    """What a checkpoint of updater ``name`` with ``seed`` on ``data`` must match."""
    x = [data.x_train, data.y_train, data.train_offsets, data.x_val, data.y_val, data.val_offsets]
    return {
        "recipe": recipe,
        "updater": name,
        "data": ckpt.fingerprint(x),
        "model": ckpt.model_signature(params),
        "config": relevant_config(cfg, name, seed),
    }


# ---------------------------------------------------------------------- one sub-run
def run_sub(
    fabric: Fabric,
    cfg: DictConfig,
    name: str,
    seed: int,
    recipe: str,
    folder: Path,
    resume_from: Path | None = None,
    announce: bool = False,
    init: dict[str, Any] | None = None,
    built: Assembly | None = None,
) -> tuple[dict[str, float], FederatedLoop]:
    """Run updater ``name`` with ``seed`` into ``folder``, from ``resume_from`` if given; its
    data and updater come from ``built`` (built there once per run).

    ``init`` is the run's shared starting point (:mod:`lit_fedco.experiment.pretrain`): ``{"params":
    the model parameters, "from": where they come from}``; None: the seeded initialisation.
    It is recorded in ``status.json`` and the logged config (``init``).

    Returns:
        Its final metrics (``diverged_round`` when it diverged) and the loop.

    Raises:
        Stopped: a stop was requested; the checkpoint is saved.
        ckpt.CheckpointError: ``resume_from`` does not belong to this run.
    """
    rank0 = fabric.global_rank == 0
    built = built or Assembly()
    data = built.data(cfg, seed)
    stats = data.partition_stats()
    if rank0:
        folder.mkdir(parents=True, exist_ok=True)
        sweep(folder)  # what a killed run's atomic writes left half-done
        write_json(folder / "partition.json", stats)
        if announce:
            print(format_partition_stats(stats), flush=True)
    init_params = None if init is None else init["params"]
    updater, problem = built.updater(cfg, name, seed, init_params)
    init_record = (
        pretrain.describe(init["from"], init["params"]) if init is not None
        else {"from": "seed", "fingerprint": pretrain.fingerprint(updater.params())}
    )  # fmt: skip
    identity = identity_of(recipe, cfg, name, seed, data, updater.params())
    executor = make_executor(run_executor(cfg), cfg.chunk_size)
    loop = FederatedLoop(
        fabric, updater, data, loop_config(cfg, seed), executor, DTYPES[cfg.dtype], problem
    )
    if resume_from is not None:
        found = ckpt.load(resume_from)
        verify(found, identity, resume_from)
        loop.load_state_dict(found["loop"])
    status_path = folder / "status.json"
    status = read_json(status_path) or {}
    history = History(folder) if rank0 else None
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    # the resolved config as it ran; what the updater says of itself and the partition beside
    logged = {
        **resolved,
        "seed": seed,
        "describe": updater.describe(),
        "partition": partition_summary(stats),
        "init": init_record,
    }
    run_label = f"{recipe}-{name}-seed{seed}"
    wandb_dir = folder.parent  # W&B writes <run folder>/wandb/
    wandb_id = status.get("wandb_id")
    loggers = (
        make_loggers(cfg.tracking, wandb_dir, run_label, cfg.project, logged, wandb_id=wandb_id)
        if rank0
        else []
    )
    if rank0:
        status.update(state="running", updater=name, seed=seed, rounds=cfg.rounds)
        status.setdefault("init", init_record)  # a resumed sub-run keeps where it started
        status["wandb_id"] = next((getattr(lg, "version", None) for lg in loggers), None)
        write_json(status_path, status)
    folder_ck = folder / "checkpoints"

    def save() -> Path | None:
        if not rank0 or not finite(loop):  # a diverged state never replaces a good one
            return None
        path = folder_ck / ckpt.name_of(loop.round)
        try:
            folder_ck.mkdir(exist_ok=True)
            ckpt.save(path, content(loop, identity))
            ckpt.prune(folder_ck, cfg.checkpoint_keep)
            if history is not None:
                history.write_csv()
        except OSError as err:  # a full disk: the previous checkpoint stays whole; train on
            print(f"lit_fedco: cannot write {path} ({err.strerror or err}); the previous "
                  "checkpoint is kept and the run goes on", file=sys.stderr)  # fmt: skip
            return None
        return path

    bar = tqdm(total=cfg.rounds, initial=loop.round, desc=name, dynamic_ncols=True,
               disable=not cfg.progress or not rank0)  # fmt: skip

    def on_round(logs: dict[str, float]) -> None:
        """Progress, the record, the divergence check, checkpoints and stop requests."""
        if "val/acc_avg" in logs:
            bar.set_postfix(avg=f"{logs['val/acc_avg']:.3f}", worst=f"{logs['val/acc_worst']:.3f}")
        bad = [k for k in ("train/loss", "val/loss_avg") if not math.isfinite(logs.get(k, 0.0))]
        if bad:
            raise Diverged(
                loop.round,
                f"{name}: {bad[0]} became {logs[bad[0]]} in round {loop.round}; lower the step "
                f"size ({name}.lr)",
            )
        if history is not None and loop.round > history.last_round:
            history.append(loop.round, logs)
            for logger in loggers:
                logger.log_metrics(logs, step=loop.round)
        bar.update(1)
        every = cfg.checkpoint_every
        if loop.round == cfg.rounds or (every and loop.round % every == 0):
            save()
        if signum := stop_requested(fabric, loop.comm):
            raise Stopped(signum, loop.round, save())
        loop.comm.carry(stop_request())  # rides the next round's aggregation

    start = time.perf_counter()
    outcome = "failed"
    loop.comm.carry(stop_request())  # stop requests ride each round's aggregation
    try:
        final = loop.run(on_round)
        outcome = "complete"
    except Diverged as err:  # a result, not a crash: reported in the table, the rest go on
        if rank0:
            print(f"lit_fedco: {err}", file=sys.stderr)
        final, outcome = {"diverged_round": float(err.round)}, "diverged"
    except Stopped:
        outcome = "stopped"
        raise
    finally:
        bar.close()
        finalize_loggers(loggers, "success" if outcome in ("complete", "diverged") else "failed")
        if history is not None:
            history.close()
        if rank0:
            status.update(state=outcome, round=loop.round)
            write_json(status_path, status)
    final = {**final, "time_s": time.perf_counter() - start}
    if rank0:
        status.update(final=final)
        per_client = loop.evaluate_clients.last_per_client
        if per_client is not None:  # every client's final validation accuracy (figures)
            status["per_client"] = [float(v) for v in per_client.tolist()]
        write_json(status_path, status)
    return final, loop
