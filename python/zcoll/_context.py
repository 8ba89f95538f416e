"""Per-communicator contexts and their registry: the bridge between mpi4py and the C++ engine.

A context is created collectively the first time zcoll sees a communicator and is cached on it
as an MPI attribute, so it is found again in O(1), is not inherited by ``Dup`` and is released
by ``Free``. Making one splits the communicator into nodes (:mod:`zcoll._node`) -- or, for a
communicator derived from one that has a context, takes a block of that context's node pool
(:mod:`zcoll._pool`) -- opens its
messages between nodes (:mod:`zcoll._transport`) and, for the first context of the process,
installs the exit hooks (:mod:`zcoll._exit`). :func:`set_timeout` and :func:`set_tuning` apply
to every live context.
"""

from __future__ import annotations

import weakref
from typing import NoReturn

from mpi4py import MPI

from . import _core, _exit, _node, _pool, _settings, _tuning
from ._registry import ALLGATHER, ALLOCATE, ALLTOALL, BARRIER, COLLECTIVES, OPS, RULE_ORDER_CODES
from ._settings import TUNING_MODES
from ._transport import Transport, barrier_bounded

# Engine order code -> name, "auto" and "eager" included (online tuning's choices).
_ORDER_NAMES = {code: name for name, code in RULE_ORDER_CODES.items()}

__all__ = [
    "Context",
    "Unusable",
    "context",
    "lookup",
    "set_timeout",
    "set_tuning",
]


_live_contexts: weakref.WeakSet[Context] = weakref.WeakSet()


def set_timeout(seconds: float) -> None:
    """Set how long a rank waits for a peer before raising :class:`zcoll.PeerError`.

    Applies to existing and future contexts of this process. The default is 60 s or the value
    of the ``ZCOLL_TIMEOUT`` environment variable. Local: call it on every rank.
    """
    seconds = float(seconds)
    if not seconds > 0:
        raise ValueError("zcoll.set_timeout: seconds must be positive")
    _settings.override("timeout", seconds, "set_timeout")
    for ctx in list(_live_contexts):
        ctx.settings = ctx.settings.replace("set_timeout", timeout=seconds)
        ctx._apply_wait()


def set_tuning(mode: str) -> str:
    """Choose how ``order="auto"`` and ``copy="auto"`` decide.

    Local, but it must be the same on every rank: call it on every rank, between collectives.
    Applies to existing and future communicators of this process.

    Parameters
    ----------
    mode : {"table", "online", "off"}
        "table" (the default, or ``ZCOLL_TUNING``): follow the tuning table where it has a
        rule, the built-in rules elsewhere. "online": also, for calls no rule covers, try each
        order (and the eager path where allowed) on the first calls of each block size and
        keep the fastest (HINT's online selection; one small allreduce per block size).
        "off": built-in rules only.

    Returns
    -------
    str
        The previous mode.
    """
    if mode not in TUNING_MODES:
        raise ValueError(f"zcoll.set_tuning: mode must be one of {TUNING_MODES}, got {mode!r}")
    previous = _settings.get_tuning()
    _settings.override("tuning", mode, "set_tuning")
    for ctx in list(_live_contexts):
        ctx.settings = ctx.settings.replace("set_tuning", tuning=mode)
        ctx.apply_tuning(mode)
    return previous


