"""Training throughput, side by side: lit_fedco's executors against a plain per-client PyTorch loop.

    python -m lit_fedco.benchmarks.throughput [--workloads logreg conv resnet20 cnn4]
        [--clients K ...] [--threads N ...] [--repeat 2] [--quick] [--json PATH]
        [--device cpu|cuda] [--profile vectorized] [--data-dir DIR [--data-name mnist]]
        [--devices 1 2 [--updater scaffold] [--shard-data]]

Each workload is FedAvg (the same learning rate everywhere) run three ways on the same data:

- ``plain``: a per-client loop written here, the honest baseline: one ``nn.Module``; for every
  cohort client, copy the global weights into it, take I steps of SGD (autograd, in-place
  updates) on the client's minibatches, add the result to a running sum; the new global model
  is that sum divided by m. No ``vmap``, no lit_fedco round.
- ``vectorized`` and ``sequential``: :class:`~lit_fedco.engine.loop.FederatedLoop` with that
  executor.

All three draw the round's cohort with :func:`~lit_fedco.core.seeding.sample_cohort` and its
minibatches with :class:`~lit_fedco.data.BatchSampler` (seeded by seed, client, round), so a
client sees the same rows in every implementation and the drawing costs the same.

Timing: one untimed warm-up round per implementation, then the implementations alternate
(plain, vectorized, sequential, plain, ... ``--repeat`` times); each slot runs whole training
rounds (cohort sampling, minibatch sampling and gathering, local steps, aggregation; never
evaluation) for at least ``--min-time`` seconds and at least one round. A slot's figure is
client-steps per second: rounds × m × I / seconds. Ratios are the median of an
implementation's slots over the median of the plain loop's, measured in the same run, with
the same threads: absolute figures move with the machine's load, ratios much less.

Memory: on CPU, the process's peak resident set while an implementation's rounds run
(``VmHWM``, reset through ``/proc/self/clear_refs`` before each slot, after returning freed
heap to the system), and that peak above the resident set before the slot (the round's working
memory, also per cohort client); where the peak cannot be reset, ``ru_maxrss`` (a high-water
mark of the whole process). On CUDA, the allocator's peak (``max_memory_allocated``). Per
simulated client: the peak above what the process held before the workload's data were built
(the data, the three implementations' state, one-off allocations of first use), divided by K.

Processes (``--devices 1 2``): lit_fedco's executors again, each on N CPU processes that
Lightning Fabric starts (gloo, ``--threads`` per process), as a recipe with ``devices=N`` runs;
each measurement in fresh processes (:mod:`lit_fedco.benchmarks.processes`): client-steps/s,
its ratio to this run's plain loop (one process) and to the same executor on one launched
process, and per process the peak resident set and the kept client state it holds
(``--updater scaffold``: a control variate per client; FedAvg keeps none) and the client data
it holds (all clients'; with ``--shard-data``, its own clients' rows only, and each round's
cohort split by owner, as a recipe with ``shard_data=true`` runs).

Agreement: after timing, every implementation runs ``--check-rounds`` rounds again, in
float64, from the same initial model; the final global models of lit_fedco's executors must
equal the plain loop's to a relative max-norm difference of :data:`AGREE_TOL`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import re
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_fedco.process.cpu_memory import keep_freed_memory

IMPLS = ("plain", "vectorized", "sequential")
WORKLOADS = ("logreg", "conv", "resnet20", "cnn4")
CONV_MODELS = ("cnn", "simple_cnn")
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
"""Where Debian's ``dataset-fashion-mnist`` puts its files: the conv data if no folder is given."""
IDX_TRAIN = 60_000
"""Training images of MNIST and Fashion-MNIST."""
FASHION_TRAIN = IDX_TRAIN  # the name before --data-dir
IDX_SOURCES = ("mnist", "fashion_mnist")
AGREE_TOL = 1e-9
"""Relative max-norm difference allowed between final models (float64): ‖a − b‖∞ / max(1,
‖a‖∞). The implementations differ only in the order of floating-point sums (batched against
per-client products), ~1e-15 per operation; a changed step size or a skipped step is >1e-4."""
SYNTHETIC_STREAM = 0xBE7C
"""The synthetic images' generator is named (seed, 0xBE7C, 1): no (seed, client, round) name."""


# ---------------------------------------------------------------------- workloads
@dataclass(frozen=True)
class Workload:
    """One benchmark configuration (FedAvg).

    Attributes:
        name: ``logreg``, ``conv``, ``resnet20`` or ``cnn4``.
        model: a :func:`lit_fedco.core.models.build_model` name, or ``simple_cnn``.
        data: ``digits``, ``mnist``, ``fashion_mnist`` (IDX files from a folder) or
            ``synthetic`` (seeded CIFAR-shaped noise).
        clients: K, clients holding data.
        cohort: m, clients sampled per round.
        per_client: training images per client (0: an IID split of the whole pool).
        local_steps: I.
        batch_size: b.
        lr: the client step size.
        hidden: the model's hidden width (``cnn``) or filters (``conv4``).
    """

    name: str
    model: str
    data: str
    clients: int
    cohort: int
    per_client: int
    local_steps: int
    batch_size: int
    lr: float
    hidden: int = 64

    @property
    def client_steps(self) -> int:
        """Client-steps per round, m × I."""
        return self.cohort * self.local_steps

    def label(self) -> str:
        """A table row's name."""
        data = {"fashion_mnist": "fmnist", "synthetic": "synthetic"}.get(self.data, self.data)
        return (
            f"{self.name} {self.model} {data} K={self.clients} m={self.cohort} "
            f"I={self.local_steps} b={self.batch_size}"
        )


