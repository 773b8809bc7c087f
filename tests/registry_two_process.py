"""Every updater of the registry's table (``tests/updaters/test_registry.py``, ``TINY``) on N CPU
processes, for the 1 process = 2 processes check::

    python -m tests.registry_two_process --devices N --out FILE

One launched Fabric (``strategy="ddp"``, gloo, when N > 1) runs every entry in turn for
:data:`ROUNDS` rounds with the vectorized executor in float64; rank 0 writes ``FILE`` (a
``torch.save`` of ``{name: {"state": ..., "logs": ...}}``: the flattened server state followed
by the flattened client-held rows, the last round's logs with its evaluation, and how many
kept rows and bytes the process holds). Every other
rank writes its own ``FILE.rank<r>`` the same way, so that the caller can check that all
processes hold the same state.

``--shard-data``: every loop is given only the data rows of the clients its process owns
(:meth:`~lit_fedco.data.FederatedData.held_by`, as a run with ``shard_data=true`` is), and the
record says how many training and validation rows each process held.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from lightning.fabric import Fabric

from lit_fedco.core.state import flatten
from lit_fedco.engine.loop import FederatedLoop
from lit_fedco.engine.store import owned_by

ROUNDS = 3


def snapshot(loop: FederatedLoop) -> torch.Tensor:
    """The server state, then every client's kept rows (gathered from the processes that own
    them onto process 0; none on the others), as one float64 vector."""
    server = flatten(loop.server)[0].double()
    clients = loop.state_dict()["clients"]
    rows = flatten(clients)[0].double() if clients is not None else torch.zeros(0)
    return torch.cat([server, rows]).cpu()


def hold_owned_rows() -> None:
    """Give every :class:`FederatedLoop` built from here on the rows of its process's own
    clients only: the data a process of a ``shard_data=true`` run holds."""
    original = FederatedLoop.__init__

    def init(self, fabric, updater, data, *args, **kw):  # type: ignore[no-untyped-def]
        owned = owned_by(fabric.global_rank, fabric.world_size, data.num_clients)
        original(self, fabric, updater, data.held_by(owned, "test"), *args, **kw)

    FederatedLoop.__init__ = init  # type: ignore[method-assign]


def run_all(fabric: Fabric, rounds: int = ROUNDS) -> dict[str, dict]:
    """Every entry of ``TINY`` on ``fabric``: ``{name: {"state", "logs"}}``."""
    from tests.updaters.test_registry import TINY  # the table; imported after the launch

    out = {}
    for name in sorted(TINY):
        build, hparams = TINY[name]
        loop = build(name, hparams, executor="vectorized", fabric=fabric, rounds=rounds,
                     eval_every=rounds)  # fmt: skip
        loop.run()
        out[name] = {"state": snapshot(loop), "server": flatten(loop.server)[0].double(),
                     "logs": dict(loop.history[-1]),
                     "kept_rows": len(loop.store.owned) if loop.store.rows else 0,
                     "kept_bytes": loop.store.nbytes(),
                     "data_rows": (len(loop.data.x_train), len(loop.data.x_val)),
                     "data_clients": loop.data.holds()}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--shard-data", action="store_true")
    args = parser.parse_args(argv)
    if args.shard_data:
        hold_owned_rows()
    torch.set_num_threads(1)  # N processes on few cores; results do not depend on it
    strategy = "ddp" if args.devices > 1 else "auto"
    fabric = Fabric(accelerator="cpu", devices=args.devices, strategy=strategy)
    fabric.launch()
    out = run_all(fabric, args.rounds)
    rank = fabric.global_rank
    path = args.out if rank == 0 else args.out.with_name(f"{args.out.name}.rank{rank}")
    torch.save({"world_size": fabric.world_size, "updaters": out}, path)
    fabric.barrier()


if __name__ == "__main__":
    main()
