"""``fast_steps=false``: every step through ``client_step``, the same numbers as the updaters'
fast forms (stacked on the vectorized executor, in place on the sequential one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_fedco.engine.executors import make_executor
from lit_fedco.testing import digits_loop, snapshot


def _run(updater: str, executor: str, fast: bool, model: str) -> np.ndarray:
    loop = digits_loop(updater, {"lr": 0.1}, executor, torch.float64, model=model)
    loop.executor = make_executor(executor, 0, fast_steps=fast)
    calls = []
    for hook in ("client_step_stacked", "client_step_inplace"):
        real = getattr(loop.updater, hook)

        def spy(*a, _real=real, _hook=hook):  # type: ignore[no-untyped-def]
            calls.append(_hook)
            return _real(*a)

        setattr(loop.updater, hook, spy)
    for _ in range(3):
        loop.run_round()
    assert bool(calls) == fast, (fast, calls)  # the fast form ran exactly when switched on
    return snapshot(loop)


@pytest.mark.parametrize("updater", ["fedavg", "scaffold", "fedadam"])
@pytest.mark.parametrize(("executor", "model"), [("vectorized", "logreg"), ("sequential", "mlp")])
def test_fast_steps_off_gives_the_same_numbers(updater, executor, model):
    """float64: the stacked form and the vmapped step sum in other orders (within 1e-12); the
    in-place form writes the out-of-place step's numbers (bit for bit)."""
    off = _run(updater, executor, False, model)
    on = _run(updater, executor, True, model)
    if executor == "sequential":
        assert np.array_equal(on, off)
    else:
        np.testing.assert_allclose(on, off, rtol=0, atol=1e-12)


def test_the_switch_is_a_config_key():
    from lit_fedco.config.load import load_config

    assert load_config([], None).fast_steps is True
    assert load_config(["fast_steps=false"], None).fast_steps is False
