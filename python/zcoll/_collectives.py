"""alltoall and allgather as ordered block copies in the node's shared arena."""

from __future__ import annotations

from typing import NoReturn

import numpy as np
from mpi4py import MPI

from . import _core, _registry
from ._context import Context, lookup
from ._registry import AUTO

__all__ = ["IN_PLACE", "allgather", "alltoall"]

#: Pass as `sendbuf` to exchange in place in `recvbuf` (the same object as ``MPI.IN_PLACE``).
IN_PLACE = MPI.IN_PLACE
_core._set_in_place(IN_PLACE)

ORDER_CODES = _registry.ORDER_CODES
COPY_CODES = _registry.COPY_CODES
_ALLTOALL = _registry.ALLTOALL
_ALLGATHER = _registry.ALLGATHER
_ALLTOALL_CODE = _registry.OPS[_ALLTOALL]
_ALLGATHER_CODE = _registry.OPS[_ALLGATHER]
# One crossing into the engine for a call on a known communicator (on one node, or across
# nodes by its route) with a recvbuf: returns recvbuf, or None when the Python path
# (_exchange) must run the call.
_fast = _core.fast_collective


def _option_error(order, copy) -> ValueError | None:
    """The engine's error for these ``order=`` / ``copy=`` values, or None when both are valid."""
    message = _core.option_error(order, copy)
    return None if message is None else ValueError(message)


def _fail_options(ctx: Context, opname: str, order, copy) -> NoReturn:
    """Raise on every rank the engine's error for the invalid ``order=`` / ``copy=`` values."""
    error = _option_error(order, copy)
    assert error is not None  # only called when `order` or `copy` has no code
    ctx.fail(opname, error)


def option_codes(ctx: Context, opname: str, order, copy) -> tuple[int, int]:
    """The engine codes of ``order=`` and ``copy=``; the engine's error on every rank when
    either names no order or mode."""
    code = ORDER_CODES.get(order) if type(order) is str else None
    copy_code = COPY_CODES.get(copy) if type(copy) is str else None
    if code is None or copy_code is None:
        _fail_options(ctx, opname, order, copy)
    return code, copy_code


def _new_recvbuf(ctx: Context, opname: str, sendbuf, label: str | None = None) -> np.ndarray:
    """Allocate the result of `opname` in the arena (collective); errors are raised on every
    rank, named after `label` (default `opname`)."""
    try:
        if sendbuf is IN_PLACE:
            raise ValueError("IN_PLACE needs recvbuf, which holds the data")
        send = np.asarray(sendbuf)
        if send.dtype.hasobject:
            raise TypeError("arrays of Python objects cannot be exchanged through shared memory")
        if send.ndim == 0:
            raise ValueError("sendbuf must have at least one dimension")
    except (TypeError, ValueError) as exc:
        ctx.fail(label or opname, exc)
    shape = send.shape if opname == _ALLTOALL else (ctx.size, *send.shape)
    return _arena_array(ctx, shape, send.dtype)


def _arena_array(ctx: Context, shape: tuple, dtype: np.dtype) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    block = ctx.allocate(count * dtype.itemsize)
    # memoryview: numpy's stubs take no buffer-protocol object; the view keeps the block alive.
    return np.frombuffer(memoryview(block), dtype=dtype, count=count).reshape(shape)


def _exchange(opname: str, comm: MPI.Comm, sendbuf, recvbuf, order, copy) -> np.ndarray:
    """The Python path of every collective, for what `_fast` leaves to it: a first call,
    online tuning, or an invalid option (raised on every rank)."""
    ctx = lookup(comm)
    code, copy_code = option_codes(ctx, opname, order, copy)
    if ctx.multi_node:
        # Whole in the extension, as the one crossing runs it (docs/design.md, "Across nodes").
        ctx.transport.collective(_registry.OPS[opname], sendbuf, recvbuf, code, copy_code)
    else:
        getattr(ctx.core, opname)(sendbuf, recvbuf, code, copy_code)
    return recvbuf


