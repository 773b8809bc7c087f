"""The plug-in interface: :class:`CompositionalUpdater` and its hyperparameter dataclass.

An updater is a client rule (one local step on one client's state, a pure function that the
executors vmap or loop over) plus a communication rule (what is averaged and what the server
does with it). Writing a new method means overriding :meth:`CompositionalUpdater.client_step`
and, where the server does more than average, :meth:`CompositionalUpdater.server_update`.

The loop calls, per round (``DESIGN.md``, "The data flow of one run")::

    state   = init_client(server)                  # broadcast to every cohort client
    ctx     = round_context(server, probes)        # probes: objective.probe at the broadcast x
    for t in range(I):
        state, logs = client_step(state, batches_t, ctx, t)      # every cohort client
        state[k] = cohort mean of state[k] for k in step_keys    # per-step communication
    server  = server_update(server, cohort mean of upload(state), ctx)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from lit_fedco.errors import ConfigError
from lit_fedco.objectives.base import Batch, Context, Objective, model_params
from lit_fedco.state import State


@dataclass(frozen=True)
class Hparams:
    """Hyperparameters shared by every updater; subclass per updater (it is the config schema).

    Attributes:
        lr: η, the client step size.
    """

    lr: float = 0.01

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check ranges; raise :class:`ConfigError` naming the key. Extend in subclasses."""
        self.require("lr", self.lr > 0, "a float > 0", "0.01")

    def require(self, field: str, ok: bool, expected: str, example: str) -> None:
        """Raise a :class:`ConfigError` for ``field`` unless ``ok``."""
        if not ok:
            raise ConfigError.bad_value(field, getattr(self, field), expected, example)


