"""What a run will do, decided before any process starts: its folder, what each sub-run
resumes from, and what is complete already (:class:`Plan`).

Every resume problem is found here, as a :class:`~lit_fedco.core.errors.ConfigError`: a run name
in use, no run to resume, a checkpoint that does not verify or belongs to another run, a run
that would be shortened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lit_fedco.core.errors import ConfigError
from lit_fedco.experiment import pretrain
from lit_fedco.experiment.assemble import Assembly
from lit_fedco.experiment.rundir import check_writable, existing_run_dir, holds_run, taken
from lit_fedco.experiment.session import identity_of, verify
from lit_fedco.experiment.subruns import SubRunSpec, pretrain_runs, sub_runs
from lit_fedco.store import checkpoint as ckpt
from lit_fedco.store.files import check_entries, read_json


@dataclass
class Plan:
    """What a run will do, decided before any process starts.

    Attributes:
        run_dir: the run folder (None: to be created).
        resume: per sub-run folder name, the checkpoint it continues from.
        done: per sub-run folder name, the final metrics of a sub-run already complete.
        notes: lines to print (checkpoints skipped as corrupted, sub-runs complete).
        branch: a branch from an older checkpoint (``resume=PATH``), else empty.
    """

    run_dir: Path | None = None
    resume: dict[str, Path] = field(default_factory=dict)
    done: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    after_jobs: bool = False
    """A ``jobs=N`` run whose sub-runs its workers ran: its start is recorded already and
    what is left is the table."""
    branch: dict[str, Any] = field(default_factory=dict)
    """For ``resume=PATH`` of an earlier checkpoint, or of a complete run: the sub-run's
    folder name, the checkpoint, its round and the run it came from; it runs as a new run."""


@dataclass
class RunSpec:
    """What a run is, as each step of running it reads it: the recipe, the whole run's config,
    one (variant, config) per variant (or just ``("", cfg)``), the seeds, and what was built
    for it once (shared by the checks, the plan and the sub-runs)."""

    recipe: str
    cfg: DictConfig
    configs: list[tuple[str, DictConfig]]
    seeds: list[int]
    built: Assembly

    def chosen(self) -> list[SubRunSpec]:
        """The sub-runs this process runs: all of them, or ``sub_run=INDEX``'s."""
        sub = self.cfg.sub_run
        return [s for s in sub_runs(self.configs, self.seeds) if sub < 0 or s.number == sub]

    def folders(self) -> list[str]:
        """Every sub-run's folder of the whole run, the pre-trainings' last."""
        return [s.folder for s in sub_runs(self.configs, self.seeds)] + [
            f for *_, f in pretrain_runs(self.configs, self.seeds)
        ]


def plan_run(spec: RunSpec) -> Plan:
    """Where the run goes and what it resumes; every resume problem is found here.

    Raises:
        ConfigError: an unwritable output location, a run name in use, no run to resume, or a
            checkpoint that does not verify or belongs to another run.
    """
    recipe, cfg = spec.recipe, spec.cfg
    out_dir = Path(cfg.out_dir)
    check_writable(out_dir, recipe)
    plan = Plan()
    if not cfg.resume and cfg.sub_run < 0:
        if cfg.run_name:  # a link there would put the run elsewhere (a file: not a folder)
            check_entries(out_dir / recipe / cfg.run_name, [])
        if cfg.run_name and holds_run(out_dir / recipe / cfg.run_name):
            raise taken(cfg.run_name, out_dir / recipe / cfg.run_name)
        return plan
    if cfg.resume in ("auto", ""):  # a sub-run (sub_run=INDEX) always continues what it has
        plan.run_dir = existing_run_dir(out_dir, recipe, cfg.run_name)
        if not holds_run(plan.run_dir) and cfg.sub_run < 0:
            plan.notes.append(f"run {cfg.run_name} never got past its start (no config.yaml, no "
                              "sub-run): starting it now")  # fmt: skip
        return plan_existing(plan, spec)
    return _plan_path(plan, spec)


def plan_existing(plan: Plan, spec: RunSpec) -> Plan:
    """What each sub-run of ``plan.run_dir`` (or just ``sub_run``'s) continues from, or its
    final metrics when it is complete."""
    assert plan.run_dir is not None
    recipe, cfg, built = spec.recipe, spec.cfg, spec.built
    pretrains = list(pretrain_runs(spec.configs, spec.seeds))
    check_entries(plan.run_dir, [s.folder for s in spec.chosen()] + [f for *_, f in pretrains])
    for vcfg, seed, folder in pretrains if cfg.sub_run < 0 else []:
        plan_pretrain(plan, recipe, vcfg, seed, plan.run_dir / folder, built)
    for s in spec.chosen():
        _plan_sub(plan, recipe, s.cfg, s.updater, s.seed, plan.run_dir / s.folder, built)
    if cfg.sub_run < 0 and plan.done and not plan.resume and len(plan.done) == len(spec.folders()):
        plan.notes.append(f"run {plan.run_dir.name} is already complete: nothing to run")
    return plan


