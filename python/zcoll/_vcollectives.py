"""Irregular and neighbourhood collectives: alltoallv, allgatherv, neighbor_*.

Each call is one list of block copies in the node's arena (the engine's vexchange.hpp): the
4-tuples (sender, receiver, send block, receive block) of the communicator's pattern --
every pair for alltoallv and allgatherv, the process topology's edges for the neighbourhood
collectives -- made once per communicator and cached in its context. Per call only the counts
and displacements travel, parsed here from mpi4py's buffer specifications.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
from mpi4py import MPI

from . import _core, _registry
from ._collectives import IN_PLACE, _arena_array, option_codes
from ._context import Context, lookup
from ._plans import BY_PERSISTENT_REQUESTS, PlanMixin, buffer_role
from ._registry import AUTO
from ._transport import VCallArgs

__all__ = [
    "VPlan",
    "allgatherv",
    "allgatherv_init",
    "alltoallv",
    "alltoallv_init",
    "neighbor_allgather",
    "neighbor_allgather_init",
    "neighbor_allgatherv",
    "neighbor_allgatherv_init",
    "neighbor_alltoall",
    "neighbor_alltoall_init",
    "neighbor_alltoallv",
    "neighbor_alltoallv_init",
]

_NONE, _GATHER, _SWAP = 0, 1, 2  # v_in_place codes
_PLAN_TAG = 0x40000  # plans: a range of 64 tags per plan (plan id modulo 4096)
_NO_COUNTS = np.zeros(0, np.int64)
_DENSE_ROLE, _TOPOLOGY_ROLE = 0, 1  # which calls the engine's one-crossing path runs a pattern for
# One crossing into the engine for a call on a known communicator (on one node, or across
# nodes by its route) whose buffer specifications it can parse: returns the receive array, or
# None when the Python path must run the call (first call, a datatype in a specification, an
# error to raise).
_fast = _core.fast_irregular
_ALLTOALLV_CODE = _registry.OPS[_registry.ALLTOALLV]
_ALLGATHERV_CODE = _registry.OPS[_registry.ALLGATHERV]
_NEIGHBOR_ALLTOALL_CODE = _registry.OPS[_registry.NEIGHBOR_ALLTOALL]
_NEIGHBOR_ALLGATHER_CODE = _registry.OPS[_registry.NEIGHBOR_ALLGATHER]
_NEIGHBOR_ALLTOALLV_CODE = _registry.OPS[_registry.NEIGHBOR_ALLTOALLV]
_NEIGHBOR_ALLGATHERV_CODE = _registry.OPS[_registry.NEIGHBOR_ALLGATHERV]


@dataclass(frozen=True)
class Pattern:
    """A communicator's pattern as this rank sees it: the engine's id for it, and this rank's
    send and receive lists as (peer, tag) pairs."""

    id: int  # the node context's pattern id
    sends: np.ndarray  # this rank's send list, (k, 2) int32: peer (-1: PROC_NULL), tag
    recvs: np.ndarray  # this rank's receive list

    @property
    def outdegree(self) -> int:
        return len(self.sends)

    @property
    def indegree(self) -> int:
        return len(self.recvs)


def _edges(peers, tags) -> np.ndarray:
    peers = np.asarray(peers, np.int64).reshape(-1)
    edges = np.empty((peers.size, 2), np.int32)
    edges[:, 0] = np.where(peers < 0, -1, peers)  # every MPI's PROC_NULL is negative
    edges[:, 1] = tags
    return edges


def _topology_lists(comm: MPI.Comm) -> tuple[np.ndarray, np.ndarray] | None:
    """This rank's send and receive lists in MPI's neighbour order, or None without topology.

    Cartesian: per dimension the negative then the positive neighbour, for sending and
    receiving alike; the tag is the direction of travel (2d: positive, 2d + 1: negative), so
    where both neighbours are one rank (a periodic dimension of 2) the block sent toward the
    positive side lands in the receiver's negative slot, as MPI-4.1 specifies."""
    kind = comm.Get_topology()
    if kind == MPI.CART:
        cart = cast(MPI.Cartcomm, comm)
        peers, send_tags, recv_tags = [], [], []
        for dim in range(cart.Get_dim()):
            below, above = cart.Shift(dim, 1)
            peers += [below, above]
            send_tags += [2 * dim + 1, 2 * dim]
            recv_tags += [2 * dim, 2 * dim + 1]
        return _edges(peers, send_tags), _edges(peers, recv_tags)
    if kind == MPI.DIST_GRAPH:
        sources, destinations, _ = cast(MPI.Distgraphcomm, comm).Get_dist_neighbors()
        return _edges(destinations, 0), _edges(sources, 0)
    if kind == MPI.GRAPH:
        neighbours = cast(MPI.Graphcomm, comm).Get_neighbors(comm.rank)
        return _edges(neighbours, 0), _edges(neighbours, 0)
    return None


