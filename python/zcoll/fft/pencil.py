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

import operator
from collections.abc import Sequence
from math import prod
from typing import cast

import numpy as np
from mpi4py import MPI

from .. import _core
from .._arena import empty
from .._collectives import _option_error, option_codes
from .._context import Context, has_context, lookup
from .._plans import _PLAN_TAG_BASE, _PLAN_TAG_SPAN, PlanMixin, buffer_role
from .._registry import AUTO, TRANSFER
from ._mpi_runs import MpiRuns

__all__ = ["Pencil", "Subcomm", "Transfer", "TransferPlan", "transfer", "transfer_init"]

_TRANSFER_INIT = "transfer_init"


def block_share(n: int, p: int, rank: int) -> tuple[int, int]:
    """(count, start) of `rank`'s block when `n` elements are split over `p` ranks."""
    return _core.block_share(n, p, rank)


def fitting_dims(size: int, dims: Sequence[int]) -> list[int]:
    """`dims` with wildcards (values <= 0) as 0; ValueError if no grid of `size` ranks has
    them (``MPI.Compute_dims`` would fail less clearly)."""
    dims = [max(0, int(d)) for d in dims]
    fixed = prod(d for d in dims if d > 0)
    if size % fixed or (0 not in dims and fixed != size):
        raise ValueError(f"zcoll.fft: a process grid {tuple(dims)} does not fit {size} ranks")
    return dims


def _grid_request(dims) -> list[int]:
    """mpi4py-fft's forms of `dims` (None, an int, a sequence) as a list for Compute_dims."""
    if dims is None:
        return [0]
    if isinstance(dims, int) or (not isinstance(dims, (list, tuple)) and np.ndim(dims) == 0):
        n = operator.index(dims)
        if n <= 0:
            raise ValueError(f"zcoll.fft.Subcomm: dims={n} must be a positive number of axes")
        return [0] * n
    dims = [operator.index(d) for d in dims]
    if not dims:
        raise ValueError("zcoll.fft.Subcomm: dims must not be empty")
    return dims


class Subcomm(tuple):
    """One communicator per axis of a Cartesian process grid (mpi4py-fft's ``Subcomm``).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The communicator to decompose, or a Cartesian communicator whose grid is used as is
        (then `dims` must be None).
    dims : None, int or sequence of int, optional
        Processes along each axis; values <= 0 are wildcards filled by ``MPI.Compute_dims``.
        An int ``d`` is ``[0] * d``; None is ``[0]`` (a one-dimensional grid).
    reorder : bool, optional
        Passed to ``Create_cart``.

    Attributes
    ----------
    comm : mpi4py.MPI.Cartcomm or None
        The Cartesian communicator spanning the grid (the one made here, or the one passed
        in); zcoll allocates the arena arrays of pencils on this grid over it. None after
        :meth:`destroy`.
    dims : tuple of int
        Processes along each axis.

    Notes
    -----
    Collective over `comm`. :meth:`destroy` frees the sub-communicators and the Cartesian
    communicator made here (also collective); a Cartesian communicator passed in stays the
    caller's.
    """

    comm: MPI.Cartcomm | None
    _owns_comm: bool

    def __new__(cls, comm: MPI.Intracomm, dims=None, reorder: bool = True):
        if not isinstance(comm, MPI.Comm) or comm.Is_inter():
            raise TypeError(f"zcoll.fft.Subcomm: expected an intracommunicator, got {comm!r}")
        if comm.Get_topology() == MPI.CART:
            if dims is not None:
                raise ValueError("zcoll.fft.Subcomm: dims must be None for a Cartesian comm")
            cart = cast(MPI.Cartcomm, comm)
            owned = False
            if cart.Get_dim() < 1:
                raise ValueError("zcoll.fft.Subcomm: the Cartesian communicator has no axes")
        else:
            grid = MPI.Compute_dims(comm.size, fitting_dims(comm.size, _grid_request(dims)))
            cart = comm.Create_cart(grid, reorder=bool(reorder))
            owned = True
        ndim = cart.Get_dim()
        subs = [cart.Sub([k == i for k in range(ndim)]) for i in range(ndim)]
        self = super().__new__(cls, subs)
        self.comm = cart
        self._owns_comm = owned
        return self

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(c.size for c in self)

    def destroy(self) -> None:
        """Free the communicators (collective)."""
        for c in self:
            if c != MPI.COMM_NULL:
                c.Free()
        if self.comm is not None and self._owns_comm and self.comm != MPI.COMM_NULL:
            self.comm.Free()
        self.comm = None


