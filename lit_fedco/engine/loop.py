"""The federated loop on Lightning Fabric: a thin driver of cohort sampling → round
(:func:`lit_fedco.engine.round.federated_round`) → evaluation schedule → state dict.

One code path for 1 or N processes: every rank samples the same cohort (seeded by seed and
round), runs its share of the cohort clients, and takes part in every collective. The share is
``cohort[rank::world]`` (balanced), or, for an updater whose clients keep state across rounds
and for data held by owner (``shard_data``: each process holds only its clients' rows,
:meth:`~lit_fedco.data.FederatedData.held_by`), the cohort clients the rank owns (client k on
rank k mod N, :mod:`lit_fedco.engine.store`): a client's kept state and data then live on one
process only and never travel (a rank that owns none of a round's cohort still takes part in
its collectives). The communication schedule depends
only on step counters, never on data, so no rank can skip a collective. The model is not
DDP-wrapped: local steps do not communicate; every collective is one ``fabric.all_reduce`` of
one flat buffer.

Randomness: the cohort of round r comes from a generator seeded by (seed, r); client k's
minibatches in round r from one seeded by (seed, k, r) (:class:`~lit_fedco.data.BatchSampler`).
A run is therefore reproducible from its round counter and server state alone, and the same on
1 and N processes up to the order of floating-point summation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from torch import Tensor

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.protocol import RoundInfo
from lit_fedco.core.seeding import client_generator, client_generators, sample_cohort
from lit_fedco.core.server_opt import ServerOptimizer
from lit_fedco.core.state import State, tree_map
from lit_fedco.data import FederatedData
from lit_fedco.engine.comm import FabricComm
from lit_fedco.engine.evaluation import Evaluator
from lit_fedco.engine.executors import Executor
from lit_fedco.engine.round import federated_round
from lit_fedco.engine.schedule import LoopConfig
from lit_fedco.engine.store import make_store, owned_by, owned_clients
from lit_fedco.problems import Classification, Problem, ProblemParams
from lit_fedco.process import faults
from lit_fedco.updaters.base import CompositionalUpdater

__all__ = ["FederatedLoop", "LoopConfig", "client_generator", "sample_cohort"]


class FederatedLoop:
    """Rounds of cohort sampling, local steps, aggregation and evaluation.

    Args:
        fabric: a launched :class:`lightning.fabric.Fabric`.
        updater: the algorithm.
        data: all clients' data (moved to ``fabric.device``), or the rows of the clients this
            process owns (:meth:`~lit_fedco.data.FederatedData.held_by`).
        cfg: the schedule (the updater's ``local_steps`` hyperparameter, when set, wins).
        executor: vectorized or sequential client execution.
        dtype: floating dtype of parameters and data.
        problem: the task (samplers, conditional samples, evaluation); plain classification
            when None.
    """

    def __init__(
        self,
        fabric: Fabric,
        updater: CompositionalUpdater,
        data: FederatedData,
        cfg: LoopConfig,
        executor: Executor,
        dtype: torch.dtype = torch.float32,
        problem: Problem | None = None,
    ) -> None:
        self.fabric, self.updater, self.cfg, self.executor = fabric, updater, cfg, executor
        self.dtype = dtype
        self.rank, self.world = fabric.global_rank, fabric.world_size
        k = data.num_clients
        cfg.validate(k, self.world)
        if data.held is not None and not torch.equal(data.held, owned_by(self.rank, self.world, k)):
            raise ValueError(
                f"data: holds the rows of clients {data.held.tolist()[:8]}..., but process "
                f"{self.rank} of {self.world} runs clients k with k mod {self.world} = {self.rank}"
            )
        self.local_steps = updater.hparams.local_steps or cfg.local_steps
        self.data = data.to(fabric.device, dtype)
        self.problem = problem or Classification(ProblemParams(), data)
        # The problem may bring its own sampler (few-shot tasks, or positives in every batch).
        self.sampler = self.problem.sampler(updater.objective, self.data, cfg.seed)
        self.comm = FabricComm(fabric, dtype)
        params = updater.init_server(updater.params(), k)
        self.server: State = tree_map(lambda t: t.to(fabric.device, dtype), params)
        # state clients keep across rounds, each client's on the process that owns it
        self.store = make_store(updater, self.server, k, self.rank, self.world)
        # the server optimizer: the updater's own (FedAdam), else the run's (server_opt.name)
        opt = updater.server_opt_config() or cfg.server_opt
        self.server_opt = ServerOptimizer(opt) if opt is not None and opt.name else None
        self.sizes = self.data.sizes("train").cpu()  # every client's, also of held rows only
        self.round = 0
        self.comm_total = 0.0
        self.evaluate_clients = Evaluator(
            updater, self.problem, self.data, executor, self.rank, self.world, cfg.seed,
            cfg.batch_size, cfg.eval_batch, fabric.device,
        )  # fmt: skip
        self.history: list[dict[str, float]] = []

    def run_round(self) -> dict[str, float]:
        """Run round ``self.round`` (:func:`~lit_fedco.engine.round.federated_round`); its logs."""
        cfg, upd = self.cfg, self.updater
        k = self.data.num_clients
        cohort = sample_cohort(cfg.seed, self.round, k, cfg.cohort)
        mine = self.share(cohort)
        info = RoundInfo(self.round, k, cohort, self.local_steps, cfg.seed, self.sizes[cohort])
        roles = upd.batch_roles
        idx = self.sampler.sample_round(mine, self.round, self.local_steps, roles, cfg.batch_size)
        gens = (
            client_generators(cfg.seed, mine.tolist(), self.round)
            if self.problem.draws_conditional(upd.objective)
            else []
        )
        self.fabric.call("on_round_start", loop=self, cohort=cohort)
        res = federated_round(
            upd, self.server, info, mine, lambda t: self._batches(idx, t, roles, gens),
            self.comm, self.executor, self.store, cfg.failures, self.server_opt,
        )  # fmt: skip
        self.server = res.server
        self.comm_total += res.traffic.up + res.traffic.down
        out = {
            **res.logs,
            "comm/up_floats_per_client": float(res.traffic.up),
            "comm/down_floats_per_client": float(res.traffic.down),
            "comm/total_floats_per_client": self.comm_total,
        }
        self.round += 1
        self.fabric.call("on_round_end", loop=self, logs=out)
        return out

    def share(self, cohort: Tensor) -> Tensor:
        """The cohort clients this process runs: the ones it owns when clients keep state or
        data are held by owner (their state and rows are here), else every world-th from its
        rank (balanced)."""
        if self.store.rows or self.data.held is not None:
            return owned_clients(cohort, self.rank, self.world)
        return cohort[self.rank :: self.world].contiguous()  # searchsorted warns on a strided view

    def _batches(
        self, idx: Tensor, t: int, roles: tuple[str, ...], gens: list[torch.Generator]
    ) -> dict[str, dict[str, Tensor]]:
        """Step t's minibatch per role for every client of this rank: one gather each, into
        reused buffers; then the problem's conditional samples, if it draws any."""
        out = {}
        for j, role in enumerate(roles):
            x, y = self.sampler.gather(idx[t, j], role=role)
            out[role] = {"x": x, "y": y}
            if gens:
                out[role] = self.problem.augment(self.updater.objective, out[role], gens)
        return out

    def evaluate(self) -> dict[str, float]:
        """Every client's metrics (:class:`~lit_fedco.engine.evaluation.Evaluator`), then the
        ``on_eval_end`` hook."""
        faults.point("evaluation")
        out = self.evaluate_clients(self.server, self.store, self.dtype)
        self.fabric.call("on_eval_end", loop=self, metrics=out)
        return out

    def run(self, on_round: Callable[[dict[str, float]], None] | None = None) -> dict[str, float]:
        """Run the remaining rounds; evaluate every E rounds and after the last one.

        Args:
            on_round: called with each round's logs (the runner's progress bar, loggers and
                divergence check; raising stops the run).

        Returns:
            The logs of the last evaluated round.
        """
        final: dict[str, float] = {}
        while self.round < self.cfg.rounds:
            logs = self.run_round()
            if self.round % self.cfg.eval_every == 0 or self.round == self.cfg.rounds:
                logs.update(self.evaluate())
                final = logs
            if on_round is not None:
                on_round(logs)
            self.history.append(logs)
        return final

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: round counter, server state, the state clients keep
        across rounds, communication count, the server optimizer's moments (if any).

        Other client state is rebuilt from the server state at every round, and minibatches,
        cohorts and conditional samples are functions of (seed, client, round), so there is no
        other RNG state. With N processes the kept state is gathered from its owners onto
        process 0, which writes checkpoints (one collective; ``"clients"`` is None on the
        others): every process must call it.
        """
        out = {
            "round": self.round,
            "server": self.server,
            "clients": self.store.gather(self.comm),
            "comm_total": self.comm_total,
            "seed": self.cfg.seed,
        }
        if self.server_opt is not None:
            out["server_opt"] = self.server_opt.state_dict()
        return out

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the seed must match."""
        if int(sd["seed"]) != self.cfg.seed:
            raise ConfigError.bad_value(
                "seed", self.cfg.seed, f"the checkpoint's seed {sd['seed']}", str(sd["seed"])
            )
        self.round = int(sd["round"])
        self.comm_total = float(sd["comm_total"])
        self.server = tree_map(lambda t: t.to(self.fabric.device, self.dtype), sd["server"])
        self.store.load(tree_map(lambda t: t.to(self.fabric.device, self.dtype), sd["clients"]))
        if self.server_opt is not None:
            self.server_opt.load_state_dict(
                tree_map(lambda t: t.to(self.fabric.device), sd.get("server_opt", {}))
            )

    def save(self, path: str | Path) -> None:
        """Save :meth:`state_dict` with ``fabric.save`` (rank 0 writes)."""
        self.fabric.save(path, {"loop": self.state_dict()})

    def load(self, path: str | Path) -> None:
        """Resume from a file written by :meth:`save`."""
        if not Path(path).exists():
            raise ConfigError.bad_value(
                "resume", str(path), "an existing checkpoint file", "runs/x.ckpt"
            )
        self.load_state_dict(self.fabric.load(path)["loop"])
