"""Pencil decompositions and the transfers between them (mpi4py-fft's Subcomm/Pencil/Transfer).

A global array of shape ``N`` is distributed over a Cartesian grid of processes: axis ``k``
is block-distributed over the ranks of ``subcomms[k]`` (a communicator of size 1 means the
axis is whole on every rank). A pencil is *aligned* in one axis, which is never distributed.
A :class:`Transfer` moves the data from a pencil aligned in axis ``a`` to one aligned in axis
``b``: one global transpose over the communicator that distributes ``b``, executed by zcoll's
ordered shared-memory engine as one strided copy per element on a node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from .. import _core
from .._arena import empty, is_shared
from .._collectives import _option_error, option_codes
from .._context import lookup
from .._registry import AUTO, TRANSFER

__all__ = ["Pencil", "Subcomm", "Transfer", "transfer"]

_TRANSFER_TAG = 0x7A0D


def block_share(n: int, p: int, rank: int) -> tuple[int, int]:
    """(count, start) of `rank`'s block when `n` elements are split over `p` ranks."""
    return _core.block_share(n, p, rank)


def fitting_dims(size: int, dims: Sequence[int]) -> list[int]:
    """`dims` with wildcards (values <= 0) as 0; ValueError if no grid of `size` ranks has
    them (``MPI.Compute_dims`` would fail less clearly)."""
    dims = [max(0, int(d)) for d in dims]
    fixed = int(np.prod([d for d in dims if d > 0]))
    if size % fixed or (0 not in dims and fixed != size):
        raise ValueError(f"zcoll.fft: a process grid {tuple(dims)} does not fit {size} ranks")
    return dims


class Subcomm(tuple):
    """One communicator per axis of a Cartesian process grid (mpi4py-fft's ``Subcomm``).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator to decompose.
    dims : sequence of int
        Processes along each axis; values <= 0 are wildcards filled by ``MPI.Compute_dims``.

    Notes
    -----
    Collective over `comm`. :meth:`destroy` frees the communicators (also collective).
    """

    def __new__(cls, comm: MPI.Intracomm, dims: Sequence[int]):
        dims = MPI.Compute_dims(comm.size, fitting_dims(comm.size, dims))
        cart = comm.Create_cart(dims, reorder=False)
        subs = [cart.Sub([k == i for k in range(len(dims))]) for i in range(len(dims))]
        cart.Free()
        return super().__new__(cls, subs)

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(c.size for c in self)

    def destroy(self) -> None:
        """Free the communicators (collective)."""
        for c in self:
            if c != MPI.COMM_NULL:
                c.Free()