def _dense_lists(size: int) -> tuple[np.ndarray, np.ndarray]:
    everyone = _edges(np.arange(size), 0)
    return everyone, everyone


def _pattern(ctx: Context, comm: MPI.Comm, opname: str, neighbours: bool) -> Pattern:
    """The communicator's pattern (made collectively on first use, identically on every
    rank); a ValueError on every rank when a neighbourhood call has no topology."""
    key = "neighbours" if neighbours else "dense"
    pattern = ctx.patterns.get(key)
    if pattern is not None:
        return pattern
    if neighbours:
        lists = _topology_lists(comm)
        if lists is None:  # a property of the communicator: every rank raises here
            raise ValueError(
                f"zcoll.{opname}: the communicator has no process topology "
                "(make one with comm.Create_cart, Create_dist_graph_adjacent or Create_dist_graph)"
            )
        gathered = ctx.transport.allgather(comm, lists, f"zcoll.{opname} (its topology)")
        all_sends = tuple(s for s, _ in gathered)
        all_recvs = tuple(r for _, r in gathered)
    else:
        lists = _dense_lists(ctx.size)
        all_sends = all_recvs = (lists[0],) * ctx.size
    local = list(ctx.local_ranks)
    role = _TOPOLOGY_ROLE if neighbours else _DENSE_ROLE
    # Across nodes the engine also needs every rank's lists: its rounds check every pair.
    whole = (list(all_sends), list(all_recvs)) if ctx.multi_node else ([], [])
    pid = ctx.core.v_pattern(
        [all_sends[r] for r in local], [all_recvs[r] for r in local], role, *whole
    )
    pattern = Pattern(pid, lists[0], lists[1])
    ctx.patterns[key] = pattern
    return pattern


# --- buffer specifications --------------------------------------------------------------------


def _is_datatype(ob) -> bool:
    return isinstance(ob, (MPI.Datatype, str))


def _type_name(datatype) -> str:
    return datatype.Get_name() if isinstance(datatype, MPI.Datatype) else repr(datatype)


def _as_datatype_dtype(datatype) -> np.dtype:
    """The NumPy dtype of an mpi4py datatype or typecode string."""
    code = datatype if isinstance(datatype, str) else MPI._typecode(datatype)
    if code is None:
        raise TypeError(f"MPI datatype {_type_name(datatype)} has no NumPy equivalent")
    try:
        return np.dtype(code)
    except TypeError:
        raise TypeError(f"datatype {datatype!r} has no NumPy equivalent") from None


def _is_integral(ob) -> bool:
    return isinstance(ob, (int, np.integer)) and not isinstance(ob, (bool, np.bool_))


def _counts_vector(counts, blocks: int, what: str, stride: bool = False) -> np.ndarray:
    """An integer sequence of `blocks` values, or one integer: the same for every block, or
    (displacements, `stride`) i times it for block i -- mpi4py's readings."""
    if _is_integral(counts):
        value = int(counts)
        if stride:
            return np.arange(blocks, dtype=np.int64) * value
        return np.full(blocks, value, np.int64)
    array = np.asarray(counts)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ValueError(f"{what} must be an integer or a sequence of integers")
    return array.astype(np.int64, copy=False)


