"""Seeding by (seed, *keys): the construction every random stream of a run is built on."""

from __future__ import annotations

import numpy as np
import torch

from lit_fedco.seeding import generator, numpy_generator, torch_seed


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