def plan_finished(run_dir: Path, spec: RunSpec) -> Plan:
    """The plan of a ``jobs=N`` run whose workers have just completed every sub-run: each one's
    final metrics, as its ``status.json`` records them (its checkpoints were verified by the
    worker that resumed it)."""
    plan = Plan(run_dir=run_dir, after_jobs=True)
    for folder in spec.folders():
        status = read_json(run_dir / folder / "status.json") or {}
        if status.get("state") not in ("complete", "diverged") or not status.get("final"):
            raise ConfigError(
                f"resume: {run_dir / folder} did not complete ({status.get('state', 'no status')})"
                f"; continue the run with resume=auto run_name={run_dir.name}",
                key="resume",
            )
        plan.done[folder] = status["final"]
    return plan


def _plan_path(plan: Plan, spec: RunSpec) -> Plan:
    """``resume=PATH``: the newest checkpoint of a sub-run that has not ended continues in its
    run; any other (an earlier one, or one of a complete run) starts a new run from it, and the
    run it came from is left as it is."""
    recipe, built = spec.recipe, spec.built
    path = Path(spec.cfg.resume)
    found = ckpt.load(path)  # unreadable, truncated, corrupted: refused here
    ((_, _, _, vcfg, name, seed, folder),) = list(sub_runs(spec.configs, spec.seeds))
    data = built.data(vcfg, seed)
    params = built.updater(vcfg, name, seed)[0].params()
    verify(found, identity_of(recipe, vcfg, name, seed, data, params), path)
    at = int(found["loop"]["round"])
    if at >= vcfg.rounds:
        raise ConfigError(
            f"resume: {path} is at round {at}, the end of a {vcfg.rounds}-round run; there is "
            f"nothing left to run (set rounds={at + 1} or more to continue from it)",
            key="resume",
        )
    sub_dir = path.resolve().parent.parent
    run = sub_dir.parent
    ours = sub_dir.name == folder and (run / "config.yaml").is_file()
    newest = ckpt.newest_valid(sub_dir / "checkpoints") if ours else None
    ended = (read_json(sub_dir / "status.json") or {}).get("state") == "complete"
    if ours and newest is not None and newest[0].resolve() == path.resolve() and not ended:
        plan.run_dir = run  # the newest checkpoint of a sub-run that stopped: continue it
        for _, pseed, pfolder in pretrain_runs(spec.configs, spec.seeds):  # its pre-training
            plan_pretrain(plan, recipe, vcfg, pseed, plan.run_dir / pfolder, built)
    else:
        what = "a complete run" if ended else "an earlier checkpoint of its run"
        plan.branch = {"folder": folder, "checkpoint": str(path), "round": at,
                       "run": str(run) if ours else None,
                       "history": str(sub_dir / "metrics.jsonl") if ours else None}  # fmt: skip
        source = f" {run.name}" if ours else ""
        plan.notes.append(f"resume: {path} is round {at} of {what}{source}; it continues as a "
                          "new run (the run it came from is left as it is)")  # fmt: skip
    plan.resume[folder] = path
    return plan


def plan_pretrain(
    plan: Plan, recipe: str, vcfg: DictConfig, seed: int, folder: Path, built: Assembly
) -> None:
    """:func:`_plan_sub` for the pre-training of (a variant's config ``vcfg``, ``seed``)."""
    pcfg = pretrain.pretrain_config(vcfg)
    _plan_sub(plan, recipe, pcfg, str(vcfg.pretrain.updater), seed, folder, built)


def _plan_sub(
    plan: Plan, recipe: str, cfg: DictConfig, name: str, seed: int, folder: Path, built: Assembly
) -> None:
    status = read_json(folder / "status.json") or {}
    if status.get("state") == "diverged" and status.get("final"):
        plan.done[folder.name] = status["final"]  # a result: resuming would diverge again
        return
    newest = ckpt.newest_valid(folder / "checkpoints")
    if newest is None:
        listed = ckpt.listing(folder / "checkpoints")
        if listed:  # every checkpoint fails: refuse rather than restart from round 0 unasked
            reason = ""
            try:
                ckpt.load(listed[-1])
            except ckpt.CheckpointError as err:
                reason = str(err).removeprefix("resume: ")
            raise ConfigError(
                f"resume: every checkpoint of {folder.name} fails its check (the newest: "
                f"{reason}); move {folder / 'checkpoints'} away to run {folder.name} again from "
                "round 0",
                key="resume",
            )
        return  # nothing to resume: the sub-run starts from round 0
    path, found, skipped = newest
    plan.notes += [f"skipped: {reason}" for reason in skipped]
    at = int(found["loop"]["round"])
    if at > cfg.rounds:
        raise ConfigError(
            f"rounds: got {cfg.rounds}, but {folder.name} has run {at} rounds already (its newest "
            f"checkpoint); a run is not shortened: set rounds={at} or more to continue it, or "
            "start a new run from an earlier checkpoint with resume=PATH",
            key="rounds",
        )
    data = built.data(cfg, seed)
    params = built.updater(cfg, name, seed)[0].params()
    verify(found, identity_of(recipe, cfg, name, seed, data, params), path)
    if at >= cfg.rounds and status.get("final"):
        plan.done[folder.name] = status["final"]
    else:
        plan.resume[folder.name] = path