def idx_source(folder: str, name: str = "") -> str:
    """The IDX data set whose four files (training and test images and labels) are in
    ``folder``, or ``""`` where any is missing (the workloads are built from both splits).

    Files are looked for flat in ``folder`` and in torchvision's ``folder/MNIST/raw`` and
    ``folder/FashionMNIST/raw`` (gzipped or not). The two data sets share the file names, so
    which one it is comes from ``name`` (``mnist`` or ``fashion_mnist``) when given, else from
    the layout (``FashionMNIST/raw``: Fashion-MNIST, ``MNIST/raw``: MNIST), else from the
    folder's path (``fashion`` in it: Fashion-MNIST, otherwise MNIST).
    """
    root = Path(folder)
    if not folder or not root.is_dir():
        return ""
    stems = tuple(f"{split}-{kind}-idx{d}-ubyte" for split in ("train", "t10k")
                  for kind, d in (("images", 3), ("labels", 1)))  # fmt: skip

    def holds(base: Path) -> bool:
        return all((base / s).is_file() or (base / f"{s}.gz").is_file() for s in stems)

    layouts = {"mnist": root / "MNIST" / "raw", "fashion_mnist": root / "FashionMNIST" / "raw"}
    if name:
        return name if holds(layouts[name]) or holds(root) else ""
    for source, base in layouts.items():
        if holds(base):
            return source
    if holds(root):
        return "fashion_mnist" if "fashion" in str(root.resolve()).lower() else "mnist"
    return ""


def fashion_present(folder: str) -> bool:
    """Whether Fashion-MNIST's files are in ``folder`` (:func:`idx_source`)."""
    return idx_source(folder, "fashion_mnist") == "fashion_mnist"


def make_workloads(
    names: list[str],
    clients: list[int] | None,
    quick: bool,
    conv_model: str = "cnn",
    data_dir: str = FASHION_DIR,
    data_name: str = "",
) -> list[Workload]:
    """The configurations to time, in order.

    - ``logreg``: the embedded digits split IID over K ∈ {10, 100, 1000} (quick: {10, 100}),
      multinomial logistic regression, cohort = all K, I = 5, b = 16.
    - ``conv``: pfl-research's CIFAR-10 benchmark shape on MNIST or Fashion-MNIST when the
      training files are in ``data_dir`` (:func:`idx_source`; ``data_name`` says which, else
      it is inferred): 1000 clients × 50 images, cohort 50 (quick: 10), one epoch of b = 10
      (I = 5); on the embedded digits otherwise (100 clients of ~14 images). Model
      ``conv_model``: lit_fedco's ``cnn`` with 128 hidden units (the closest of its models to
      pfl-research's ``simple_cnn``), or ``simple_cnn`` (:class:`SimpleCNN`).
    - ``resnet20``: lit_fedco's ResNet-20 (GroupNorm) on seeded random 3×32×32 images of 10
      classes, 8 clients × 32 images (quick: 2), cohort = all, I = 2, b = 16.
    - ``cnn4``: lit_fedco's ``conv4`` (4 conv blocks, 64 filters) on the ``conv`` data and
      schedule.

    ``clients`` replaces K everywhere (cohort = K for logreg and resnet20, min(cohort, K)
    otherwise).
    """
    img = idx_source(data_dir, data_name) or "digits"
    img_k, img_n = (1000, 50) if img in IDX_SOURCES else (100, 0)
    img_m = 10 if quick else 50
    out: list[Workload] = []
    for name in names:
        if name == "logreg":
            for k in clients or ([10, 100] if quick else [10, 100, 1000]):
                out.append(Workload("logreg", "logreg", "digits", k, k, 0, 5, 16, 0.1))
        elif name in ("conv", "cnn4"):
            model, hidden = (conv_model, 128) if name == "conv" else ("conv4", 64)
            for k in clients or [img_k]:
                out.append(Workload(name, model, img, k, min(img_m, k), img_n, 5, 10, 0.05, hidden))
        elif name == "resnet20":
            for k in clients or [2 if quick else 8]:
                out.append(Workload("resnet20", "resnet20", "synthetic", k, k, 32, 2, 16, 0.05))
    return out


