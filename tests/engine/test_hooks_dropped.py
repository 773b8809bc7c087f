"""``client_end`` and dropped clients, as the documentation's hooks reference says: it runs for
every cohort client, a dropped one with ``steps = 0``; whatever it returns for that client is
discarded (not uploaded, not kept), so a division by ``steps`` there does no harm, and
``steps > 0`` is the participant mask."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch.func import grad_and_value

import lit_fedco
from lit_fedco import Sync, tree_axpy, tree_map
from lit_fedco.core.state import flatten
from lit_fedco.testing import digits_loop
from tests.engine.test_failures import Forced

DONE = (3, 0, 2, 0)  # the cohort's fates: full, dropped, stopped after 2 of 3, dropped


class CountingEnd(lit_fedco.CompositionalUpdater[lit_fedco.Hparams]):
    """Local SGD whose ``client_end`` divides by ``steps``: a dropped client's upload and kept
    count would be non-finite if they were used. Records the ``steps`` it was called with."""

    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND, "rounds": Sync.KEEP}
    seen: ClassVar[list[float]] = []
    record: ClassVar[bool] = True  # not under vmap (a batched steps has no float)

    def client_step(self, state, batches, ctx, step):
        g, loss = grad_and_value(lambda p: self.objective.value(p, batches, ctx))(state["x"])
        return {**state, "x": tree_axpy(-self.hparams.lr, g, state["x"])}, {"loss": loss}

    def client_end(self, state, start, ctx, steps):
        if self.record:
            CountingEnd.seen.append(float(steps))
        per_step = 1.0 / steps  # inf for a dropped client
        x = tree_map(lambda v: v * (steps * per_step), state["x"])  # nan for a dropped client
        rounds = tree_map(lambda v: v + steps * per_step, state["rounds"])  # nan likewise
        return {"x": x, "rounds": rounds}


def test_client_end_runs_for_dropped_clients_with_zero_steps_and_its_result_is_discarded():
    CountingEnd.seen.clear()
    loop = digits_loop(CountingEnd, {"lr": 0.1}, executor="sequential", rounds=1,
                       failures=Forced(done=DONE))  # fmt: skip
    loop.run()
    assert sorted(CountingEnd.seen) == sorted(float(d) for d in DONE)  # every cohort client
    assert bool(torch.isfinite(flatten(loop.server)[0]).all())  # the NaN uploads were dropped
    counts = flatten(loop.store.rows)[0]
    assert bool(torch.isfinite(counts).all())  # the NaN kept rows were not written back
    # the two clients that took part counted one round in every entry; the rest none
    per_client = loop.store.rows["rounds"]
    took = [float(next(iter(tree_map(lambda v: v[k].max(), per_client).values())))
            for k in range(loop.data.num_clients)]  # fmt: skip
    assert sorted(took) == [0.0] * (loop.data.num_clients - 2) + [1.0, 1.0]
    logs = loop.history[-1]
    assert logs["failures/dropped"] == 2 and logs["failures/partial"] == 1
    assert all(math.isfinite(v) for v in logs.values())


def test_client_end_under_vmap_gets_the_same_zero_steps():
    """The vectorized executor runs the same hook over all clients at once: the same state."""
    runs = []
    for executor in ("vectorized", "sequential"):
        loop = digits_loop(CountingEnd, {"lr": 0.1}, executor=executor, rounds=2,
                           failures=Forced(done=DONE))  # fmt: skip
        loop.updater.record = False  # type: ignore[misc]
        loop.run()
        runs.append(torch.cat([flatten(loop.server)[0], flatten(loop.store.rows)[0]]))
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-10, atol=1e-10)
