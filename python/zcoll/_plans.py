"""Persistent collectives: ``alltoall_init`` and ``allgather_init`` return a :class:`Plan`."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from mpi4py import MPI

from . import _core
from ._collectives import _ALLGATHER, _ALLTOALL, IN_PLACE, _new_recvbuf, option_codes
from ._context import Context, lookup
from ._registry import AUTO

__all__ = ["Plan", "allgather_init", "alltoall_init"]

# Tags of a plan's blocks between nodes: one per plan, so ranks that run different plans by
# mistake never match each other's messages (they time out with PeerError instead).
_PLAN_TAG_BASE = 0x10000
_PLAN_TAG_SPAN = 0x10000


_P = TypeVar("_P", bound="PlanMixin")

#: How the blocks of a plan's runs cross nodes, as ``explain()`` says it.
BY_PERSISTENT_REQUESTS = "rank to rank, by persistent MPI requests made once"


def buffer_role(buf, shadowed: bool, *, pulled: bool) -> str:
    """How a plan's buffer takes part in a run, as ``explain()`` names it: "in place", "shared"
    (the arena or the shared heap), "shadowed" (a plain array with an arena copy), "pulled" (a
    plain array its peers read by CMA) or "private" (a plain array this rank fills itself)."""
    if buf is IN_PLACE:
        return "in place"
    if _core.array_in_arena(buf) or _core.in_heap(buf):
        return "shared"
    if shadowed:
        return "shadowed"
    return "pulled" if pulled else "private"


class PlanMixin:
    """What every plan class adds to its engine class: ``copy``, the context manager (which
    frees the plan), ``repr`` and the dict ``explain()`` returns. `_kind` names the class in
    ``repr``; `_summary` says what the plan moves."""

    _kind = "zcoll.Plan"
    #: None on one node, else how a run's blocks cross nodes (``explain()``'s between_nodes).
    _between_nodes: str | None = None
    #: Set once the engine's plan exists. An instance whose construction raised is still
    #: reachable (a traceback's repr of `self`), and the engine's accessors must not be used
    #: on it: they would read a plan that was never made.
    _made = False

    if TYPE_CHECKING:  # provided by the engine class the plan derives from
        copy_mode: str
        order: str
        id: int
        freed: bool
        active: bool

        def free(self) -> None: ...

    def _summary(self) -> str:
        raise NotImplementedError

    def _explained(self, op: str, path: str, why: str, **buffers: object) -> dict[str, object]:
        """``explain()``'s dict: the keys every plan has, with this plan's buffers' roles."""
        return {
            "op": op,
            "path": path,
            "order": self.order,
            "copy": self.copy,
            **buffers,
            "between_nodes": self._between_nodes,
            "why": why,
        }

    @property
    def copy(self) -> str:
        return self.copy_mode

    def __enter__(self: _P) -> _P:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.free()

    def __repr__(self) -> str:
        if not self._made:
            return f"<{self._kind} (not made)>"
        if self.freed:
            return f"<{self._kind} #{self.id} (freed)>"
        return (
            f"<{self._kind} #{self.id} {self._summary()} order={self.order!r} "
            f"copy={self.copy!r}{' active' if self.active else ''}>"
        )


class Plan(PlanMixin, _core.Plan):
    """A persistent collective: every check and decision made once, then run many times.

    Made by :func:`alltoall_init` or :func:`allgather_init` (collective). The counterpart of
    mpi4py's ``comm.Alltoall_init(...)`` -> ``MPI.Prequest``: ``start()`` then ``wait()`` (or
    ``test()``) runs the collective once on the buffers given at creation; ``plan()`` does
    both and returns `recvbuf`.

    Attributes
    ----------
    sendbuf : numpy.ndarray or zcoll.IN_PLACE
        The source, read on every run (write new data into it between runs).
    recvbuf : numpy.ndarray
        The result, complete after ``wait()`` (or a ``test()`` that returned True).
    op : str
        "alltoall" or "allgather".
    order : str
        What ``order="auto"`` resolved to: an order name, or "eager" (small calls: one barrier,
        the data through per-rank slots).
    copy : str
        The copy mode of the block copies ("temporal" for eager plans); what ``copy="auto"``
        resolved to, which may still change on the first runs while it times the hybrid
        threshold.
    active : bool
        Started and not yet waited for.

    Notes
    -----
    ``start()`` does this rank's share of the copies. On the ordered path it first waits for
    every rank to start (one node barrier) and returns once its own copies are done; on the
    eager path it copies this rank's data into its slot and returns at once. ``wait()`` waits
    for the peers' copies (and, eager, pulls this rank's blocks). Between ``start()`` and
    ``wait()`` the send buffer must not change and the receive buffer must not be read.

    Any other zcoll call on the same communicator, including another plan's ``start()``,
    first finishes a started plan: runs complete in the order they were started.

    On a communicator spanning several nodes, blocks between nodes travel by persistent MPI
    point-to-point requests, one tag per plan: ranks of one node that run different plans
    raise ValueError together, ranks on different nodes that do raise
    :class:`zcoll.PeerError` after the timeout; nothing is corrupted either way.

    A plan holds its buffers (dropping your references is safe). Plain NumPy buffers are
    pulled by CMA on every run where a plain call would pull them; otherwise the plan holds a
    shadow in the arena for each buffer that is not there (a run costs one extra copy of that
    buffer, and no staging barrier). ``free()`` is local; using a plan after ``free()``, after
    its communicator was freed or after a peer died raises. A plan is a context manager that
    frees itself.
    """

    def __init__(
        self, ctx: Context, opname: str, sendbuf, recvbuf: np.ndarray, order: int, copy: int
    ) -> None:
        super().__init__(ctx.core, opname, sendbuf, recvbuf, order, copy)
        self._made = True
        self._ctx = ctx

    def _summary(self) -> str:
        return self.op

    def explain(self) -> dict[str, object]:
        """What the plan decided when it was made, and why: every run does the same.

        Returns
        -------
        dict
            ``op``; ``path``, how a run moves this node's blocks: "eager" (through per-rank
            slots, one barrier: small blocks), "ordered" (block copies in the schedule's
            order between two barriers), "pulled" (plain buffers read by CMA from the
            senders' memory, each rank filling its own receive buffer) or "empty" (no bytes);
            ``order`` and ``copy``, as "auto" resolved them (the copy mode may still change
            on the first runs, see :func:`zcoll.alltoall`); ``sendbuf`` and ``recvbuf``, how
            each buffer takes part: "shared" (the arena or the shared heap: read or written
            in place), "shadowed" (a plain array with an arena copy: one more copy per run),
            "pulled" (a plain array read where it is), "private" (a plain array this rank
            writes itself) or "in place"; ``between_nodes``: None on one node, else how
            blocks cross nodes; ``why``: the reasons, in words.
        """
        path = self.path
        send_shadow, recv_shadow = self.shadowed
        why = {
            "empty": "blocks of 0 bytes: a run only agrees",
            "eager": "blocks within the eager size: one barrier beats the ordered copies",
            "ordered": "blocks beyond the eager size: each block copied once, in order",
            "pulled": "plain buffers and enough bytes received: one copy by CMA beats staging",
        }[path]
        return self._explained(
            self.op,
            path,
            why,
            sendbuf=buffer_role(self.sendbuf, send_shadow, pulled=path == "pulled"),
            recvbuf=buffer_role(self.recvbuf, recv_shadow, pulled=False),
        )


