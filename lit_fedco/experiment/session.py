"""One (updater, seed) of a run, made to survive: periodic checkpoints, exact resume, clean
stops on SIGTERM / SIGINT, and refusals of checkpoints that belong elsewhere.

A sub-run writes into ``<run_dir>/<sub>/`` (:mod:`lit_fedco.experiment.rundir`). After every
``checkpoint_every`` rounds, after the last round, and when the process is asked to stop, rank
0 writes a checkpoint (:mod:`lit_fedco.store.checkpoint`) of everything needed to
continue: the loop state, and what the state belongs to. Minibatches, cohorts and conditional
samples are functions of (seed, client, round), so a run resumed from round r ends
bit-identical to one never stopped. A diverged run (non-finite loss or state) writes no
checkpoint: the last good one stays. A write that fails (a full disk) stops the run after the
round every process is in, with one line naming the file, the error and the last good
checkpoint, and ``status.json`` says so (:class:`WriteFailed`).
"""

from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from tqdm.auto import tqdm

from lit_fedco.config.parser import flat_keys
from lit_fedco.core.state import tree_leaves
from lit_fedco.core.version import VERSION
from lit_fedco.data import FederatedData, format_partition_stats
from lit_fedco.engine.comm import Comm
from lit_fedco.engine.executors import make_executor
from lit_fedco.engine.loop import FederatedLoop
from lit_fedco.engine.schedule import DTYPES
from lit_fedco.experiment import pretrain
from lit_fedco.experiment.assemble import (
    RESUMABLE_CHANGES,
    Assembly,
    loop_config,
    partition_summary,
    relevant_config,
    run_executor,
)
from lit_fedco.process.stops import SIGNALS, WRITE_FAILED, first_request, request_stop
from lit_fedco.report.tracking import finalize_loggers, make_loggers
from lit_fedco.store import checkpoint as ckpt
from lit_fedco.store.files import read_json, sweep, write_json
from lit_fedco.store.history import History


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


class WriteFailed(Exception):
    """A file of the run could not be written (a full disk, a removed folder): the run stopped.

    Attributes:
        round: the round after which it stopped.
        last_good: the newest checkpoint that was written, if any (the run resumes from it).
    """

    def __init__(self, message: str, round_idx: int, last_good: Path | None) -> None:
        where = f"; the last good checkpoint is {last_good}" if last_good else "; no checkpoint"
        super().__init__(f"{message} (after round {round_idx}){where}")
        self.round, self.last_good = round_idx, last_good


# ---------------------------------------------------------------------- stop requests
def stop_request() -> Tensor:
    """This process's stop request as a one-hot vector over signal numbers (all zero: none):
    summed over processes, the highest signal any of them received is the last non-zero."""
    flags = torch.zeros(SIGNALS)
    if first := first_request():
        flags[min(first, SIGNALS - 1)] = 1.0
    return flags


def agree(fabric: Fabric, code: int) -> int:
    """The largest ``code`` over the processes (one collective; this process's with one)."""
    if fabric.world_size == 1:
        return code
    return int(fabric.all_reduce(torch.tensor([float(code)]), reduce_op="max").item())  # type: ignore[union-attr]


def stop_requested(fabric: Fabric, comm: Comm) -> int:
    """The signal asking every process to stop, or 0, the same on every process so that all
    of them stop after the same round: the requests that travelled in the round's aggregation
    (:meth:`~lit_fedco.engine.round.Comm.carry`, given :func:`stop_request` before the round), with
    no collective of their own; one collective only if no collective took them."""
    if fabric.world_size == 1 or comm.carried is None:
        return agree(fabric, first_request())
    hits = torch.nonzero(comm.carried.cpu() > 0.5).flatten()
    return int(hits[-1]) if len(hits) else 0


# ---------------------------------------------------------------------- checkpoints
def finite(state: dict[str, Any]) -> bool:
    """Whether every entry of a loop state's (:meth:`FederatedLoop.state_dict`) server state and
    clients' kept state is finite."""
    leaves = tree_leaves({"s": state["server"], "c": state["clients"]})
    return all(bool(torch.isfinite(t).all()) for t in leaves if t.is_floating_point())


