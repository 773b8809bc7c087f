"""README.md's "Writing a new updater" example runs as written, through a recipe."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # every test here runs a recipe in a subprocess


def test_readme_fedprox_example_runs(tmp_path):
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    example = next(b for b in blocks if "my_fedprox.py" in b)
    script = tmp_path / "my_fedprox.py"
    script.write_text(example)
    args = [
        sys.executable, str(script), "fedprox.mu=0.5", "rounds=4", "eval_every=2",
        "progress=false", "tracking=[none]", f"out_dir={tmp_path / 'out'}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fedprox" in proc.stdout and "fedavg" in proc.stdout
    (run_dir,) = (tmp_path / "out" / "fedprox_demo").iterdir()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["config"]["fedprox"]["mu"] == 0.5
    # μ > 0 pulls every client towards x̄, so FedProx's model differs from FedAvg's
    a, b = results["results"]["fedprox"][0], results["results"]["fedavg"][0]
    assert a["val/loss_avg"] != b["val/loss_avg"]