class CompositionalUpdater:
    """Base class of every federated algorithm.

    Subclasses set :attr:`name` (via :func:`register`), :attr:`hparams_cls`, and override
    :meth:`client_step`; optionally :meth:`build_objective`, :meth:`init_server`,
    :meth:`init_client`, :meth:`upload` and :meth:`server_update`.

    Args:
        hparams: an instance of :attr:`hparams_cls`.
        model: the network; used only functionally through the objective.
        objective: the objective to minimise; :meth:`build_objective` builds it when None
            (the runner passes the one a configured :class:`~lit_fedco.objectives.Problem`
            offers for this updater's compositions).
    """

    name: ClassVar[str] = ""
    hparams_cls: ClassVar[type[Hparams]] = Hparams
    batch_roles: ClassVar[tuple[str, ...]] = ("inner",)
    """Independent minibatches each client draws per local step (e.g. ``("inner", "outer")``)."""
    step_keys: ClassVar[tuple[str, ...]] = ()
    """Client-state entries replaced by their cohort mean after every local step (FedDRO's ȳ)."""
    persistent_keys: ClassVar[tuple[str, ...]] = ()
    """Client-state entries each client keeps across rounds (Ditto's personal model): restored
    at the start of every round the client takes part in, instead of being broadcast."""
    compositions: ClassVar[tuple[str, ...]] = ("erm", "local", "distributed", "conditional")
    """Objective kinds this updater applies to."""
    fixed_local_steps: ClassVar[int | None] = None
    """Local steps per round this method is defined with (MBSGD: 1), or None to take the run's
    ``local_steps``; the runner applies it."""
    client_id_key: ClassVar[str] = ""
    """If set, the loop writes each client's id k (an int64 0-d tensor) into its state under
    this key at the start of every round (DRFL reads its own weight λ_k with it). The id is the
    client's own knowledge, not communication."""
    num_clients: int = 0
    """K, the number of clients; the loop sets it before :meth:`init_server` (DRFL keeps a
    weight per client in the server state)."""

    def __init__(
        self, hparams: Hparams, model: nn.Module, objective: Objective | None = None
    ) -> None:
        if not isinstance(hparams, self.hparams_cls):
            raise ConfigError(
                f"{self.name or type(self).__name__}: hyperparameters must be a "
                f"{self.hparams_cls.__name__}, got {type(hparams).__name__}"
            )
        self.hparams = hparams
        self.model = model
        self.objective = objective if objective is not None else self.build_objective(model)
        if self.objective.composition not in self.compositions:
            raise ConfigError(
                f"{self.name}: objective {type(self.objective).__name__} is "
                f"{self.objective.composition!r}, expected one of {self.compositions}"
            )

    # ------------------------------------------------------------------ set-up
    def build_objective(self, model: nn.Module) -> Objective:
        """The objective this updater minimises; plain empirical risk by default."""
        return Objective(model)

    def init_server(self, params: dict[str, Tensor]) -> State:
        """Server state at round 0 from the initial parameters; ``{"x": params}`` by default."""
        return {"x": {k: v.clone() for k, v in params.items()}}

    def init_client(self, server: State) -> State:
        """One client's state at the start of a round (what is broadcast). Default: ``x``."""
        return {"x": server["x"]}

    # ------------------------------------------------------------------ client side
    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: int
    ) -> tuple[State, dict[str, Tensor]]:
        """One local step of one client. Pure: no in-place updates, no communication.

        Args:
            state: this client's state (unbatched leaves).
            batches: one minibatch per role in :attr:`batch_roles`.
            ctx: the round context (same for every client).
            step: the local step index t in [0, I).

        Returns:
            The new state and a dict of scalar logs (e.g. the batch loss).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement client_step")

    @property
    def uses_probe(self) -> bool:
        """Whether the loop runs :meth:`probe` at the start of each round (one all-reduce)."""
        return self.objective.has_probe

    def probe(self, state: State, batches: dict[str, Batch], ctx: Context) -> Tensor | None:
        """A tensor per client at the broadcast point, on the round's first batches; the loop
        gathers the cohort's values (``[m, ...]``) for :meth:`round_context`. The objective
        decides by default."""
        return self.objective.probe(state["x"], batches["inner"], ctx)

    def upload(self, state: State) -> State:
        """What a client sends at the end of the round; averaged over the cohort."""
        return {"x": state["x"]}

    # ------------------------------------------------------------------ server side
    def round_context(
        self, server: State, probes: Tensor | None, cohort: Tensor | None = None
    ) -> Context:
        """Round context from the cohort's probe values (None without a probe), in the order of
        ``cohort`` (the sorted client ids of the round). Every entry except ``"weights"``
        (logged only) and those whose key starts with ``_`` (kept on the server for
        :meth:`server_update`) counts as broadcast communication."""
        if probes is None:
            return {}
        return self.objective.round_context(probes)

    def server_update(self, server: State, mean: State, ctx: Context) -> State:
        """New server state from the cohort mean of the uploads; replaces by default."""
        return {**server, **mean}

    def client_weights(self, server: State, losses: Tensor) -> Tensor | None:
        """Per-client weights logged at evaluation (``dro/weight_client{k}``), given every
        client's training loss ``[K]``: the objective's implied weights by default (ComFedL's
        softmax(L/γ)); DRFL and TR-MAML log their explicit λ. None: nothing to log."""
        return self.objective.client_weights(losses)

    def eval_params(self, server: State) -> dict[str, Tensor]:
        """The parameters evaluated on every client's data; the server's x by default."""
        return server["x"]

    # ------------------------------------------------------------------ personalisation
    @property
    def personalizes(self) -> bool:
        """Whether each client is evaluated with its own parameters
        (:meth:`personal_params`) instead of the shared :meth:`eval_params`: when the objective
        adapts before evaluation (personalised FL), or the method keeps personal models."""
        return self.objective.eval_adapt_steps > 0

    def personal_params(self, state: State, support: Batch, ctx: Context) -> dict[str, Tensor]:
        """One client's parameters at evaluation (personalised FL, ComFedL §5.2).

        Args:
            state: ``{"x": eval_params(server)}`` plus the client's persistent entries.
            support: the client's fixed evaluation support batch (its own training rows).
            ctx: empty.

        Returns:
            By default the objective's adaptation of x on the support batch (one or a few
            gradient steps, :meth:`~lit_fedco.objectives.Objective.adapt_for_eval`); Ditto
            returns its personal model.
        """
        return self.objective.adapt_for_eval(state["x"], support)

    # ------------------------------------------------------------------ helpers
    def params(self) -> dict[str, Tensor]:
        """The model's initial parameters as a dict."""
        return model_params(self.model)

    def describe(self) -> dict[str, Any]:
        """Logged with the run's config: the updater, its hyperparameters, the objective."""
        return {
            "updater": self.name,
            **dataclasses.asdict(self.hparams),
            **self.objective.describe(),
        }


_REGISTRY: dict[str, type[CompositionalUpdater]] = {}


def register(name: str, *, override: bool = False):  # type: ignore[no-untyped-def]
    """Class decorator that registers an updater under ``name`` (its config key too)."""

    def deco(cls: type[CompositionalUpdater]) -> type[CompositionalUpdater]:
        if name in _REGISTRY and not override and _REGISTRY[name] is not cls:
            raise ConfigError(
                f"updater name {name!r} is already registered by {_REGISTRY[name].__qualname__}; "
                "choose another name or pass override=True to register(...)"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_updater(name: str) -> type[CompositionalUpdater]:
    """The updater class registered under ``name``."""
    if name not in _REGISTRY:
        import difflib

        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"updater: got {name!r}, expected one of {sorted(_REGISTRY)}.{hint} "
            "Register new updaters with @lit_fedco.register('name')."
        )
    return _REGISTRY[name]


def available_updaters() -> list[str]:
    """Names of all registered updaters."""
    return sorted(_REGISTRY)