# ---------------------------------------------------------------------- data and models
def build_data(w: Workload, seed: int, data_dir: str = FASHION_DIR):  # -> FederatedData
    """The federated data of ``w``: real images split IID (``per_client`` each, or the whole
    pool; MNIST and Fashion-MNIST from ``data_dir``), or seeded random images. Validation
    (unused here): one held-out row per client.

    Raises:
        ValueError: the folder's training pool holds fewer than K × ``per_client`` images.
    """
    from lit_fedco.core.seeding import generator, numpy_generator
    from lit_fedco.data import build_federated, load_source, partition_iid
    from lit_fedco.data.build import PARTITION_STREAM

    k, n = w.clients, w.per_client
    if w.data == "synthetic":
        g = generator(seed, SYNTHETIC_STREAM, 1)
        x = torch.randn(k * n + k, 3, 32, 32, generator=g)
        y = torch.randint(10, (k * n + k,), generator=g)
        x, y, x_te, y_te, num_classes = x[: k * n], y[: k * n], x[k * n :], y[k * n :], 10
        parts = [np.arange(i * n, (i + 1) * n) for i in range(k)]
    else:
        x, y, x_te, y_te, num_classes = load_source(
            w.data, data_dir if w.data in IDX_SOURCES else ""
        )
        rng = numpy_generator(seed, PARTITION_STREAM)
        if k * n > len(y):
            raise ValueError(
                f"{w.data} in {data_dir!r} has {len(y)} training images; {w.name} needs "
                f"{k} clients × {n} = {k * n} (pass fewer --clients)"
            )
        if n:
            rows = rng.permutation(len(y))[: k * n].reshape(k, n)
            parts = [np.sort(r).astype(np.int64) for r in rows]
        else:
            parts = partition_iid(y.numpy(), k, rng)
    val = [np.array([i % len(y_te)], dtype=np.int64) for i in range(k)]
    return build_federated(x, y, x_te, y_te, parts, val, num_classes, w.data)


def digits_pool_size() -> int:
    """Training images of the embedded digits (the most clients a split can have)."""
    from lit_fedco.data import load_source

    return len(load_source("digits")[1])


