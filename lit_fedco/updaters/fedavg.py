"""FedAvg (McMahan et al. 2017): local SGD on the empirical risk, x averaged every I steps."""

from __future__ import annotations

from torch import Tensor
from torch.func import grad_and_value

from lit_fedco.core.state import State, tree_axpy
from lit_fedco.objectives.base import Batch, Context
from lit_fedco.updaters.base import CompositionalUpdater, H, Hparams, register


@register("fedavg")
class FedAvg(CompositionalUpdater[H]):
    """FedAvg: ``x ← x − η ∇ℓ(x; B)`` locally, ``x̄ ← mean_k x_k`` every I steps.

    The cohort mean is unweighted (each sampled client counts 1/m), as in ComFedL's
    Algorithm 1 line 20, so that the two are compared on the same aggregation.
    """

    hparams_cls = Hparams

    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: int
    ) -> tuple[State, dict[str, Tensor]]:
        g, loss = grad_and_value(lambda p: self.objective.value(p, batches, ctx))(state["x"])
        return {"x": tree_axpy(-self.hparams.lr, g, state["x"])}, {"loss": loss}
