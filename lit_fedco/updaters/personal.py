"""Personalised-FL baselines of the ComFedL paper (§5.2): FedMAML (Per-FedAvg, Fallah,
Mokhtari, Ozdaglar 2020) and Ditto (Li, Hu, Beirami, Smith 2021).

- FedMAML (Per-FedAvg, Algorithm 1): local meta-steps on three independent batches D, D′, D″
  of the client, ``x ← x − β (I − α ∇²L_k(x; D″)) ∇L_k(x − α ∇L_k(x; D); D′)``, x averaged
  every I steps. ``hessian="support"`` takes the Hessian on D instead: then the step is the
  exact gradient of the sampled task's MAML loss, ComFedL-MAML's estimator on the MAML
  composition (the two then differ only in their step sizes).
- Ditto: a global model trained by FedAvg and, on every client, a personal model v_k kept
  across rounds and pulled towards the round's global model w (Ditto, Algorithm 1)::

      x ← x − η ∇L_k(x; B)                           (global, averaged every I steps)
      v_k ← v_k − η_p (∇L_k(v_k; B) + λ (v_k − w))   (personal, never leaves the client)

  Each client is evaluated with its own v_k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn
from torch.func import grad

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.models import BATCH_STATISTICS_MODELS
from lit_fedco.core.protocol import RoundInfo, StepInfo, Sync
from lit_fedco.core.ranges import Bound
from lit_fedco.core.state import State, tree_axpy, tree_sub
from lit_fedco.objectives.base import Batch, Context, Objective
from lit_fedco.objectives.maml import per_fedavg_direction
from lit_fedco.objectives.personalized import MetaLearning
from lit_fedco.updaters.base import register
from lit_fedco.updaters.fedavg import FedAvg
from lit_fedco.updaters.hparams import Hparams

HESSIAN_BATCHES = ("independent", "support")


@dataclass(frozen=True)
class FedMAMLHparams(Hparams):
    """FedMAML (Per-FedAvg) hyperparameters; α is the problem's ``pfl.inner_lr``.

    Attributes:
        lr: β, the meta step size (ComFedL §5.2: 0.1).
        hessian: ``"independent"`` (Per-FedAvg: the Hessian on a third batch D″; default) or
            ``"support"`` (on the adaptation batch D: the exact meta-gradient of the task).
    """

    hessian: str = "independent"

    def validate(self) -> None:
        super().validate()
        self.require("hessian", self.hessian in HESSIAN_BATCHES, f"one of {HESSIAN_BATCHES}",
                     "independent")  # fmt: skip


@register("fedmaml")
class FedMAML(FedAvg[FedMAMLHparams]):
    """FedMAML / Per-FedAvg: local meta-steps on the MAML composition (module docstring)."""

    compositions: ClassVar[tuple[str, ...]] = ("local",)
    default_problem: ClassVar[str] = "pfl"
    unvmappable_models: ClassVar[frozenset[str]] = BATCH_STATISTICS_MODELS

    def __init__(
        self, hparams: FedMAMLHparams, model: nn.Module, objective: Objective | None = None
    ) -> None:
        super().__init__(hparams, model, objective)
        meta = self.objective
        if not isinstance(meta, MetaLearning):
            raise ConfigError(
                f"fedmaml: objective {type(meta).__name__} is not the MAML composition; "
                "run it with objective=pfl"
            )
        if self._independent and meta.inner_steps != 1:
            raise ConfigError(
                f"pfl.inner_steps: got {meta.inner_steps}, but Per-FedAvg's estimator "
                "(fedmaml.hessian=independent) is defined for one adaptation step; set "
                "pfl.inner_steps=1 or fedmaml.hessian=support"
            )
        # D (support), D′ (query) and, for Per-FedAvg's estimator, D″ (Hessian)
        self.batch_roles = (
            ("inner", "outer", "hessian") if self._independent else ("inner", "outer")
        )

    @property
    def _independent(self) -> bool:
        """Whether steps draw the Hessian batch D″ (not for ``hessian="support"`` or
        first-order MAML, which has no Hessian term)."""
        meta = self.objective
        assert isinstance(meta, MetaLearning)
        return self.hparams.hessian == "independent" and not meta.first_order

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        if not self._independent:  # the gradient of the task's MAML loss (FedAvg's step on it)
            return super().client_step(state, batches, ctx, step)
        meta = self.objective
        assert isinstance(meta, MetaLearning)
        s, q, h = batches["inner"], batches["outer"], batches["hessian"]
        u, loss = per_fedavg_direction(
            meta.batch_loss, state["x"], (s["x"], s["y"]), (q["x"], q["y"]), (h["x"], h["y"]),
            meta.inner_lr,
        )  # fmt: skip
        return {**state, "x": tree_axpy(-self.hparams.lr, u, state["x"])}, {"loss": loss}


@dataclass(frozen=True)
class DittoHparams(Hparams):
    """Ditto hyperparameters.

    Attributes:
        lr: η, the global model's step size (ComFedL §5.2: 0.2).
        personal_lr: η_p, the personal models' step size (ComFedL §5.2: 0.2).
        lam: λ, the pull of a personal model towards the global one (ComFedL §5.2: 0.1; grid
            0.05, 0.1, 0.5, 1, 5).
    """

    lr: float = 0.2
    personal_lr: float = 0.2
    lam: float = 0.1

    bounds: ClassVar[dict[str, Bound]] = {
        "personal_lr": Bound("a float > 0", "0.2", gt=0),
        "lam": Bound("a float >= 0", "0.1", ge=0),
    }


@register("ditto")
class Ditto(FedAvg[DittoHparams]):
    """Ditto: FedAvg for the global model, a persistent personal model per client (the kept
    entry ``"personal"``, declared as the :attr:`personal_key`: each client is evaluated with
    it)."""

    compositions: ClassVar[tuple[str, ...]] = ("erm",)
    client_state: ClassVar[dict[str, Sync]] = {
        "x": Sync.ROUND, "anchor": Sync.LOCAL, "personal": Sync.KEEP
    }  # fmt: skip
    personal_key: ClassVar[str] = "personal"

    def init_client(self, server: State, info: RoundInfo) -> State:
        """The anchor w is the broadcast model (sent once, with x); the personal model v comes
        from the client's own store (the initial model before its first round)."""
        return {"anchor": server["x"], "personal": server["x"]}

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        hp = self.hparams
        new, logs = super().client_step(state, batches, ctx, step)
        v = state["personal"]
        gv = grad(lambda p: self.objective.value(p, batches, ctx))(v)
        gv = tree_axpy(hp.lam, tree_sub(v, state["anchor"]), gv)
        return {**state, "x": new["x"], "personal": tree_axpy(-hp.personal_lr, gv, v)}, logs
