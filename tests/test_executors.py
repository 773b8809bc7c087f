"""The vectorized and the sequential executor give the same numbers (float64, rtol 1e-10)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import assert_executors_agree, flat_server, make_loop

TOL = 1e-10  # float64; the two differ only in the order of batched floating-point sums


@pytest.mark.parametrize(
    "name,hparams,problem",
    [
        ("fedavg", {"lr": 0.1}, None),
        ("comfedl", {"lr": 0.05}, {"gamma": 0.5, "form": "stable"}),
        ("comfedl", {"lr": 0.005}, {"gamma": 1.0, "form": "literal"}),
    ],
)
def test_vectorized_equals_sequential(name, hparams, problem):
    assert_executors_agree(name, hparams, problem=problem)


def test_chunked_vectorized_equals_unchunked():
    a = make_loop("comfedl", {"lr": 0.05}, executor="vectorized")
    a.run()
    b = make_loop("comfedl", {"lr": 0.05}, executor="vectorized")
    b.executor.chunk_size = 3  # 4 cohort clients → chunks of 3 and 1
    b.run()
    np.testing.assert_allclose(flat_server(a), flat_server(b), rtol=TOL, atol=TOL)
