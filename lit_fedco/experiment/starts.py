"""The model every method of a (variant, seed) starts from: its seeded initialisation,
``init_from``'s parameters, or the final model of a pre-training that runs as a sub-run of its
own before the methods (``pretrain.rounds > 0``)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from torch import Tensor

from lit_fedco.experiment import pretrain
from lit_fedco.experiment.assemble import Assembly, trains
from lit_fedco.experiment.plan import Plan, plan_pretrain
from lit_fedco.experiment.session import run_sub
from lit_fedco.experiment.subruns import pretrain_folder, pretrains
from lit_fedco.store import checkpoint as ckpt
from lit_fedco.store.files import lock_run


def starting_point(
    recipe: str,
    i: int,
    variant: str,
    vcfg: DictConfig,
    seed: int,
    plan: Plan,
    run_dir: Path,
    fabric: Any,
    record: Any,
    built: Assembly,
) -> dict[str, Any] | None:
    """``{"params", "from"}`` every method of (variant ``i``, ``seed``) starts from, or None
    (each its seeded initialisation). With ``pretrain.rounds > 0`` the pre-training runs as a
    sub-run of its own (resumed, or read back when complete) and its row is recorded.

    Raises:
        SystemExit: the pre-training diverged (exit code 1): no method can start from it.
    """
    base = None
    if vcfg.init_from:
        base = {"params": pretrain.load_params(vcfg.init_from), "from": str(vcfg.init_from)}
    if not pretrains(vcfg):
        return base
    folder = pretrain_folder(i, variant, seed)
    pcfg, name = pretrain.pretrain_config(vcfg), str(vcfg.pretrain.updater)
    with contextlib.ExitStack() as held:
        if vcfg.sub_run >= 0:  # beside other sub-runs: the first to need it runs it, others wait
            held.callback(lock_run(run_dir, wait=True, name=f".lock-{folder}").release)
            if folder not in plan.done:
                plan_pretrain(plan, recipe, vcfg, seed, run_dir / folder, built)
        final, params = _pretrained(recipe, pcfg, name, seed, plan, run_dir / folder, fabric,
                                    built, base)  # fmt: skip
    label = f"pretrain [{variant}]" if variant else "pretrain"
    record(label, final, folder, trains(pcfg, name)["composition"])
    return {"params": params, "from": f"{folder}/{pretrain.PRETRAINED}"}


def _pretrained(
    recipe: str,
    pcfg: DictConfig,
    name: str,
    seed: int,
    plan: Plan,
    sub_dir: Path,
    fabric: Any,
    built: Assembly,
    base: dict[str, Any] | None,
) -> tuple[dict[str, float], dict[str, Tensor]]:
    """The final metrics and model of the pre-training (config ``pcfg``, updater ``name``) in
    ``sub_dir``: read back when complete, else run (or resumed); exit code 1 if it diverged."""
    folder, saved = sub_dir.name, sub_dir / pretrain.PRETRAINED
    rank0 = fabric.global_rank == 0
    loop = None
    if folder in plan.done:
        final = plan.done[folder]
        if rank0 and not plan.after_jobs:
            print(f"lit_fedco: {folder} is already complete; its model is {saved}")
    else:
        final, loop = run_sub(fabric, pcfg, name, seed, recipe, sub_dir, plan.resume.get(folder),
                              False, base, built)  # fmt: skip
    if "diverged_round" in final:
        if rank0:
            print(
                f"lit_fedco: the pre-training ({name}, {folder}) diverged in round "
                f"{int(final['diverged_round'])}; no method can start from it: lower "
                f"pretrain.lr (got {pcfg.pretrain.lr})",
                file=sys.stderr,
            )
        raise SystemExit(1)
    if loop is None:
        if not saved.is_file():  # removed since: the last checkpoint holds the same model
            saved = ckpt.listing(sub_dir / "checkpoints")[-1]
        return final, pretrain.load_params(saved)
    model = loop.server[loop.updater.model_key]
    last = sub_dir / "checkpoints" / ckpt.name_of(loop.round)
    if rank0 and last.is_file():  # the final checkpoint, under a name init_from= takes
        ckpt.atomic_write(saved, last.read_bytes())
    elif rank0:
        why = f"no checkpoint of round {loop.round}"
        print(f"lit_fedco: cannot write {saved} ({why}); the methods start from the "
              "pre-trained model all the same", file=sys.stderr)  # fmt: skip
    return final, {k: v.detach().clone() for k, v in model.items()}