def _split_spec(spec, side: str):
    """(array, counts or None, displs or None, datatype or None) of an mpi4py message:
    ``array``; ``[array, counts]``, ``[array, (counts, displs)]``, ``[array, datatype]``;
    ``[array, counts or (counts, displs), datatype]``; ``[array, counts, displs, datatype]``.
    Also ``[array, counts, displs]`` (a zcoll extension: mpi4py reads a third item as the
    datatype and rejects it)."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    items = list(spec)
    if len(items) == 4:
        return items[0], items[1], items[2], items[3]
    if len(items) not in (2, 3):
        raise ValueError(f"{side}: a buffer specification has 1 to 4 items, got {len(items)}")
    buf, counts = items[0], items[1]
    if len(items) == 2 and _is_datatype(counts):
        return buf, None, None, counts
    datatype = items[2] if len(items) == 3 and _is_datatype(items[2]) else None
    displs = items[2] if len(items) == 3 and datatype is None else None
    if isinstance(counts, tuple) and displs is None:
        if len(counts) != 2:
            raise ValueError(f"{side}: a tuple of counts is (counts, displacements)")
        counts, displs = counts
    return buf, counts, displs, datatype


def _array_of(buf, side: str, writable: bool) -> np.ndarray:
    if buf is IN_PLACE:
        raise ValueError(f"{side}: IN_PLACE is not allowed here (MPI has no in-place form)")
    if isinstance(buf, np.ndarray):
        return buf
    if writable:
        raise TypeError(f"{side} must hold a numpy.ndarray, got {type(buf).__name__}")
    return np.asarray(buf)


def _check_datatype(datatype, array: np.ndarray, side: str) -> None:
    if datatype is not None and _as_datatype_dtype(datatype) != array.dtype:
        name = _type_name(datatype)
        raise TypeError(f"{side}: datatype {name} does not match the array's dtype {array.dtype}")


def parse_vector(spec, blocks: int, side: str, writable: bool):
    """(array, counts, displs) in elements of a v-variant's buffer specification with `blocks`
    entries; with no counts the array is split as mpi4py splits it (the first size % blocks
    blocks one element longer)."""
    buf, counts, displs, datatype = _split_spec(spec, side)
    array = _array_of(buf, side, writable)
    _check_datatype(datatype, array, side)
    if counts is None:  # as mpi4py: the first size % blocks blocks one element longer
        each, extra = divmod(array.size, blocks) if blocks else (0, 0)
        counts = np.full(blocks, each, np.int64)
        counts[:extra] += 1
    else:
        counts = _counts_vector(counts, blocks, f"{side} counts")
    if displs is None:
        displs = np.zeros(counts.size, np.int64)
        np.cumsum(counts[:-1], out=displs[1:])
    else:
        displs = _counts_vector(displs, blocks, f"{side} displacements", stride=True)
    return array, counts, displs


def parse_simple(spec, side: str):
    """(array, count) of a regular message: ``array``, ``[array, count]``,
    ``[array, datatype]`` or ``[array, count, datatype]``."""
    buf, count, displs, datatype = _split_spec(spec, side)
    if displs is not None:
        raise ValueError(f"{side}: displacements are not allowed here")
    array = _array_of(buf, side, False)
    _check_datatype(datatype, array, side)
    if count is None:
        return array, array.size
    if not _is_integral(count):
        raise ValueError(f"{side}: the count must be an integer")
    return array, int(count)


# --- one call ---------------------------------------------------------------------------------


@dataclass
class _Call:
    """One rank's irregular call, ready for the engine."""

    send: object  # an ndarray or IN_PLACE
    recv: np.ndarray
    in_place: int
    send_counts: np.ndarray
    send_displs: np.ndarray
    recv_counts: np.ndarray
    recv_displs: np.ndarray


def _engine_args(
    opname: str, pattern: Pattern, call: _Call, code: int, copy_code: int
) -> VCallArgs:
    """The arguments of the engine's vexchange, v_record and VPlan for `call`."""
    return (
        _registry.OPS[opname],
        pattern.id,
        call.send,
        call.recv,
        call.in_place,
        call.send_counts,
        call.send_displs,
        call.recv_counts,
        call.recv_displs,
        code,
        copy_code,
    )


def _run(ctx: Context, opname: str, pattern: Pattern, call: _Call, order, copy) -> np.ndarray:
    code, copy_code = option_codes(ctx, opname, order, copy)
    args = _engine_args(opname, pattern, call, code, copy_code)
    if not ctx.multi_node:
        ctx.core.vexchange(*args)
        return call.recv
    # All of it in one call of the extension: the round between nodes checks every rank's
    # call and counts and carries the blocks up to the size rule; larger ones go rank to rank
    # after the node's part.
    ctx.transport.v_call(args)
    return call.recv


