"""Learning tasks built from labelled data for the FCSG experiments.

- **Few-shot tasks** (FCSG §5.2): a client's data are whole classes; an N-way K-shot task is N
  of the client's classes, with K support and Q query images of each. :class:`TaskSampler`
  draws the tasks of every local step afresh (task sampling is what makes MAML a *conditional*
  problem: the support set η is drawn given the task ξ). Sources: scikit-learn's digits
  (embedded, 8×8) and Omniglot from a local folder through torchvision (28×28, the
  1028/172/423 class split); copies rotated by 90°, 180°, 270° count as new classes.
- **Imbalanced binary AUPRC task** (FCSG §5.3): classes [0, C/2) negative, [C/2, C) positive,
  a fraction of the training positives removed (:func:`binarize`, :func:`drop_positives`), and
  :class:`PositiveSampler`, which puts positives in every minibatch.

Batch layout of a task batch (rows of one client, one step): ``T`` tasks one after the other,
each ``N`` classes one after the other, each ``K + Q`` rows (support first). The objective
relabels classes 0..N−1 by position, so no label arithmetic happens inside ``vmap``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_fedco.data.federated import BatchSampler, FederatedData, _seed_of, build_federated
from lit_fedco.errors import ConfigError

OMNIGLOT_SPLIT = (1028, 172, 423)
"""Train / validation / test characters (Vinyals et al. 2016; Torchmeta's split sizes)."""

TASK_SOURCES = ("digits", "omniglot")


# ---------------------------------------------------------------------- binary AUPRC task
def binarize(y: Tensor, num_classes: int) -> Tensor:
    """Labels ``1(y >= C/2)``: the first half of the classes negative, the rest positive."""
    return (y >= num_classes // 2).long()


def drop_positives(y: Tensor, fraction: float, rng: np.random.Generator) -> Tensor:
    """Sorted indices of the rows kept after removing ``fraction`` of the positives (y = 1)."""
    if not 0.0 <= fraction < 1.0:
        raise ConfigError.bad_value("data.drop_positive", fraction, "a float in [0, 1)", "0.8")
    labels = y.numpy()
    pos = np.flatnonzero(labels == 1)
    drop = rng.choice(pos, size=round(fraction * len(pos)), replace=False)
    keep = np.setdiff1d(np.arange(len(labels)), drop)
    return torch.from_numpy(keep.astype(np.int64))


def _draw(n: int, k: int, g: torch.Generator) -> Tensor:
    """k indices in [0, n): without replacement when n >= k, with replacement otherwise."""
    if n >= k:
        return torch.randperm(n, generator=g)[:k]
    return torch.randint(n, (k,), generator=g)


class PositiveSampler(BatchSampler):
    """Minibatches with ``positives`` rows drawn from the client's positives and the other
    ``b − positives`` uniformly from all its rows (the AUPRC sampler of FCSG §5.3).

    Seeded by (seed, client, round) like :class:`BatchSampler`.

    Raises:
        ConfigError: a client holds no positive sample.
    """

    def __init__(self, data: FederatedData, seed: int, positives: int) -> None:
        super().__init__(data, seed)
        self.positives = positives
        y = data.y_train.cpu()
        self.pos_rows: list[Tensor] = []
        for k in range(data.num_clients):
            lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
            rows = torch.nonzero(y[lo:hi] == 1).flatten()
            if len(rows) == 0:
                raise ConfigError(
                    f"auprc: client {k} holds no positive sample; use fewer clients "
                    "(data.num_clients) or remove fewer positives (data.drop_positive)"
                )
            self.pos_rows.append(rows)

    def sample_round(
        self, clients: Tensor, round_idx: int, steps: int, roles: tuple[str, ...], batch_size: int
    ) -> Tensor:
        """Global row indices ``[steps, len(roles), n, b]``; the first ``positives`` of each
        batch are positives."""
        p = self.positives
        if batch_size <= p:
            raise ConfigError.bad_value(
                "batch_size", batch_size, f"more than auprc.positives = {p}", str(4 * p)
            )
        n, r = len(clients), len(roles)
        out = torch.empty(steps, r, n, batch_size, dtype=torch.int64)
        for i, k in enumerate(clients.tolist()):
            g = torch.Generator().manual_seed(_seed_of(self.seed, k, round_idx))
            pos, size, base = self.pos_rows[k], self.sizes[k], int(self.offsets[k])
            for s in range(steps):
                for j in range(r):
                    chosen = pos[_draw(len(pos), p, g)]
                    rest = _draw(size, batch_size - p, g)
                    out[s, j, i] = torch.cat([chosen, rest]) + base
        return out.to(self.data.y_train.device)


# ---------------------------------------------------------------------- few-shot tasks
def rows_by_class(y: Tensor) -> dict[int, Tensor]:
    """Row indices of each label present in ``y``."""
    labels = y.cpu()
    return {int(c): torch.nonzero(labels == c).flatten() for c in torch.unique(labels)}


def sample_task_rows(
    by_class: dict[int, Tensor], ways: int, per_class: int, tasks: int, g: torch.Generator
) -> Tensor:
    """Row indices of ``tasks`` tasks, each ``ways`` distinct classes with ``per_class``
    distinct rows, in the task-batch layout (int64 ``[tasks · ways · per_class]``)."""
    classes = list(by_class)
    out = []
    for _ in range(tasks):
        for c in torch.randperm(len(classes), generator=g)[:ways].tolist():
            rows = by_class[classes[c]]
            out.append(rows[torch.randperm(len(rows), generator=g)[:per_class]])
    return torch.cat(out)


def check_tasks(by_class: dict[int, Tensor], ways: int, per_class: int, where: str) -> None:
    """Raise a :class:`ConfigError` unless ``ways`` classes have ``per_class`` rows each."""
    usable = sum(len(r) >= per_class for r in by_class.values())
    if usable < ways:
        raise ConfigError(
            f"maml: {where} has {usable} classes with at least {per_class} images "
            f"(shots + queries), fewer than ways = {ways}; lower maml.ways, maml.shots or "
            "maml.queries, or give each client more classes (data.classes_per_client)"
        )


class TaskSampler(BatchSampler):
    """Fresh N-way tasks from each client's own classes at every local step.

    ``batch_size`` is the number of tasks per step (the meta-batch); a batch holds
    ``batch_size · ways · per_class`` rows (module docstring for the layout). Seeded by
    (seed, client, round) like :class:`BatchSampler`.
    """

    def __init__(self, data: FederatedData, seed: int, ways: int, per_class: int) -> None:
        super().__init__(data, seed)
        self.ways, self.per_class = ways, per_class
        self.by_class: list[dict[int, Tensor]] = []
        for k in range(data.num_clients):
            lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
            local = {c: r + lo for c, r in rows_by_class(data.y_train[lo:hi]).items()}
            check_tasks(local, ways, per_class, f"client {k}")
            self.by_class.append({c: r for c, r in local.items() if len(r) >= per_class})

    def sample_round(
        self, clients: Tensor, round_idx: int, steps: int, roles: tuple[str, ...], batch_size: int
    ) -> Tensor:
        """Global row indices ``[steps, len(roles), n, batch_size · ways · per_class]``."""
        n, r = len(clients), len(roles)
        rows = batch_size * self.ways * self.per_class
        out = torch.empty(steps, r, n, rows, dtype=torch.int64)
        for i, k in enumerate(clients.tolist()):
            g = torch.Generator().manual_seed(_seed_of(self.seed, k, round_idx))
            for s in range(steps):
                for j in range(r):
                    out[s, j, i] = sample_task_rows(
                        self.by_class[k], self.ways, self.per_class, batch_size, g
                    )
        return out.to(self.data.y_train.device)


def with_rotations(x: Tensor, y: Tensor, rotations: int) -> tuple[Tensor, Tensor]:
    """Images [n, C, H, W] and, for r < ``rotations``, copies rotated by r · 90° labelled
    ``y · rotations + r`` (each rotation a class of its own, as in MAML's Omniglot)."""
    if rotations not in (1, 2, 3, 4):
        raise ConfigError.bad_value("data.rotations", rotations, "1, 2, 3 or 4", "4")
    xs = [torch.rot90(x, r, dims=(2, 3)) for r in range(rotations)]
    ys = [y * rotations + r for r in range(rotations)]
    order = torch.arange(len(y) * rotations).view(rotations, -1).t().reshape(-1)
    return torch.cat(xs)[order], torch.cat(ys)[order]


def assign_classes(
    labels: np.ndarray, classes: np.ndarray, num_clients: int, per_client: int, rng: Any
) -> list[np.ndarray]:
    """Each client's rows: whole classes, a disjoint share of ``classes`` (``per_client`` = 0),
    or ``per_client`` classes each, dealt round-robin from a shuffled list so that every class
    goes to about equally many clients, its rows split evenly among them."""
    classes = rng.permutation(classes)
    if per_client == 0:
        holders = {
            int(c): [k] for k, part in enumerate(np.array_split(classes, num_clients)) for c in part
        }
    else:
        if per_client > len(classes):
            raise ConfigError.bad_value(
                "data.classes_per_client",
                per_client,
                f"at most the {len(classes)} classes",
                str(len(classes)),
            )
        holders = {int(c): [] for c in classes}
        deck = np.concatenate([classes] * (num_clients * per_client // len(classes) + 1))
        pos = 0
        for k in range(num_clients):
            mine: set[int] = set()
            while len(mine) < per_client:
                c = int(deck[pos % len(deck)])
                pos += 1
                if c not in mine:
                    mine.add(c)
                    holders[c].append(k)
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c, ks in holders.items():
        rows = rng.permutation(np.flatnonzero(labels == c))
        for k, share in zip(ks, np.array_split(rows, len(ks)), strict=True):
            parts[k].extend(share.tolist())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def omniglot_split(n: int) -> tuple[int, int, int]:
    """Train / validation / test character counts: 1028/172/423 for the full 1623, the same
    proportions for a partial copy."""
    full = sum(OMNIGLOT_SPLIT)
    if n == full:
        return OMNIGLOT_SPLIT
    n_tr, n_va = round(n * OMNIGLOT_SPLIT[0] / full), round(n * OMNIGLOT_SPLIT[1] / full)
    return n_tr, n_va, n - n_tr - n_va


def load_omniglot(data_dir: str | Path) -> tuple[Tensor, Tensor]:
    """All 1623 Omniglot characters (background then evaluation alphabets) as 28×28 images in
    [0, 1] (ink = 1), labelled by character, read by torchvision's ``Omniglot`` class from
    ``data_dir/omniglot-py/images_{background,evaluation}/<alphabet>/<character>/*.png``.

    Raises:
        ConfigError: the folders are not there; the message says where they belong.
    """
    from PIL import Image
    from torchvision.datasets import Omniglot

    if not str(data_dir):
        raise ConfigError(
            "data.data_dir: empty, expected the folder holding omniglot-py/ (the unzipped "
            "images_background and images_evaluation of the Omniglot distribution)"
        )
    root = Path(data_dir).expanduser()

    class _Local(Omniglot):
        """torchvision's class reading unzipped folders (it checks the zip files otherwise)."""

        def _check_integrity(self) -> bool:
            return (Path(self.root) / self._get_target_folder()).is_dir()

    images, labels, offset = [], [], 0
    for background in (True, False):
        try:
            ds = _Local(str(root), background=background, download=False)
        except RuntimeError:
            folder = "images_background" if background else "images_evaluation"
            raise ConfigError(
                f"data.data_dir: got {str(root)!r}, expected the Omniglot folder "
                f"{root / 'omniglot-py' / folder}/<alphabet>/<character>/*.png"
            ) from None
        for i in range(len(ds)):
            img, c = ds[i]
            small = img.resize((28, 28), Image.Resampling.LANCZOS)
            images.append(1.0 - torch.tensor(np.asarray(small, dtype=np.float32)) / 255.0)
            labels.append(c + offset)
        offset += len(ds._characters)
    return torch.stack(images).unsqueeze(1), torch.tensor(labels, dtype=torch.int64)


def make_task_data(spec: Any) -> FederatedData:
    """Few-shot data: each client's training rows are whole meta-training classes, its
    validation rows whole held-out classes (tasks are drawn from them at evaluation).

    - ``digits``: the 1797 digits; ``heldout_classes`` base digits (a fixed choice) and their
      rotations are held out.
    - ``omniglot``: the 1623 characters in a fixed random order split 1028/172/423
      (:func:`omniglot_split`); clients train on the 1028 and are evaluated on the 423 (the
      172 validation characters are unused).

    Classes are dealt by :func:`assign_classes` (``classes_per_client``) with an RNG seeded by
    (seed, 12345); the class split itself is fixed (seed 0), the same for every run.
    """
    if spec.name not in TASK_SOURCES:
        raise ConfigError.bad_value(
            "data.name", spec.name, f"one of {TASK_SOURCES} with partition=classes", "digits"
        )
    if spec.name == "digits":
        from lit_fedco.data.sources import load_digits_arrays

        x, base = load_digits_arrays()
        bases = np.random.default_rng(0).permutation(10)
        h = spec.heldout_classes
        if not 1 <= h <= 9:
            raise ConfigError.bad_value("data.heldout_classes", h, "an int in [1, 9]", "3")
        train_bases, test_bases = bases[h:], bases[:h]
    else:
        x, base = load_omniglot(spec.data_dir)
        chars = np.random.default_rng(0).permutation(int(base.max()) + 1)
        n_tr, n_va = omniglot_split(len(chars))[:2]
        train_bases, test_bases = chars[:n_tr], chars[n_tr + n_va :]
    x, y = with_rotations(x, base, spec.rotations)
    r = spec.rotations
    train_classes = np.concatenate([train_bases * r + i for i in range(r)])
    test_classes = np.concatenate([test_bases * r + i for i in range(r)])
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 12345]))
    labels = y.numpy()
    k, per = spec.num_clients, spec.classes_per_client
    if k < 1:
        raise ConfigError.bad_value("data.num_clients", k, "an int >= 1", "16")
    for classes, what in ((train_classes, "training"), (test_classes, "held-out")):
        if per == 0 and len(classes) < k:
            raise ConfigError.bad_value(
                "data.classes_per_client",
                per,
                f"an int >= 1: the {len(classes)} {what} classes cannot be shared out "
                f"disjointly over {k} clients",
                "6",
            )
    parts = assign_classes(labels, train_classes, k, per, rng)
    val = assign_classes(labels, test_classes, k, per, rng)
    return build_federated(x, y, x, y, parts, val, int(y.max()) + 1, f"{spec.name}_tasks")
