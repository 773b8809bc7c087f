"""Wall time of the command line's answers that must not wait for torch: ``--help``,
``--help-all``, an unknown key and one value of each kind the catalog refuses (a name outside
an enumeration: model, partition, executor; an int below its range; a value of the wrong type;
a repeated updater; a repeated variant; a bad last entry of 1,000 variants), each a fresh
``python -m lit_fedco.recipes.<recipe>`` process, started from this repository.

    python -m lit_fedco.benchmarks.cli [--recipe ds_feddro] [--repeat 10]

Prints the median, min and max over ``--repeat`` runs of each, and for comparison a bare
``python -c pass`` and ``python -c "import torch"`` on the same machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def wall_times(cmd: list[str], repeat: int) -> tuple[list[float], int]:
    """Seconds per run of ``cmd`` (a fresh process each), and its last exit code."""
    times, code = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        code = subprocess.run(cmd, cwd=REPO, capture_output=True).returncode
        times.append(time.perf_counter() - start)
    return times, code


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lit_fedco.benchmarks.cli", description=__doc__)
    parser.add_argument("--recipe", default="ds_feddro")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args(argv)
    recipe = [sys.executable, "-m", f"lit_fedco.recipes.{args.recipe}"]
    many = ",".join([f"rounds={r}" for r in range(2, 1001)] + ["rounds=0"])
    cases = [
        ("--help", [*recipe, "--help"]),
        ("--help-all", [*recipe, "--help-all"]),
        ("unknown key (roundz=3)", [*recipe, "roundz=3"]),
        ("bad name (model.name=cnnn)", [*recipe, "model.name=cnnn"]),
        ("out of range (rounds=0)", [*recipe, "rounds=0"]),
        ("bad partition", [*recipe, "data.partition=dirichlett"]),
        ("bad executor", [*recipe, "executor=vectorised"]),
        ("wrong type (rounds=abc)", [*recipe, "rounds=abc"]),
        ("repeated (updaters=[a,a])", [*recipe, "updaters=[fedavg,fedavg]"]),
        ("repeated variants", [*recipe, "variants=[rounds=3,rounds=3]"]),
        ("1,000 variants, last bad", [*recipe, f"variants=[{many}]"]),
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("python -c 'import torch'", [sys.executable, "-c", "import torch"]),
    ]
    print(f"{'command':28s} {'exit':>4s} {'median s':>9s} {'min s':>7s} {'max s':>7s}")
    for name, cmd in cases:
        times, code = wall_times(cmd, args.repeat)
        print(f"{name:28s} {code:4d} {statistics.median(times):9.3f} "
              f"{min(times):7.3f} {max(times):7.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