def _uniform(count: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full(blocks, count, np.int64), np.zeros(blocks, np.int64)


def _strided(count: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full(blocks, count, np.int64), np.arange(blocks, dtype=np.int64) * count


def _block_elements(array: np.ndarray, blocks: int, side: str) -> int:
    """Elements per block of a neighbour buffer of `blocks` equal blocks (0: no blocks)."""
    if not blocks:
        return 0
    if array.size % blocks:
        raise ValueError(f"{side}: {array.size} elements cannot be split into {blocks} blocks")
    return array.size // blocks


# --- each operation's arguments as a _Call ------------------------------------------------------
# A preparer turns one rank's (sendbuf, recvbuf) into a _Call, raising TypeError or ValueError
# for what it finds wrong (raised on every rank by the caller); recvbuf=None was replaced by a
# new arena array first (collectively: _new_result).


def _prepare_alltoallv(ctx: Context, pattern: Pattern, sendbuf, recvbuf) -> _Call:
    recv, rcounts, rdispls = parse_vector(recvbuf, pattern.indegree, "recvbuf", True)
    if sendbuf is IN_PLACE:
        return _Call(IN_PLACE, recv, _SWAP, _NO_COUNTS, _NO_COUNTS, rcounts, rdispls)
    send, scounts, sdispls = parse_vector(sendbuf, pattern.outdegree, "sendbuf", False)
    return _Call(send, recv, _NONE, scounts, sdispls, rcounts, rdispls)


def _prepare_allgatherv(ctx: Context, pattern: Pattern, sendbuf, recvbuf) -> _Call:
    recv, rcounts, rdispls = parse_vector(recvbuf, pattern.indegree, "recvbuf", True)
    if sendbuf is IN_PLACE:
        scounts, sdispls = _uniform(int(rcounts[ctx.rank]), pattern.outdegree)
        sdispls[:] = rdispls[ctx.rank]
        return _Call(IN_PLACE, recv, _GATHER, scounts, sdispls, rcounts, rdispls)
    send, count = parse_simple(sendbuf, "sendbuf")
    return _Call(send, recv, _NONE, *_uniform(count, pattern.outdegree), rcounts, rdispls)


def _prepare_neighbor_alltoall(ctx: Context, pattern: Pattern, sendbuf, recvbuf) -> _Call:
    send = _array_of(sendbuf, "sendbuf", False)
    recv = _array_of(recvbuf, "recvbuf", True)
    sblock = _block_elements(send, pattern.outdegree, "sendbuf")
    rblock = _block_elements(recv, pattern.indegree, "recvbuf")
    return _Call(
        send,
        recv,
        _NONE,
        *_strided(sblock, pattern.outdegree),
        *_strided(rblock, pattern.indegree),
    )


def _prepare_neighbor_allgather(ctx: Context, pattern: Pattern, sendbuf, recvbuf) -> _Call:
    send = _array_of(sendbuf, "sendbuf", False)
    recv = _array_of(recvbuf, "recvbuf", True)
    rblock = _block_elements(recv, pattern.indegree, "recvbuf")
    return _Call(
        send,
        recv,
        _NONE,
        *_uniform(send.size, pattern.outdegree),
        *_strided(rblock, pattern.indegree),
    )


def _prepare_neighbor_alltoallv(ctx: Context, pattern: Pattern, sendbuf, recvbuf) -> _Call:
    send, scounts, sdispls = parse_vector(sendbuf, pattern.outdegree, "sendbuf", False)
    recv, rcounts, rdispls = parse_vector(recvbuf, pattern.indegree, "recvbuf", True)
    return _Call(send, recv, _NONE, scounts, sdispls, rcounts, rdispls)


def _prepare_neighbor_allgatherv(ctx: Context, pattern: Pattern, sendbuf, recvbuf) -> _Call:
    send, count = parse_simple(sendbuf, "sendbuf")
    recv, rcounts, rdispls = parse_vector(recvbuf, pattern.indegree, "recvbuf", True)
    return _Call(send, recv, _NONE, *_uniform(count, pattern.outdegree), rcounts, rdispls)


_PREPARERS = {
    _registry.ALLTOALLV: _prepare_alltoallv,
    _registry.ALLGATHERV: _prepare_allgatherv,
    _registry.NEIGHBOR_ALLTOALL: _prepare_neighbor_alltoall,
    _registry.NEIGHBOR_ALLGATHER: _prepare_neighbor_allgather,
    _registry.NEIGHBOR_ALLTOALLV: _prepare_neighbor_alltoallv,
    _registry.NEIGHBOR_ALLGATHERV: _prepare_neighbor_allgatherv,
}
_DENSE_OPS = (_registry.ALLTOALLV, _registry.ALLGATHERV)


def _new_result(ctx: Context, comm: MPI.Comm, opname: str, label: str, pattern: Pattern, sendbuf):
    """The receive array of a call without one, in the arena; an invalid `sendbuf` on any rank
    raises that rank's error on every rank. allgatherv gathers the counts first, with the
    verdicts (as a ``[array, counts]`` specification); the neighbourhood calls know their
    shape locally, and a rank's error is published in the call itself, as any argument error
    (no round of their own)."""
    shape: tuple = ()
    error = None
    try:
        if sendbuf is IN_PLACE:
            raise ValueError("IN_PLACE needs recvbuf, which holds the data")
        send, count = parse_simple(sendbuf, "sendbuf")
        if send.dtype.hasobject:
            raise TypeError("arrays of Python objects cannot be exchanged through shared memory")
        if opname == _registry.NEIGHBOR_ALLGATHER:
            shape = (pattern.indegree, *send.shape)
        elif opname == _registry.NEIGHBOR_ALLTOALL:
            if send.ndim == 1:
                shape = (pattern.indegree * _block_elements(send, pattern.outdegree, "sendbuf"),)
            elif send.ndim == 0 or send.shape[0] != pattern.outdegree:
                raise ValueError(
                    f"sendbuf's first axis must be the out-degree {pattern.outdegree}, "
                    f"got shape {send.shape}"
                )
            else:
                shape = (pattern.indegree, *send.shape[1:])
        elif opname != _registry.ALLGATHERV:
            raise ValueError("recvbuf is required")
    except (TypeError, ValueError) as exc:
        if opname != _registry.ALLGATHERV:
            ctx.fail(label, exc)
        error = (isinstance(exc, TypeError), f"zcoll.{label}: {exc}")
        count = 0
    if opname != _registry.ALLGATHERV:
        return _arena_array(ctx, shape, send.dtype)
    what = f"zcoll.{label} (making its result)"
    gathered = ctx.transport.allgather(comm, (count, error), what)  # counts and verdicts
    for _, failed in gathered:
        if failed is not None:
            raise (TypeError if failed[0] else ValueError)(failed[1])
    counts = np.array([c for c, _ in gathered], np.int64)
    return [_arena_array(ctx, (int(counts.sum()),), send.dtype), counts]


def _new_recvbuf(opname: str, comm: MPI.Comm, sendbuf):
    """The result of a call made without `recvbuf` (collective: see _new_result), so that the
    call then takes the same path as one made with it."""
    ctx = lookup(comm)
    pattern = _pattern(ctx, comm, opname, neighbours=opname not in _DENSE_OPS)
    return _new_result(ctx, comm, opname, opname, pattern, sendbuf)


def _prepared(comm: MPI.Comm, opname: str, label: str, sendbuf, recvbuf):
    """(context, pattern, call) of one rank's arguments; errors raised on every rank."""
    ctx = lookup(comm)
    pattern = _pattern(ctx, comm, opname, neighbours=opname not in _DENSE_OPS)
    if recvbuf is None:
        recvbuf = _new_result(ctx, comm, opname, label, pattern, sendbuf)
    try:
        call = _PREPARERS[opname](ctx, pattern, sendbuf, recvbuf)
    except (TypeError, ValueError) as exc:
        ctx.fail(label, exc)
    return ctx, pattern, call


def _python_path(opname: str, comm: MPI.Comm, sendbuf, recvbuf, order, copy) -> np.ndarray:
    """An irregular call that the engine's one crossing (`_fast`, which each public function
    tries first, in its own frame) left to Python."""
    ctx, pattern, call = _prepared(comm, opname, opname, sendbuf, recvbuf)
    return _run(ctx, opname, pattern, call, order, copy)


# --- persistent plans ---------------------------------------------------------------------------


class VPlan(PlanMixin, _core.VPlan):
    """A persistent irregular collective, made by :func:`alltoallv_init` and its kin.

    As :class:`zcoll.Plan`: ``plan()`` runs it once and returns the receive array;
    ``plan.start()`` / ``plan.wait()`` / ``plan.test()``; ``plan.free()`` or a ``with``
    block. Counts, displacements and buffers are those given at creation (write new data into
    the send array between runs). Attributes ``sendbuf``, ``recvbuf``, ``op``, ``order`` (what
    "auto" resolved to), ``copy``, ``active``, ``copied_bytes`` (what this rank copies per run);
    ``explain()`` says what creation decided.

    Notes
    -----
    Creation checks and agrees on the call and checks every pair's counts once; it cuts this
    rank's share of the copies and resolves every rank's buffers (arena shadows for private
    ones). A run is one node barrier, this rank's copies and a completion barrier.
    """

    _kind = "zcoll.VPlan"

    def __init__(self, ctx: Context, opname: str, pattern: Pattern, call: _Call, code, copy_code):
        super().__init__(ctx.core, *_engine_args(opname, pattern, call, code, copy_code))
        self._made = True
        self._ctx = ctx

    def _summary(self) -> str:
        return self.op

    def explain(self) -> dict[str, object]:
        """What the plan decided when it was made, and why: every run does the same.

        Returns
        -------
        dict
            As :meth:`zcoll.Plan.explain`, with ``path`` always "ordered" (this rank's piece of
            the node's copies between two barriers: a plan has no eager or pulled path), and
            ``copied_bytes``, the bytes this rank copies per run.
        """
        send_shadow, recv_shadow = self.shadowed
        return self._explained(
            self.op,
            "ordered",
            "persistent: the node's bytes cut into equal pieces, one per rank, copied in order",
            sendbuf=buffer_role(self.sendbuf, send_shadow, pulled=False),
            recvbuf=buffer_role(self.recvbuf, recv_shadow, pulled=False),
            copied_bytes=self.copied_bytes,
        )


class _MultiNodeVPlan(VPlan):
    """A plan spanning several nodes: the node part in the engine, blocks between nodes by
    persistent MPI point-to-point requests on the private dup, one tag range per plan, from
    C++."""

    _between_nodes = BY_PERSISTENT_REQUESTS

    def __init__(self, ctx: Context, opname: str, pattern: Pattern, call: _Call, code, copy_code):
        # Every rank's call and every pair's counts checked once, in one round between nodes.
        args = _engine_args(opname, pattern, call, code, copy_code)
        ctx.transport.v_round(f"{opname}_init", args, False)
        super().__init__(ctx, opname, pattern, call, code, copy_code)
        self._attach_remote(ctx.transport.check(), _PLAN_TAG + (self.id % 0x1000) * 64)


def _plan(opname: str, comm: MPI.Comm, sendbuf, recvbuf, order, copy) -> VPlan:
    label = f"{opname}_init"
    ctx, pattern, call = _prepared(comm, opname, label, sendbuf, recvbuf)
    code, copy_code = option_codes(ctx, label, order, copy)
    if (why := _core.plan_buffers_error(call.send, call.recv)) is not None:
        ctx.fail(label, TypeError(why))
    kind = _MultiNodeVPlan if ctx.multi_node else VPlan
    return kind(ctx, opname, pattern, call, code, copy_code)


# --- the public functions -----------------------------------------------------------------------

_SPEC = """mpi4py's buffer specification, counts and displacements in elements of the array's
        dtype: ``array`` (split as evenly as it goes), ``[array, counts]`` (packed),
        ``[array, (counts, displs)]``, ``[array, counts, displs]``, or either with an mpi4py
        datatype last, which must match the array's dtype"""


def alltoallv(
    comm: MPI.Comm, sendbuf, recvbuf, *, order: str = AUTO, copy: str = AUTO
) -> np.ndarray:
    """All-to-all exchange with per-pair counts and displacements, in shared memory.

    Collective over `comm`; the semantics of ``comm.Alltoallv``: rank ``i`` sends
    ``scounts[j]`` elements from ``sendbuf[sdispls[j]:]`` to rank ``j``, which stores them at
    ``recvbuf[rdispls[i]:]``. The same arguments as ``comm.Alltoallv`` work unchanged.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Intracommunicator.
    sendbuf : buffer specification or zcoll.IN_PLACE
        {spec}; one count per rank. ``IN_PLACE``: `recvbuf`'s blocks are sent and replaced
        (MPI's in-place alltoallv: rank i's count for j equals j's count for i).
    recvbuf : buffer specification
        The same forms around a writable, C-contiguous ndarray of the same dtype. Elements
        that no block covers are left as they are.
    order : {"auto", "row", "column", "morton", "hilbert", "numa"}
        Traversal of the (receiver, sender) grid of the pairs that communicate; the same on
        every rank ("numa" runs as Morton: the pieces are balanced by bytes over all ranks).
        "auto": calls where every rank's data (sent and received) is within the eager size
        (``ZCOLL_EAGER_BYTES``) through the eager path (each rank's data through its slot,
        one barrier), and so are calls whose ranks all have a buffer outside shared memory,
        up to ``ZCOLL_CMA_BYTES`` (16 KiB) where the slots hold it (16 KiB);
        others Morton order (its pieces balanced by bytes). "row" is the
        naive baseline: each receiver copies its own blocks, in its list's order.
    copy : {"auto", "temporal", "streaming", "hybrid"}
        Stores used by the block copies, as for :func:`zcoll.alltoall`.

    Returns
    -------
    numpy.ndarray
        The array of `recvbuf`.

    Notes
    -----
    Every rank publishes its counts and displacements in the node's shared control area;
    after one node barrier every rank checks every pair's counts and copies an equal share of
    the bytes along the order's curve (a large block may be split between ranks), then a
    second barrier. Arena buffers (:func:`zcoll.empty`) move with one copy; plain NumPy
    buffers are read by CMA (one copy) when some rank of the node receives at least
    ``ZCOLL_CMA_BYTES``, else take the eager slots where they hold the call, else are staged
    through the arena (one more copy each way and one more barrier). Blocks between
    nodes travel by MPI point-to-point. The common buffer forms are parsed in C++ (one
    crossing into the engine per call).

    Raises
    ------
    ValueError, TypeError
        On every rank, if any rank's arguments are invalid (counts or displacements negative
        or out of bounds, overlapping receive blocks, dtypes that differ) or the ranks'
        counts disagree.
    zcoll.PeerError
        If a peer dies or does not arrive within the timeout.
    """
    if recvbuf is None:  # then the same path as with it
        recvbuf = _new_recvbuf(_registry.ALLTOALLV, comm, sendbuf)
    recv = _fast(_ALLTOALLV_CODE, comm, sendbuf, recvbuf, order, copy)
    if recv is not None:
        return recv
    return _python_path(_registry.ALLTOALLV, comm, sendbuf, recvbuf, order, copy)


def allgatherv(
    comm: MPI.Comm, sendbuf, recvbuf=None, *, order: str = AUTO, copy: str = AUTO
) -> np.ndarray:
    """Gather a block of any size from every rank on every rank, in shared memory.

    Collective over `comm`; the semantics of ``comm.Allgatherv``.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Intracommunicator.
    sendbuf : array_like, ``[array, count]``, ``[array, count, datatype]`` or zcoll.IN_PLACE
        This rank's block (``count`` elements, default all). ``IN_PLACE``: it already sits at
        ``recvbuf[displs[comm.rank]:]``.
    recvbuf : buffer specification, optional
        {spec}; one count per rank. When omitted, the counts are gathered and a 1-D arena
        array holding the blocks in rank order is allocated (collectively).
    order, copy
        As for :func:`alltoallv`.

    Returns
    -------
    numpy.ndarray
        The receive array; block ``j`` is rank ``j``'s `sendbuf`.

    Notes
    -----
    Costs and errors as for :func:`alltoallv`.
    """
    if recvbuf is None:  # then the same path as with it
        recvbuf = _new_recvbuf(_registry.ALLGATHERV, comm, sendbuf)
    recv = _fast(_ALLGATHERV_CODE, comm, sendbuf, recvbuf, order, copy)
    if recv is not None:
        return recv
    return _python_path(_registry.ALLGATHERV, comm, sendbuf, recvbuf, order, copy)


def neighbor_alltoall(
    comm: MPI.Comm, sendbuf, recvbuf=None, *, order: str = AUTO, copy: str = AUTO
) -> np.ndarray:
    """Send block ``i`` to the ``i``-th destination of the process topology, in shared memory.

    Collective over `comm`, a communicator with a Cartesian or graph topology; the semantics
    of ``comm.Neighbor_alltoall``: MPI's neighbour order (Cartesian: per dimension the
    negative then the positive neighbour; a PROC_NULL neighbour's slot is neither sent nor
    written; on a periodic dimension of 1 or 2 ranks the block sent toward the positive side
    lands in the receiver's negative slot, as MPI-4.1 specifies), graph edges in the order
    the topology lists them (an edge repeated k times carries k blocks, matched in order).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Made by ``Create_cart``, ``Create_dist_graph_adjacent``, ``Create_dist_graph`` or
        ``Create_graph``.
    sendbuf : array_like
        First axis the out-degree (block ``i`` = ``sendbuf[i]``), or 1-D with a size
        divisible by it.
    recvbuf : numpy.ndarray, optional
        First axis the in-degree (block ``j`` came from the ``j``-th source), or 1-D. When
        omitted, an arena array of shape ``(indegree, *sendbuf.shape[1:])`` is allocated
        (collectively; a 1-D sendbuf gives ``(indegree * block,)``).
    order, copy
        As for :func:`alltoallv`.

    Returns
    -------
    numpy.ndarray
        The receive array.

    Notes
    -----
    The topology's edges become the engine's 4-tuples (sender, receiver, send block,
    receive block) once per communicator (one ``allgather`` of the neighbour lists on the
    first call); each call then costs what an :func:`alltoallv` over those pairs costs.

    Raises
    ------
    ValueError
        On every rank, for a communicator without topology, and as for :func:`alltoallv`.
    """
    if recvbuf is None:  # then the same path as with it
        recvbuf = _new_recvbuf(_registry.NEIGHBOR_ALLTOALL, comm, sendbuf)
    recv = _fast(_NEIGHBOR_ALLTOALL_CODE, comm, sendbuf, recvbuf, order, copy)
    if recv is not None:
        return recv
    return _python_path(_registry.NEIGHBOR_ALLTOALL, comm, sendbuf, recvbuf, order, copy)


def neighbor_allgather(
    comm: MPI.Comm, sendbuf, recvbuf=None, *, order: str = AUTO, copy: str = AUTO
) -> np.ndarray:
    """Send the whole `sendbuf` to every destination of the process topology.

    Collective over `comm`; the semantics of ``comm.Neighbor_allgather`` (neighbour order as
    for :func:`neighbor_alltoall`).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Communicator with a Cartesian or graph topology.
    sendbuf : array_like
        This rank's block.
    recvbuf : numpy.ndarray, optional
        In-degree blocks of the size of `sendbuf`. When omitted, an arena array of shape
        ``(indegree, *sendbuf.shape)`` is allocated (collectively).
    order, copy
        As for :func:`alltoallv`.

    Returns
    -------
    numpy.ndarray
        The receive array; block ``j`` is the ``j``-th source's `sendbuf`.
    """
    if recvbuf is None:  # then the same path as with it
        recvbuf = _new_recvbuf(_registry.NEIGHBOR_ALLGATHER, comm, sendbuf)
    recv = _fast(_NEIGHBOR_ALLGATHER_CODE, comm, sendbuf, recvbuf, order, copy)
    if recv is not None:
        return recv
    return _python_path(_registry.NEIGHBOR_ALLGATHER, comm, sendbuf, recvbuf, order, copy)


def neighbor_alltoallv(
    comm: MPI.Comm, sendbuf, recvbuf, *, order: str = AUTO, copy: str = AUTO
) -> np.ndarray:
    """:func:`neighbor_alltoall` with per-edge counts and displacements.

    Collective over `comm`; the semantics of ``comm.Neighbor_alltoallv``.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Communicator with a Cartesian or graph topology.
    sendbuf : buffer specification
        {spec}; one count per destination.
    recvbuf : buffer specification
        The same forms; one count per source.
    order, copy
        As for :func:`alltoallv`.

    Returns
    -------
    numpy.ndarray
        The receive array.
    """
    if recvbuf is None:  # then the same path as with it
        recvbuf = _new_recvbuf(_registry.NEIGHBOR_ALLTOALLV, comm, sendbuf)
    recv = _fast(_NEIGHBOR_ALLTOALLV_CODE, comm, sendbuf, recvbuf, order, copy)
    if recv is not None:
        return recv
    return _python_path(_registry.NEIGHBOR_ALLTOALLV, comm, sendbuf, recvbuf, order, copy)


def neighbor_allgatherv(
    comm: MPI.Comm, sendbuf, recvbuf, *, order: str = AUTO, copy: str = AUTO
) -> np.ndarray:
    """:func:`neighbor_allgather` with per-source receive counts and displacements.

    Collective over `comm`; the semantics of ``comm.Neighbor_allgatherv``.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Communicator with a Cartesian or graph topology.
    sendbuf : array_like, ``[array, count]`` or ``[array, count, datatype]``
        This rank's block.
    recvbuf : buffer specification
        {spec}; one count per source.
    order, copy
        As for :func:`alltoallv`.

    Returns
    -------
    numpy.ndarray
        The receive array.
    """
    if recvbuf is None:  # then the same path as with it
        recvbuf = _new_recvbuf(_registry.NEIGHBOR_ALLGATHERV, comm, sendbuf)
    recv = _fast(_NEIGHBOR_ALLGATHERV_CODE, comm, sendbuf, recvbuf, order, copy)
    if recv is not None:
        return recv
    return _python_path(_registry.NEIGHBOR_ALLGATHERV, comm, sendbuf, recvbuf, order, copy)


for _function in (alltoallv, allgatherv, neighbor_alltoallv, neighbor_allgatherv):
    _function.__doc__ = (_function.__doc__ or "").replace("{spec}", _SPEC)


def _init_doc(name: str) -> str:
    mpi_name = name[0].upper() + name[1:]
    return f"""A persistent :func:`{name}` (mpi4py's ``comm.{mpi_name}_init``).

    Collective over `comm`; the arguments as for :func:`{name}`, fixed at creation (counts
    and displacements included): checked, agreed on and resolved once. Returns a
    :class:`zcoll.VPlan`: ``plan()`` runs it and returns the receive array, or
    ``plan.start()`` / ``plan.wait()``. The send array is read on every run (it must be a
    C-contiguous ndarray: write new data into it between runs).

    Raises
    ------
    ValueError, TypeError
        On every rank, as for :func:`{name}`.
    """


def alltoallv_init(
    comm: MPI.Comm, sendbuf, recvbuf, *, order: str = AUTO, copy: str = AUTO
) -> VPlan:
    return _plan(_registry.ALLTOALLV, comm, sendbuf, recvbuf, order, copy)


def allgatherv_init(
    comm: MPI.Comm, sendbuf, recvbuf=None, *, order: str = AUTO, copy: str = AUTO
) -> VPlan:
    return _plan(_registry.ALLGATHERV, comm, sendbuf, recvbuf, order, copy)


def neighbor_alltoall_init(
    comm: MPI.Comm, sendbuf, recvbuf=None, *, order: str = AUTO, copy: str = AUTO
) -> VPlan:
    return _plan(_registry.NEIGHBOR_ALLTOALL, comm, sendbuf, recvbuf, order, copy)


def neighbor_allgather_init(
    comm: MPI.Comm, sendbuf, recvbuf=None, *, order: str = AUTO, copy: str = AUTO
) -> VPlan:
    return _plan(_registry.NEIGHBOR_ALLGATHER, comm, sendbuf, recvbuf, order, copy)


def neighbor_alltoallv_init(
    comm: MPI.Comm, sendbuf, recvbuf, *, order: str = AUTO, copy: str = AUTO
) -> VPlan:
    return _plan(_registry.NEIGHBOR_ALLTOALLV, comm, sendbuf, recvbuf, order, copy)


def neighbor_allgatherv_init(
    comm: MPI.Comm, sendbuf, recvbuf, *, order: str = AUTO, copy: str = AUTO
) -> VPlan:
    return _plan(_registry.NEIGHBOR_ALLGATHERV, comm, sendbuf, recvbuf, order, copy)


for _persistent in (
    alltoallv_init,
    allgatherv_init,
    neighbor_alltoall_init,
    neighbor_allgather_init,
    neighbor_alltoallv_init,
    neighbor_allgatherv_init,
):
    _persistent.__doc__ = _init_doc(_persistent.__name__.removesuffix("_init"))
