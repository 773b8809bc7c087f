"""The plug-in interface: :class:`CompositionalUpdater` and its hyperparameter dataclass.

An updater is a client rule (one local step on one client's state, a pure function that the
executors vmap or loop over) plus a communication rule (what is averaged and what the server
does with it). Writing a new method means overriding :meth:`CompositionalUpdater.client_step`
and, where the server does more than average, :meth:`CompositionalUpdater.server_update`; how
each state entry travels is declared in :attr:`CompositionalUpdater.client_state`.

The round (:func:`lit_fedco.engine.round.federated_round`, written once) calls::

    state   = init_client(server, info)                       # broadcast to every cohort client
    ctx     = round_context(server, info, probes)              # probes only if :attr:`probes`
    for t in range(I):
        state, logs = client_step(state, batches_t, ctx.broadcast, t)    # every cohort client
        state[k] = cohort mean of state[k] for k declared Sync.STEP       # per-step communication
    server  = server_update(server, cohort mean of upload(state), ctx, info)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from torch import Tensor, nn

from lit_fedco.core.errors import ConfigError
from lit_fedco.core.protocol import RoundContext, RoundInfo, Sync
from lit_fedco.core.state import State, tree_map
from lit_fedco.objectives.base import Batch, Context, Objective, model_params


@dataclass(frozen=True)
class Hparams:
    """Hyperparameters shared by every updater; subclass per updater (it is the config schema).

    Attributes:
        lr: η, the client step size.
        local_steps: I for this method, or 0 to take the run's ``local_steps`` (MBSGD and the
            "parallel" baselines are defined with one step per round).
    """

    lr: float = 0.01
    local_steps: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check ranges; raise :class:`ConfigError` naming the key. Extend in subclasses."""
        self.require("lr", self.lr > 0, "a float > 0", "0.01")
        self.require(
            "local_steps", self.local_steps >= 0, "an int >= 0 (0: the run's local_steps)", "0"
        )

    def require(self, field: str, ok: bool, expected: str, example: str) -> None:
        """Raise a :class:`ConfigError` for ``field`` unless ``ok``."""
        if not ok:
            raise ConfigError.bad_value(field, getattr(self, field), expected, example)


H = TypeVar("H", bound=Hparams)


