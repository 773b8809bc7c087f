"""Values carried in a round's next collective (:meth:`lit_fedco.engine.round.Comm.carry`): the stop
request travels in the aggregation instead of a collective of its own."""

from __future__ import annotations

import signal

import torch

from lit_fedco.engine.comm import Comm, LocalComm
from lit_fedco.experiment import session
from lit_fedco.process import stops


class CountingComm(Comm):
    """One process, counting its collectives: a sum over processes is the identity."""

    def __init__(self) -> None:
        super().__init__(torch.float64)
        self.calls = 0

    def all_sum(self, flat: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return flat * 1.0


def test_carried_values_ride_the_next_collective_and_leave_the_tree_alone():
    comm = CountingComm()
    tree = {"a": torch.arange(3.0), "b": {"c": torch.ones(2, 2)}}
    assert comm.carried is None
    comm.carry(torch.tensor([0.0, 1.0, 0.0]))
    assert comm.carried is None  # nothing has travelled yet
    out = comm.sum_tree(tree)
    assert comm.calls == 1  # one collective for both
    assert torch.equal(out["a"], tree["a"]) and torch.equal(out["b"]["c"], tree["b"]["c"])
    assert torch.equal(comm.carried, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))
    again = comm.sum_tree(tree)  # carried once: the next collective is the tree alone
    assert comm.calls == 2 and torch.equal(again["a"], tree["a"])
    assert torch.equal(comm.carried, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))


def test_a_stop_request_is_a_one_hot_vector_of_its_signal():
    assert session.stop_request().sum() == 0  # none requested
    stops.request_stop(signal.SIGTERM)
    try:
        flags = session.stop_request()
    finally:
        stops._REQUESTED.clear()
    assert flags.shape == (stops.SIGNALS,) and flags.sum() == 1
    assert flags[signal.SIGTERM] == 1
    summed = LocalComm().sum_tree({"x": torch.zeros(1)})  # a round without a request
    assert torch.equal(summed["x"], torch.zeros(1, dtype=torch.float64))