def alltoall(
    comm: MPI.Comm, sendbuf, recvbuf=None, *, order: str = AUTO, copy: str = AUTO
) -> np.ndarray:
    """All-to-all personalised exchange, as ordered block copies in shared memory.

    Collective over `comm`. Block ``i`` of `sendbuf` goes to rank ``i``; block ``j`` of the
    result came from rank ``j`` -- the semantics of ``comm.Alltoall``.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Intracommunicator (WORLD, dups, splits, SELF, or one spanning several nodes).
    sendbuf : array_like or zcoll.IN_PLACE
        First axis of length ``comm.size`` (block ``i`` = ``sendbuf[i]``), or 1-D with a size
        divisible by ``comm.size``. Any dtype without Python objects; non-contiguous input is
        copied first. ``IN_PLACE`` exchanges the blocks of `recvbuf` in place.
    recvbuf : numpy.ndarray, optional
        C-contiguous, writable, same dtype and size as `sendbuf`, first axis ``comm.size`` or
        1-D. Allocated in the arena (collectively) when omitted.
    order : {"auto", "row", "column", "morton", "hilbert", "numa"}
        Traversal of the P x P block matrix; must be the same on every rank. "row" is the
        SH-Naive baseline (each rank fills its own receive row); "numa" (TPDS'18 §2.4): each
        NUMA node's ranks fill only their own receive buffers, in staggered steps, Morton
        inside (see :func:`zcoll.schedule`). "auto" follows the tuning table where it has a
        rule (see :func:`zcoll.set_tuning`), else small calls take the one-barrier eager path
        and larger ones "numa" when the node's ranks span NUMA nodes, else row (P <= 2) or
        Morton order.
    copy : {"auto", "temporal", "streaming", "hybrid"}
        Stores used by the block copies (see :data:`zcoll.COPY_MODES`): ordinary, non-temporal
        (cache-bypassing), or hybrid (the first part of each block ordinary, the rest
        non-temporal). "auto" follows the tuning table (``python -m zcoll.tune``) where it has
        a rule; otherwise it uses ordinary stores for blocks below the hybrid threshold (L2
        size / ranks per node, ``ZCOLL_COPY_THRESHOLD``) and for calls whose buffers fill at
        most 1/2 of the last-level cache. Above that it times ordinary stores against the
        hybrid copy (halving its threshold) on the first calls of each block size and keeps
        the fastest, so it never settles on a mode slower than ordinary stores. May differ
        between ranks; the result is the same.

    Returns
    -------
    numpy.ndarray
        `recvbuf`.

    Notes
    -----
    When every buffer is in shared memory (the arena, :func:`zcoll.empty`, or the shared heap,
    :func:`zcoll.use_shared_heap`) each block moves with one copy between two node barriers,
    and no MPI call is made. A plain NumPy buffer is read from its owner's memory by CMA
    (``process_vm_readv``, one copy) when each rank receives at least ``ZCOLL_CMA_BYTES`` and
    the kernel allows it; otherwise (and in place) it is staged through the arena: one extra
    copy of that buffer and one extra node barrier. On a communicator spanning several nodes,
    blocks between nodes travel by MPI: small ones in one aggregated message per pair of
    nodes, larger ones rank to rank (docs/design.md); there, with a buffer outside the arena,
    each rank packs and unpacks its own blocks instead of staging.

    Raises
    ------
    ValueError, TypeError
        On every rank, if any rank's arguments are invalid or disagree with the others'.
    zcoll.PeerError
        If a peer dies or does not arrive within the timeout (see :func:`zcoll.set_timeout`).
    """
    if recvbuf is None:  # then the same path as with it
        recvbuf = _new_recvbuf(lookup(comm), _ALLTOALL, sendbuf)
    if _fast(_ALLTOALL_CODE, comm, sendbuf, recvbuf, order, copy) is not None:
        return recvbuf
    return _exchange(_ALLTOALL, comm, sendbuf, recvbuf, order, copy)


def allgather(
    comm: MPI.Comm, sendbuf, recvbuf=None, *, order: str = AUTO, copy: str = AUTO
) -> np.ndarray:
    """Gather every rank's `sendbuf` on every rank, as ordered copies in shared memory.

    Collective over `comm`; the semantics of ``comm.Allgather``.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Intracommunicator.
    sendbuf : array_like or zcoll.IN_PLACE
        This rank's block; same size and dtype on every rank. With ``IN_PLACE``, block
        ``comm.rank`` of `recvbuf` holds it.
    recvbuf : numpy.ndarray, optional
        C-contiguous and writable, ``comm.size`` times the size of `sendbuf`, first axis
        ``comm.size`` or 1-D. When omitted, an arena array of shape
        ``(comm.size, *sendbuf.shape)`` is allocated (collectively).
    order : {"auto", "row", "column", "morton", "hilbert"}
        Traversal of the P x P block matrix; same on every rank.
    copy : {"auto", "temporal", "streaming", "hybrid"}
        Stores used by the block copies, as for :func:`alltoall`.

    Returns
    -------
    numpy.ndarray
        `recvbuf`; block ``j`` is rank ``j``'s `sendbuf`.

    Notes
    -----
    Costs as for :func:`alltoall`. Across nodes, blocks up to four times alltoall's size limit
    travel in one message per pair of nodes (each rank copying its block into every message
    its node sends); larger ones rank to rank, or between the nodes' leaders (SC'05 concurrent
    exchange) where the tuning table's ``internode`` rules say so.
    """
    if recvbuf is None:  # then the same path as with it
        recvbuf = _new_recvbuf(lookup(comm), _ALLGATHER, sendbuf)
    if _fast(_ALLGATHER_CODE, comm, sendbuf, recvbuf, order, copy) is not None:
        return recvbuf
    return _exchange(_ALLGATHER, comm, sendbuf, recvbuf, order, copy)
