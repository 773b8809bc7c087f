"""What a run folder records about the run as a whole: its start (``config.yaml``, a line of
``resumes.jsonl`` per resume), the check that a sub-run joins the run it names, and what the
results gather from the sub-runs' records (``history``, ``per_client``, the tuning's choice)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lit_fedco.config.parser import flat_keys
from lit_fedco.core.errors import ConfigError
from lit_fedco.experiment.assemble import RESUMABLE_CHANGES
from lit_fedco.experiment.plan import Plan
from lit_fedco.experiment.rundir import holds_run
from lit_fedco.experiment.tuning import TUNE_FILE, TUNE_SUFFIX
from lit_fedco.store.files import read_json, sweep, write_text
from lit_fedco.store.history import History


def whole_run(cfg: DictConfig) -> dict[str, Any]:
    """The run's config as its ``config.yaml`` records it, whichever sub-run writes it."""
    whole = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(whole, dict)
    whole.update(sub_run=-1, jobs=1, resume="")
    return {str(k): v for k, v in whole.items()}


_READ: dict[tuple[str, int, int, int], dict[str, Any] | None] = {}
"""Run configs read (:func:`run_config`), by path and file identity: a ``jobs=N`` worker checks
each of its sub-runs against the same ``config.yaml``."""


def run_config(path: Path) -> dict[str, Any] | None:
    """A run's ``config.yaml`` as dotted keys; None where there is none or it is unreadable (the
    checkpoints still verify what each sub-run resumes). Read once while the file is unchanged."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path.resolve()), st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _READ:
        try:
            before = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except Exception:
            before = None
        _READ.clear()  # one run at a time
        _READ[key] = flat_keys(before) if isinstance(before, dict) else None
    return _READ[key]


def check_same_run(cfg: DictConfig, run_dir: Path) -> None:
    """A sub-run joins a run only with the run's own command line (how it executes aside).

    Raises:
        ConfigError: naming the first key that differs from the run's ``config.yaml``.
    """
    theirs = run_config(run_dir / "config.yaml")
    if theirs is None:
        return
    # where the run lives is the folder itself: a run named by its start time has run_name ''
    # in config.yaml and its sub-runs the name; out_dir may be spelt relative or absolute
    free = {*RESUMABLE_CHANGES, "resume", "run_name", "out_dir"}
    mine = flat_keys(whole_run(cfg))
    for key in sorted(set(theirs) | set(mine)):
        if key.split(".")[0] in free or theirs.get(key) == mine.get(key):
            continue
        raise ConfigError(
            f"sub_run: run {run_dir.name} was started with {key}={theirs.get(key)!r}, this "
            f"sub-run has {key}={mine.get(key)!r}; give every sub-run of a run the same command "
            "line (only sub_run, threads and how it executes may differ)",
            key="sub_run",
        )


def tuning_record(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """``{"tuning": ...}``: a tuned run's choice and every grid point's scores (its tuning
    run's ``tune.json``); nothing for a run that was not tuned."""
    if not list(cfg.tune.chosen):
        return {}
    record = read_json(run_dir.with_name(run_dir.name + TUNE_SUFFIX) / TUNE_FILE)
    return {"tuning": record or {"chosen": list(cfg.tune.chosen)}}


def branch_start(plan: Plan, folder: str, run_dir: Path) -> dict[str, Any]:
    """For the sub-run a branch starts (``resume=PATH`` of an earlier checkpoint): its record
    up to the checkpoint's round, copied from the run it came from, and the note for its
    ``status.json``; nothing for any other sub-run."""
    if plan.branch.get("folder") != folder:
        return {}
    source = plan.branch.get("history")
    if source and not (run_dir / folder / "metrics.jsonl").exists():
        rows = [
            r for r in History.read_file(Path(source)) if int(r["round"]) <= plan.branch["round"]
        ]
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
        write_text(run_dir / folder / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return {"branched_from": {k: plan.branch[k] for k in ("checkpoint", "round", "run")}}


def record_start(cfg: DictConfig, plan: Plan, run_dir: Path, own: str = "") -> None:
    """``config.yaml`` for a new run; one line of ``resumes.jsonl`` for a resumed one, with
    what changed (rounds, and how it executes). A single sub-run (``sub_run``, in folder
    ``own``) writes the run's ``config.yaml`` if no other has, and nothing else."""
    first = run_dir / "config.yaml"
    if cfg.sub_run >= 0:  # beside other sub-runs: the run's config, written by the first
        sweep(run_dir / own)  # never the other sub-runs' files
        if not first.exists():
            write_text(first, OmegaConf.to_yaml(OmegaConf.create(whole_run(cfg))))
        return
    sweep(run_dir)  # temporary files a killed run's atomic writes left behind
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if not first.exists():
        if cfg.resume and holds_run(run_dir):
            print(f"lit_fedco: {first} was missing; written again from this command line (the "
                  "checkpoints verify what resumes)", file=sys.stderr)  # fmt: skip
        write_text(first, OmegaConf.to_yaml(OmegaConf.create(resolved)))
        return
    try:
        before = OmegaConf.to_container(OmegaConf.load(first), resolve=True)
    except Exception as err:  # not YAML, not text, an interpolation that does not resolve
        before = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:100]}"
    assert isinstance(resolved, dict)
    if not isinstance(before, dict):
        why = before if isinstance(before, str) else f"a {type(before).__name__}, not a mapping"
        print(f"lit_fedco: {first} is damaged ({why}); written again from this command line "
              "(the checkpoints verify what resumes)", file=sys.stderr)  # fmt: skip
        write_text(first, OmegaConf.to_yaml(OmegaConf.create(resolved)))
        before = resolved
    changed = {k: [before.get(k), resolved.get(k)] for k in RESUMABLE_CHANGES
               if before.get(k) != resolved.get(k)}  # fmt: skip
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "resume": cfg.resume, "changed": changed,
            "from": {k: str(v) for k, v in plan.resume.items()}}  # fmt: skip
    with open(run_dir / "resumes.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    if changed:
        print(f"lit_fedco: resuming {run_dir.name} with " + ", ".join(
            f"{k}: {a} -> {b}" for k, (a, b) in changed.items()))  # fmt: skip


def recorded(run_dir: Path, folders: dict[str, list[str]]) -> dict[str, Any]:
    """Every evaluated round's metrics per method and seed (``history``), and every client's
    final validation accuracy (``per_client``), read back from the sub-runs' records."""
    history: dict[str, list[list[dict[str, float]]]] = {}
    per_client: dict[str, list[list[float] | None]] = {}
    for label, subs in folders.items():
        for sub in subs:
            rows = History.read_file(run_dir / sub / "metrics.jsonl")
            history.setdefault(label, []).append([r for r in rows if "val/acc_avg" in r])
            status = read_json(run_dir / sub / "status.json") or {}
            per_client.setdefault(label, []).append(status.get("per_client"))
    return {"history": history, "per_client": per_client}