class SimpleCNN(nn.Module):
    """pfl-research's ``simple_cnn`` (its CIFAR-10 and FEMNIST benchmarks' model, from Keras's
    MNIST example) without its two dropout layers: 3×3 convolutions of 32 and 64 channels
    (no padding, ReLU), 2×2 max-pooling, a dense layer of 128 and the output; 1.2M parameters
    on 28×28 images. Dropout is left out so that every implementation computes the same
    deterministic step (lit_fedco's vmap forbids unseeded randomness)."""

    def __init__(self, input_shape: tuple[int, ...], outputs: int) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128)
        self.fc2 = nn.Linear(128, outputs)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(torch.relu(self.conv2(torch.relu(self.conv1(x)))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def build_net(w: Workload, input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    """The workload's network, its parameters drawn from a generator seeded by ``seed`` (the
    same initial model in every implementation)."""
    from lit_fedco.core.models import build_model

    if w.model == "simple_cnn":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return SimpleCNN(input_shape, num_classes)
    return build_model(w.model, input_shape, num_classes, seed, hidden=w.hidden)


def conv_model(value: str) -> str:
    """``--conv-model``: one of :data:`CONV_MODELS`, or a researcher's ``MODULE:NAME`` (built
    as ``model.name=MODULE:NAME`` is, with its ``Params`` defaults)."""
    if value in CONV_MODELS or (":" in value and all(value.partition(":")[::2])):
        return value
    raise argparse.ArgumentTypeError(
        f"got {value!r}, expected one of {', '.join(CONV_MODELS)} or MODULE:NAME"
    )


# ---------------------------------------------------------------------- implementations
class PlainLoop:
    """FedAvg as a plain per-client PyTorch loop (the baseline; module docstring).

    Args:
        w: the workload.
        data: the federated data (copied to ``device`` and ``dtype``).
        device, dtype: where and in what the model and data live.
        seed: the initial model's seed and the cohort and minibatch streams' seed.
        lr: the client step size; ``w.lr`` when None.
    """

    def __init__(self, w: Workload, data, device: str, dtype: torch.dtype, seed: int,
                 lr: float | None = None) -> None:  # fmt: skip
        from lit_fedco.data import BatchSampler

        self.w, self.seed = w, seed
        self.lr = w.lr if lr is None else lr
        self.data = data.to(device, dtype)
        self.sampler = BatchSampler(self.data, seed)
        from lit_fedco.core.models import running_stats

        net = build_net(w, tuple(data.x_train.shape[1:]), data.num_classes, seed)
        self.net = net.to(device, dtype)
        self.names = [name for name, _ in self.net.named_parameters()]
        self.weights: list[Tensor] = [p for _, p in self.net.named_parameters()]
        # a batch norm's running statistics: the module's own buffers, which its forward
        # updates; averaged with the parameters (lit_fedco's model.buffers=average)
        buffers = dict(self.net.named_buffers())
        self.names += list(running_stats(self.net))
        self.state = self.weights + [buffers[n] for n in running_stats(self.net)]
        self.server = [p.detach().clone() for p in self.state]
        self.total = [torch.zeros_like(p) for p in self.state]
        self.round_idx = 0

    @torch.no_grad()
    def _start_client(self) -> None:
        torch._foreach_copy_(self.state, self.server)

    def run_round(self) -> None:
        """One FedAvg round: cohort, every client's I local steps, the average."""
        from lit_fedco.core.seeding import sample_cohort

        w = self.w
        cohort = sample_cohort(self.seed, self.round_idx, self.data.num_clients, w.cohort)
        idx = self.sampler.sample_round(
            cohort, self.round_idx, w.local_steps, ("inner",), w.batch_size
        )
        x_all, y_all = self.data.x_train, self.data.y_train
        with torch.no_grad():
            torch._foreach_zero_(self.total)
        for i in range(len(cohort)):
            self._start_client()
            for t in range(w.local_steps):
                rows = idx[t, 0, i]
                loss = F.cross_entropy(self.net(x_all[rows]), y_all[rows])
                grads = torch.autograd.grad(loss, self.weights)
                with torch.no_grad():
                    torch._foreach_add_(self.weights, grads, alpha=-self.lr)
            with torch.no_grad():
                torch._foreach_add_(self.total, self.state)
        with torch.no_grad():
            torch._foreach_div_(self.total, len(cohort))
        self.server, self.total = self.total, self.server
        self.round_idx += 1

    def params(self) -> dict[str, Tensor]:
        """The global model, by parameter name."""
        return dict(zip(self.names, self.server, strict=True))


class LitFedco:
    """FedAvg (or ``updater``, with FedAvg's step size) through
    :class:`~lit_fedco.engine.loop.FederatedLoop` with executor ``executor``, on ``fabric``
    (default: one process on ``device``)."""

    def __init__(self, w: Workload, data, device: str, dtype: torch.dtype, seed: int,
                 executor: str, updater: str = "fedavg", fabric=None) -> None:  # fmt: skip
        from lightning.fabric import Fabric

        from lit_fedco.engine.executors import make_executor
        from lit_fedco.engine.loop import FederatedLoop, LoopConfig
        from lit_fedco.updaters import get_updater

        net = build_net(w, tuple(data.x_train.shape[1:]), data.num_classes, seed)
        cls = get_updater(updater)
        upd = cls(cls.hparams_cls(lr=w.lr), net)
        cfg = LoopConfig(rounds=10**9, local_steps=w.local_steps, cohort=w.cohort,
                         batch_size=w.batch_size, seed=seed, progress=False)  # fmt: skip
        fabric = fabric or Fabric(accelerator=device, devices=1)
        self.loop = FederatedLoop(fabric, upd, data, cfg, make_executor(executor), dtype)

    def run_round(self) -> None:
        self.loop.run_round()

    def params(self) -> dict[str, Tensor]:
        return self.loop.server["x"]


def free_port() -> int:
    """A TCP port free on this machine now (for ``MASTER_PORT``)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_impl(impl: str, w: Workload, data, device: str, dtype: torch.dtype, seed: int):
    """Implementation ``impl`` (one of :data:`IMPLS`) of workload ``w``, at round 0."""
    if impl == "plain":
        return PlainLoop(w, data, device, dtype, seed)
    return LitFedco(w, data, device, dtype, seed, impl)


# ---------------------------------------------------------------------- agreement
def max_rel_diff(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """‖a − b‖∞ / max(1, ‖a‖∞) over all parameters (both must have the same names and
    shapes); inf when they do not."""
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return math.inf
    fa = torch.cat([a[k].detach().double().cpu().flatten() for k in sorted(a)])
    fb = torch.cat([b[k].detach().double().cpu().flatten() for k in sorted(a)])
    return float((fa - fb).abs().max() / max(1.0, float(fa.abs().max())))


def models_agree(a: dict[str, Tensor], b: dict[str, Tensor], tol: float = AGREE_TOL):
    """(whether ``a`` and ``b`` agree within ``tol``, their :func:`max_rel_diff`)."""
    d = max_rel_diff(a, b)
    return d <= tol, d


def agreement(w: Workload, data, device: str, seed: int, rounds: int, impls=IMPLS):
    """Each lit_fedco implementation's :func:`max_rel_diff` from the plain loop after
    ``rounds`` float64 rounds from the same initial model and minibatches; empty when
    ``rounds`` is 0 (no check)."""
    if rounds == 0:
        return {}
    plain = PlainLoop(w, data, device, torch.float64, seed)
    for _ in range(rounds):
        plain.run_round()
    out = {}
    for impl in impls:
        if impl == "plain":
            continue
        other = make_impl(impl, w, data, device, torch.float64, seed)
        for _ in range(rounds):
            other.run_round()
        out[impl] = max_rel_diff(plain.params(), other.params())
    return out


# ---------------------------------------------------------------------- memory
_STATUS = Path("/proc/self/status")


def _status_kb(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _maxrss_kb() -> int:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb // 1024 if sys.platform == "darwin" else kb  # bytes on macOS


class PeakMemory:
    """Peak memory while a block of rounds runs (module docstring for the method)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.method = "cuda max_memory_allocated" if self.cuda else "VmHWM reset per slot"
        self.base = 0
        if not self.cuda and not self._reset_hwm():
            self.method = "ru_maxrss (process high-water mark)"

    @staticmethod
    def _reset_hwm() -> bool:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # return freed heap pages first
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            return False
        return _status_kb("VmHWM") is not None

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            if self.method.startswith("VmHWM"):
                self._reset_hwm()
            self.base = (_status_kb("VmRSS") or _maxrss_kb()) * 1024

    def current(self) -> float:
        """MiB in use now: the resident set after returning freed heap (CPU), or what the
        allocator holds (CUDA)."""
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated() / 2**20
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        return (_status_kb("VmRSS") or _maxrss_kb()) / 1024

    def stop(self) -> tuple[float, float]:
        """(peak MiB, peak above the start MiB)."""
        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        elif self.method.startswith("VmHWM"):
            peak = (_status_kb("VmHWM") or 0) * 1024
        else:
            peak = _maxrss_kb() * 1024
        return peak / 2**20, max(0, peak - self.base) / 2**20


# ---------------------------------------------------------------------- timing
def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_slot(runner, w: Workload, device: str, min_time: float, mem: PeakMemory):
    """Whole rounds for at least ``min_time`` s (and one round): client-steps/s, rounds,
    (peak MiB, working MiB)."""
    mem.start()
    _sync(device)
    start = time.perf_counter()
    rounds = 0
    while True:
        runner.run_round()
        _sync(device)
        rounds += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            break
    return rounds * w.client_steps / elapsed, rounds, mem.stop()


def measure(
    w: Workload, data, args: argparse.Namespace, threads: int, base_mib: float = 0.0
) -> list[dict[str, Any]]:
    """Alternating timed slots of every implementation of ``w``, then the agreement check;
    one record per implementation. ``base_mib``: the memory in use before ``data`` was built
    (:meth:`PeakMemory.current`), for the footprint of the whole simulation."""
    torch.set_num_threads(threads)
    impls = args.impls
    mem = PeakMemory(args.device)
    runners = {i: make_impl(i, w, data, args.device, torch.float32, args.seed) for i in impls}
    for r in runners.values():
        r.run_round()  # warm-up, untimed: allocation, first calls, vmap's tracing
    rates: dict[str, list[float]] = {i: [] for i in impls}
    rounds = dict.fromkeys(impls, 0)
    peak = dict.fromkeys(impls, 0.0)
    work = dict.fromkeys(impls, 0.0)
    for _ in range(args.repeat):
        for impl in impls:
            rate, n, (p, d) = time_slot(runners[impl], w, args.device, args.min_time, mem)
            rates[impl].append(rate)
            rounds[impl] += n
            peak[impl], work[impl] = max(peak[impl], p), max(work[impl], d)
    del runners
    diffs = agreement(w, data, args.device, args.seed, args.check_rounds, impls)
    base = statistics.median(rates["plain"]) if "plain" in rates else None
    records = []
    for impl in impls:
        med = statistics.median(rates[impl])
        diff = diffs.get(impl)
        records.append({
            "workload": w.name, "clients": w.clients, "impl": impl, "threads": threads,
            "client_steps_per_s": med, "client_steps_per_s_runs": rates[impl],
            "ratio_to_plain": med / base if base else None,
            "cohort": w.cohort, "local_steps": w.local_steps, "batch_size": w.batch_size,
            "lr": w.lr, "model": w.model, "data": w.data, "per_client": w.per_client,
            "data_dir": args.data_dir if w.data in IDX_SOURCES else "",
            "rounds_timed": rounds[impl], "device": args.device, "dtype": "float32",
            "peak_mem_mib": peak[impl], "round_mem_mib": work[impl],
            "round_mem_kib_per_cohort_client": work[impl] * 1024 / w.cohort,
            "workload_mem_mib": max(0.0, peak[impl] - base_mib),
            "workload_mem_kib_per_client": max(0.0, peak[impl] - base_mib) * 1024 / w.clients,
            "mem_method": mem.method,
            "max_rel_diff_to_plain": diff,
            "agrees": None if diff is None else diff <= AGREE_TOL,
            "agree_tol": AGREE_TOL, "check_rounds": args.check_rounds,
            "torch": torch.__version__,
        })  # fmt: skip
    return records


def run_processes(spec: dict[str, Any], folder: Path, timeout: float = 3600) -> dict[str, Any]:
    """Run the measurement ``spec`` in a fresh ``python -m lit_fedco.benchmarks.processes``
    (Fabric starts its other processes) and return its record.

    Raises:
        RuntimeError: the measurement failed; the message ends with its standard error.
    """
    import os
    import subprocess

    spec_path, out_path = folder / "spec.json", folder / "out.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    env = {**os.environ, "MASTER_PORT": str(free_port()), "WANDB_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, "-m", "lit_fedco.benchmarks.processes", str(spec_path), str(out_path)],
        capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip
    if proc.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"devices={spec['devices']} failed: {proc.stderr[-2000:]}")
    return json.loads(out_path.read_text())


def measure_processes(
    w: Workload, args: argparse.Namespace, threads: int, plain_rate: float | None
) -> list[dict[str, Any]]:
    """lit_fedco's executors on each of ``args.devices`` CPU processes (``threads`` each),
    every measurement in fresh processes that Fabric starts
    (:mod:`lit_fedco.benchmarks.processes`); one record per (executor, processes). Ratios: to
    ``plain_rate`` (the plain loop's median in this run, one process with ``threads``; FedAvg
    only), and to the same executor on one launched process."""
    import dataclasses
    import tempfile

    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for impl in [i for i in args.impls if i != "plain"]:
            for n in args.devices:
                spec = {
                    "workload": dataclasses.asdict(w), "impl": impl, "updater": args.updater,
                    "devices": n, "threads": threads, "min_time": args.min_time,
                    "repeat": args.repeat, "seed": args.seed, "data_dir": args.data_dir,
                    "system_malloc": args.system_malloc, "shard_data": args.shard_data,
                }  # fmt: skip
                got = run_processes(spec, Path(tmp))
                rate = got["client_steps_per_s"]
                fedavg = args.updater == "fedavg"
                records.append({
                    "workload": w.name, "clients": w.clients, "impl": impl, "threads": threads,
                    "updater": args.updater, **got,
                    "ratio_to_plain": rate / plain_rate if plain_rate and fedavg else None,
                    "cohort": w.cohort, "local_steps": w.local_steps, "batch_size": w.batch_size,
                    "model": w.model, "data": w.data, "device": "cpu", "dtype": "float32",
                    "torch": torch.__version__,
                })  # fmt: skip
            ones = [r for r in records if r["impl"] == impl and r["processes"] == 1]
            for r in records:
                if r["impl"] == impl:
                    one = ones[0]["client_steps_per_s"] if ones else None
                    r["ratio_to_one_process"] = r["client_steps_per_s"] / one if one else None
    return records


def profile_round(w: Workload, data, args: argparse.Namespace, impl: str, rows: int = 15) -> str:
    """torch.profiler's table (self time, top ``rows`` ops) of one round of ``impl``, after a
    warm-up round."""
    from torch.profiler import ProfilerActivity, profile

    runner = make_impl(impl, w, data, args.device, torch.float32, args.seed)
    runner.run_round()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=acts) as prof:
        runner.run_round()
        _sync(args.device)
    key = "self_device_time_total" if args.device == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