class Pencil:
    """A global shape distributed over `subcomms`, aligned (whole on every rank) in `axis`.

    Parameters
    ----------
    subcomms : sequence of mpi4py.MPI.Comm
        One communicator per axis; ``subcomms[axis]`` must have size 1.
    shape : sequence of int
        Global shape.
    axis : int
        The aligned axis.
    comm : mpi4py.MPI.Comm, optional
        A communicator spanning the whole grid, on which arrays of this pencil are allocated.
    """

    def __init__(
        self,
        subcomms: Sequence[MPI.Comm],
        shape: Sequence[int],
        axis: int,
        comm: MPI.Comm | None = None,
    ) -> None:
        ndim = len(shape)
        axis = _axis(axis, ndim)
        if len(subcomms) != ndim:
            raise ValueError(f"zcoll.fft: {len(subcomms)} communicators for {ndim} axes")
        if subcomms[axis].size != 1:
            raise ValueError(f"zcoll.fft: the aligned axis {axis} must not be distributed")
        self.shape = tuple(int(n) for n in shape)
        self.axis = axis
        self.subcomm = tuple(subcomms)
        self.comm = comm
        self._transfers: dict[tuple, Transfer] = {}
        shares = [block_share(n, c.size, c.rank) for n, c in zip(self.shape, self.subcomm)]
        self.subshape = tuple(count for count, _ in shares)
        self.substart = tuple(start for _, start in shares)

    def too_small(self) -> str:
        """Why some rank would hold no data ("" when every rank holds some)."""
        for k, (n, c) in enumerate(zip(self.shape, self.subcomm)):
            if n < c.size:
                return (
                    f"axis {k} has {n} elements but is distributed over {c.size} processes; "
                    "use a smaller grid along it"
                )
        return ""

    def pencil(self, axis: int) -> Pencil:
        """The pencil aligned in `axis`, distributed over this one's aligned axis instead."""
        axis = _axis(axis, len(self.shape))
        subs = list(self.subcomm)
        subs[axis], subs[self.axis] = subs[self.axis], subs[axis]
        return Pencil(subs, self.shape, axis, self.comm)

    def reshaped(self, axis: int, n: int) -> Pencil:
        """The same distribution with axis `axis` of global length `n`."""
        shape = list(self.shape)
        shape[axis] = n
        return Pencil(self.subcomm, shape, self.axis, self.comm)

    def transfer(
        self, other: Pencil, dtype, *, order: str = AUTO, copy: str = AUTO, staging=True
    ) -> Transfer:
        """Collective: the transfer from this pencil to `other` (aligned in another axis);
        made once per (axis, dtype, order, copy, staging) and kept."""
        key = (other.axis, np.dtype(dtype), order, copy, staging)
        if key not in self._transfers:
            comm = self.subcomm[other.axis]
            shape = list(self.subshape)
            shape[self.axis] = self.shape[self.axis]
            shape[other.axis] = self.shape[other.axis]
            self._transfers[key] = Transfer(
                comm, shape, dtype, self.axis, other.axis, order=order, copy=copy, staging=staging
            )
        return self._transfers[key]

    def local_slice(self) -> tuple[slice, ...]:
        return tuple(slice(s, s + n) for s, n in zip(self.substart, self.subshape))


def _axis(axis: int, ndim: int) -> int:
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"zcoll.fft: axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


