"""The one entry point: :func:`run`, what every recipe calls (``lit_fedco.run``).

``python -m lit_fedco.recipes.<name> [preset=NAME] [key=value ...]`` parses its command line
once (:mod:`lit_fedco.config.parser`), imports the modules of the user's own it names
(:mod:`lit_fedco.config.plugins`), merges everything into the typed config
(:mod:`lit_fedco.config.load`) and then either prints the help (``--help``, ``--help-all``) or
runs the recipe (:func:`lit_fedco.experiment.runner.run_recipe`). Up to that point nothing
imports torch unless a module of the user's own does, so help and the refusal of a mistyped
key come in a fraction of a second. Bad input ends the process with exit code 2 and one line.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, NoReturn

from omegaconf import OmegaConf

from lit_fedco.config.early import check_values
from lit_fedco.config.helptext import render
from lit_fedco.config.load import load, variant_configs
from lit_fedco.config.parser import parse
from lit_fedco.config.plugins import import_plugins
from lit_fedco.core.errors import ConfigError, refuse
from lit_fedco.core.ranges import check_jobs
from lit_fedco.experiment.rundir import RUN_DIR_ENV
from lit_fedco.experiment.subruns import listing, sub_runs
from lit_fedco.experiment.tuning import run_tuned
from lit_fedco.process.forking import can_fork
from lit_fedco.process.serving import handle_signals, serve
from lit_fedco.process.workers import WORKER_ENV, exit_now, prestart, program_is_a_recipe


def run(
    recipe: str,
    defaults: dict[str, Any],
    argv: list[str] | None = None,
    *,
    columns: list[tuple[str, str]] | None = None,
    callbacks: list[Any] | None = None,
    evaluated_on: str = "validation",
) -> list[Any]:
    """Run a recipe from its command line (``sys.argv[1:]`` by default).

    Args:
        recipe: the recipe's name (its runs go to ``<out_dir>/<recipe>/``).
        defaults: the recipe's defaults, merged under any preset and the command line.
        argv: the command line; ``--help`` / ``--help-all`` print the help instead of running,
            ``--list-sub-runs`` the run's sub-runs (what ``sub_run=INDEX`` runs).
        columns: the results table's ``(metric key, label)`` pairs (a default set otherwise).
        callbacks: objects with any of the loop's hooks (``on_round_start``, ``on_round_end``,
            ``on_eval_end``), called on every process.
        evaluated_on: what the ``val/`` metrics are measured on (``"validation"``, or
            ``"test"`` for a recipe whose held-out data is a test set).

    Returns:
        The table's rows ``(label, final metrics per seed)``; nothing for help.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cmd = import_plugins(parse(argv, defaults))
        cfg = load(cmd)
        if cmd.help in ("", "sub-runs"):  # what the catalog can check, before torch
            check_values(cfg)
    except ConfigError as err:
        refuse(err)
    # a tuned run's two phases (tune.grid), or their listing; a worker or a process of one of
    # its runs runs one phase's sub-run
    inner = os.environ.get(RUN_DIR_ENV) or os.environ.get(WORKER_ENV)
    if list(cfg.tune.grid) and not inner and cmd.help in ("", "sub-runs"):
        return run_tuned(recipe, defaults, argv, cmd, cfg, _launch, _list_sub_runs,
                         columns=columns, callbacks=callbacks,
                         evaluated_on=evaluated_on)  # fmt: skip
    if cmd.help == "sub-runs":
        return _list_sub_runs(cmd, cfg)
    if cmd.help:
        values = OmegaConf.to_container(cfg, resolve=False)
        assert isinstance(values, dict)
        shown = {str(k): v for k, v in values.items()}
        print(render(recipe, defaults, shown, cmd.help == "all"), end="")
        return []
    return _launch(recipe, cmd, cfg, columns, callbacks, evaluated_on)