# ---------------------------------------------------------------------- output
def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def format_processes(
    records: list[dict[str, Any]], workloads: dict[tuple[str, int], Workload]
) -> str:
    """The ``--devices`` table: each executor on N processes."""
    lines = [
        "processes (--devices): client-steps/s, every timed slot; ratio to the plain loop (one "
        "process, same threads, this run) and to one launched process; per process: peak MiB, "
        "MiB of kept client state (clients held), MiB of client data held",
        f"{'workload':<52}{'thr':>4}  {'impl':<11}{'updater':<9}{'N':>2}  {'slots':<22}"
        f"{'/plain':>7}{'/N=1':>7}  per process",
    ]
    for r in records:
        w = workloads[(r["workload"], r["clients"])]
        slots = " / ".join(_num(x) for x in r["client_steps_per_s_runs"])
        plain = f"{r['ratio_to_plain']:.2f}x" if r["ratio_to_plain"] else "-"
        one = f"{r['ratio_to_one_process']:.2f}x" if r.get("ratio_to_one_process") else "-"
        mem = ", ".join(
            f"{p:.0f} / {k:.1f} ({c}) / {d:.1f}"
            for p, k, c, d in zip(r["peak_mem_mib_per_process"], r["kept_state_mib_per_process"],
                                  r["kept_clients_per_process"], r["data_mib_per_process"],
                                  strict=True)
        )  # fmt: skip
        lines.append(f"{w.label():<52}{r['threads']:>4}  {r['impl']:<11}{r['updater']:<9}"
                     f"{r['processes']:>2}  {slots:<22}{plain:>7}{one:>7}  {mem}")  # fmt: skip
    return "\n".join(lines)


