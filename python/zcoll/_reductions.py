"""allreduce, reduce, reduce_scatter_block, bcast and barrier on the node's shared heap.

The node's ranks combine their buffers where they are (HPDC'13's algorithms, in the C++
engine: ``cpp/zcoll/reduction.hpp``). Across nodes, a small reduction travels whole in the
call's round of messages between nodes (each node's partial result in every message it
sends, folded in node order on every rank; a bcast's buffer in the root's node's messages:
``cpp/zcoll/aggregate.hpp``); a larger one is spread over every rank after that round
(``cpp/zcoll/spread_reduction.hpp``).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import _core, _registry
from ._collectives import IN_PLACE
from ._context import Context, lookup
from ._registry import AUTO

__all__ = [
    "REDUCE_ALGORITHMS",
    "REDUCE_OPS",
    "allreduce",
    "barrier",
    "bcast",
    "reduce",
    "reduce_scatter_block",
]

#: The names ``op=`` accepts (mpi4py's ``MPI.SUM`` ... ``MPI.BXOR`` mean the same).
REDUCE_OPS: tuple[str, ...] = _registry.REDUCE_OPS
#: The algorithms ``algorithm=`` accepts besides "auto".
REDUCE_ALGORITHMS: tuple[str, ...] = _registry.REDUCE_ALGORITHMS

_OP_CODES = _registry.REDUCE_OP_CODES
_ALGORITHM_CODES = _registry.REDUCE_ALGORITHM_CODES
_ALLREDUCE_CODE = _registry.OPS[_registry.ALLREDUCE]
_REDUCE_CODE = _registry.OPS[_registry.REDUCE]
_REDUCE_SCATTER_CODE = _registry.OPS[_registry.REDUCE_SCATTER]
_BCAST_CODE = _registry.OPS[_registry.BCAST]
_PUBLIC_NAMES = {
    _ALLREDUCE_CODE: "allreduce",
    _REDUCE_CODE: "reduce",
    _REDUCE_SCATTER_CODE: "reduce_scatter_block",
    _BCAST_CODE: "bcast",
}
# mpi4py's predefined operations, by the name they mean.
_MPI_OPS = tuple(zip((MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX, MPI.LAND, MPI.LOR, MPI.LXOR,
                      MPI.BAND, MPI.BOR, MPI.BXOR), REDUCE_OPS))  # fmt: skip
_core.set_mpi_ops({name: mpi_op for mpi_op, name in _MPI_OPS})  # op=MPI.SUM: one crossing too
# One crossing into the engine for a call on a known communicator (on one node, or across
# nodes by its route): returns True, or None when the Python path (_reduction) must run it.
_fast = _core.fast_reduction
_fast_barrier = _core.fast_barrier


def _op_code(ctx: Context, name: str, op) -> int:
    """The engine code of ``op=``; the same ValueError on every rank when it names no op."""
    if type(op) is str and op in _OP_CODES:
        return _OP_CODES[op]
    if isinstance(op, MPI.Op):
        for mpi_op, op_name in _MPI_OPS:
            if op == mpi_op:
                return _OP_CODES[op_name]
    ctx.fail(
        name,
        ValueError(
            f"op must be one of {list(REDUCE_OPS)} or the mpi4py MPI.Op of the same name, "
            f"got {op!r}"
        ),
    )


def _algorithm_code(ctx: Context, name: str, algorithm) -> int:
    if type(algorithm) is str and algorithm in _ALGORITHM_CODES:
        return _ALGORITHM_CODES[algorithm]
    ctx.fail(
        name,
        ValueError(
            f"algorithm must be '{AUTO}' or one of {list(REDUCE_ALGORITHMS)}, got {algorithm!r}"
        ),
    )


def _new_result(ctx: Context, name: str, code: int, sendbuf) -> np.ndarray:
    """A private array for the result (no collective allocation: ranks write only their own
    result); errors raised on every rank."""
    try:
        if sendbuf is IN_PLACE:
            raise ValueError("IN_PLACE needs recvbuf, which holds the input")
        send = np.asarray(sendbuf)
        if send.dtype.hasobject:
            raise TypeError("arrays of Python objects cannot be exchanged through shared memory")
    except (TypeError, ValueError) as exc:
        ctx.fail(name, exc)
    if code != _REDUCE_SCATTER_CODE:
        return np.empty(send.shape, send.dtype)
    if send.ndim > 1 and send.shape[0] == ctx.size:
        return np.empty(send.shape[1:], send.dtype)
    return np.empty(send.size // ctx.size, send.dtype)


def _reduction(code: int, comm: MPI.Comm, sendbuf, recvbuf, op, algorithm, root: int):
    """The Python path of every reduction, for what `_fast` leaves to it."""
    ctx = lookup(comm)
    name = _PUBLIC_NAMES[code]
    op_code = _op_code(ctx, name, op)
    alg_code = _algorithm_code(ctx, name, algorithm)
    if type(root) is not int:
        try:
            root = int(root)
        except (TypeError, ValueError):
            ctx.fail(name, TypeError(f"root must be an int, got {type(root).__name__}"))
    wants = code != _REDUCE_CODE or ctx.rank == root or sendbuf is IN_PLACE
    if recvbuf is None and wants:
        recvbuf = _new_result(ctx, name, code, sendbuf)
    if ctx.multi_node:  # whole in the extension: in the round, or spread over the ranks
        ctx.transport.reduction((code, sendbuf, recvbuf, op_code, alg_code, root))
    else:
        ctx.core.reduction(code, sendbuf, recvbuf, op_code, alg_code, root)
    return recvbuf


def allreduce(
    comm: MPI.Comm, sendbuf, recvbuf=None, op="sum", *, algorithm: str = AUTO
) -> np.ndarray:
    """Combine every rank's buffer element-wise; the result on every rank.

    Collective over `comm`; the semantics of ``comm.Allreduce``, with NumPy's arithmetic.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Intracommunicator (WORLD, dups, splits, SELF, or one spanning several nodes).
    sendbuf : array_like or zcoll.IN_PLACE
        This rank's input, any shape; the same size and dtype on every rank. dtypes: bool,
        every integer width, float16/32/64, complex64/128. ``IN_PLACE``: `recvbuf` holds
        the input and receives the result.
    recvbuf : numpy.ndarray, optional
        C-contiguous and writable, the size and dtype of `sendbuf`; need not be in the arena.
        A new private array of `sendbuf`'s shape when omitted.
    op : str or mpi4py.MPI.Op
        "sum", "prod", "min", "max", "land", "lor", "lxor", "band", "bor", "bxor", or
        ``MPI.SUM`` ... ``MPI.BXOR``; the same on every rank. NumPy's semantics per dtype:
        integers wrap; bool sum/max are "or", prod/min are "and"; float min/max propagate
        NaN; logical ops give 0 or 1 in the dtype. An op NumPy does not define for the dtype
        (bitwise ops on floats; min, max and logical ops on complex) is a TypeError.
    algorithm : {"auto", "flat", "tree", "dissemination", "tiled"}
        How the ranks of a node combine (same on every rank): "flat", every rank folds all
        inputs (one barrier for small buffers); "tree", a reduction tree over the NUMA
        hierarchy, then a broadcast; "dissemination", ceil(log2 P) pairwise rounds; "tiled",
        rank i combines tile i of every buffer, then every rank copies every tile. "auto"
        takes the least predicted time of a + b*m cost models (measured by
        ``python -m zcoll.tune``, else built-in estimates).

    Returns
    -------
    numpy.ndarray
        `recvbuf`.

    Notes
    -----
    The result of a call is **bit-identical on every rank**, and for a given (number of
    ranks, algorithm, size) the same from run to run: every algorithm combines in a fixed
    order (rank order for "flat" and each tile of "tiled", the tree's order, recursive
    doubling's pairs), never one that depends on timing. MPI promises neither. Floating-point
    results may differ from ``comm.Allreduce``'s in the last bits (another order); across
    nodes, each node's result is its ranks' inputs combined in rank order and the nodes'
    results are combined in node order, whatever `algorithm` says (small calls travel whole in
    the round between nodes; larger ones are spread over the ranks, each rank combining one
    piece of the result, then the pieces go to every node).

    The node's ranks read each other's inputs where they are when they are arena arrays
    (:func:`zcoll.empty`); other inputs are first copied into the arena (one copy of the
    input). Results are written only by their own rank, so `recvbuf` may be any array.

    Raises
    ------
    ValueError, TypeError
        On every rank, if any rank's arguments are invalid or disagree with the others'.
    zcoll.PeerError
        If a peer dies or does not arrive within the timeout.

    Examples
    --------
    >>> total = zcoll.allreduce(comm, np.array([comm.rank]))           # doctest: +SKIP
    >>> zcoll.allreduce(comm, zcoll.IN_PLACE, x, op="max")             # doctest: +SKIP
    """
    if recvbuf is None:  # then the same path as with it
        recvbuf = _new_result(lookup(comm), "allreduce", _ALLREDUCE_CODE, sendbuf)
    if _fast(_ALLREDUCE_CODE, comm, sendbuf, recvbuf, op, algorithm, 0):
        return recvbuf
    return _reduction(_ALLREDUCE_CODE, comm, sendbuf, recvbuf, op, algorithm, 0)


def reduce(
    comm: MPI.Comm, sendbuf, recvbuf=None, op="sum", *, root: int = 0, algorithm: str = AUTO
) -> np.ndarray | None:
    """Combine every rank's buffer element-wise; the result on `root` only.

    Collective over `comm`; the semantics of ``comm.Reduce``. Arguments as for
    :func:`allreduce`; `recvbuf` matters on `root` only (``IN_PLACE`` there: `recvbuf` holds
    root's input and receives the result). `root` must be the same on every rank.

    Returns
    -------
    numpy.ndarray or None
        On `root`, `recvbuf` (a new private array when omitted); None elsewhere.

    Notes
    -----
    Deterministic and independent of timing, as :func:`allreduce`; the ranks compute as for
    an allreduce and only `root` copies the result out.
    """
    try:
        here = comm.rank == root
    except Exception:  # noqa: BLE001 - not a usable communicator: _reduction says so everywhere
        here = None
    if recvbuf is None and here:  # then the same path as with it
        recvbuf = _new_result(lookup(comm), "reduce", _REDUCE_CODE, sendbuf)
    if (recvbuf is not None or here is False) and _fast(
        _REDUCE_CODE, comm, sendbuf, recvbuf, op, algorithm, root
    ):
        return recvbuf if here else None
    result = _reduction(_REDUCE_CODE, comm, sendbuf, recvbuf, op, algorithm, root)
    return result if comm.rank == root else None


def reduce_scatter_block(
    comm: MPI.Comm, sendbuf, recvbuf=None, op="sum", *, algorithm: str = AUTO
) -> np.ndarray:
    """Combine every rank's buffer element-wise; block ``i`` of the result on rank ``i``.

    Collective over `comm`; the semantics of ``comm.Reduce_scatter_block``. `sendbuf` holds
    ``comm.size`` blocks (its size divisible by ``comm.size``); `recvbuf` one block (a new
    private array when omitted: ``sendbuf.shape[1:]`` when the first axis is ``comm.size``,
    else 1-D). ``IN_PLACE``: `recvbuf` holds all blocks and receives this rank's in its first
    ``recvbuf.size // comm.size`` elements (flat order). Other arguments as for
    :func:`allreduce`; with "tiled" (and "flat") each rank combines only its own block.

    Returns
    -------
    numpy.ndarray
        `recvbuf`.
    """
    if recvbuf is None:  # then the same path as with it
        recvbuf = _new_result(lookup(comm), "reduce_scatter_block", _REDUCE_SCATTER_CODE, sendbuf)
    if _fast(_REDUCE_SCATTER_CODE, comm, sendbuf, recvbuf, op, algorithm, 0):
        return recvbuf
    return _reduction(_REDUCE_SCATTER_CODE, comm, sendbuf, recvbuf, op, algorithm, 0)


def bcast(comm: MPI.Comm, buf: np.ndarray, *, root: int = 0) -> np.ndarray:
    """Copy `root`'s `buf` into every rank's `buf`.

    Collective over `comm`; the semantics of ``comm.Bcast``.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Intracommunicator.
    buf : numpy.ndarray
        C-contiguous; the same size and dtype on every rank (any dtype without Python
        objects); writable except on `root`.
    root : int
        The rank whose buffer is copied; the same on every rank.

    Returns
    -------
    numpy.ndarray
        `buf`.

    Notes
    -----
    Small buffers go through the root's eager slot (one barrier); larger ones are read by
    every rank straight from the root's buffer when it is an arena array (else from a copy in
    the arena), followed by one more barrier. Across nodes, small buffers travel in the
    call's round of messages between nodes (the root's node sends it to every other node);
    larger ones are cut into one piece per rank: the root's node sends each piece to its owner
    (the root's node's own ranks' pieces to a rank of every other node), the other nodes pass
    their pieces on between them, and every rank copies the pieces from its node's arena.
    """
    if _fast(_BCAST_CODE, comm, None, buf, "sum", AUTO, root):
        return buf
    return _reduction(_BCAST_CODE, comm, None, buf, "sum", AUTO, root)


def barrier(comm: MPI.Comm) -> None:
    """Block until every rank of `comm` has called it.

    The engine's node barrier (shared-memory flags: spin, yield, then futex; bounded, dead
    peers detected); on a communicator spanning several nodes, one round of messages between
    nodes from the extension (a node's messages leave once all its ranks arrived), the first
    call included.

    Raises
    ------
    zcoll.PeerError
        If a peer dies or does not arrive within the timeout.
    """
    if _fast_barrier(comm):
        return  # in one crossing: the node barrier, or the round between nodes
    # The first call (the context is made now): the same barrier, with no error to raise.
    lookup(comm).raise_together("barrier", None)
