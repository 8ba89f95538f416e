"""Pencil decompositions and the transfers between them (mpi4py-fft's Subcomm/Pencil/Transfer).

A global array of shape ``N`` is distributed over a Cartesian grid of processes: axis ``k``
is block-distributed over the ranks of ``subcomms[k]`` (a communicator of size 1 means the
axis is whole on every rank). A pencil is *aligned* in one axis, which is never distributed.
A :class:`Transfer` moves the data from a pencil aligned in axis ``a`` to one aligned in axis
``b``: one global transpose over the communicator that distributes ``b``, executed by zcoll's
ordered shared-memory engine as one strided copy per element on a node. A
:class:`TransferPlan` (:func:`transfer_init`) is such a transpose between fixed arrays, checked
and resolved once and run many times.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from .. import _core
from .._arena import empty, is_shared
from .._collectives import _option_error, _remote_ranks, option_codes
from .._context import Context, lookup
from .._plans import _PLAN_TAG_BASE, _PLAN_TAG_SPAN, PlanMixin, finish_requests
from .._registry import AUTO, TRANSFER

__all__ = ["Pencil", "Subcomm", "Transfer", "TransferPlan", "transfer", "transfer_init"]

_TRANSFER_TAG = 0x7A0D
_TRANSFER_INIT = "transfer_init"


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
        arrays are staged, and the persistent plans of both directions on them. Without them
        every array passed must be an arena array, and each call is a plain :func:`transfer`.

    Notes
    -----
    Construction is collective (over `comm`). :meth:`forward` and :meth:`backward` are
    collective over `comm`. On a node the transpose is one strided copy per element from the
    source array into the destination array; arrays outside the arena cost one extra copy each.

    With `staging`, each direction is a :class:`TransferPlan` built here between the work
    arrays: every check, the agreement between ranks, the schedule, the copy mode and the
    peers' addresses are settled once, and a call is one run (one crossing into the engine, two
    node barriers, the copies). Each rank still decides alone, on every call, whether its
    arrays go through the work arrays: an array that already is a C-contiguous arena array is
    handed to the run in place of the work array (the plan's rebinding: the rank publishes its
    address in the run's entry barrier, which it passes anyway), any other one is copied into
    or out of the work array. So every rank always runs the same plan -- never a plan on one
    rank and a plain transfer on another, which would raise -- without an extra barrier to
    agree on staging and without an extra copy of arena arrays. On a communicator spanning
    several nodes each call also agrees across nodes (one small allgather, as a plain transfer
    does), and blocks between nodes go by MPI with subarray datatypes made at construction.

    :meth:`forward_init` and :meth:`backward_init` make plans between arrays of your own (how
    :class:`PFFT` runs its transposes); :meth:`free` frees the work arrays' plans.
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
        self._work: tuple[np.ndarray, np.ndarray] | None = None
        self._plans: tuple[TransferPlan, TransferPlan] | None = None
        if staging:
            work = (
                empty(comm, self.subshape_a, self.dtype),
                empty(comm, self.subshape_b, self.dtype),
            )
            self._work = work
            self._plans = (
                self.forward_init(work[0], work[1]),
                self.backward_init(work[1], work[0]),
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

    def forward_init(self, array_a: np.ndarray, array_b: np.ndarray) -> TransferPlan:
        """Collective: a persistent :meth:`forward` from `array_a` into `array_b` (C-contiguous
        arena arrays of this rank's shapes); see :func:`transfer_init`."""
        return transfer_init(self.comm, array_a, array_b, self.shape, self.axis_a, self.axis_b,
                             order=self.order, copy=self.copy)  # fmt: skip

    def backward_init(self, array_b: np.ndarray, array_a: np.ndarray) -> TransferPlan:
        """Collective: a persistent :meth:`backward` from `array_b` into `array_a`."""
        return transfer_init(self.comm, array_b, array_a, self.shape, self.axis_b, self.axis_a,
                             order=self.order, copy=self.copy)  # fmt: skip

    def free(self) -> None:
        """Local: free the plans on the work arrays (later calls raise); idempotent."""
        for plan in self._plans or ():
            plan.free()

    def _run(self, src, dst, a: int, b: int, side: int) -> np.ndarray:
        plans, work = self._plans, self._work
        if plans is None or work is None:
            transfer(self.comm, src, dst, self.shape, a, b, order=self.order, copy=self.copy)
            return dst
        # Each rank decides alone what goes through the work arrays; the plan runs either way
        # (None: the plan's own array; an arena array: this run's, see the class notes).
        src_in = src if _shared(src) or not _filled(work[side], src) else None
        dst_in = dst if _shared(dst) or not _fits(dst, work[1 - side]) else None
        plans[side].run(src_in, dst_in)
        if dst_in is None:
            dst[...] = work[1 - side]
        return dst


def _shared(a) -> bool:
    return isinstance(a, np.ndarray) and a.flags.c_contiguous and is_shared(a)


def _filled(work: np.ndarray, src) -> bool:
    """Copy `src` into `work`; False when it cannot be (wrong shape or type: the run then gets
    `src` itself, and its checks report the error on every rank)."""
    try:
        work[...] = src
    except (ValueError, TypeError):
        return False
    return True


def _fits(dst, work: np.ndarray) -> bool:
    """Whether the result can be copied from `work` into `dst` after the run (if not, the run
    gets `dst` itself, and its checks report why on every rank)."""
    return isinstance(dst, np.ndarray) and dst.shape == work.shape and dst.flags.writeable


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


def _subarray(base: MPI.Datatype, shape, axis: int, count: int, start: int) -> MPI.Datatype:
    """The part of an array of `shape` with `axis` in [start, start + count)."""
    sub = list(shape)
    sub[axis] = count
    starts = [0] * len(shape)
    starts[axis] = start
    return base.Create_subarray(list(shape), sub, starts).Commit()


class TransferPlan(PlanMixin, _core.TransferPlan):
    """A persistent global transpose: checked and resolved once, run many times.

    Made by :func:`transfer_init` (collective), or :meth:`Transfer.forward_init` /
    :meth:`Transfer.backward_init`. ``plan()`` runs the transpose of `src` into `dst` given at
    creation and returns `dst`; ``start()`` then ``wait()`` (or ``test()``) split a run in two,
    as for :class:`zcoll.Plan`.

    A run may replace this rank's arrays, for that run only: ``plan(src=a, dst=b)`` with
    C-contiguous arena arrays of the same shapes and dtype (checked on this rank; an unfit one
    raises on every rank). Each rank chooses alone: the others need not pass arrays.

    Attributes
    ----------
    src, dst : numpy.ndarray
        The plan's arrays on this rank.
    shape : list of int
        The global shape, as :func:`transfer` takes it.
    axis_a, axis_b : int
        The aligned axis of `src` and of `dst`.
    order : str
        What ``order="auto"`` resolved to.
    copy : str
        The copy mode of the box copies (what ``copy="auto"`` resolved to; it may change on
        the first runs while it times the hybrid threshold).
    active : bool
        Started and not yet waited for.

    Notes
    -----
    The plan holds its arrays. ``free()`` is local; using a plan after ``free()``, after its
    communicator was freed or after a peer died raises. Ranks that run different plans, or a
    plan against a plain call, raise ValueError together. A plan is a context manager that
    frees itself. On a communicator spanning several nodes every run also agrees across nodes
    (one small allgather, so errors and mismatched plans raise on every rank), and blocks
    between nodes go by MPI point-to-point with subarray datatypes made at creation.
    """

    _kind = "zcoll.fft.TransferPlan"

    def __init__(self, ctx: Context, src, dst, shape, axis_a: int, axis_b: int, order, copy):
        super().__init__(ctx.core, src, dst, shape, axis_a, axis_b, order, copy)
        self._ctx = ctx

    def run(self, src=None, dst=None) -> None:
        """Collective: one run (``start(src, dst)`` then ``wait()``)."""
        super().__call__(src, dst)

    def _summary(self) -> str:
        return f"{tuple(self.shape)} axis {self.axis_a}->{self.axis_b}"


class _MultiNodeTransferPlan(TransferPlan):
    """A transfer plan on a communicator spanning several nodes: the node part in the engine;
    blocks between nodes by MPI point-to-point on the context's private dup -- persistent
    requests on the plan's arrays, fresh ones on arrays a run is given -- with subarray
    datatypes made once. Every run first agrees across nodes."""

    def __init__(self, ctx: Context, src, dst, shape, axis_a: int, axis_b: int, order, copy):
        record = ctx.core.transfer_record(src, dst, shape, axis_a, axis_b, order, copy, True)
        ctx.agree(_TRANSFER_INIT, record)
        super().__init__(ctx, src, dst, shape, axis_a, axis_b, order, copy)
        self._base: MPI.Datatype | None = None
        self._types: list[MPI.Datatype] = []
        self._recv_types: list[tuple[int, MPI.Datatype]] = []  # (peer, its block of dst)
        self._send_types: list[tuple[int, MPI.Datatype]] = []  # (peer, its block of src)
        self._recvs: list[MPI.Prequest] = []  # persistent, on the plan's arrays
        self._sends: list[MPI.Prequest] = []
        self._running: list[MPI.Request] = []  # the current run's requests
        self._peers: list[int] = []
        self._tag = _PLAN_TAG_BASE + self.id % _PLAN_TAG_SPAN
        self._remote_types(ctx, src, dst, shape, axis_a, axis_b)

    def _remote_types(self, ctx: Context, src, dst, shape, a: int, b: int) -> None:
        remote = _remote_ranks(ctx)
        if not remote:
            return
        self._base = base = MPI.BYTE.Create_contiguous(dst.itemsize).Commit()
        comm = ctx.p2p_comm()
        for r in remote:
            # Receive r's part of axis b into dst, send r's part of axis a from src: the blocks
            # of _transfer_remote, empty ones left out alike on both sides.
            count, start = block_share(shape[b], ctx.size, r)
            if count and dst.size:
                t = _subarray(base, dst.shape, b, count, start)
                self._types.append(t)
                self._recv_types.append((r, t))
                self._recvs.append(comm.Recv_init([dst, 1, t], r, self._tag))
            count, start = block_share(shape[a], ctx.size, r)
            if count and src.size:
                t = _subarray(base, src.shape, a, count, start)
                self._types.append(t)
                self._send_types.append((r, t))
                self._sends.append(comm.Send_init([src, 1, t], r, self._tag))
        self._peers = [r for r, _ in self._recv_types] + [r for r, _ in self._send_types]

    def start(self, src=None, dst=None) -> None:
        ctx = self._ctx
        ctx.check_unbroken()
        if self.freed or self.active or ctx.core.closed:
            super().start(src, dst)  # raises the engine's error before any message goes out
        ctx.agree(TRANSFER, self.record(src, dst))  # all ranks of all nodes go on, or none
        comm = ctx.p2p_comm()
        self._running = [
            *self._started(self._recvs, dst, self.dst, comm.Irecv, self._recv_types),
            *self._started(self._sends, src, self.src, comm.Isend, self._send_types),
        ]
        super().start(src, dst)

    def _started(self, persistent, given, own, post, types) -> list[MPI.Request]:
        """One side's requests of a run: the persistent ones on the plan's own array, fresh
        ones (`post`) on an array the run was given."""
        if not persistent:
            return []
        if given is None or given is own:
            MPI.Prequest.Startall(persistent)
            return persistent
        return [post([given, 1, t], r, self._tag) for r, t in types]

    def wait(self) -> None:
        super().wait()
        self._finish_remote()

    def _finish_remote(self) -> None:
        finish_requests(self._ctx, self._running, "zcoll.transfer plan", self._peers)
        self._running = []

    def test(self) -> bool:
        if not super().test():
            return False
        if self._running and not MPI.Request.Testall(self._running):
            return False
        self._running = []
        return True

    def run(self, src=None, dst=None) -> None:
        self.start(src, dst)
        self.wait()

    def __call__(self, src=None, dst=None):
        self.run(src, dst)
        return self.dst if dst is None else dst

    def free(self) -> None:
        if self.freed:
            return
        try:
            if self.active or self._running:
                self.wait()
        finally:
            super().free()
            for req in self._recvs + self._sends:
                if req != MPI.REQUEST_NULL:
                    req.Free()
            self._recvs, self._sends, self._running = [], [], []
            if not MPI.Is_finalized():
                for t in self._types:
                    t.Free()
                if self._base is not None:
                    self._base.Free()
            self._types, self._base = [], None


def transfer_init(
    comm, src, dst, shape, axis_a: int, axis_b: int, *, order: str = AUTO, copy: str = AUTO
) -> TransferPlan:
    """Collective: a persistent :func:`transfer` from `src` into `dst`.

    Every check, the ranks' agreement, the block schedule, the copy mode and the addresses of
    every rank's arrays are settled here, once; a run of the returned plan is the node barriers
    and the copies. Arguments as for :func:`transfer`: `src` and `dst` are C-contiguous arena
    arrays on every rank.

    Returns
    -------
    TransferPlan

    Raises
    ------
    ValueError, TypeError
        On every rank, if any rank's arguments are invalid or disagree with the others'.
    zcoll.PeerError
        If a peer dies or does not arrive within the timeout.
    """
    ctx = lookup(comm)
    codes = option_codes(ctx, _TRANSFER_INIT, order, copy)
    shape = [int(n) for n in shape]
    kind = _MultiNodeTransferPlan if ctx.multi_node else TransferPlan
    return kind(ctx, src, dst, shape, int(axis_a), int(axis_b), *codes)