class _MultiNodePlan(Plan):
    """A plan on a communicator spanning several nodes: the node part in the engine, blocks
    between nodes by persistent MPI point-to-point requests on the context's private dup, made
    and run by the engine in the same crossing as the node part (``_attach_remote``)."""

    _between_nodes = BY_PERSISTENT_REQUESTS

    def __init__(
        self, ctx: Context, opname: str, sendbuf, recvbuf: np.ndarray, order: int, copy: int
    ) -> None:
        record = ctx.core.record(opname, sendbuf, recvbuf, order, copy, planned=True)
        ctx.agree(f"{opname}_init", record)
        super().__init__(ctx, opname, sendbuf, recvbuf, order, copy)
        self._attach_remote(ctx.transport.check(), _PLAN_TAG_BASE + self.id % _PLAN_TAG_SPAN)


def _plan(opname: str, comm: MPI.Comm, sendbuf, recvbuf, order, copy) -> Plan:
    ctx = lookup(comm)
    label = f"{opname}_init"
    if recvbuf is None:
        recvbuf = _new_recvbuf(ctx, opname, sendbuf, label)
    code, copy_code = option_codes(ctx, label, order, copy)
    if (why := _core.plan_buffers_error(sendbuf, recvbuf)) is not None:
        ctx.fail(label, TypeError(why))
    kind = _MultiNodePlan if ctx.multi_node else Plan
    return kind(ctx, opname, sendbuf, recvbuf, code, copy_code)


def alltoall_init(
    comm: MPI.Comm, sendbuf, recvbuf=None, *, order: str = AUTO, copy: str = AUTO
) -> Plan:
    """A persistent :func:`alltoall`: checked and resolved once, run by ``plan()`` or
    ``plan.start()`` / ``plan.wait()``.

    Collective over `comm`; the counterpart of mpi4py's ``comm.Alltoall_init``.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Intracommunicator.
    sendbuf : numpy.ndarray or zcoll.IN_PLACE
        As for :func:`alltoall`, but a C-contiguous ndarray: the plan reads it in place on
        every run (no copy is made at creation).
    recvbuf : numpy.ndarray, optional
        As for :func:`alltoall`; allocated in the arena (collectively) when omitted.
    order, copy : str
        As for :func:`alltoall`; "auto" is resolved once, here (see :attr:`Plan.order`).

    Returns
    -------
    Plan

    Raises
    ------
    ValueError, TypeError
        On every rank, if any rank's arguments are invalid or disagree with the others'.
    zcoll.PeerError
        If a peer dies or does not arrive within the timeout.

    Examples
    --------
    >>> plan = zcoll.alltoall_init(comm, send, recv)       # doctest: +SKIP
    >>> for step in range(steps):                          # doctest: +SKIP
    ...     send[...] = produce(step)
    ...     consume(plan())
    """
    return _plan(_ALLTOALL, comm, sendbuf, recvbuf, order, copy)


def allgather_init(
    comm: MPI.Comm, sendbuf, recvbuf=None, *, order: str = AUTO, copy: str = AUTO
) -> Plan:
    """A persistent :func:`allgather` (mpi4py's ``comm.Allgather_init``).

    Collective over `comm`. Parameters, returns and errors as for :func:`alltoall_init`; the
    semantics of each run are those of :func:`allgather`.
    """
    return _plan(_ALLGATHER, comm, sendbuf, recvbuf, order, copy)