class Pencil:
    """A global shape distributed over `subcomm`, aligned (whole on every rank) in `axis`.

    Parameters
    ----------
    subcomm : Subcomm or sequence of mpi4py.MPI.Comm
        One communicator per axis (``subcomm[axis]`` of size 1), or fewer: then, as in
        mpi4py-fft, they are padded with ``MPI.COMM_SELF`` to one less than the number of
        axes and one ``COMM_SELF`` is inserted at `axis`.
    shape : sequence of int
        Global shape (at least two axes, none empty).
    axis : int, optional
        The aligned axis (default the last).
    comm : mpi4py.MPI.Comm, optional
        A communicator spanning the whole grid, over which arena arrays of this pencil are
        allocated collectively. Default: ``subcomm.comm`` where `subcomm` is a
        :class:`Subcomm`, else None (arrays of this pencil are then ordinary NumPy arrays).

    Attributes
    ----------
    shape, axis, subcomm, subshape, substart, comm

    Notes
    -----
    Local. mpi4py-fft asserts its arguments; zcoll raises ValueError. Unlike mpi4py-fft, an
    axis may be shorter than the processes along it (some ranks then hold empty blocks);
    :meth:`too_small` says where.
    """

    def __init__(
        self,
        subcomm: Sequence[MPI.Comm],
        shape: Sequence[int],
        axis: int = -1,
        comm: MPI.Comm | None = None,
    ) -> None:
        shape = tuple(operator.index(n) for n in shape)
        ndim = len(shape)
        if ndim < 2:
            raise ValueError(f"zcoll.fft.Pencil: shape {shape} must have at least two axes")
        if min(shape) < 1:
            raise ValueError(f"zcoll.fft.Pencil: shape {shape} has an empty axis")
        axis = _axis(axis, ndim)
        if comm is None:
            comm = getattr(subcomm, "comm", None)
        subs = list(subcomm)
        if not 1 <= len(subs) <= ndim:
            raise ValueError(f"zcoll.fft.Pencil: {len(subs)} communicators for {ndim} axes")
        if len(subs) < ndim:
            subs += [MPI.COMM_SELF] * (ndim - 1 - len(subs))
            subs.insert(axis, MPI.COMM_SELF)
        if subs[axis].size != 1:
            raise ValueError(f"zcoll.fft.Pencil: the aligned axis {axis} must not be distributed")
        self._place(shape, axis, tuple(subs), comm)

    def _place(self, shape: tuple[int, ...], axis: int, subcomm: tuple, comm) -> None:
        """Sets the checked layout: the attributes, and this rank's block of every axis."""
        self.shape = shape
        self.axis = axis
        self.subcomm = subcomm
        self.comm = comm
        self._transfers: dict[tuple, Transfer] = {}
        self._pencils: dict[int, Pencil] = {}
        counts, starts = list(shape), [0] * len(shape)  # whole along the axes of one rank
        self._short = None
        for k, c in enumerate(subcomm):
            p = c.size
            if p > 1:
                counts[k], starts[k] = _core.block_share(shape[k], p, c.rank)
                if self._short is None and shape[k] < p:
                    self._short = (k, shape[k], p)
        self.subshape = tuple(counts)
        self.substart = tuple(starts)

    def forget_partners(self) -> None:
        """Local: drop the pencils and transfers kept for later calls, here and in every
        pencil reached through them (pencils keep each other: cycles), so that the pencils go
        with their last outside reference."""
        reached, todo = {id(self): self}, [self]
        while todo:
            for other in todo.pop()._pencils.values():
                if id(other) not in reached:
                    reached[id(other)] = other
                    todo.append(other)
        for pencil in reached.values():
            pencil._pencils.clear()
            pencil._transfers.clear()

    def too_small(self) -> str:
        """Why some rank would hold no data ("" when every rank holds some)."""
        if self._short is None:
            return ""
        k, n, p = self._short
        return (
            f"axis {k} has {n} elements but is distributed over {p} processes; "
            "use a smaller grid along it"
        )

    def pencil(self, axis: int) -> Pencil:
        """The pencil aligned in `axis`, distributed over this one's aligned axis instead.

        Made once per axis and kept, and the new pencil's ``pencil(self.axis)`` is this one:
        arrays redistributed back and forth share pencils, and so the transfers kept on them.
        """
        axis = _axis(axis, len(self.shape))
        if axis == self.axis:
            return self
        made = self._pencils.get(axis)
        if made is None:
            subs = list(self.subcomm)
            subs[axis], subs[self.axis] = subs[self.axis], subs[axis]
            made = self._pencils[axis] = Pencil.__new__(Pencil)  # this one's layout, checked
            made._place(self.shape, axis, tuple(subs), self.comm)
            made._pencils[self.axis] = self
        return made

    def reshaped(self, axis: int, n: int) -> Pencil:
        """The same distribution with axis `axis` of global length `n`."""
        shape = list(self.shape)
        shape[axis] = n
        return Pencil(self.subcomm, shape, self.axis, self.comm)

    def transfer(
        self, pencil: Pencil, dtype, *, order: str = AUTO, copy: str = AUTO, staging=True
    ) -> Transfer:
        """The :class:`Transfer` from this pencil to `pencil`, aligned in another axis.

        Made once per (axis, dtype, order, copy, staging) and kept for later calls (a new one
        is made after the kept one's :meth:`Transfer.free` or :meth:`Transfer.destroy`).
        Local, unlike ``Transfer(...)``: the pencils' subshapes are the block distribution's,
        so there is nothing for the ranks to agree on; what is collective (the communicator's
        context, work arrays and plans) is made by the Transfer's first run, over
        ``self.subcomm[pencil.axis]``.

        Raises
        ------
        ValueError
            If `pencil` is not this distribution aligned in another axis.
        """
        if error := self._transfer_problem(pencil):
            raise ValueError(f"zcoll.fft.Pencil.transfer: {error}")
        key = (pencil.axis, np.dtype(dtype), order, copy, staging)
        kept = self._transfers.get(key)
        if kept is None or kept.freed:
            comm = self.subcomm[pencil.axis]
            shape = list(self.subshape)
            shape[pencil.axis] = self.shape[pencil.axis]
            kept = self._transfers[key] = Transfer._of_blocks(
                comm, shape, dtype, self.subshape, self.axis, pencil.subshape, pencil.axis,
                order=order, copy=copy, staging=staging,
            )  # fmt: skip
        return kept

    def _transfer_problem(self, other) -> str:
        if not isinstance(other, Pencil):
            return f"expected a Pencil, got {type(other).__name__}"
        if other.shape != self.shape:
            return f"the pencils' global shapes differ: {self.shape} and {other.shape}"
        if other.axis == self.axis:
            return f"both pencils are aligned in axis {self.axis}"
        for i in range(len(self.shape)):
            if i not in (self.axis, other.axis) and (
                not same_comm(self.subcomm[i], other.subcomm[i])
                or self.subshape[i] != other.subshape[i]
            ):
                return f"the pencils distribute axis {i} differently"
        if not same_comm(self.subcomm[other.axis], other.subcomm[self.axis]):
            return (
                f"axis {other.axis} of this pencil must be distributed as axis {self.axis} of "
                "the other"
            )
        return ""

    def local_slice(self) -> tuple[slice, ...]:
        """Where this rank's part lies in the global array."""
        return tuple(slice(s, s + n) for s, n in zip(self.substart, self.subshape))


