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


# numpy's SeedSequence constants (O'Neill's seed_seq hash, as numpy implements it): a pool of 4
# 32-bit words, hashed in with one multiplier, mixed, and read out with another.
_POOL = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_WORD = 2**32


def torch_seeds(seed: int, keys: np.ndarray) -> list[int]:
    """:func:`torch_seed` of every name ``(seed, *keys[i])`` at once, e.g. the round's
    minibatch streams ``(seed, client, round)`` of a whole cohort.

    Equal to ``[torch_seed(seed, *row) for row in keys]``, bit for bit (tested against numpy),
    without a ``SeedSequence`` object per name: the hash of ``np.random.SeedSequence`` —
    every entropy word hashed into a pool of four 32-bit words, the pool mixed, two words read
    out — runs on columns of uint32 words, one column per key. Rows with a key of 2³² or more
    (several words per key) take the one-name path.

    Args:
        seed: the run's seed (>= 0).
        keys: int ``[n, w]``, each row a stream's keys (each >= 0).
    """
    keys = np.asarray(keys, dtype=np.int64)
    if keys.ndim != 2:
        raise ValueError(f"keys: expected a 2-D array [n, w], got shape {keys.shape}")
    if len(keys) == 0:
        return []
    if not 0 <= seed < _WORD or keys.min() < 0 or keys.max() >= _WORD:
        return [torch_seed(seed, *(int(k) for k in row)) for row in keys]
    u = np.uint32
    words = np.concatenate([np.full((len(keys), 1), seed, dtype=np.int64), keys], axis=1)
    words = words.astype(np.uint32)
    with np.errstate(over="ignore"):
        hash_a = u(_INIT_A)

        def hashmix(value: np.ndarray) -> np.ndarray:
            nonlocal hash_a
            value = value ^ hash_a
            hash_a = u(hash_a * u(_MULT_A))
            value = value * hash_a
            return value ^ (value >> u(16))

        def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            out = np.subtract(u(_MIX_L) * x, u(_MIX_R) * y, dtype=np.uint32)
            return out ^ (out >> u(16))

        width = words.shape[1]
        zero = np.zeros(len(words), dtype=np.uint32)
        pool = [hashmix(words[:, i] if i < width else zero) for i in range(_POOL)]
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = mix(pool[dst], hashmix(pool[src]))
        for src in range(_POOL, width):
            for dst in range(_POOL):
                pool[dst] = mix(pool[dst], hashmix(words[:, src]))
        hash_b, state = u(_INIT_B), []
        for i in range(2):
            value = pool[i] ^ hash_b
            hash_b = u(hash_b * u(_MULT_B))
            value = value * hash_b
            state.append((value ^ (value >> u(16))).astype(np.uint64))
    return ((state[0] << np.uint64(32)) | state[1]).tolist()


def generator(seed: int, *keys: int) -> torch.Generator:
    """A CPU ``torch.Generator`` for the stream named ``(seed, *keys)`` (:func:`torch_seed`).

    Example: ``generator(seed, client, round_idx)`` draws client ``client``'s minibatches of
    round ``round_idx``; ``generator(seed, round_idx, 0xC0407)`` could draw the round's cohort.
    """
    return torch.Generator().manual_seed(torch_seed(seed, *keys))


def generators(seed: int, clients: list[int], *keys: int) -> list[torch.Generator]:
    """``[generator(seed, k, *keys) for k in clients]``, the names hashed all at once
    (:func:`torch_seeds`); e.g. ``generators(seed, cohort, round_idx)`` gives every cohort
    client's minibatch stream of the round."""
    if not clients:  # a process without clients this round
        return []
    rows = np.array([[k, *keys] for k in clients], dtype=np.int64).reshape(len(clients), -1)
    return [torch.Generator().manual_seed(s) for s in torch_seeds(seed, rows)]


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


def client_generators(seed: int, clients: list[int], round_idx: int) -> list[torch.Generator]:
    """:func:`client_generator` of every client in ``clients``, the names hashed at once."""
    return generators(seed, clients, round_idx, 0xA06)


def client_generator(seed: int, client: int, round_idx: int) -> torch.Generator:
    """Client ``client``'s conditional samples in round ``round_idx`` (stream
    (seed, client, round, 0xA06))."""
    return generator(seed, client, round_idx, 0xA06)


def failure_generator(seed: int, client: int, round_idx: int) -> torch.Generator:
    """Client ``client``'s failure draws in round ``round_idx`` (stream
    (seed, client, round, 0xFA11); :class:`lit_fedco.engine.failures.Failures`)."""
    return generator(seed, client, round_idx, 0xFA11)


def dropout_seed(seed: int, client: int, round_idx: int, step: int) -> int:
    """The seed of the global generator for client ``client``'s training forwards at local step
    ``step`` of round ``round_idx`` (stream (seed, client, round, step, 0xD509)): a model's
    dropout masks are the same on any number of processes."""
    return torch_seed(seed, client, round_idx, step, 0xD509)


def support_generator(seed: int, client: int) -> torch.Generator:
    """Client ``client``'s fixed evaluation support batch (stream (seed, client, 0x5099))."""
    return generator(seed, client, 0x5099)