def format_tables(records: list[dict[str, Any]], workloads: dict[tuple[str, int], Workload]) -> str:
    """The throughput table (every slot, like issue 13's) and the memory/agreement table (of
    the one-process records; :func:`format_processes` shows the others)."""
    groups: dict[tuple[str, int, int], dict[str, dict[str, Any]]] = {}
    for r in records:
        if "processes" in r:
            continue
        groups.setdefault((r["workload"], r["clients"], r["threads"]), {})[r["impl"]] = r
    impls = [i for i in IMPLS if any(i in g for g in groups.values())]
    lines = [
        "client-steps/s, every timed slot (ratio: median / plain's median, same run)",
        f"{'workload':<52}{'thr':>4}  " + "".join(f"{i:<22}" for i in impls) + "ratios",
    ]
    for (name, k, thr), g in groups.items():
        w = workloads[(name, k)]
        cells = "".join(
            f"{' / '.join(_num(x) for x in g[i]['client_steps_per_s_runs']):<22}" for i in impls
        )
        ratios = "  ".join(
            f"{i[:3]} {g[i]['ratio_to_plain']:.2f}x"
            for i in impls
            if i != "plain" and g[i]["ratio_to_plain"] is not None
        )
        lines.append(f"{w.label():<52}{thr:>4}  {cells}{ratios}")
    lines += ["", "memory: MiB peak of the process / MiB above the pre-round resident set / KiB of "
              "that per cohort client; KiB per simulated client (the peak above the process "
              "before the data were built: data, all implementations' state, this round, / K); "
              "agreement with the plain loop (float64)"]  # fmt: skip
    lines.append(f"{'workload':<52}{'thr':>4}  " + "".join(f"{i:<34}" for i in impls) + "agree")
    for (name, k, thr), g in groups.items():
        w = workloads[(name, k)]
        cells = "".join(
            f"{g[i]['peak_mem_mib']:>6.0f} /{g[i]['round_mem_mib']:>6.1f} /"
            f"{_num(g[i]['round_mem_kib_per_cohort_client']):>7} /"
            f"{_num(g[i]['workload_mem_kib_per_client']):>8}  "
            for i in impls
        )
        agree = "  ".join(
            f"{i[:3]} {'ok' if g[i]['agrees'] else 'FAIL'} ({g[i]['max_rel_diff_to_plain']:.1e})"
            for i in impls
            if g[i]["agrees"] is not None
        )
        lines.append(f"{w.label():<52}{thr:>4}  {cells}{agree or '(not checked)'}")
    if records:
        lines.append(
            f"memory method: {records[0]['mem_method']}; agreement tolerance "
            f"{AGREE_TOL:g} (relative max-norm), {records[0]['check_rounds']} rounds"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------- command line
class _Parser(argparse.ArgumentParser):
    """argparse, with an error as one line on stderr (exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(
        prog="python -m lit_fedco.benchmarks.throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument(
        "--clients",
        type=int,
        nargs="+",
        default=None,
        help="K for every workload (default: each workload's own)",
    )
    p.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=None,
        help="torch threads; several: each in turn (default: torch's)",
    )
    p.add_argument("--repeat", type=int, default=2, help="timed slots per implementation")
    p.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="seconds per slot, whole rounds (default 2, quick 0.3)",
    )
    p.add_argument(
        "--check-rounds",
        type=int,
        default=2,
        help="float64 rounds of the agreement check (0: no check)",
    )
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--quick", action="store_true", help="fewer clients, shorter slots")
    p.add_argument(
        "--system-malloc",
        action="store_true",
        help="leave glibc's malloc thresholds alone (recipes raise them: "
        "lit_fedco/process/cpu_memory.py)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the records to this file")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--conv-model",
        type=conv_model,
        default="cnn",
        help="the conv workload's net: lit_fedco's cnn (hidden 128), simple_cnn, or your own "
        "MODULE:NAME (built as model.name=MODULE:NAME is; the module on PYTHONPATH)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="folder with the IDX files of MNIST or Fashion-MNIST (flat, or torchvision's "
        "DIR/MNIST/raw, DIR/FashionMNIST/raw) for conv, cnn4; default: Fashion-MNIST from "
        f"{FASHION_DIR} if it is there, else the embedded digits",
    )
    p.add_argument(
        "--data-name",
        choices=IDX_SOURCES,
        default="",
        help="which data set --data-dir holds (default: from the layout, else 'fashion' in "
        "the path)",
    )
    p.add_argument(
        "--fashion-dir",
        default=None,
        help="Fashion-MNIST folder: --data-dir DIR --data-name fashion_mnist ('': the digits)",
    )
    p.add_argument(
        "--profile",
        choices=IMPLS,
        default=None,
        help="print torch.profiler's top ops of one round of this impl",
    )
    p.add_argument(
        "--devices",
        type=int,
        nargs="+",
        default=None,
        help="also run lit_fedco's executors on each of these numbers of CPU processes "
        "(Lightning Fabric, gloo; --threads per process), e.g. --devices 1 2",
    )
    p.add_argument(
        "--updater",
        choices=("fedavg", "scaffold"),
        default="fedavg",
        help="the updater of the --devices runs (scaffold: control variates kept per client, "
        "to see the kept state per process; no ratio to the plain loop then)",
    )
    p.add_argument(
        "--shard-data",
        action="store_true",
        help="the --devices runs hold only their own clients' data rows, as a recipe with "
        "shard_data=true (cohorts split by owner)",
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for key in ("clients", "threads", "devices"):
        bad = [v for v in getattr(args, key) or [] if v < 1]
        if bad:
            p.error(f"--{key}: got {bad[0]}, need integers >= 1")
    if args.repeat < 1:
        p.error(f"--repeat: got {args.repeat}, need an integer >= 1")
    if args.check_rounds < 0:
        p.error(f"--check-rounds: got {args.check_rounds}, need an integer >= 0")
    if args.min_time is None:
        args.min_time = 0.3 if args.quick else 2.0
    if not args.min_time >= 0 or math.isinf(args.min_time):
        p.error(f"--min-time: got {args.min_time}, need a finite number >= 0")
    if args.seed < 0:
        p.error(f"--seed: got {args.seed}, need an integer >= 0")
    if "plain" not in args.impls:
        p.error("--impls: the plain loop is the baseline of every ratio; include plain")
    if args.devices and args.device != "cpu":
        p.error("--devices: CPU processes only (one GPU per process needs several GPUs)")
    if args.updater != "fedavg" and not args.devices:
        p.error("--updater: applies to the --devices runs; add --devices 1 2")
    if args.shard_data and not args.devices:
        p.error("--shard-data: applies to the --devices runs; add --devices 1 2")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here; use --device cpu")
    if args.json is not None and not args.json.parent.is_dir():
        p.error(f"--json: folder {args.json.parent} does not exist")
    if args.fashion_dir is not None:
        if args.data_dir is not None:
            p.error("--fashion-dir: is --data-dir DIR --data-name fashion_mnist; give one of them")
        args.data_dir, args.data_name = args.fashion_dir, args.data_name or "fashion_mnist"
    if args.data_dir is None:  # the Fashion-MNIST package if installed, else the digits
        args.data_dir = FASHION_DIR if idx_source(FASHION_DIR) else ""
    elif args.data_dir and not idx_source(args.data_dir, args.data_name):
        which = args.data_name or "MNIST or Fashion-MNIST"
        p.error(
            f"--data-dir: {args.data_dir!r} does not hold {which}'s four files "
            "(train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
            "t10k-labels-idx1-ubyte; optionally .gz) in it, in DIR/MNIST/raw or in "
            "DIR/FashionMNIST/raw; place all four there"
        )
    args.work = make_workloads(
        args.workloads, args.clients, args.quick, args.conv_model, args.data_dir, args.data_name
    )
    pool = digits_pool_size() if any(w.data == "digits" for w in args.work) else 0
    for w in args.work:
        if w.data in IDX_SOURCES and w.clients * w.per_client > IDX_TRAIN:
            p.error(
                f"--clients: {w.name} gives each client {w.per_client} of {w.data}'s "
                f"{IDX_TRAIN} images, so K <= {IDX_TRAIN // w.per_client}; got {w.clients}"
            )
        if w.data == "digits" and w.clients > pool:
            p.error(
                f"--clients: the embedded digits have {pool} training "
                f"images, so K <= {pool}; got {w.clients}"
            )
    return args


def _import_all() -> None:
    """Import what the implementations use, so that the memory baseline holds the modules."""
    import lightning.fabric  # noqa: F401

    import lit_fedco.data
    import lit_fedco.engine.executors
    import lit_fedco.engine.loop
    import lit_fedco.updaters  # noqa: F401


def _warm_process(device: str, data_dir: str) -> None:
    """One round of every implementation on 2 digits clients, thrown away: the process's
    one-off allocations of first use (thread pools, Fabric, kernels' caches) then happen
    before any memory baseline is taken."""
    w = Workload("logreg", "logreg", "digits", 2, 2, 0, 1, 4, 0.1)
    data = build_data(w, 0, data_dir)
    for impl in IMPLS:
        make_impl(impl, w, data, device, torch.float32, 0).run_round()


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if not args.system_malloc:  # as every recipe runs (the plain loop shares the process)
        keep_freed_memory()
    _import_all()
    _warm_process(args.device, args.data_dir)
    threads = args.threads or [torch.get_num_threads()]
    print(f"lit_fedco throughput: FedAvg, device={args.device}, torch {torch.__version__}, "
          f"threads {threads}, repeat {args.repeat}, min {args.min_time:g} s a slot, "
          f"impls {' '.join(args.impls)}", flush=True)  # fmt: skip
    images = sorted({w.data for w in args.work if w.data in IDX_SOURCES})
    if images:
        print(f"conv data: {images[0]} from {args.data_dir}", flush=True)
    records: list[dict[str, Any]] = []
    by_key = {(w.name, w.clients): w for w in args.work}
    for w in args.work:
        data = None  # the previous workload's, out of the baseline
        base = PeakMemory(args.device).current()
        data = build_data(w, args.seed, args.data_dir)
        for n in threads:
            got = measure(w, data, args, n, base)
            records += got
            line = "  ".join(f"{r['impl']} {_num(r['client_steps_per_s'])}" for r in got)
            print(f"{w.label()} threads={n}: {line} client-steps/s", flush=True)
            if args.devices:
                plain = next(r["client_steps_per_s"] for r in got if r["impl"] == "plain")
                procs = measure_processes(w, args, n, plain)
                records += procs
                line = "  ".join(f"{r['impl']} N={r['processes']} "
                                 f"{_num(r['client_steps_per_s'])}" for r in procs)  # fmt: skip
                print(f"{w.label()} threads={n} per process: {line} client-steps/s", flush=True)
            if args.json is not None:  # written as it grows: a long run keeps what it measured
                args.json.write_text(json.dumps(records, indent=1))
        if args.profile:
            print(f"\nprofile: one {args.profile} round of {w.label()} "
                  f"(threads={threads[-1]})", flush=True)  # fmt: skip
            print(profile_round(w, data, args, args.profile), flush=True)
    print()
    print(format_tables(records, by_key))
    procs = [r for r in records if "processes" in r]
    if procs:
        print()
        print(format_processes(procs, by_key))
    return records


if __name__ == "__main__":
    main()
