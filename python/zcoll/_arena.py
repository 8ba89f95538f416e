"""NumPy arrays in the node's shared arena."""

from __future__ import annotations

import operator
from math import prod

import numpy as np
from mpi4py import MPI

from . import _core
from ._context import context

__all__ = ["empty", "empty_like", "is_shared", "peer_arrays", "zeros"]


def _normalize_shape(shape) -> tuple[int, ...]:
    try:
        dims: tuple[int, ...] = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimensions are not allowed: {dims}")
    return dims


def _as_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects, which cannot live in shared memory")
    return dt


def empty(comm: MPI.Comm, shape, dtype=float) -> np.ndarray:
    """Return a new uninitialised array in the node's shared arena.

    Collective over `comm`: every rank must call it (like ``MPI_Win_allocate_shared``), each
    with its own `shape` and `dtype`. Every rank of the node can then read and write every
    other rank's array, which is what lets zcoll's collectives move each block with one copy.
    Allocation needs no communication beyond one node barrier unless the arena must grow.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Intracommunicator; ranks on other nodes get arrays in their own node's arena.
    shape : int or tuple of int
        Shape of this rank's array; may differ between ranks.
    dtype : data-type, optional
        Any NumPy dtype without Python objects. Default float64.

    Returns
    -------
    numpy.ndarray
        C-contiguous, writable, 64-byte aligned. The memory is returned to the arena when the
        array (and every view of it) is garbage collected; it stays valid after `comm` is freed.

    Raises
    ------
    TypeError, ValueError
        On every rank, if any rank passed an invalid shape or dtype.
    """
    ctx = context(comm)
    try:
        dims = _normalize_shape(shape)
        dt = _as_dtype(dtype)
        nbytes = prod(dims) * dt.itemsize
    except (TypeError, ValueError) as exc:
        ctx.fail("empty", exc)
    block = ctx.allocate(nbytes)
    # memoryview: numpy's stubs take no buffer-protocol object; the view keeps the block alive.
    return np.frombuffer(memoryview(block), dtype=dt, count=prod(dims)).reshape(dims)


def local_bytes(pool, nbytes: int) -> tuple[np.ndarray, object]:
    """Local (no communication): `nbytes` of 64-byte aligned memory (uint8) for arrays of a
    communicator made before it has a context, and where they lie: `pool` or None.

    They come from the arena of `pool` (a :class:`zcoll._pool.Pool`, the one the
    communicator's context will be derived from: :func:`zcoll._pool.pool_for`), so that its
    peers share them as any arena array, where this rank's region of it holds them; else from
    private memory (None), which zcoll's calls stage or pull like any plain array. Whoever
    takes them checks, when the communicator gets its context, that the context's pool is the
    one named here.
    """
    arena = None if pool is None else pool.arena
    block = None if arena is None else arena.allocate(nbytes)
    if block is not None:
        return np.frombuffer(memoryview(block), dtype=np.uint8, count=nbytes), pool
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + nbytes], None


def zeros(comm: MPI.Comm, shape, dtype=float) -> np.ndarray:
    """Return a new zero-filled array in the node's shared arena.

    Collective over `comm`; see :func:`empty`. Each rank fills its own array, so its pages are
    first touched by their owner.
    """
    a = empty(comm, shape, dtype)
    a.fill(0)
    return a


def empty_like(comm: MPI.Comm, a) -> np.ndarray:
    """Return an uninitialised arena array with the shape and dtype of `a`.

    Collective over `comm`; see :func:`empty`.
    """
    a = np.asarray(a)
    return empty(comm, a.shape, a.dtype)


def is_shared(a) -> bool:
    """Tell whether `a` lies entirely in a zcoll shared arena (local, no communication).

    An array in the arena of one communicator can be used directly by collectives on any
    communicator whose ranks on this node all belong to the allocating communicator (its dups
    and splits, for example); other arrays are staged through the arena at the cost of one
    extra copy on each side.
    """
    if not isinstance(a, np.ndarray):
        return False
    return _core.array_in_arena(a)


def peer_arrays(comm: MPI.Comm, a: np.ndarray) -> list[np.ndarray | None]:
    """Return views of every rank's arena array: what ``Win.Shared_query`` gives in MPI.

    Collective over `comm`: every rank passes its own arena array (shapes and dtypes may
    differ). Element ``r`` of the result is a writable view of rank ``r``'s array when rank
    ``r`` shares this node's memory, else None. The views stay valid while they live.

    Raises
    ------
    ValueError
        On every rank, if any rank's array is not in an arena that every rank of this node in
        `comm` has mapped (allocate it with :func:`empty` on `comm` or on a communicator that
        contains `comm`'s ranks).
    """
    ctx = context(comm)
    mine = None
    if isinstance(a, np.ndarray) and a.flags.c_contiguous and is_shared(a):
        segment, offset = ctx.core.where(a)
        if segment:
            mine = (segment, offset, a.nbytes, a.shape, a.dtype.str)
    everything = ctx.transport.allgather(comm, (ctx.node_of[ctx.rank], mine), "zcoll.peer_arrays")
    missing = [r for r, (_, m) in enumerate(everything) if m is None]
    if missing:
        raise ValueError(
            f"zcoll.peer_arrays: the array of rank(s) {missing} is not in an arena shared by "
            "this communicator's ranks on its node"
        )
    views: list[np.ndarray | None] = []
    for node, (segment, offset, nbytes, shape, dtype) in everything:
        if node != ctx.node_of[ctx.rank]:
            views.append(None)
            continue
        dt = np.dtype(dtype)
        block = ctx.core.view(segment, offset, nbytes)
        views.append(np.frombuffer(memoryview(block), dtype=dt, count=prod(shape)).reshape(shape))
    return views
