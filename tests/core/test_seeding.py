"""Seeding by (seed, *keys): the construction every random stream of a run is built on."""

from __future__ import annotations

import numpy as np
import torch

from lit_fedco.core.seeding import (
    client_generator,
    client_generators,
    generator,
    generators,
    numpy_generator,
    torch_seed,
    torch_seeds,
)


def test_torch_seed_is_the_two_words_of_the_seed_sequence_high_first():
    for name in ([0], [3, 7, 11], [2**40, 1, 0xC0407]):
        words = np.random.SeedSequence(name).generate_state(2)
        assert torch_seed(*name) == int(words[0]) << 32 | int(words[1])
        assert 0 <= torch_seed(*name) < 2**64


def test_generator_reproduces_the_streams_written_out_by_hand():
    """Today's code (the samplers, the synthetic data, the loop's cohort and conditional
    samples) seeds ``torch.Generator().manual_seed(w0 << 32 | w1)``; the helper must give the
    very same numbers."""
    for name in ([5, 2, 9], [0, 0x1A7], [1, 4, 0xC0407], [7, 3, 8, 0xA06]):
        words = np.random.SeedSequence(name).generate_state(2)
        by_hand = torch.Generator().manual_seed(int(words[0]) << 32 | int(words[1]))
        g = generator(*name)
        assert torch.equal(torch.randperm(50, generator=g), torch.randperm(50, generator=by_hand))
        assert torch.equal(torch.randn(8, generator=g), torch.randn(8, generator=by_hand))


def test_numpy_generator_is_seeded_by_the_sequence_itself():
    a = numpy_generator(3, 12345).permutation(100)
    b = np.random.default_rng(np.random.SeedSequence([3, 12345])).permutation(100)
    assert np.array_equal(a, b)


def test_streams_depend_on_every_key_and_their_order():
    draws = {
        name: tuple(torch.randperm(1000, generator=generator(*name)).tolist())
        for name in ((0, 1, 2), (0, 2, 1), (1, 1, 2), (0, 1, 3))
    }
    assert len(set(draws.values())) == len(draws)
    assert draws[(0, 1, 2)] == tuple(torch.randperm(1000, generator=generator(0, 1, 2)).tolist())


def test_trailing_zero_keys_name_the_same_stream():
    """A property of ``SeedSequence`` (it pads its entropy with zeros) that the module
    docstring warns about: (seed, k, 0) is the stream (seed, k)."""
    assert torch_seed(4, 9, 0) == torch_seed(4, 9)
    assert torch_seed(4, 9, 0, 0xA06) != torch_seed(4, 9, 0xA06)


def test_torch_seeds_hash_every_name_at_once_exactly_as_numpy_does():
    """The vectorised hash equals numpy's SeedSequence, name by name: 1 to 6 keys, zeros
    among them (trailing ones included), the largest 32-bit words, several seeds."""
    rng = np.random.default_rng(0)
    for width in range(1, 7):
        keys = rng.integers(0, 2**32, size=(200, width))
        keys[rng.random(keys.shape) < 0.3] = 0
        keys[0] = 2**32 - 1
        for seed in (0, 3, 2**32 - 1):
            expected = [torch_seed(seed, *(int(k) for k in row)) for row in keys]
            assert torch_seeds(seed, keys) == expected, (width, seed)


def test_torch_seeds_takes_the_one_name_path_for_keys_of_several_words():
    keys = np.array([[2**32, 5], [1, 2**40], [7, 8]])
    assert torch_seeds(1, keys) == [torch_seed(1, *(int(k) for k in r)) for r in keys]
    assert torch_seeds(2**33, keys[2:]) == [torch_seed(2**33, 7, 8)]
    assert torch_seeds(0, np.zeros((0, 2), dtype=np.int64)) == []


def test_generators_draw_what_one_generator_per_name_draws():
    clients = [0, 5, 423, 999_999]
    for got, k in zip(generators(7, clients, 12), clients, strict=True):
        assert torch.equal(
            torch.randperm(50, generator=got), torch.randperm(50, generator=generator(7, k, 12))
        )
    for got, k in zip(client_generators(7, clients, 3), clients, strict=True):
        assert torch.equal(
            torch.rand(5, generator=got), torch.rand(5, generator=client_generator(7, k, 3))
        )
