"""Federated few-shot learning (FCSG §5.2): N-way tasks drawn from each client's own classes;
clients scored by query accuracy after adapting on tasks of their held-out rows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import vmap

from lit_fedco.core.models import call
from lit_fedco.core.ranges import Bound
from lit_fedco.core.seeding import generator
from lit_fedco.data import BatchSampler, FederatedData, TaskSampler
from lit_fedco.data.samplers import rows_by_class, sample_task_rows
from lit_fedco.objectives.base import Objective, Params
from lit_fedco.objectives.maml import MAML, FewShot, TaskERM, adapt
from lit_fedco.problems.base import Problem, ProblemParams, register_problem


@dataclass(frozen=True)
class MAMLParams(ProblemParams):
    """Federated few-shot learning (FCSG §5.2); data: ``data.partition=classes``.

    Attributes:
        ways: N classes per task (paper: 5).
        shots: K support images per class (paper: 1 and 5).
        queries: Q query images per class (paper: 15).
        inner_lr: α, the adaptation step size (paper: 0.4).
        inner_steps: adaptation steps in training (paper: 1).
        eval_steps: adaptation steps at evaluation (paper: 3).
        eval_tasks: tasks per client and split at each evaluation.
        first_order: first-order MAML instead of the exact second-order meta-gradient.
    """

    ways: int = 5
    shots: int = 1
    queries: int = 15
    inner_lr: float = 0.4
    inner_steps: int = 1
    eval_steps: int = 3
    eval_tasks: int = 10
    first_order: bool = False

    bounds: ClassVar[dict[str, Bound]] = {
        "ways": Bound("an int >= 2", "5", ge=2),
        **{
            key: Bound("an int >= 1", "5", ge=1)
            for key in ("shots", "queries", "inner_steps", "eval_steps", "eval_tasks")
        },
        "inner_lr": Bound("a float > 0", "0.4", gt=0),
    }


@register_problem("maml")
class MAMLProblem(Problem):
    """FCSG §5.2: conditional MAML for the FCSG family and Local-SCGD(M), task-level ERM for
    FedAvg; all evaluated by query accuracy after ``eval_steps`` adaptation steps."""

    params_cls = MAMLParams
    offers = ("conditional", "erm")

    def num_outputs(self) -> int:
        p = self.params
        assert isinstance(p, MAMLParams)
        return p.ways

    def objectives(self, model: nn.Module) -> dict[str, Objective]:
        p = self.params
        assert isinstance(p, MAMLParams)
        task = (p.ways, p.shots, p.queries)
        return {
            "conditional": MAML(model, *task, p.inner_lr, p.inner_steps, p.first_order),
            "erm": TaskERM(model, *task),
        }

    def sampler(self, objective: Objective, data: FederatedData, seed: int) -> BatchSampler:
        """N-way tasks of K + Q rows per class from each client's own classes."""
        p = self.params
        assert isinstance(p, MAMLParams)
        return TaskSampler(data, seed, p.ways, p.shots + p.queries)

    def eval_classes(self) -> int:
        p = self.params
        assert isinstance(p, MAMLParams)
        return p.ways

    def eval_outputs(
        self,
        objective: Objective,
        params: Params,
        data: tuple[Tensor, Tensor],
        rows: Tensor,
        owner: Tensor,
        chunk: int,
        seed: int,
    ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """Query logits after ``eval_steps`` steps of size α on each task's support set, for
        ``eval_tasks`` tasks per client drawn from its rows by a generator seeded by
        (seed, client) — the same tasks at every evaluation of a run. Clients with too few
        classes are skipped."""
        p = self.params
        assert isinstance(p, MAMLParams) and isinstance(objective, FewShot)
        x_all, y_all = data
        per_class = p.shots + p.queries
        owners = owner.cpu().numpy()
        for k in np.unique(owners).tolist():
            mine = rows[torch.from_numpy(np.flatnonzero(owners == k)).to(rows.device)]
            by_class = {c: r for c, r in rows_by_class(y_all[mine]).items() if len(r) >= per_class}
            if len(by_class) < p.ways:
                continue
            g = generator(seed, k, 0xE7A1)
            local = sample_task_rows(by_class, p.ways, per_class, p.eval_tasks, g)
            sx, sy, qx, qy = objective.split({"x": x_all[mine[local.to(mine.device)]]})

            def one(s: Tensor, q: Tensor) -> Tensor:
                fast = adapt(objective.task_loss, params, s, sy, p.inner_lr, p.eval_steps, True)
                return call(objective.model, fast, q)

            logits = vmap(one)(sx, qx)  # [T, N·Q, N]
            target = qy.repeat(len(sx))
            yield logits.reshape(-1, p.ways), target, torch.full_like(target, k)