class Context:
    """zcoll's state for one communicator: its node split and the C++ node context."""

    def __init__(self, comm: MPI.Comm) -> None:
        # Every setting is read first, on every rank: a bad value raises everywhere, before any
        # communication. The context keeps them (set_timeout and set_tuning update them).
        self.settings = s = _settings.settings()
        self.size = comm.size
        self.rank = comm.rank
        self.handle = comm.handle
        derived = _pool.derive(comm, s, _live_contexts)
        if derived is None or derived.layout.multi_node:  # blocking MPI calls follow
            barrier_bounded(comm, _pool.CREATION)
        node = _node.join(comm, s) if derived is None else _node.from_pool(derived)
        # The node pool this context's control block is in: held while the context lives.
        self.pool: _pool.Pool | None = node.pool
        self.node_size = node.size
        self.node_rank = node.rank
        self.local_ranks = node.local_ranks
        self.node_of = node.node_of  # node of each comm rank, named by its lowest comm rank
        self.multi_node = node.multi_node
        self.oversubscribed = node.oversubscribed
        # The NUMA node each node rank runs on (hwloc, or the ZCOLL_TOPOLOGY placement).
        self.numa_nodes = node.numa_nodes
        self.core = node.core
        self.transport = Transport(comm, self.core, self.multi_node, self.oversubscribed)
        # The tuning table's rules for every node size, the same on every rank (rank 0 read it
        # for the full creation of the pool).
        if derived is None:
            node.pool.tuning = _tuning.shared_tuning(comm, s.tuning)
            _pool.register(node.pool)
        self.tuning: _tuning.SharedTuning = node.pool.tuning
        # The irregular collectives' communication patterns (_vcollectives), made on first use.
        self.patterns: dict = {}
        self._tuned = False
        self.apply_tuning(s.tuning)
        _live_contexts.add(self)

    def apply_tuning(self, mode: str) -> None:
        """Local: give the engine the table rules for this node size (none when `mode` is
        "off"), and put online selection in front of it when `mode` is "online"."""
        if self.core.closed:
            return
        # A new engine context has no rules: only a change of mode must clear them.
        fresh = not self._tuned
        self._tuned = True
        table = _tuning.SharedTuning() if mode == "off" else self.tuning
        if not fresh or table.rules or table.reductions or table.pulls:
            self._apply_table(table, fresh)
        if self.multi_node:
            self._apply_internode_rules(table.internode)
        # Online selection runs in the engine (online_tuner.hpp), on one node only: a context
        # spanning nodes resolves "auto" by its rules.
        online = mode == "online" and not self.multi_node
        if online or not fresh:  # a new engine context's is off
            self.core.set_online(online)
        # The one-crossing path (_core.fast_collective) serves this communicator's calls. On
        # several nodes only the irregular collectives take it, with the route of their
        # messages between nodes (none where the extension cannot send: the Python path then
        # raises why).
        route = self.transport.route()
        if self.multi_node and route is None:
            _core.register_fast(self.handle, None)
        elif route is not None:
            _core.register_fast(self.handle, self.core, route)
        else:
            _core.register_fast(self.handle, self.core)

    def _apply_table(self, table: _tuning.SharedTuning, fresh: bool) -> None:
        """Local: the engine's rules, cost models and pull thresholds for this node size from
        `table`; a fresh engine context is only given what the table has for it."""
        for op in COLLECTIVES:
            mine = [
                r.engine_rule()
                for r in table.rules
                if r.collective == op and r.ranks_per_node == self.node_size
            ]
            if mine or not fresh:
                self.core.set_tuning_rules(op, mine)
        for code, pieces in _tuning.reduction_pieces(table.reductions, self.node_size).items():
            if pieces or not fresh:
                self.core.set_reduction_model(code, pieces)
        for call, nbytes in _tuning.pull_thresholds(table.pulls, self.node_size).items():
            if nbytes is not None or not fresh:
                self.core.set_pull_bytes(call, nbytes)

    def online_choice(self, opname: str, block_bytes: int) -> str | None:
        """The order online tuning chose for `opname`'s blocks of `block_bytes` ("eager", an
        order, "auto" where the table or the built-in rule decides), or None while still
        trying (or tuning is off)."""
        code = self.core.online_choice(opname, block_bytes * self.size)
        return None if code is None else _ORDER_NAMES[code]

    def layout(self) -> tuple[int, int]:
        """(nodes, ranks of the largest node): what the table's internode rules match."""
        sizes = [self.node_of.count(leader) for leader in set(self.node_of)]
        return len(sizes), max(sizes)

    def _apply_internode_rules(self, rules: tuple[_tuning.InternodeRule, ...]) -> None:
        """Give the engine's crossing policy the table's internode rules of an alltoall and an
        allgather for these nodes (their round's limit; the allgather's route beyond it)."""
        nodes, per_node = self.layout()
        codes = _tuning.INTERNODE_METHOD_CODES
        for op in (ALLTOALL, ALLGATHER):
            mine = _tuning.internode_rules_for(rules, op, nodes, per_node)
            engine_rules = [
                (r.min_block, r.max_block, codes[r.method], r.concurrency) for r in mine
            ]
            self.core.nodes_set_internode_rules(OPS[op], engine_rules)

    def _apply_wait(self) -> None:
        if not self.core.closed:
            self.core.set_wait(**self.settings.wait_for(self.oversubscribed))

    def allocate(self, nbytes: int) -> _core.ArenaBlock:
        """Collective arena allocation (ranks on other nodes allocate in their own arena)."""
        if self.multi_node:  # pairs with a failing rank's agree() in fail()
            self.agree("empty", _core.op_record(ALLOCATE))
        return self.core.allocate(nbytes)

    def fail(self, opname: str, exc: Exception) -> NoReturn:
        """Publish a local argument error; raises the same error on every rank."""
        message = f"zcoll.{opname}: {exc}"
        type_error = isinstance(exc, TypeError)
        if self.multi_node:
            self.agree(opname, _core.error_record(type_error, message))
        else:
            self.core.fail(type_error, message)
        raise AssertionError("unreachable: a published error raises on every rank")

    def raise_together(self, opname: str, exc: Exception | None) -> None:
        """Collective: every rank raises the first rank's error if any rank has one (`exc`
        is this rank's, or None), else every rank returns. One node barrier on one node."""
        if exc is not None:
            self.fail(opname, exc)
        if self.multi_node:
            self.agree(opname, _core.op_record(BARRIER))
        else:
            self.core.barrier()

    def agree(self, opname: str, record: bytes) -> None:
        """Multi-node only: every rank learns every rank's call record (this rank's is
        `record`, from the engine) and raises the error the ranks of one node would raise
        for those calls -- the same on every rank -- or returns.

        One round of messages between nodes (`Transport.round`): the records of a node travel
        together, one message per ordered pair of nodes."""
        self.transport.round(opname, record)

    def close(self) -> None:
        if _by_handle.get(self.handle, self) is self:  # the handle may already name a new comm
            _core.register_fast(self.handle, None)
        self.core.close()
        self.transport.close()
        self.pool = None