def same_comm(a: MPI.Comm, b: MPI.Comm) -> bool:
    """Whether `a` and `b` distribute alike: the same ranks in the same order (mpi4py-fft
    asks for the same communicator)."""
    return a == b or MPI.Comm.Compare(a, b) in (MPI.IDENT, MPI.CONGRUENT)


def _axis(axis: int, ndim: int) -> int:
    axis = operator.index(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"zcoll.fft: axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


class _Staging:
    """A Transfer's arena work arrays for one leading shape (made together, one node barrier)
    and the plans between them, each direction's made at its first run."""

    def __init__(self, work_a: np.ndarray, work_b: np.ndarray) -> None:
        self.work = (work_a, work_b)
        self.plans: list[TransferPlan | None] = [None, None]  # forward, backward


#: What Transfers have made so far in this process: work array pairs and plans on them. Tests
#: read it to see that a transpose never used allocates and plans nothing.
made = {"work_arrays": 0, "plans": 0}


def arena_arrays(comm: MPI.Comm, specs: Sequence[tuple[Sequence[int], np.dtype]]) -> list:
    """Collective: arena arrays of the given (shape, dtype) specs, carved from one allocation
    (one node barrier, not one per array); each 64-byte aligned (the arena's alignment) and
    returned to the arena when the last of them is collected."""
    return carve(empty(comm, carved_bytes(specs), np.uint8), specs)


def carved_bytes(specs: Sequence[tuple[Sequence[int], np.dtype]]) -> int:
    """The bytes :func:`carve` needs for arrays of these (shape, dtype) specs."""
    return sum(-(-prod(shape) * np.dtype(dtype).itemsize // 64) * 64 for shape, dtype in specs)


def carve(raw: np.ndarray, specs: Sequence[tuple[Sequence[int], np.dtype]]) -> list:
    """Arrays of the given (shape, dtype) specs, one after another in the 64-byte aligned
    bytes `raw` (:func:`carved_bytes` long), each 64-byte aligned; `raw`'s memory lives while
    any of them does."""
    arrays, offset = [], 0
    for shape, dtype in specs:
        size = prod(shape) * np.dtype(dtype).itemsize
        arrays.append(raw[offset : offset + size].view(dtype).reshape(tuple(shape)))
        offset += -(-size // 64) * 64
    return arrays


class Transfer:
    """Global transpose over `comm` from alignment in `axisA` to alignment in `axisB`.

    mpi4py-fft's ``Transfer``, with its positional signature. The global array has shape
    `shape` as seen by `comm`: axes `axisA` and `axisB` at their global lengths, every other
    axis at the local extent that all ranks of `comm` share. Before, every rank holds all of
    `axisA` and its block of `axisB` (shape `subshapeA`); after, all of `axisB` and its block
    of `axisA` (`subshapeB`). Blocks follow mpi4py-fft's distribution (the first ``n % p``
    ranks hold one more element).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The ranks that exchange data.
    shape : sequence of int
        See above.
    dtype : numpy.dtype
        Element type (any dtype without Python objects).
    subshapeA : sequence of int
        This rank's shape before: `shape` with `axisB` cut to this rank's block.
    axisA : int
        The aligned axis before :meth:`forward`.
    subshapeB : sequence of int
        This rank's shape after: `shape` with `axisA` cut to this rank's block.
    axisB : int
        The aligned axis after :meth:`forward`.
    order : str
        Block order of the exchange, as for :func:`zcoll.alltoall`.
    copy : str
        Stores of the block copies, as for :func:`zcoll.alltoall`.
    staging : bool
        Stage arrays that are not C-contiguous arena arrays through two arena work arrays, with
        a persistent plan per direction on them (made collectively by the first call of each
        direction, so a Transfer never run holds no arena memory). Without them every array
        passed must be an arena array, and each call is a plain :func:`transfer`.

    Attributes
    ----------
    comm, shape, dtype, subshapeA, axisA, subshapeB, axisB
        As given (axes made non-negative).
    axis_a, axis_b, subshape_a, subshape_b
        zcoll's names of the same.

    Raises
    ------
    ValueError, TypeError
        On every rank of `comm`, if any rank's arguments are invalid (among them subshapes
        other than the block distribution gives).

    Notes
    -----
    Construction is collective (over `comm`). :meth:`forward` and :meth:`backward` are
    collective over `comm`. On a node the transpose is one strided copy per element from the
    source array into the destination array. Arrays in the shared heap are used in place; other
    plain arrays are pulled by CMA (one copy, from the CMA threshold up, where the kernel allows
    it) or cost one extra copy each through the work arrays.

    **Several components at once.** ``forward(a, b)`` also takes arrays with extra leading
    axes, ``lead + subshapeA`` and ``lead + subshapeB`` (a vector field ``(3, *subshapeA)``,
    for example): all components move in one exchange (one transpose of the global shape
    ``lead + shape``: the barriers of one transfer, not one transfer per component). With
    `staging`, the work arrays and plans for a leading shape are made collectively on its first
    use and kept; ranks that pass different leading shapes raise on every rank.

    With `staging`, each direction is a :class:`TransferPlan` between the work arrays: every
    check, the agreement between ranks, the schedule, the copy mode and the peers' addresses
    are settled once, and a call is one run (one crossing into the engine, two node barriers,
    the copies). On one node the pair agrees once: the second direction's plan is made from
    what the first one's creation resolved (the same arrays, swapped), with no agreement of
    its own. Each rank still decides alone, on every call, whether its arrays go through
    the work arrays: a C-contiguous array the plan accepts (in the arena or the shared heap,
    or any when the plan pulls by CMA) is handed to the run in place of the work array (the
    plan's rebinding: the rank publishes its address in the run's entry barrier, which it
    passes anyway), any other one is copied into or out of the work array. So every rank
    always runs the same plan -- never a plan on one rank and a plain transfer on another,
    which would raise -- without an extra barrier to agree on staging and without an extra
    copy of arena arrays. On a communicator spanning several nodes each call
    also agrees across nodes (one small allgather, as a plain transfer does), and blocks
    between nodes go by MPI with subarray datatypes made at construction.

    :meth:`forward_init` and :meth:`backward_init` make plans between arrays of your own (how
    :class:`PFFT` runs its transposes); :meth:`free` frees the work arrays' plans and
    :meth:`destroy` also drops the work arrays.
    """

    def __init__(
        self,
        comm,
        shape,
        dtype,
        subshapeA,
        axisA: int,
        subshapeB,
        axisB: int,
        *,
        order=AUTO,
        copy=AUTO,
        staging=True,
    ) -> None:
        self.comm = comm
        self._setup(shape, dtype, axisA, axisB, order, copy)
        ctx = lookup(comm)  # the context is made now, collectively, not inside a first call
        # Arguments the same on every rank raise above; the subshapes are each rank's own.
        ctx.raise_together("fft.Transfer", self._subshape_error(subshapeA, subshapeB))
        self._start(staging)

    @classmethod
    def _of_blocks(
        cls, comm, shape, dtype, subshapeA, axisA, subshapeB, axisB, *, order, copy, staging
    ) -> Transfer:
        """A Transfer whose subshapes are the block distribution's by construction (those of
        two pencils): nothing to agree on, so nothing collective happens here -- the context,
        work arrays and plans come with the first run that needs them. On a communicator
        without a context its first runs go through MPI (_mpi_runs)."""
        self = cls.__new__(cls)
        self.comm = comm
        self._setup(shape, dtype, axisA, axisB, order, copy)
        self.subshapeA = tuple(subshapeA)
        self.subshapeB = tuple(subshapeB)
        self._start(staging)
        if self._staging and not has_context(comm):
            subshapes = (self.subshapeA, self.subshapeB)
            axes = (self.axisA, self.axisB)
            self._mpi = MpiRuns(comm, self.dtype, self.shape, subshapes, axes)
        return self

    def _start(self, staging) -> None:
        # Work arrays and plans are made by the first run of each leading shape and direction:
        # a Transfer never run holds no arena memory and has agreed on nothing.
        self._staging = bool(staging)
        self._staged: dict[tuple[int, ...], _Staging] = {}
        self._freed = False
        self._mpi: MpiRuns | None = None

    def _setup(self, shape, dtype, axisA, axisB, order, copy) -> None:
        self.shape = tuple(operator.index(n) for n in shape)
        ndim = len(self.shape)
        self.axisA, self.axisB = _axis(axisA, ndim), _axis(axisB, ndim)
        if self.axisA == self.axisB:
            raise ValueError("zcoll.fft.Transfer: axisA and axisB must differ")
        self.dtype = np.dtype(dtype)
        if error := _option_error(order, copy):
            raise error
        self.order, self.copy = order, copy

    def _subshape_error(self, subshapeA, subshapeB) -> ValueError | None:
        try:
            self.subshapeA = tuple(operator.index(n) for n in subshapeA)
            self.subshapeB = tuple(operator.index(n) for n in subshapeB)
        except TypeError:
            return ValueError("subshapeA and subshapeB must be sequences of int")
        given = {"A": self.subshapeA, "B": self.subshapeB}
        for name, cut in (("A", self.axisB), ("B", self.axisA)):
            want = list(self.shape)
            want[cut] = block_share(want[cut], self.comm.size, self.comm.rank)[0]
            if given[name] != tuple(want):
                return ValueError(
                    f"subshape{name} {given[name]} is not this rank's block {tuple(want)} of "
                    f"{self.shape}"
                )
        return None

    axis_a = property(lambda self: self.axisA, doc="zcoll's name of `axisA`.")
    axis_b = property(lambda self: self.axisB, doc="zcoll's name of `axisB`.")
    subshape_a = property(lambda self: self.subshapeA, doc="zcoll's name of `subshapeA`.")
    subshape_b = property(lambda self: self.subshapeB, doc="zcoll's name of `subshapeB`.")

    @property
    def freed(self) -> bool:
        """Whether :meth:`free` or :meth:`destroy` was called."""
        return self._freed

    def forward(self, arrayA: np.ndarray, arrayB: np.ndarray) -> np.ndarray:
        """Collective: redistribute `arrayA` (aligned in axisA) into `arrayB` (aligned in axisB).

        Both of shape ``lead + subshape`` with the same leading shape ``lead`` (none for one
        component). Returns `arrayB`.
        """
        return self._run(arrayA, arrayB, 0)

    def backward(self, arrayB: np.ndarray, arrayA: np.ndarray) -> np.ndarray:
        """Collective: the inverse of :meth:`forward`; returns `arrayA`."""
        return self._run(arrayB, arrayA, 1)

    def forward_init(self, arrayA: np.ndarray, arrayB: np.ndarray) -> TransferPlan:
        """Collective: a persistent :meth:`forward` from `arrayA` into `arrayB` (C-contiguous
        arena arrays of this rank's shapes, with leading axes if any); see
        :func:`transfer_init`."""
        return self._init(arrayA, arrayB, 0)

    def backward_init(self, arrayB: np.ndarray, arrayA: np.ndarray) -> TransferPlan:
        """Collective: a persistent :meth:`backward` from `arrayB` into `arrayA`."""
        return self._init(arrayB, arrayA, 1)

    def inverse_init(self, plan: TransferPlan, src: np.ndarray, dst: np.ndarray, side: int):
        """Collective: the plan of direction `side` (0 forward), the opposite of `plan`'s,
        from `plan`'s destination `src` into its source `dst`. On one node it is made from
        what `plan`'s creation agreed on and resolved, with no agreement of its own (at the
        same point on every rank)."""
        if plan.across_nodes:
            return self._init(src, dst, side)
        made["plans"] += 1
        return plan.reversed()

    def free(self) -> None:
        """Local: free the plans on the work arrays (later calls raise); idempotent."""
        self._freed = True
        self._mpi = None  # its datatypes go with the last Transfer holding them
        for staged in self._staged.values():
            for plan in staged.plans:
                if plan is not None:
                    plan.free()

    def destroy(self) -> None:
        """Local: :meth:`free`, and drop the work arrays (mpi4py-fft's ``destroy``)."""
        self.free()
        self._staged.clear()

    def _geometry(self, src, side: int) -> tuple[tuple[int, ...], list[int], int, int]:
        """(leading shape, global shape, source axis, destination axis) for `src`."""
        k = max(0, getattr(src, "ndim", 0) - len(self.shape))
        lead = tuple(src.shape[:k]) if k else ()
        a, b = (self.axisA, self.axisB) if side == 0 else (self.axisB, self.axisA)
        return lead, [*lead, *self.shape], a + k, b + k

    def _init(self, src, dst, side: int) -> TransferPlan:
        _, shape, a, b = self._geometry(src, side)
        made["plans"] += 1
        return transfer_init(self.comm, src, dst, shape, a, b, order=self.order, copy=self.copy)

    def _staged_plan(self, lead: tuple[int, ...], side: int) -> tuple[_Staging, TransferPlan]:
        """The work arrays for leading shape `lead` and the plan of direction `side` (0
        forward) between them, made collectively on their first use. Work arrays are kept only
        with a plan made on them: when the ranks' leading shapes differ, the plan raises on
        every rank and every rank is left as it was."""
        staged = self._staged.get(lead)
        if (staged is None or staged.plans[side] is None) and self._freed:
            raise ValueError("zcoll.fft.Transfer: used after free() or destroy()")
        if staged is None:
            work_a, work_b = arena_arrays(
                self.comm,
                [((*lead, *self.subshapeA), self.dtype), ((*lead, *self.subshapeB), self.dtype)],
            )
            made["work_arrays"] += 1
            staged = _Staging(work_a, work_b)
        plan = staged.plans[side]
        if plan is None:
            inverse = staged.plans[1 - side]
            if inverse is not None:  # the pair agrees once (on one node)
                plan = self.inverse_init(inverse, staged.work[side], staged.work[1 - side], side)
            else:
                plan = self._init(staged.work[side], staged.work[1 - side], side)
            staged.plans[side] = plan
        self._staged[lead] = staged
        return staged, plan

    def _through_mpi(self, src, dst, side: int) -> bool:
        """Collective: the run through MPI while the Transfer's communicator has no context and
        the rule keeps it there (_mpi_runs); False, having moved nothing, when zcoll runs it
        (from then on). A rank whose own arguments are wrong calls it with None arrays, so
        that its peers' agreement ends: every rank then goes on to zcoll's checks."""
        mpi = self._mpi
        if mpi is None:
            return False
        if not has_context(self.comm) and mpi.run(src, dst, side):
            return True
        self._mpi = None
        return False

    def _run(self, src, dst, side: int) -> np.ndarray:
        if self._through_mpi(src, dst, side):
            return dst
        lead, shape, a, b = self._geometry(src, side)
        if not self._staging:
            transfer(self.comm, src, dst, shape, a, b, order=self.order, copy=self.copy)
            return dst
        staged, plan = self._staged_plan(lead, side)
        work_src, work_dst = staged.work[side], staged.work[1 - side]
        # Each rank decides alone what goes through the work arrays; the plan runs either way
        # (None: the plan's own array; an array it accepts: this run's, see the class notes).
        src_in = src if _direct(plan, src, work_src) or not _filled(work_src, src) else None
        dst_in = dst if _direct(plan, dst, work_dst) or not _fits(dst, work_dst) else None
        plan.run(src_in, dst_in)
        if dst_in is None:
            dst[...] = work_dst
        return dst


def _direct(plan, a, work: np.ndarray) -> bool:
    """Whether `a` can be bound to a run as it is: a C-contiguous array of the work array's
    shape and dtype that the plan accepts (in shared memory -- the arena, the shared heap --
    or any when the plan pulls private arrays by CMA)."""
    return (
        isinstance(a, np.ndarray)
        and a.flags.c_contiguous
        and a.shape == work.shape
        and a.dtype == work.dtype
        and plan.accepts(a)
    )


def _filled(work: np.ndarray, src) -> bool:
    """Copy `src` into `work`; False when it cannot be (wrong shape or type: the run then gets
    `src` itself, and its checks report the error on every rank)."""
    if not (isinstance(src, np.ndarray) and src.shape == work.shape and src.dtype == work.dtype):
        return False
    work[...] = src
    return True


def _fits(dst, work: np.ndarray) -> bool:
    """Whether the result can be copied from `work` into `dst` after the run (if not, the run
    gets `dst` itself, and its checks report why on every rank)."""
    return (
        isinstance(dst, np.ndarray)
        and dst.shape == work.shape
        and dst.dtype == work.dtype
        and dst.flags.writeable
    )


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
        ctx.transport.transfer(src, dst, shape, axis_a, axis_b, *codes)
    else:
        ctx.core.transfer(src, dst, shape, axis_a, axis_b, *codes)


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
    ``explain()`` says what creation decided.
    """

    _kind = "zcoll.fft.TransferPlan"

    #: Whether runs also cross nodes (then each direction is made by its own agreement).
    across_nodes = False

    def __init__(self, ctx: Context, src, dst, shape, axis_a: int, axis_b: int, order, copy):
        super().__init__(ctx.core, src, dst, shape, axis_a, axis_b, order, copy)
        self._made = True
        self._ctx = ctx
        self._copy_code = copy

    def reversed(self) -> TransferPlan:
        """Local, at the same point on every rank (the plans of a context are numbered in the
        order they are made): the plan of the inverse transpose, from `dst` into `src`, made
        from what this plan's creation agreed on and resolved, with no agreement of its own.
        Only on one node."""
        plan = TransferPlan.__new__(TransferPlan)
        _core.TransferPlan.__init__(plan, self, self._copy_code)
        plan._made = True
        plan._ctx = self._ctx
        plan._copy_code = self._copy_code
        return plan

    def run(self, src=None, dst=None) -> None:
        """Collective: one run (``start(src, dst)`` then ``wait()``)."""
        super().__call__(src, dst)

    def _summary(self) -> str:
        return f"{tuple(self.shape)} axis {self.axis_a}->{self.axis_b}"

    def explain(self) -> dict[str, object]:
        """What the plan decided when it was made, and why: every run does the same.

        Returns
        -------
        dict
            As :meth:`zcoll.Plan.explain`, with ``src`` and ``dst`` for the buffers (the
            plan's own arrays: "shared"); ``path`` "ordered" (this rank's boxes of the
            schedule copied between two barriers); ``rebinding``, which arrays this rank may
            name instead for a run: "shared" (arena or shared-heap arrays only) or "shared or
            plain" (a run in which any rank names a plain array is then pulled by CMA, each
            rank filling its own destination); ``copied_bytes``, the bytes this rank copies
            per run.
        """
        why = "the schedule's boxes copied once each, in order"
        if self.pulls:
            why += "; plain arrays may be named for a run: the blocks are big enough to pull"
        else:
            why += "; a run takes shared arrays only: blocks below the CMA threshold, or no CMA"
        return self._explained(
            "transfer",
            "ordered",
            why,
            src=buffer_role(self.src, False, pulled=False),
            dst=buffer_role(self.dst, False, pulled=False),
            rebinding="shared or plain" if self.pulls else "shared",
            copied_bytes=self.copied_bytes,
        )


class _MultiNodeTransferPlan(TransferPlan):
    """A transfer plan on a communicator spanning several nodes: the node part in the engine;
    every run agrees across nodes on its record and exchanges the blocks between nodes as MPI
    subarray messages (datatypes made once), from C++ in the run's crossing."""

    across_nodes = True
    _between_nodes = "rank to rank, MPI subarray messages (datatypes made once); each run agrees"

    def __init__(self, ctx: Context, src, dst, shape, axis_a: int, axis_b: int, order, copy):
        record = ctx.core.transfer_record(src, dst, shape, axis_a, axis_b, order, copy, True)
        ctx.agree(_TRANSFER_INIT, record)
        super().__init__(ctx, src, dst, shape, axis_a, axis_b, order, copy)
        tag = _PLAN_TAG_BASE + self.id % _PLAN_TAG_SPAN
        self._attach_remote(ctx.transport.check(), tag)


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
