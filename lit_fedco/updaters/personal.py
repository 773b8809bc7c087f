"""Personalised-FL baselines of the ComFedL paper (§5.2): FedMAML (Per-FedAvg, Fallah,
Mokhtari, Ozdaglar 2020) and Ditto (Li, Hu, Beirami, Smith 2021).

- FedMAML: FedAvg on the MAML objective, ``x ← x − η ∇ L_k(x − α ∇L_k(x; B); B̃)`` locally
  (exact second-order meta-gradient), x averaged every I steps.
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

from lit_fedco.objectives.base import Batch, Context, Objective
from lit_fedco.objectives.personalized import MetaLearning, PFLParams
from lit_fedco.state import State, tree_axpy, tree_sub
from lit_fedco.updaters.base import Hparams, register
from lit_fedco.updaters.fedavg import FedAvg


@register("fedmaml")
class FedMAML(FedAvg):
    """FedMAML / Per-FedAvg: FedAvg's local SGD on the MAML composition (module docstring)."""

    compositions: ClassVar[tuple[str, ...]] = ("local",)
    batch_roles: ClassVar[tuple[str, ...]] = ("inner", "outer")  # type: ignore[misc]

    def build_objective(self, model: nn.Module) -> Objective:
        return MetaLearning(model, PFLParams())


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

    def validate(self) -> None:
        super().validate()
        self.require("personal_lr", self.personal_lr > 0, "a float > 0", "0.2")
        self.require("lam", self.lam >= 0, "a float >= 0", "0.1")


@register("ditto")
class Ditto(FedAvg):
    """Ditto: FedAvg for the global model, a persistent personal model per client."""

    hparams_cls = DittoHparams
    compositions: ClassVar[tuple[str, ...]] = ("erm",)
    persistent_keys: ClassVar[tuple[str, ...]] = ("v",)

    def init_client(self, server: State) -> State:
        """x and the anchor w are the broadcast model (sent once); v comes from the client's
        own store (the initial model before its first round)."""
        return {"x": server["x"], "anchor": server["x"], "v": server["x"]}

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: int
    ) -> tuple[State, dict[str, Tensor]]:
        hp = self.hparams
        assert isinstance(hp, DittoHparams)
        new, logs = super().client_step(state, batches, ctx, step)
        gv = grad(lambda p: self.objective.value(p, batches, ctx))(state["v"])
        gv = tree_axpy(hp.lam, tree_sub(state["v"], state["anchor"]), gv)
        v = tree_axpy(-hp.personal_lr, gv, state["v"])
        return {**state, "x": new["x"], "v": v}, logs

    @property
    def personalizes(self) -> bool:
        return True

    def personal_params(self, state: State, support: Batch, ctx: Context) -> dict[str, Tensor]:
        """The client's personal model v_k (Ditto's own adaptation; no extra steps)."""
        return state["v"]