class Unusable:
    """The attribute of a communicator whose context creation gave up waiting for a peer
    (PeerError `why`): every later zcoll call on it raises at once, as on a context whose
    wait gave up, rather than start a creation its late peers would pair with the first."""

    def __init__(self, why: str) -> None:
        self.why = why

    def close(self) -> None:
        pass

    def raise_again(self) -> NoReturn:
        raise _core.PeerError(
            "zcoll: this communicator's zcoll context is unusable after an earlier failure: "
            + self.why
        )


_by_handle: dict[int, Context] = {}  # MPI handle -> context; entries leave when the comm is freed
_keyval = None


def _delete_attribute(comm: MPI.Comm, keyval: int, ctx: Context | Unusable) -> None:  # noqa: ARG001 - MPI callback signature
    if isinstance(ctx, Context) and _by_handle.get(ctx.handle) is ctx:
        del _by_handle[ctx.handle]
    ctx.close()


def _attribute_key() -> int:
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_delete_attribute)
    return _keyval


def has_context(comm: MPI.Comm) -> bool:
    """Local: whether zcoll has made `comm`'s context (the same on every rank of `comm`)."""
    handle = getattr(comm, "handle", None)
    ctx = _by_handle.get(handle) if handle is not None else None
    return ctx is not None and not ctx.core.closed


def lookup(comm: MPI.Comm) -> Context:
    """Fast path of :func:`context` for the collectives' hot path."""
    try:
        return _by_handle[comm.handle]
    except (KeyError, AttributeError):
        return context(comm)


def context(comm: MPI.Comm) -> Context:
    """The zcoll context of `comm`, created collectively on first use."""
    try:
        # mpi4py's stub types every attribute value as `int | Any | None`; ours is a Context.
        ctx: Context | Unusable | None = comm.Get_attr(_attribute_key())  # type: ignore[assignment]
    except AttributeError:
        raise TypeError(
            f"zcoll: expected an mpi4py communicator, got {type(comm).__name__}"
        ) from None
    except MPI.Exception as exc:
        if comm == MPI.COMM_NULL:
            raise ValueError(
                "zcoll: the communicator is MPI.COMM_NULL (freed, or this rank is not in it)"
            ) from None
        raise ValueError(f"zcoll: unusable communicator ({exc.Get_error_string()})") from None
    if isinstance(ctx, Unusable):
        ctx.raise_again()
    if ctx is not None:
        return ctx
    if comm.Is_inter():
        raise TypeError("zcoll: intercommunicators are not supported; use an intracommunicator")
    _exit.install(_close_all)  # before the first engine context exists
    try:
        ctx = Context(comm)
    except _core.PeerError as exc:
        comm.Set_attr(_attribute_key(), Unusable(str(exc)))
        raise
    comm.Set_attr(_attribute_key(), ctx)
    _by_handle[ctx.handle] = ctx
    return ctx


def _close_all() -> None:
    for ctx in list(_live_contexts):
        ctx.close()