def _launch(
    recipe: str,
    cmd: Any,
    cfg: Any,
    columns: list[tuple[str, str]] | None,
    callbacks: list[Any] | None,
    evaluated_on: str,
    may_fork: bool = True,
) -> list[Any]:
    """Run the loaded config (:func:`~lit_fedco.experiment.runner.run_recipe`), with the
    ``jobs=N`` workers started first. ``may_fork=False``: this process has run torch operations
    already (a tuned run's second phase), so they are started beside it, not forked."""
    launcher = cfg.jobs > 1 and cfg.sub_run < 0 and not os.environ.get(RUN_DIR_ENV)
    # forked only where nothing but lit_fedco's own code has run here (one of its recipes, no
    # plugins): a fork after torch's thread pool has started can hang the child's first parallel
    # operation (GNU OpenMP), and a script or module of one's own may have computed at import
    fork = launcher and may_fork and can_fork() and program_is_a_recipe() and not list(cfg.plugins)
    if launcher and not fork:
        _prestart_workers(cmd, cfg, fork=False)  # they import torch while this process does
    from lit_fedco.experiment.runner import run_recipe

    if fork:
        import lit_fedco.experiment.session  # noqa: F401  (what a sub-run imports, once)
        from lit_fedco.report.tracking import import_wandb

        import_wandb(list(cfg.tracking))  # and W&B's modules, where the run tracks there

        _prestart_workers(cmd, cfg, fork=True)  # before this process runs any torch operation

    return run_recipe(recipe, cmd, cfg, columns, callbacks, evaluated_on)


def main(recipe: str, defaults: dict[str, Any], **options: Any) -> NoReturn:
    """A recipe's ``__main__``: :func:`run` (the same arguments: ``argv``, ``columns``,
    ``callbacks``, ``evaluated_on``), then the end of the process, exit code 0. Its exit
    functions run and its output is flushed, but the interpreter's teardown of torch and the
    other modules is skipped (one to two seconds); where the script still has threads of its
    own running, it ends as usual, after them. Bad input and failures end it as :func:`run`
    does."""
    if sys.stdout is None:  # started with stdout closed (>&-): what it prints goes nowhere
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 — for the life of the process
    sys.stdout = _ReaderMayLeave(sys.stdout)
    run(recipe, defaults, **options)
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if any(t.is_alive() and not t.daemon for t in others):
        raise SystemExit(0)
    exit_now(0)


class _ReaderMayLeave:
    """A program's stdout whose reader may leave early (``... | head``): from then on the output
    is dropped instead of the run ending with a ``BrokenPipeError`` wherever it next prints."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except OSError as err:
            self._drop(err)
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            self._drop(err)

    def _drop(self, err: OSError) -> None:
        if not isinstance(err, BrokenPipeError):  # /dev/full, a closed stdout: said once
            print(f"lit_fedco: stdout cannot be written ({err.strerror or err}); the run goes "
                  "on without it (its table and results are written to the run folder)",
                  file=sys.stderr)  # fmt: skip
        _reader_gone()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _reader_gone() -> None:
    """The reader of stdout has gone (``| head``): what is printed from now on goes nowhere."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _list_sub_runs(cmd: Any, cfg: Any, first: int = 0) -> list[Any]:
    """Print the index, folder, updater, seed and variant of every sub-run of the run (numbered
    from ``first``)."""
    try:
        configs = variant_configs(cmd, cfg)
    except ConfigError as err:
        refuse(err)
    try:
        print(listing(configs, list(cfg.seeds) or [cfg.seed], first), flush=True)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        _reader_gone()
    return []


def _prestart_workers(cmd: Any, cfg: Any, fork: bool) -> None:
    """``jobs=N``: start the worker processes before this one checks the run, so that their
    start-up overlaps its checks (a run that is then refused ends them with it): forked from
    this one once it has imported torch (Linux), else started beside it (they import torch while
    this one does)."""
    try:
        count = len(list(sub_runs(variant_configs(cmd, cfg), list(cfg.seeds) or [cfg.seed])))
        check_jobs(cfg.jobs)
    except ConfigError:
        return  # refused by the run's own checks, with its line
    prestart(min(cfg.jobs, count), _forked_worker if fork else None)


def _forked_worker(inp: Any, channel: Any) -> None:
    """A worker forked from this process: it serves its tasks through :func:`run`; the
    recipe's script, if the run has one, already ran here."""
    handle_signals()
    serve(inp, channel, run, main_imported=True)
