"""Seeding by (seed, key, ...): independent random streams named by integers.

Every random stream of a run is named by the run's seed and a few integers — a client, a
round, a constant that says what the stream is for (``12345``: the data partition; ``0x1A7``:
the synthetic data). ``np.random.SeedSequence`` hashes the name into well-mixed state, so two
names give independent streams however close their integers are, and a stream depends only
on its own name: client k's batches in round r are the same whichever other clients are
sampled and whichever process runs client k. That is what makes 1 and N processes agree, and
a resumed run continue with the data it would have seen.

One caveat comes with ``SeedSequence``: it pads its entropy with zeros, so trailing zero keys
are invisible — (seed, k, 0) names the same stream as (seed, k). The synthetic data's
(seed, 0x1A7) is thus also client 423's round-0 minibatch stream; it stays so, because
changing a name changes the data of every run. A new stream should take a name no
(seed, client, round) can spell: three or more keys, the last a non-zero constant of its own
(as the loop's (seed, round, 0xC0407) for cohorts).

This module imports only numpy and torch so that every layer (data, loop, updaters) can use
it. The construction is the one the code has always used; changing it changes every stream.
"""

from __future__ import annotations

import numpy as np
import torch


def torch_seed(seed: int, *keys: int) -> int:
    """A 64-bit seed for ``torch.Generator.manual_seed`` from the name ``(seed, *keys)``.

    The two 32-bit words of ``SeedSequence([seed, *keys]).generate_state(2)``, high word
    first: 64 bits, because a 32-bit seed would make collisions between the many
    (client, round) streams of a long run likely.

    Args:
        seed: the run's seed (>= 0).
        keys: the stream's name, e.g. ``(client, round)`` (each >= 0).
    """
    state = np.random.SeedSequence([seed, *keys]).generate_state(2)
    return int(state[0]) << 32 | int(state[1])


def generator(seed: int, *keys: int) -> torch.Generator:
    """A CPU ``torch.Generator`` for the stream named ``(seed, *keys)`` (:func:`torch_seed`).

    Example: ``generator(seed, client, round_idx)`` draws client ``client``'s minibatches of
    round ``round_idx``; ``generator(seed, round_idx, 0xC0407)`` could draw the round's cohort.
    """
    return torch.Generator().manual_seed(torch_seed(seed, *keys))


def numpy_generator(seed: int, *keys: int) -> np.random.Generator:
    """A ``numpy.random.Generator`` for the stream named ``(seed, *keys)``.

    Seeded by the ``SeedSequence`` itself (not by :func:`torch_seed`), so it uses the whole
    hashed state; e.g. ``numpy_generator(seed, 12345)`` draws the data partition.
    """
    return np.random.default_rng(np.random.SeedSequence([seed, *keys]))


# ---------------------------------------------------------------------- the run's named streams
def sample_cohort(seed: int, round_idx: int, num_clients: int, m: int) -> torch.Tensor:
    """The sorted ids of the m clients of round ``round_idx`` (stream (seed, round, 0xC0407));
    identical on every process. m ≥ K is full participation."""
    if m >= num_clients:
        return torch.arange(num_clients)
    g = generator(seed, round_idx, 0xC0407)
    return torch.randperm(num_clients, generator=g)[:m].sort().values


def client_generator(seed: int, client: int, round_idx: int) -> torch.Generator:
    """Client ``client``'s conditional samples in round ``round_idx`` (stream
    (seed, client, round, 0xA06))."""
    return generator(seed, client, round_idx, 0xA06)


def failure_generator(seed: int, client: int, round_idx: int) -> torch.Generator:
    """Client ``client``'s failure draws in round ``round_idx`` (stream
    (seed, client, round, 0xFA11); :class:`lit_fedco.failures.Failures`)."""
    return generator(seed, client, round_idx, 0xFA11)


def support_generator(seed: int, client: int) -> torch.Generator:
    """Client ``client``'s fixed evaluation support batch (stream (seed, client, 0x5099))."""
    return generator(seed, client, 0x5099)