class Transfer:
    """Global transpose over `comm` from alignment in `axis_a` to alignment in `axis_b`.

    The global array has shape `shape` as seen by `comm`: axes `axis_a` and `axis_b` at their
    global lengths, every other axis at the local extent that all ranks of `comm` share. Before,
    every rank holds all of `axis_a` and its block of `axis_b` (shape :attr:`subshape_a`);
    after, all of `axis_b` and its block of `axis_a` (:attr:`subshape_b`). Blocks follow
    mpi4py-fft's distribution (the first ``n % p`` ranks hold one more element).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The ranks that exchange data.
    shape : sequence of int
        See above.
    dtype : numpy.dtype
        Element type (any dtype without Python objects).
    axis_a, axis_b : int
        The aligned axis before and after :meth:`forward`.
    order : str
        Block order of the exchange, as for :func:`zcoll.alltoall`.
    copy : str
        Stores of the block copies, as for :func:`zcoll.alltoall`.
    staging : bool
        Allocate two arena work arrays through which arrays that are not C-contiguous arena
        arrays are staged. Without them every array passed must be an arena array.

    Notes
    -----
    Construction is collective (over `comm`). :meth:`forward` and :meth:`backward` are
    collective over `comm`. On a node the transpose is one strided copy per element from the
    source array into the destination array; arrays outside the arena cost one extra copy each.
    """

    def __init__(
        self,
        comm,
        shape,
        dtype,
        axis_a: int,
        axis_b: int,
        *,
        order=AUTO,
        copy=AUTO,
        staging=True,
    ) -> None:
        self.comm = comm
        self.shape = tuple(int(n) for n in shape)
        ndim = len(self.shape)
        self.axis_a, self.axis_b = _axis(axis_a, ndim), _axis(axis_b, ndim)
        if self.axis_a == self.axis_b:
            raise ValueError("zcoll.fft.Transfer: axis_a and axis_b must differ")
        self.dtype = np.dtype(dtype)
        if error := _option_error(order, copy):
            raise error
        self.order, self.copy = order, copy
        self.subshape_a = self._subshape(self.axis_b)
        self.subshape_b = self._subshape(self.axis_a)
        lookup(comm)  # the context is made now, collectively, not inside a first call
        self._work = None
        if staging:
            self._work = (
                empty(comm, self.subshape_a, self.dtype),
                empty(comm, self.subshape_b, self.dtype),
            )

    def _subshape(self, distributed: int) -> tuple[int, ...]:
        shape = list(self.shape)
        shape[distributed] = block_share(shape[distributed], self.comm.size, self.comm.rank)[0]
        return tuple(shape)

    def forward(self, array_a: np.ndarray, array_b: np.ndarray) -> np.ndarray:
        """Redistribute `array_a` (aligned in axis_a) into `array_b` (aligned in axis_b)."""
        return self._run(array_a, array_b, self.axis_a, self.axis_b, 0)

    def backward(self, array_b: np.ndarray, array_a: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`forward`."""
        return self._run(array_b, array_a, self.axis_b, self.axis_a, 1)

    def _run(self, src, dst, a: int, b: int, side: int) -> np.ndarray:
        # Each rank decides alone whether to stage: the work arrays exist on every rank.
        work = self._work
        src_in = src if work is None or _shared(src) else _filled(work[side], src)
        dst_in = dst if work is None or _shared(dst) else work[1 - side]
        transfer(self.comm, src_in, dst_in, self.shape, a, b, order=self.order, copy=self.copy)
        if dst_in is not dst:
            dst[...] = dst_in
        return dst


def _shared(a) -> bool:
    return isinstance(a, np.ndarray) and a.flags.c_contiguous and is_shared(a)


def _filled(work: np.ndarray, src) -> np.ndarray:
    try:
        work[...] = src
    except (ValueError, TypeError):
        return src  # wrong shape or type: let the collective check report it on every rank
    return work


def transfer(
    comm, src, dst, shape, axis_a: int, axis_b: int, *, order: str = AUTO, copy: str = AUTO
) -> None:
    """Collective: global transpose of arena arrays (the engine behind :class:`Transfer`).

    `src` is this rank's part aligned in `axis_a`, `dst` receives its part aligned in
    `axis_b`; see :class:`Transfer` for `shape`. Both must be C-contiguous arena arrays.
    """
    ctx = lookup(comm)
    codes = option_codes(ctx, TRANSFER, order, copy)
    shape = [int(n) for n in shape]
    if ctx.multi_node:
        ctx.agree(TRANSFER, ctx.core.transfer_record(src, dst, shape, axis_a, axis_b, *codes))
    ctx.core.transfer(src, dst, shape, axis_a, axis_b, *codes)
    if ctx.multi_node:
        _transfer_remote(ctx, src, dst, shape, axis_a, axis_b)


def _transfer_remote(ctx, src, dst, shape, a: int, b: int) -> None:
    """Blocks between nodes: MPI point-to-point with subarray datatypes on a private dup."""
    mine = ctx.node_of[ctx.rank]
    remote = [r for r in range(ctx.size) if ctx.node_of[r] != mine]
    base = MPI.BYTE.Create_contiguous(dst.itemsize).Commit()
    types, requests, peers = [], [], []
    try:
        for r in remote:
            for array, starts_axis, into in ((dst, b, True), (src, a, False)):
                # Receive r's part of axis b into dst; send r's part of axis a from src.
                count, start = block_share(shape[starts_axis], ctx.size, r)
                if count == 0 or array.size == 0:
                    continue
                sub = list(array.shape)
                sub[starts_axis] = count
                starts = [0] * array.ndim
                starts[starts_axis] = start
                t = base.Create_subarray(list(array.shape), sub, starts).Commit()
                types.append(t)
                comm = ctx.p2p_comm()
                op = comm.Irecv if into else comm.Isend
                requests.append(op([array, 1, t], r, _TRANSFER_TAG))
                peers.append(r)
        if requests:
            ctx.wait_bounded(requests, "zcoll.transfer (blocks between nodes)", peers=peers)
    finally:
        for t in types:
            t.Free()
        base.Free()
