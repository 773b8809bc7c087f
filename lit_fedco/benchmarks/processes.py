"""One throughput measurement of lit_fedco on N CPU processes, for the benchmark's ``--devices``
(:mod:`lit_fedco.benchmarks.throughput`)::

    python -m lit_fedco.benchmarks.processes SPEC.json OUT.json

``SPEC.json`` names the workload (the fields of :class:`~lit_fedco.benchmarks.throughput.Workload`),
the executor, the updater, the number of processes and threads per process, the timed slots
and the seed. Lightning Fabric starts the processes (``strategy="ddp"``, gloo), each building
the same data and running its share of every round's cohort, as a recipe with ``devices=N``
does. Timing: one untimed warm-up round; then the processes agree on a number of rounds per
slot (enough for ``min_time`` seconds on the slowest of them) and run ``repeat`` slots of that
many rounds, each between two barriers; a slot's figure is rounds × m × I / seconds on
process 0. Memory, per process: the peak resident set during the slots (``VmHWM``, reset before
each slot), the bytes of the kept client state and of the client data it holds (all clients',
or with ``shard_data`` only its own: :meth:`~lit_fedco.data.FederatedData.held_by`). Process 0
writes ``OUT.json``: one record with every process's figures.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lit_fedco.process.cpu_memory import keep_freed_memory


def run(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The measurement ``spec`` on the processes Fabric starts; the record on process 0
    (None on the others)."""
    from lightning.fabric import Fabric

    from lit_fedco.benchmarks.throughput import LitFedco, PeakMemory, Workload, build_data
    from lit_fedco.engine.store import owned_by

    devices = int(spec["devices"])
    fabric = Fabric(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto")
    fabric.launch()
    torch.set_num_threads(int(spec["threads"]))
    w = Workload(**spec["workload"])
    data = build_data(w, spec["seed"], spec["data_dir"])
    if spec.get("shard_data"):  # as a recipe with shard_data=true: this process's clients' rows
        data = data.held_by(owned_by(fabric.global_rank, devices, data.num_clients), "")
    runner = LitFedco(w, data, "cpu", torch.float32, spec["seed"], spec["impl"], spec["updater"],
                      fabric)  # fmt: skip
    start = time.perf_counter()
    runner.run_round()  # warm-up, untimed
    warm = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    slowest = float(fabric.all_reduce(warm, reduce_op="max"))  # type: ignore[arg-type]
    rounds = max(1, math.ceil(spec["min_time"] / max(slowest, 1e-9)))
    mem = PeakMemory("cpu")
    rates, peaks = [], []
    for _ in range(spec["repeat"]):
        mem.start()
        fabric.barrier()
        start = time.perf_counter()
        for _ in range(rounds):
            runner.run_round()
        fabric.barrier()
        rates.append(rounds * w.client_steps / (time.perf_counter() - start))
        peaks.append(mem.stop()[0])
    store = runner.loop.store
    data_mib = runner.loop.data.nbytes() / 2**20
    mine = torch.tensor([max(peaks), store.nbytes() / 2**20, float(len(store.owned)), data_mib],
                        dtype=torch.float64)  # fmt: skip
    every = fabric.all_gather(mine).reshape(devices, -1)  # type: ignore[union-attr]
    if devices > 1:  # no process may exit with the collectives' threads running (it aborts)
        fabric.barrier()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    if fabric.global_rank != 0:
        return None
    return {
        "client_steps_per_s": statistics.median(rates), "client_steps_per_s_runs": rates,
        "rounds_timed": rounds * spec["repeat"], "processes": devices,
        "threads_per_process": torch.get_num_threads(),
        "peak_mem_mib_per_process": every[:, 0].tolist(),
        "kept_state_mib_per_process": every[:, 1].tolist(),
        "kept_clients_per_process": [int(v) for v in every[:, 2].tolist()],
        "data_mib_per_process": every[:, 3].tolist(), "shard_data": bool(spec.get("shard_data")),
        "mem_method": mem.method,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m lit_fedco.benchmarks.processes SPEC.json OUT.json\n")
        sys.exit(2)
    spec = json.loads(Path(args[0]).read_text())
    if not spec.get("system_malloc"):
        keep_freed_memory()
    record = run(spec)
    if record is not None:
        Path(args[1]).write_text(json.dumps(record))


if __name__ == "__main__":
    main()
