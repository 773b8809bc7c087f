"""The plug-in interface: :class:`CompositionalUpdater` (its hyperparameters:
:mod:`lit_fedco.updaters.hparams`).

An updater is a client rule (one local step on one client's state, a pure function that the
executors vmap or loop over) plus a communication rule (what is averaged and what the server
does with it). Writing a new method means overriding :meth:`CompositionalUpdater.client_step`
and, where the server does more than average, :meth:`CompositionalUpdater.server_update`; how
each state entry travels is declared in :attr:`CompositionalUpdater.client_state`.

The round (:func:`lit_fedco.engine.round.federated_round`, written once) calls, in order::

    start  = server entries in broadcast_keys ∪ init_client(server, info)   # to every client
    ctx    = round_context(server, info, probe)                            # probe(fn) on demand
    for t in range(I):
        state, logs = client_step(state, batches_t, ctx.broadcast, info.step(t))
        state[k] = mean of state[k] over the cohort for k declared Sync.STEP
    state  = client_end(state, start, ctx.broadcast, steps completed)
    server = server_update(server, means of the Sync.ROUND entries, ctx, info)

Hooks (override what the method needs): :meth:`~CompositionalUpdater.init_server`,
:meth:`~CompositionalUpdater.init_client`, :meth:`~CompositionalUpdater.round_context`,
:meth:`~CompositionalUpdater.client_step`, :meth:`~CompositionalUpdater.client_end`,
:meth:`~CompositionalUpdater.server_update`, :meth:`~CompositionalUpdater.client_weights`,
:meth:`~CompositionalUpdater.eval_params` (:data:`HOOKS`). Declarations (class attributes):
:attr:`~CompositionalUpdater.client_state`, ``model_key``, ``personal_key``,
``broadcast_keys``, ``roles``, ``compositions``, ``default_problem``, ``aggregation``,
``server_optimizer``, ``unvmappable_models``. :func:`register` refuses a declaration that an
override makes dead.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Generic, TypeVar

from torch import Tensor, nn

from lit_fedco.core.autodiff import grad_and_value, stacked_grad_and_value
from lit_fedco.core.errors import ConfigError
from lit_fedco.core.model_stats import running_stats
from lit_fedco.core.protocol import LOCAL_STATS, Probe, RoundContext, RoundInfo, StepInfo, Sync
from lit_fedco.core.server_opt import ServerOptConfig
from lit_fedco.core.state import State
from lit_fedco.objectives.base import Batch, Context, Objective, model_params
from lit_fedco.updaters.declarations import AGGREGATIONS, HOOKS
from lit_fedco.updaters.declarations import defining_class as defining_class
from lit_fedco.updaters.hparams import Hparams, ServerOptHparams

H = TypeVar("H", bound=Hparams)


class CompositionalUpdater(Generic[H]):
    """Base class of every federated algorithm, generic in its hyperparameters ``H``.

    A subclass names its hyperparameters in the generic parameter
    (``class FedProx(CompositionalUpdater[FedProxHparams])``: :attr:`hparams_cls` follows),
    declares how its state travels (:attr:`client_state`), overrides :meth:`client_step` and
    whatever else of :data:`HOOKS` the method needs, and is registered with :func:`register`.

    Args:
        hparams: an instance of :attr:`hparams_cls`.
        model: the network; used only functionally through the objective.
        objective: the objective to minimise: the one the run's
            :class:`~lit_fedco.problems.Problem` offers for :attr:`compositions` (the
            runner builds it; :attr:`default_problem` when the run names none); plain
            empirical risk when None.
    """

    name: ClassVar[str] = ""
    hparams_cls: ClassVar[type[Hparams]] = Hparams
    """The hyperparameter dataclass: the generic parameter of the class (set automatically)."""
    client_state: ClassVar[dict[str, Sync]] = {"x": Sync.ROUND}
    """How each client-state entry travels (:class:`~lit_fedco.core.protocol.Sync`); entries
    not named are :attr:`Sync.LOCAL`. The server's means are of the ``ROUND`` entries: what a
    client uploads is its ``ROUND`` entries after :meth:`client_end`."""
    model_key: ClassVar[str] = "x"
    """The state entry (server and client) that holds the model's parameters: evaluated, read
    by ``init_from`` and the pre-training, moved by a server optimizer."""
    personal_key: ClassVar[str] = ""
    """A ``Sync.KEEP`` entry holding each client's own model: every client is then evaluated
    with it instead of the shared model (Ditto's ``"personal"``); empty: none."""
    broadcast_keys: ClassVar[tuple[str, ...]] = ("x",)
    """Server-state entries every cohort client starts the round from (those present);
    :meth:`init_client` adds to them."""
    roles: ClassVar[tuple[str, ...]] = ()
    """Independent minibatches each client draws per local step (e.g. ``("grad", "value")``);
    empty: the objective's (``("inner",)``, and ``"outer"`` when its outer function reads a
    batch of its own). The instance's :attr:`batch_roles` is the resolved tuple."""
    compositions: ClassVar[tuple[str, ...]] = ("erm", "local", "distributed", "conditional")
    """Objective kinds this updater applies to, in order of preference."""
    default_problem: ClassVar[str] = ""
    """The problem whose objective this updater trains when the run names none (config
    ``objective``), e.g. ``"sample_dro"`` for the FedDRO family; empty: empirical risk."""
    aggregation: ClassVar[str] = "uniform"
    """How the server weights the clients' uploads in its means: ``"uniform"`` (each of the
    participants counts the same: the papers' 1/m) or ``"samples"`` (by the client's number of
    training samples, n_k / Σ n_k). A round context's ``weights`` replace either."""
    server_optimizer: ClassVar[str] = ""
    """The updater's own server optimizer (:mod:`lit_fedco.core.server_opt`: ``momentum``
    for FedAvgM, ``adam``, ``yogi``), its hyperparameters a :class:`ServerOptHparams`; empty:
    the run's ``server_opt`` (none by default)."""
    unvmappable_models: ClassVar[frozenset[str]] = frozenset()
    """Models (:func:`lit_fedco.core.models.build_model` names) on which this updater's client
    step cannot run under ``vmap``; ``executor=auto`` runs a run with such a pair sequentially
    (:func:`lit_fedco.engine.executors.choose_executor`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "hparams_cls" not in cls.__dict__:
            found = _generic_hparams(cls)
            if found is not None:
                cls.hparams_cls = found

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
        self.local_stats: tuple[str, ...] = ()
        """The running statistics each client keeps (``model.buffers=local``); empty: they
        are averaged with the parameters."""

    def keep_running_stats_local(self) -> None:
        """``model.buffers=local`` (FedBN, Li et al. 2021): every client keeps its model's
        running statistics across rounds in the kept entry :data:`LOCAL_STATS` (its own
        normalisation, trained from its own batches) and is evaluated with them; the averaged
        ones in the server's model are not used by the clients."""
        self.local_stats = running_stats(self.model)
        if self.local_stats:
            self.client_state = {**type(self).client_state, LOCAL_STATS: Sync.KEEP}  # type: ignore[misc]

    # ------------------------------------------------------------------ set-up
    def init_server(self, params: dict[str, Tensor], num_clients: int) -> State:
        """Server state at round 0 from the initial parameters; ``{model_key: params}`` by
        default.

        Args:
            params: the model's initial parameters.
            num_clients: K (DRFL keeps a weight per client).
        """
        return {self.model_key: {k: v.clone() for k, v in params.items()}}

    def init_client(self, server: State, info: RoundInfo) -> State:
        """What a cohort client starts the round from besides the server's
        :attr:`broadcast_keys` entries (what is broadcast, with them): nothing by default.
        Entries declared :attr:`Sync.KEEP` here are their initial values, before a client's
        first round (later rounds restore them from the client's store); a kept entry not given
        here starts as zeros shaped like the model."""
        return {}

    # ------------------------------------------------------------------ client side
    def client_step(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        """One local step of one client. Pure: no in-place updates, no communication.

        Args:
            state: this client's state (unbatched leaves), with its row of the round
                context's ``per_client`` entries.
            batches: one minibatch per role in :attr:`batch_roles`.
            ctx: what the round context broadcasts (the same for every client).
            step: where the step is: ``step.t`` (0 ≤ t < I), ``step.first``, ``step.last``,
                ``step.local_steps`` (I), ``step.round``.

        Returns:
            The new state and a dict of scalar logs (e.g. the batch loss).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement client_step")

    def client_step_stacked(
        self, states: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> tuple[State, dict[str, Tensor]]:
        """Optional: :meth:`client_step` of n clients at once, written over their stacked states
        and batches (every leaf with a leading client dimension), for the vectorized executor to
        run instead of ``vmap`` of :meth:`client_step` where :meth:`stacked` says it may (the
        gradients from :func:`~lit_fedco.core.autodiff.stacked_grad_and_value` of the
        objective's :meth:`~lit_fedco.objectives.base.Objective.values`). It must compute what
        :meth:`client_step` does for each client. Not implemented by default.

        Returns:
            The new states and the step logs, each ``[n, ...]``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no client_step_stacked")

    def client_step_inplace(
        self, state: State, batches: dict[str, Batch], ctx: Context, step: StepInfo
    ) -> dict[str, Tensor]:
        """Optional: :meth:`client_step` of one client written into ``state``'s tensors in place
        (they are the client's rows of the executor's stacked states), for the sequential
        executor to run where :meth:`inplace` says it may: no new state per step and no
        restacking of the cohort after it, which on a large model cost as much as the step's
        backward. It must leave in ``state`` what :meth:`client_step` returns. Not
        implemented by default.

        Returns:
            The step logs (scalars).
        """
        raise NotImplementedError(f"{type(self).__name__} has no client_step_inplace")

    def loss_gradient(
        self, x: State, batches: dict[str, Batch], ctx: Context, *, stacked: bool = False
    ) -> tuple[State, Tensor]:
        """``(∇ℓ(x; B), ℓ(x; B))`` of the objective's ``value``: at one client's ``x`` (in
        :meth:`client_step` and :meth:`client_step_inplace`), or, ``stacked``, at the vectorized
        executor's clients' stacked ``x`` (every leaf ``[n, ...]``, in
        :meth:`client_step_stacked`: :func:`~lit_fedco.core.autodiff.stacked_grad_and_value` of
        the objective's ``values``, one forward and one backward for all n, each client's
        gradient the same as its own). A step written with it has the same arithmetic in all
        three forms but for this call."""
        if stacked:
            return stacked_grad_and_value(lambda p: self.objective.values(p, batches, ctx))(x)
        return grad_and_value(lambda p: self.objective.value(p, batches, ctx))(x)

    def _own(self, hook: str) -> bool:
        """Whether optional ``hook`` is implemented by the class that defines
        :meth:`client_step` (a subclass that overrides only :meth:`client_step` must not run
        its parent's fast form of the old step), and ``client_step`` was not replaced on this
        instance alone (a wrapper that records or changes the step must see every step)."""
        if "client_step" in vars(self) and hook not in vars(self):
            return False
        where = defining_class(type(self), hook)
        return where is not CompositionalUpdater and where is defining_class(
            type(self), "client_step"
        )

    def implements(self, hook: str) -> bool:
        """Whether this updater's ``hook`` is its own, not :class:`CompositionalUpdater`'s
        default (the round skips a default end hook)."""
        return hook in vars(self) or defining_class(type(self), hook) is not CompositionalUpdater

    def stacked(self) -> bool:
        """Whether the vectorized executor runs :meth:`client_step_stacked`: the updater's own
        (:meth:`_own`) and the objective has a stacked form
        (:meth:`~lit_fedco.objectives.base.Objective.stacks`)."""
        return self._own("client_step_stacked") and self.objective.stacks()

    def inplace(self) -> bool:
        """Whether the sequential executor runs :meth:`client_step_inplace` (the updater's own,
        :meth:`_own`)."""
        return self._own("client_step_inplace")

    def client_end(self, state: State, start: State, ctx: Context, steps: Tensor) -> State:
        """One client after its last local step, before it uploads its ``ROUND`` entries and
        keeps its ``KEEP`` ones: e.g. SCAFFOLD's new control variate from the round's change.
        The identity by default.

        Args:
            state: the client's state after its local steps (unbatched leaves).
            start: what the client received at the round's start (the broadcast entries).
            ctx: what the round context broadcasts.
            steps: the local steps this client completed, a 0-d tensor of the model's dtype:
                I, or fewer for a client that stopped early (``failures.partial``), or 0 for a
                client that dropped out (``failures.drop``): the hook runs for every cohort
                client, and what it returns for a dropped one is discarded (neither uploaded
                nor kept), so a division by ``steps`` is harmless there; ``steps > 0`` is the
                participant mask.
        """
        return state

    # ------------------------------------------------------------------ server side
    def round_context(self, server: State, info: RoundInfo, probe: Probe) -> RoundContext:
        """The server's decisions for the round (a :class:`RoundContext`). ``probe(fn)`` runs
        ``fn(state, batches)`` on every cohort client at the broadcast point, on its first
        step's minibatches, and returns the values gathered ``[m, ...]`` in cohort order (one
        collective; nothing is probed unless it is called). By default the objective's
        context from its probe (the DRO shift and normaliser), if it has one."""
        obj = self.objective
        if not obj.has_probe:
            return RoundContext()
        return obj.round_context(probe(lambda s, b: obj.probe(s[self.model_key], b, {})))

    def server_update(
        self, server: State, mean: State, ctx: RoundContext, info: RoundInfo
    ) -> State:
        """New server state from the means of the uploads (and of the entries synced every
        step) over the clients that finished (``info.participants`` of them, with
        ``info.participant_samples`` training samples); by default the means and
        ``ctx.server`` replace the server's entries."""
        return {**server, **ctx.server, **mean}

    def client_weights(self, server: State, losses: Tensor) -> Tensor | None:
        """Per-client weights logged at evaluation (``dro/weight_client{k}``), given every
        client's training loss ``[K]``: the objective's implied weights by default (ComFedL's
        softmax(L/γ)). None: nothing to log."""
        return self.objective.client_weights(losses)

    def eval_params(self, server: State) -> dict[str, Tensor]:
        """The parameters evaluated on every client's data: the server's model by default."""
        return server[self.model_key]

    # ------------------------------------------------------------------ helpers
    def params(self) -> dict[str, Tensor]:
        """The model's initial parameters as a dict."""
        return model_params(self.model)

    def server_opt_config(self) -> ServerOptConfig | None:
        """The updater's own server optimizer (:attr:`server_optimizer`, with the
        hyperparameters of :class:`ServerOptHparams`); None: it has none."""
        if not self.server_optimizer:
            return None
        hp = self.hparams
        if not isinstance(hp, ServerOptHparams):
            raise TypeError(
                f"{type(self).__name__} declares server_optimizer = {self.server_optimizer!r} "
                f"but its hyperparameters {type(hp).__name__} are no ServerOptHparams; derive "
                "them from lit_fedco.updaters.base.ServerOptHparams"
            )
        return hp.server_opt(self.server_optimizer)

    def describe(self) -> dict[str, Any]:
        """Logged with the run's config under ``describe``: the updater, its hyperparameters and
        the objective that ran (its class and the parameters it was built with)."""
        return {
            "updater": self.name,
            "hparams": dataclasses.asdict(self.hparams),
            "objective": self.objective.describe(),
        }


def _generic_hparams(cls: type) -> type[Hparams] | None:
    """The hyperparameter dataclass named in ``cls``'s generic base (``Base[MyHparams]``)."""
    for base in cls.__dict__.get("__orig_bases__", ()):
        origin = typing.get_origin(base)
        if isinstance(origin, type) and issubclass(origin, CompositionalUpdater):
            for arg in typing.get_args(base):
                if isinstance(arg, type) and issubclass(arg, Hparams):
                    return arg
    return None


def overridden(cls: type[CompositionalUpdater]) -> list[str]:
    """The hooks (:data:`HOOKS`) ``cls`` defines itself or takes from an unregistered base
    between it and :class:`CompositionalUpdater` (shared machinery such as the FedDRO family's
    base); a registered ancestor's hooks are that updater's, reused."""
    found: list[str] = []
    for klass in cls.__mro__:
        if klass is CompositionalUpdater:
            break
        if klass is not cls and _REGISTRY.get(getattr(klass, "name", "")) is klass:
            break
        found += [h for h in HOOKS if defining_class(cls, h) is klass]
    return found


def check_declarations(cls: type[CompositionalUpdater]) -> None:
    """Refuse declarations that cannot mean what they say (raised at :func:`register`).

    Raises:
        TypeError: naming the class, the declaration and how to fix it.
    """
    where = f"{cls.__module__}.{cls.__qualname__}"
    sync = cls.client_state
    bad = {k: v for k, v in sync.items() if not isinstance(v, Sync)}
    if bad:
        raise TypeError(f"{where}.client_state: {bad} are not Sync values (Sync.ROUND, ...)")
    if cls.personal_key:
        if sync.get(cls.personal_key) is not Sync.KEEP:
            raise TypeError(
                f"{where}.personal_key = {cls.personal_key!r} must name a Sync.KEEP entry of "
                f"client_state, got {sync.get(cls.personal_key)}; declare it Sync.KEEP"
            )
        if "eval_params" in overridden(cls):
            raise TypeError(
                f"{where} declares personal_key = {cls.personal_key!r} and overrides "
                "eval_params, which is then never called (each client is evaluated with its "
                "personal model); drop one of them"
            )
    if cls.aggregation not in AGGREGATIONS:
        raise TypeError(
            f"{where}.aggregation = {cls.aggregation!r}: expected one of {AGGREGATIONS}"
        )
    if cls.server_optimizer and not issubclass(cls.hparams_cls, ServerOptHparams):
        raise TypeError(
            f"{where} declares server_optimizer = {cls.server_optimizer!r} but its "
            f"hyperparameters {cls.hparams_cls.__name__} are not ServerOptHparams; derive "
            "them from lit_fedco.ServerOptHparams"
        )
    if cls.model_key not in cls.broadcast_keys and "init_client" not in overridden(cls):
        raise TypeError(
            f"{where}: the model entry {cls.model_key!r} is not in broadcast_keys "
            f"{cls.broadcast_keys}, so no client would start from the server's model; add it"
        )


_REGISTRY: dict[str, type[CompositionalUpdater]] = {}


def register(name: str, *, override: bool = False):  # type: ignore[no-untyped-def]
    """Class decorator that registers an updater under ``name`` (its config key too)."""

    def deco(cls: type[CompositionalUpdater]) -> type[CompositionalUpdater]:
        if name in _REGISTRY and not override and _REGISTRY[name] is not cls:
            raise ConfigError(
                f"updater name {name!r} is already registered by {_REGISTRY[name].__qualname__}; "
                "choose another name or pass override=True to register(...)"
            )
        check_declarations(cls)
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


def declares_compositions(cls: type[CompositionalUpdater]) -> bool:
    """Whether ``cls`` (or a base of it other than :class:`CompositionalUpdater`) declares its
    :attr:`~CompositionalUpdater.compositions`; one that does not takes the default, and so the
    empirical risk wherever a problem offers it."""
    return any("compositions" in c.__dict__ for c in cls.__mro__ if c is not CompositionalUpdater)


def trained_composition(cls: type[CompositionalUpdater], offers: tuple[str, ...]) -> str | None:
    """The composition updater ``cls`` trains on a problem offering ``offers``: the first of its
    :attr:`~CompositionalUpdater.compositions` offered; None if none is."""
    return next((c for c in cls.compositions if c in offers), None)


def available_updaters() -> list[str]:
    """Names of all registered updaters."""
    return sorted(_REGISTRY)