class CompositionalUpdater(Generic[H]):
    """Base class of every federated algorithm, generic in its hyperparameters ``H``.

    Subclasses set :attr:`name` (via :func:`register`), :attr:`hparams_cls`, declare
    :attr:`client_state`, and override :meth:`client_step`; where needed also
    :meth:`init_client`, :meth:`round_context`, :meth:`upload` and :meth:`server_update`.

    Args:
        hparams: an instance of :attr:`hparams_cls`.
        model: the network; used only functionally through the objective.
        objective: the objective to minimise: the one the run's
            :class:`~lit_fedco.objectives.Problem` offers for :attr:`compositions` (the
            runner builds it; :attr:`default_problem` when the run names none); plain
            empirical risk when None.
    """

    name: ClassVar[str] = ""
    hparams_cls: ClassVar[type[Hparams]] = Hparams
    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND}
    """How each client-state entry travels (:class:`~lit_fedco.core.protocol.Sync`); entries not
    named are :attr:`Sync.LOCAL`. The default uploads x for averaging."""
    roles: ClassVar[tuple[str, ...]] = ()
    """Independent minibatches each client draws per local step (e.g. ``("grad", "value")``);
    empty: the objective's (``("inner",)``, and ``"outer"`` when its outer function reads a
    batch of its own). The instance's :attr:`batch_roles` is the resolved tuple."""
    compositions: ClassVar[tuple[str, ...]] = ("erm", "local", "distributed", "conditional")
    """Objective kinds this updater applies to, in order of preference."""
    default_problem: ClassVar[str] = ""
    """The problem whose objective this updater trains when the run names none (config
    ``objective``), e.g. ``"sample_dro"`` for the FedDRO family; empty: empirical risk."""
    needs_probe: ClassVar[bool] = False
    """Whether :meth:`probe` runs every round even when the objective has none (DRFL's
    losses at the broadcast point)."""
    weights_key: ClassVar[str] = ""
    """The server-state entry holding explicit client weights λ (DRFL), logged at every
    evaluation; empty: the objective's implied weights, if any."""
    server_steps: ClassVar[dict[str, str]] = {}
    """Server step sizes: entry → the hyperparameter holding its γ. The server moves such an
    entry from where the clients started, ``e ← e₀ + γ (mean_k e_k − e₀)``, instead of
    replacing it by the mean (DS-FedDRO's γ_x, γ_y; γ = 1 is averaging)."""
    broadcast_keys: ClassVar[tuple[str, ...]] = ("x",)
    """Server-state entries every cohort client starts the round from (those present)."""
    unvmappable_models: ClassVar[frozenset[str]] = frozenset()
    """Models (:func:`lit_fedco.core.models.build_model` names) on which this updater's client step
    cannot run under ``vmap``; ``executor=auto`` runs a run with such a pair sequentially
    (:func:`lit_fedco.engine.executors.choose_executor`)."""

    def __init__(self, hparams: H, model: nn.Module, objective: Objective | None = None) -> None:
        if not isinstance(hparams, self.hparams_cls):
            raise ConfigError(
                f"{self.name or type(self).__name__}: hyperparameters must be a "
                f"{self.hparams_cls.__name__}, got {type(hparams).__name__}"
            )
        self.hparams: H = hparams
        self.model = model
        self.objective = objective if objective is not None else Objective(model)
        if self.objective.composition not in self.compositions:
            raise ConfigError(
                f"{self.name}: objective {type(self.objective).__name__} is "
                f"{self.objective.composition!r}, expected one of {self.compositions}"
            )
        self.batch_roles: tuple[str, ...] = self.roles or (
            ("inner", "outer") if self.objective.outer_needs_batch else ("inner",)
        )

    # ------------------------------------------------------------------ set-up
    def init_server(self, params: dict[str, Tensor], num_clients: int) -> State:
        """Server state at round 0 from the initial parameters; ``{"x": params}`` by default.

        Args:
            params: the model's initial parameters.
            num_clients: K (DRFL keeps a weight per client).
        """
        return {"x": {k: v.clone() for k, v in params.items()}}

    def init_client(self, server: State, info: RoundInfo) -> State:
        """One client's state at the start of a round (what is broadcast): by default the
        server's entries named in :attr:`broadcast_keys`. Entries declared :attr:`Sync.KEEP`
        are the initial values of a client's first round; later rounds restore them from the
        client's store."""
        return {k: server[k] for k in self.broadcast_keys if k in server}

    # ------------------------------------------------------------------ client side
    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: int
    ) -> tuple[State, dict[str, Tensor]]:
        """One local step of one client. Pure: no in-place updates, no communication.

        Args:
            state: this client's state (unbatched leaves), with its row of the round
                context's ``per_client`` entries.
            batches: one minibatch per role in :attr:`batch_roles`.
            ctx: what the round context broadcasts (the same for every client).
            step: the local step index t in [0, I).

        Returns:
            The new state and a dict of scalar logs (e.g. the batch loss).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement client_step")

    @property
    def probes(self) -> bool:
        """Whether the round runs :meth:`probe` on every cohort client (one collective)."""
        return self.needs_probe or self.objective.has_probe

    def probe(self, state: State, batches: dict[str, Batch], ctx: Context) -> Tensor | None:
        """A tensor per client at the broadcast point, on the round's first batches; the round
        gathers the cohort's values (``[m, ...]``) for :meth:`round_context`. By default the
        objective's probe, or, for an objective without one, the client's loss ``F_k(x̄)`` on
        those batches (DRFL's and TR-MAML's ascent)."""
        if not self.objective.has_probe:
            return self.objective.value(state["x"], batches, ctx)
        return self.objective.probe(state["x"], batches, ctx)

    def upload(self, state: State) -> State:
        """What a client sends at the end of the round; averaged over the cohort. Default:
        the entries declared :attr:`Sync.ROUND` (those the state holds)."""
        return {k: state[k] for k, s in self.client_state.items() if s is Sync.ROUND and k in state}

    # ------------------------------------------------------------------ server side
    def round_context(self, server: State, info: RoundInfo, probes: Tensor | None) -> RoundContext:
        """The round's context from the cohort's probe values (``[m, ...]`` in the order of
        ``info.cohort``; None when the method does not probe). The objective's by default
        (the DRO shift and normaliser)."""
        if probes is None:
            return RoundContext()
        return self.objective.round_context(probes)

    def server_update(
        self, server: State, mean: State, ctx: RoundContext, info: RoundInfo
    ) -> State:
        """New server state from the cohort means (of the uploads, and of the entries synced
        every step); by default they and ``ctx.server`` replace the server's entries, and an
        entry with a server step size (:attr:`server_steps`) moves from its starting value
        e₀ (what the round context broadcast, else the server's) by γ (mean − e₀)."""
        new = {**server, **ctx.server, **mean}
        for key, field in self.server_steps.items():
            gamma = getattr(self.hparams, field)
            start = ctx.broadcast.get(key, server.get(key))
            new[key] = tree_map(lambda s, m: s + gamma * (m - s), start, mean[key])
        return new

    def client_weights(self, server: State, losses: Tensor) -> Tensor | None:
        """Per-client weights logged at evaluation (``dro/weight_client{k}``), given every
        client's training loss ``[K]``: the objective's implied weights by default (ComFedL's
        softmax(L/γ)), or the server's explicit λ under :attr:`weights_key` (DRFL, TR-MAML).
        None: nothing to log."""
        if self.weights_key:
            return server[self.weights_key]
        return self.objective.client_weights(losses)

    def eval_params(self, server: State) -> dict[str, Tensor]:
        """The parameters evaluated on every client's data; the server's x by default."""
        return server["x"]

    # ------------------------------------------------------------------ helpers
    def params(self) -> dict[str, Tensor]:
        """The model's initial parameters as a dict."""
        return model_params(self.model)

    def describe(self) -> dict[str, Any]:
        """Logged with the run's config under ``describe``: the updater, its hyperparameters and
        the objective that ran (its class and the parameters it was built with)."""
        return {
            "updater": self.name,
            "hparams": dataclasses.asdict(self.hparams),
            "objective": self.objective.describe(),
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


def combine(
    name: str,
    algorithm: type[CompositionalUpdater],
    *,
    compositions: tuple[str, ...],
    default_problem: str = "",
    hparams_cls: type[Hparams] | None = None,
    doc: str = "",
    unvmappable_models: frozenset[str] = frozenset(),
) -> type[CompositionalUpdater]:
    """Register ``algorithm`` on other objectives under a name of its own: a method that is
    one algorithm on another composition (ComFedL-MAML is ComFedL on the MAML composition,
    TR-MAML is DRFL on it). Only declarations change; no method is overridden.

    Args:
        name: the new updater's name (and config key).
        algorithm: the registered algorithm it runs.
        compositions: the objectives it asks the problem for, in order of preference.
        default_problem: the problem it runs on when the run names none.
        hparams_cls: its hyperparameters (default: the algorithm's).
        doc: its docstring (one line: the method, with the paper's equation).
        unvmappable_models: models its client step cannot run under ``vmap`` on (added to
            the algorithm's :attr:`~CompositionalUpdater.unvmappable_models`).
    """
    attrs: dict[str, Any] = {
        "unvmappable_models": algorithm.unvmappable_models | unvmappable_models,
        "compositions": compositions,
        "default_problem": default_problem or algorithm.default_problem,
        "hparams_cls": hparams_cls or algorithm.hparams_cls,
        "__doc__": doc or algorithm.__doc__,
        "__module__": algorithm.__module__,
    }
    cls = type("".join(w.capitalize() for w in name.split("_")), (algorithm,), attrs)
    return register(name)(cls)


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