def verify(found: dict[str, Any], identity: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint of another recipe, updater, seed, data partition, model or setting,
    with one line saying which and how to fix it.

    Raises:
        ckpt.CheckpointError: the first mismatch.
    """
    names = {str(s).rsplit(":", 1)[0] for s in identity.get("model", [])}
    ckpt.check_params(found["loop"], names, path)
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
    old, new = flat_keys(found.get("config", {})), flat_keys(identity["config"])
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            shown = config_key(key, identity["config"])
            raise ckpt.CheckpointError(
                f"resume: {path} was made with {shown}={old.get(key)!r}, this run has "
                f"{shown}={new.get(key)!r}; resume with the settings it was made with (only "
                f"{', '.join(RESUMABLE_CHANGES[:3])} and how the run executes may change)",
                key="resume",
            )


def config_key(key: str, relevant: dict[str, Any]) -> str:
    """The config key of a key of :func:`~lit_fedco.experiment.assemble.relevant_config`:
    its ``hparams.lr`` is ``<updater>.lr``, its ``problem.gamma`` is ``<problem>.gamma``."""
    head, _, rest = key.partition(".")
    if head == "hparams" and rest:
        return f"{relevant.get('updater', head)}.{rest}"
    if head == "problem" and rest:
        return "objective" if rest == "name" else f"{relevant['problem']['name']}.{rest}"
    return key


def identity_of(
    recipe: str, cfg: DictConfig, name: str, seed: int, data: FederatedData, params: dict
) -> dict[str, Any]:
    """What a checkpoint of updater ``name`` with ``seed`` on ``data`` must match."""
    return {
        "recipe": recipe,
        "updater": name,
        "data": ckpt.data_fingerprint(data),
        "model": ckpt.model_signature(params),
        "config": relevant_config(cfg, name, seed),
    }


# ---------------------------------------------------------------------- one sub-run
class SubRun:
    """One (updater, seed) in its folder: its loop, record, loggers, status and checkpoints.

    Rank 0 writes; every process runs the loop. :meth:`run` trains to the end, or raises
    :class:`Stopped` / :class:`WriteFailed` after the round every process is in.
    """

    def __init__(
        self,
        fabric: Fabric,
        cfg: DictConfig,
        name: str,
        seed: int,
        recipe: str,
        folder: Path,
        init: dict[str, Any] | None,
        built: Assembly,
    ) -> None:
        self.fabric, self.cfg, self.name, self.folder = fabric, cfg, name, folder
        self.rank0 = fabric.global_rank == 0
        data = built.data(cfg, seed)
        self.stats = data.partition_stats()
        init_params = None if init is None else init["params"]
        updater, problem = built.updater(cfg, name, seed, init_params)
        self.init_record = (
            pretrain.describe(init["from"], init["params"]) if init is not None
            else {"from": "seed", "fingerprint": pretrain.fingerprint(updater.params())}
        )  # fmt: skip
        self.identity = identity_of(recipe, cfg, name, seed, data, updater.params())
        executor = make_executor(run_executor(cfg), cfg.chunk_size, cfg.fast_steps)
        self.loop = FederatedLoop(fabric, updater, data, loop_config(cfg, seed), executor,
                                  DTYPES[cfg.dtype], problem)  # fmt: skip
        self.status: dict[str, Any] = {}
        self.history: History | None = None
        self.loggers: list[Any] = []
        self.last_good: Path | None = None
        self.failed: str = ""  # the first write that failed
        self.label = f"{recipe}-{name}-seed{seed}"

    # ------------------------------------------------------------------ files
    def write(self, what: str, action: Any) -> bool:
        """Run ``action`` (a write of rank 0); on an OS error remember the first failure and ask
        every process to stop after this round. Whether it succeeded."""
        try:
            action()
            return True
        except OSError as err:
            if not self.failed:
                self.failed = f"cannot write {what} ({err.strerror or err})"
                request_stop(WRITE_FAILED)
            return False

    def write_status(self, **update: Any) -> None:
        """Update ``status.json`` (best effort once a write failed: the disk may be full)."""
        self.status.update(update)
        self.write(str(self.folder / "status.json"),
                   lambda: write_json(self.folder / "status.json", self.status))  # fmt: skip

    def open(self, resume_from: Path | None, announce: bool, note: dict[str, Any]) -> None:
        """Resume from ``resume_from`` (verified), and on rank 0 the folder, the partition, the
        record, the loggers and ``status.json`` (``note`` goes into it: e.g. a branch)."""
        cfg, loop = self.cfg, self.loop
        if resume_from is not None:
            found = ckpt.load(resume_from)
            verify(found, self.identity, resume_from)
            loop.load_state_dict(found["loop"])
            self.last_good = resume_from
        if not self.rank0:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        sweep(self.folder)  # what a killed run's atomic writes left half-done
        self.write(str(self.folder / "partition.json"),
                   lambda: write_json(self.folder / "partition.json", self.stats))  # fmt: skip
        if announce:
            print(format_partition_stats(self.stats), flush=True)
        self.status = read_json(self.folder / "status.json") or {}
        self.history = History(self.folder, loop.round)
        for line in self.history.notes:
            print(f"lit_fedco: {line}", file=sys.stderr)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(resolved, dict)
        # the resolved config as it ran; what the updater says of itself and the partition
        logged = {**resolved, "seed": self.loop.cfg.seed, "describe": loop.updater.describe(),
                  "partition": partition_summary(self.stats), "init": self.init_record}  # fmt: skip
        # W&B gets the rounds of the record it lacks first (a resumed run), then on_round's
        self.loggers = make_loggers(cfg.tracking, self.folder.parent, self.label, cfg.project,
                                    logged, wandb_id=self.status.get("wandb_id"),
                                    history=self.history.rows)  # fmt: skip
        self.status.setdefault("init", self.init_record)  # a resumed sub-run keeps its start
        self.status.update(note)
        wandb_id = next((getattr(lg, "version", None) for lg in self.loggers), None)
        folder = next(filter(None, (getattr(lg, "folder", None) for lg in self.loggers)), None)
        self.status["wandb_dir"] = str(folder) if folder else None  # the newest W&B folder
        trained = loop.updater.objective  # what it trains, beside its name
        self.write_status(state="running", updater=self.name, seed=self.loop.cfg.seed,
                          trains=trained.composition, objective=type(trained).__name__,
                          rounds=cfg.rounds, wandb_id=wandb_id, processes=self.fabric.world_size,
                          threads=torch.get_num_threads())  # fmt: skip

    def save(self) -> Path | None:
        """A checkpoint of the loop now (every process calls it; rank 0 writes; never of a
        diverged state)."""
        loop, folder_ck = self.loop, self.folder / "checkpoints"
        # the loop's state and what it belongs to (every process: the kept state is gathered)
        state = {
            **self.identity,
            "lit_fedco": VERSION,
            "rounds_scheduled": loop.cfg.rounds,
            "loop": loop.state_dict(),
        }
        if not self.rank0 or not finite(state["loop"]) or self.failed:
            return None
        path = folder_ck / ckpt.name_of(loop.round)

        def write() -> None:
            folder_ck.mkdir(exist_ok=True)
            ckpt.save(path, state)
            ckpt.prune(folder_ck, self.cfg.checkpoint_keep)

        if not self.write(str(path), write):
            return None  # the previous checkpoint stays whole; the run stops after this round
        self.last_good = path
        return path

    # ------------------------------------------------------------------ the rounds
    def on_round(self, logs: dict[str, float], bar: Any) -> None:
        """Progress, the record, the divergence check, checkpoints and stop requests."""
        loop, cfg = self.loop, self.cfg
        if "val/acc_avg" in logs:
            bar.set_postfix(avg=f"{logs['val/acc_avg']:.3f}", worst=f"{logs['val/acc_worst']:.3f}")
        bad = [k for k in ("train/loss", "val/loss_avg") if not math.isfinite(logs.get(k, 0.0))]
        if bad:
            raise Diverged(loop.round, f"{self.name}: {bad[0]} became {logs[bad[0]]} in round "
                           f"{loop.round}; lower the step size ({self.name}.lr)")  # fmt: skip
        if self.history is not None and not self.failed and loop.round > self.history.last_round:
            history = self.history
            if self.write(str(history.jsonl), lambda: history.append(loop.round, logs)):
                for logger in self.loggers:
                    logger.log_metrics(logs, step=loop.round)
        bar.update(1)
        every = cfg.checkpoint_every
        if loop.round == cfg.rounds or (every and loop.round % every == 0):
            self.save()
        if signum := stop_requested(self.fabric, loop.comm):
            if signum == WRITE_FAILED:
                raise WriteFailed(self.failed or "a write failed on another process", loop.round,
                                  self.last_good)  # fmt: skip
            raise Stopped(signum, loop.round, self.save())
        loop.comm.carry(stop_request())  # rides the next round's aggregation

    def run(self) -> dict[str, float]:
        """The remaining rounds; the final metrics (``diverged_round`` when it diverged)."""
        loop, cfg = self.loop, self.cfg
        bar = tqdm(total=cfg.rounds, initial=loop.round, desc=self.name, dynamic_ncols=True,
                   disable=not cfg.progress or not self.rank0)  # fmt: skip
        start, outcome = time.perf_counter(), "failed"
        loop.comm.carry(stop_request())  # stop requests ride each round's aggregation
        try:
            final = loop.run(lambda logs: self.on_round(logs, bar)) or self.recorded_final()
            written = self.last_good is not None and self.last_good.name == ckpt.name_of(loop.round)
            missing = self.rank0 and not written
            if agree(self.fabric, WRITE_FAILED if missing else 0):  # every process stops
                why = self.failed or "the final checkpoint was not written"
                raise WriteFailed(why if self.rank0 else "a write failed on another process",
                                  loop.round, self.last_good)  # fmt: skip
            outcome = "complete"
        except Diverged as err:  # a result, not a crash: reported in the table, the rest go on
            if self.rank0:
                print(f"lit_fedco: {err}", file=sys.stderr)
            final, outcome = {"diverged_round": float(err.round)}, "diverged"
        except Stopped:
            outcome = "stopped"
            raise
        except WriteFailed as err:
            self.status["error"] = str(err)
            raise
        finally:
            self.close(outcome, bar)
        final = {**final, "time_s": time.perf_counter() - start}
        if self.rank0:
            per_client = loop.evaluate_clients.last_per_client
            if per_client is not None:  # every client's final validation accuracy (figures)
                self.status["per_client"] = [float(v) for v in per_client.tolist()]
            self.write_status(final=final)
        return final

    def recorded_final(self) -> dict[str, float]:
        """The final metrics of a sub-run resumed at its last round (nothing left to run): its
        record's last row, which is what the rounds left it with; else an evaluation now."""
        rows = self.history.rows if self.history is not None else []
        last = rows[-1] if rows else {}
        if int(last.get("round", -1)) == self.loop.round and "val/acc_avg" in last:
            return {k: v for k, v in last.items() if k != "round"}
        return self.loop.evaluate()

    def close(self, outcome: str, bar: Any) -> None:
        """The progress bar, the loggers, the record's CSV and the status, whatever happened."""
        bar.close()
        finalize_loggers(
            self.loggers, "success" if outcome in ("complete", "diverged") else "failed"
        )
        if self.history is not None:
            self.write(str(self.history.csv), self.history.close)
        if self.rank0:
            last = str(self.last_good) if self.last_good else None
            self.write_status(state=outcome, round=self.loop.round, last_checkpoint=last)


def run_sub(
    fabric: Fabric,
    cfg: DictConfig,
    name: str,
    seed: int,
    recipe: str,
    folder: Path,
    resume_from: Path | None,
    announce: bool,
    init: dict[str, Any] | None,
    built: Assembly,
    note: dict[str, Any] | None = None,
) -> tuple[dict[str, float], FederatedLoop]:
    """Run updater ``name`` with ``seed`` into ``folder``, from ``resume_from`` if given; its
    data and updater come from ``built`` (built there once per run).

    ``init`` is the run's shared starting point (:mod:`lit_fedco.experiment.pretrain`):
    ``{"params": the model parameters, "from": where they come from}``; None: the seeded
    initialisation. It is recorded in ``status.json`` and the logged config (``init``), as is
    ``note`` (e.g. where a branched run started).

    Returns:
        Its final metrics (``diverged_round`` when it diverged) and the loop.

    Raises:
        Stopped: a stop was requested; the checkpoint is saved.
        WriteFailed: a file could not be written; the run stopped after the round.
        ckpt.CheckpointError: ``resume_from`` does not belong to this run.
    """
    sub = SubRun(fabric, cfg, name, seed, recipe, folder, init, built)
    sub.open(resume_from, announce, note or {})
    return sub.run(), sub.loop
