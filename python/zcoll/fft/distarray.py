"""Distributed arrays (mpi4py-fft's ``mpi4py_fft.distarray``): a rank's part of a global array."""

from __future__ import annotations

import operator
import warnings
from numbers import Integral, Number
from typing import Any

import numpy as np
from mpi4py import MPI

from .._arena import empty
from .._context import lookup
from .pencil import Pencil, Subcomm, same_comm

__all__ = ["DistArray", "Function", "newDistArray"]


class DistArray(np.ndarray):
    """This rank's part of a distributed array (mpi4py-fft's ``DistArray``), a NumPy array.

    Parameters
    ----------
    global_shape : sequence of int
        Shape of the global array, the `rank` leading (component) axes included.
    subcomm : None, Subcomm, sequence of mpi4py.MPI.Comm or sequence of int, optional
        How to distribute the last ``len(global_shape) - rank`` axes: a :class:`Subcomm`, one
        communicator per axis, or the `dims` of a :class:`Subcomm` made over
        ``MPI.COMM_WORLD``. None: a grid over ``MPI.COMM_WORLD`` distributing every axis but
        `alignment` (default the last).
    val : Number, optional
        Fill value (when `buffer` is None); otherwise the array is uninitialised.
    dtype : numpy.dtype, optional
    buffer : buffer, optional
        Memory of this rank's part (owned by the caller).
    strides : tuple of int, optional
        Strides in `buffer`; used, as by mpi4py-fft, only for arrays of one axis.
    alignment : int, optional
        The axis (not counting the `rank` leading ones) every rank holds whole. Default: the
        last axis not distributed.
    rank : int, optional
        Tensor rank: the number of leading component axes, never distributed (0 scalar,
        1 vector, 2 matrix).

    Notes
    -----
    Construction is collective over the grid when the memory comes from zcoll's arena: when
    `buffer` is None and a communicator spanning the grid is known (a :class:`Subcomm` made
    by zcoll, or `subcomm` None or ints). Then transposes of the array are one copy per
    element on a node. With a plain sequence of communicators the array is ordinary memory,
    staged through arena work arrays when redistributed. Arrays of one axis (besides the
    `rank` leading ones) are not distributed: every rank holds the whole array.

    Indexing follows mpi4py-fft: ``a[i]`` and ``a[i, j]`` of a rank > 0 array with at most
    `rank` indices are DistArrays (components, ``rank`` reduced); other indexing gives plain
    ``numpy.ndarray`` views. Ufunc results and ``numpy`` copies are DistArrays with the same
    distribution, as in mpi4py-fft.
    """

    _p0: Pencil | None = None
    _rank: int | None = 0

    def __new__(
        cls,
        global_shape,
        subcomm=None,
        val=None,
        dtype=float,
        buffer=None,
        strides=None,
        alignment=None,
        rank: int = 0,
    ):
        global_shape = tuple(operator.index(n) for n in global_shape)
        rank = operator.index(rank)
        if not 0 <= rank <= len(global_shape):
            raise ValueError(f"zcoll.fft.DistArray: rank={rank} for shape {global_shape}")
        if len(global_shape[rank:]) < 2:
            obj = np.ndarray.__new__(cls, global_shape, dtype=dtype, buffer=buffer, strides=strides)
            if buffer is None and isinstance(val, Number):
                obj.fill(val)
            obj._rank, obj._p0 = rank, None
            return obj
        pencil = _pencil_of(global_shape[rank:], subcomm, alignment)
        return _allocate(cls, pencil, global_shape[:rank], dtype, val, buffer)

    def __array_finalize__(self, obj) -> None:
        if obj is None:
            return
        self._p0 = getattr(obj, "_p0", None)
        self._rank = getattr(obj, "_rank", None)

    def __getitem__(self, i):
        if self.ndim == 1:
            return np.ndarray.__getitem__(self, i)
        rank = self._rank or 0
        if isinstance(i, (Integral, slice)):
            if rank > 0:
                return self._component(i)
            return np.ndarray.__getitem__(self.v, i)
        if isinstance(i, tuple) and len(i) <= rank:
            return self._component(i)
        return np.ndarray.__getitem__(self.v, i)

    def _component(self, i):
        v0 = np.ndarray.__getitem__(self, i)
        if isinstance(v0, DistArray):
            v0._rank = (self._rank or 0) - (self.ndim - v0.ndim)
        return v0

    @property
    def v(self) -> np.ndarray:
        """This rank's part as a plain ``numpy.ndarray`` (a view)."""
        return self.view(np.ndarray)

    @property
    def pencil(self) -> Pencil:
        """The :class:`Pencil` of the distributed (non-component) axes."""
        pencil = self._p0
        if pencil is None:
            raise ValueError("zcoll.fft.DistArray: this array is not distributed (no pencil)")
        return pencil

    @property
    def rank(self) -> int:
        """Tensor rank: the number of leading component axes."""
        return self._rank  # type: ignore[return-value]  # None only for views of plain arrays

    @property
    def dimensions(self) -> int:
        """Number of axes, the component axes not counted."""
        return len(self.pencil.shape)

    @property
    def alignment(self) -> int:
        """The axis (not counting the component axes) every rank holds whole."""
        return self.pencil.axis

    @property
    def global_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[: self.rank]) + self.pencil.shape

    @property
    def substart(self) -> tuple[int, ...]:
        """Where this rank's part starts in the global array."""
        return (0,) * self.rank + self.pencil.substart

    @property
    def subcomm(self) -> tuple[MPI.Comm, ...]:
        """One communicator per axis (``COMM_SELF`` for the component axes)."""
        return (MPI.COMM_SELF,) * self.rank + self.pencil.subcomm

    @property
    def commsizes(self) -> list[int]:
        """Processes along each axis."""
        return [c.Get_size() for c in self.subcomm]

    def local_slice(self) -> tuple[slice, ...]:
        """Where this rank's part lies in the global array."""
        return tuple(slice(0, n) for n in self.shape[: self.rank]) + self.pencil.local_slice()

    def get_pencil_and_transfer(self, axis: int):
        """Collective: the pencil aligned in `axis` and the :class:`Transfer` to it.

        Returns
        -------
        (Pencil, Transfer)
        """
        target = self.pencil.pencil(axis)
        return target, self.pencil.transfer(target, self.dtype)

    def redistribute(self, axis: int | None = None, out: np.ndarray | None = None) -> DistArray:
        """Collective: the same global array aligned in `axis` (or as `out` is).

        Parameters
        ----------
        axis : int, optional
            The axis (not counting the component axes) to align in.
        out : DistArray, optional
            Where to put the result; its alignment is used when `axis` is None. zcoll also
            takes a plain array of the right local shape when `axis` is given.

        Returns
        -------
        DistArray
            `self` when already aligned in `axis` (also when `axis` is not distributed: then
            only the alignment changes, as in mpi4py-fft); else `out`, or a new array (in the
            arena when the grid's communicator is known).

        Notes
        -----
        One global transpose over the communicator that distributes `axis`: all components
        of a rank > 0 array move in one exchange. Errors in `out` raise on every rank of the
        grid (of that communicator where the grid's is not known).
        """
        pencil = self.pencil
        if axis is not None:
            axis = operator.index(axis) % self.dimensions
            if axis == self.alignment:
                return self
            if isinstance(out, DistArray) and axis != out.alignment:
                raise ValueError(
                    f"zcoll.fft.DistArray.redistribute: axis {axis} but out is aligned in "
                    f"axis {out.alignment}"
                )
            if pencil.subcomm[axis].Get_size() == 1:
                self._p0 = Pencil(pencil.subcomm, pencil.shape, axis, pencil.comm)
                return self
        elif out is None:
            raise ValueError("zcoll.fft.DistArray.redistribute: give axis or out")
        if isinstance(out, DistArray):
            if self.global_shape != out.global_shape:
                raise ValueError(
                    f"zcoll.fft.DistArray.redistribute: out has global shape "
                    f"{out.global_shape}, this array {self.global_shape}"
                )
            axis = out.alignment
            if self.commsizes == out.commsizes:
                out[...] = self
                return out
        elif axis is None:
            raise ValueError("zcoll.fft.DistArray.redistribute: out must be a DistArray")
        target = pencil.pencil(axis)
        want = (*self.shape[: self.rank], *target.subshape)
        error = None
        if out is None:
            out = _allocate(DistArray, target, self.shape[: self.rank], self.dtype, None, None)
        elif isinstance(out, DistArray) and (problem := _layout_problem(pencil, out.pencil)):
            error = ValueError(f"out is not distributed like this array: {problem}")
        elif not isinstance(out, np.ndarray) or out.shape != want:
            error = ValueError(
                f"out must be an array of this rank's shape {want} aligned in axis {axis}"
            )
        # An error raises on every rank of the grid: over the grid's communicator (one barrier)
        # where the transfer's spans only part of it, else through the transfer's own checks.
        grid, comm = pencil.comm, pencil.subcomm[axis]
        transfer = pencil.transfer(target, self.dtype)
        if grid is not None and grid.Get_size() != comm.Get_size():
            lookup(grid).raise_together("fft.DistArray.redistribute", error)
        elif error is not None:
            transfer._through_mpi(None, None, 0)  # declines, where the peers would run by MPI
            lookup(comm).fail("fft.DistArray.redistribute", error)
        transfer.forward(self, out)
        return out  # type: ignore[return-value]  # a plain array only where the caller gave one

    def get(self, gslice) -> np.ndarray | None:
        """Collective: a slice of the global array, on rank 0.

        Parameters
        ----------
        gslice : sequence of int and slice
            One entry per axis of the global array.

        Returns
        -------
        numpy.ndarray or None
            The slice (integer entries drop their axis) on rank 0 of the grid's communicator
            (``MPI.COMM_WORLD`` where none is known); None on the other ranks.

        Notes
        -----
        mpi4py-fft writes a temporary HDF5 file; zcoll gathers the parts with MPI.
        """
        gslice = tuple(gslice)
        if self._p0 is None:  # not distributed: every rank holds the whole array
            return np.array(self.v[gslice]) if MPI.COMM_WORLD.Get_rank() == 0 else None
        comm = self._p0.comm or MPI.COMM_WORLD
        gshape, starts = self.global_shape, self.substart
        if len(gslice) != len(gshape):
            raise ValueError(
                f"zcoll.fft.DistArray.get: {len(gslice)} entries for {len(gshape)} axes"
            )
        local, where, out_shape = [], [], []
        for entry, n, start, count in zip(gslice, gshape, starts, self.shape):
            if isinstance(entry, slice):
                wanted = np.arange(n)[entry]
                out_shape.append(len(wanted))
            else:
                wanted = np.arange(n)[[operator.index(entry)]]
            mine = (wanted >= start) & (wanted < start + count)
            local.append(wanted[mine] - start)
            where.append(np.flatnonzero(mine) if isinstance(entry, slice) else None)
        part = None
        if all(len(ix) for ix in local):
            block = self.v[np.ix_(*local)]
            keep = [w is not None for w in where]
            block = block.reshape([s for s, k in zip(block.shape, keep) if k])
            part = ([w for w in where if w is not None], block)
        parts = comm.gather(part, root=0)
        if parts is None:
            return None
        result = np.zeros(out_shape, dtype=self.dtype)
        for p in parts:
            if p is not None:
                result[np.ix_(*p[0])] = p[1]
        return result

    def write(self, filename, name="darray", step=0, global_slice=None, domain=None,
              as_scalar=False) -> None:  # fmt: skip
        """Write snapshot `step` to `filename` (mpi4py-fft's ``DistArray.write``).

        Needs h5py built with MPI (``.h5``) or netCDF4 with parallel support; raises
        ImportError naming what is missing otherwise (see :mod:`zcoll.fft.io`).
        """
        from . import io

        f: Any
        if isinstance(filename, str):
            writer = io.HDF5File if filename.endswith(".h5") else io.NCFile
            f = writer(filename, domain=domain, mode="a")
        else:
            f = filename
        field = [self] if global_slice is None else [(self, global_slice)]
        f.write(step, {name: field}, as_scalar=as_scalar)

    def read(self, filename, name="darray", step=0) -> None:
        """Read snapshot `step` of `name` from `filename` into this array (mpi4py-fft's
        ``DistArray.read``); the same requirements as :meth:`write`."""
        from . import io

        f: Any
        if isinstance(filename, str):
            reader = io.HDF5File if filename.endswith(".h5") else io.NCFile
            f = reader(filename, mode="r")
        else:
            f = filename
        f.read(self, name, step=step)


def _layout_problem(a: Pencil, b: Pencil) -> str:
    """mpi4py-fft's check that `b` distributes every axis but the two aligned ones as `a`
    (communicators with the same ranks in the same order count as the same)."""
    for i in range(len(a.shape)):
        if i not in (a.axis, b.axis) and (
            not same_comm(a.subcomm[i], b.subcomm[i]) or a.subshape[i] != b.subshape[i]
        ):
            return f"axis {i} is distributed differently"
    return ""


def _pencil_of(shape: tuple[int, ...], subcomm, alignment) -> Pencil:
    """mpi4py-fft's choice of grid and alignment for a DistArray of `shape`."""
    if isinstance(subcomm, Subcomm):
        pass
    elif isinstance(subcomm, (tuple, list)):
        if len(subcomm) != len(shape):
            raise ValueError(
                f"zcoll.fft.DistArray: subcomm has {len(subcomm)} entries for {len(shape)} "
                "distributed axes"
            )
        if not all(isinstance(c, MPI.Comm) for c in subcomm):
            subcomm = Subcomm(MPI.COMM_WORLD, subcomm)
    elif subcomm is None:
        dims = [0] * len(shape)
        if alignment is not None:
            dims[operator.index(alignment)] = 1
        else:
            dims[-1] = 1
            alignment = len(dims) - 1
        subcomm = Subcomm(MPI.COMM_WORLD, dims)
    else:
        raise TypeError(
            f"zcoll.fft.DistArray: subcomm must be None, a Subcomm or a sequence, got {subcomm!r}"
        )
    sizes = [c.Get_size() for c in subcomm]
    if alignment is not None:
        alignment = operator.index(alignment)
        if not -len(sizes) <= alignment < len(sizes) or sizes[alignment] != 1:
            raise ValueError(
                f"zcoll.fft.DistArray: alignment {alignment} must be an axis the grid "
                f"{tuple(sizes)} does not distribute"
            )
    else:
        whole = [k for k, s in enumerate(sizes) if s == 1]
        if not whole:
            raise ValueError(f"zcoll.fft.DistArray: the grid {tuple(sizes)} distributes every axis")
        alignment = whole[-1]
    return Pencil(subcomm, shape, alignment)


def _allocate(cls, pencil: Pencil, lead: tuple[int, ...], dtype, val, buffer) -> Any:
    """A `cls` array of `pencil` with leading axes `lead`: in the arena (collective over
    ``pencil.comm``) when `buffer` is None and the grid's communicator is known."""
    dtype = np.dtype(dtype)
    shape = (*lead, *pencil.subshape)
    if buffer is None and pencil.comm is not None and not dtype.hasobject:
        # On the arena block itself (not a view of an ndarray), so that ``obj.v.base`` is
        # `obj`, as for mpi4py-fft's arrays, which own their memory.
        root: Any = empty(pencil.comm, shape, dtype)
        while isinstance(root, np.ndarray):
            root = root.base
        obj = np.ndarray.__new__(cls, shape, dtype=dtype, buffer=root)
    else:
        obj = np.ndarray.__new__(cls, shape, dtype=dtype, buffer=buffer)
    if buffer is None and isinstance(val, Number):
        obj.fill(val)
    obj._p0, obj._rank = pencil, len(lead)
    return obj


def _new(pencil: Pencil, dtype) -> DistArray:
    """Collective over ``pencil.comm``: an uninitialised scalar DistArray of `pencil` (in the
    arena when ``pencil.comm`` is known)."""
    return _allocate(DistArray, pencil, (), dtype, None, None)


def newDistArray(  # noqa: N802
    pfft: Any,
    forward_output: bool = True,
    val=0,
    rank: int = 0,
    view: bool = False,
):
    """Collective: a new array distributed like `pfft`'s output (or input).

    Parameters
    ----------
    pfft : PFFT
        Or any object with mpi4py-fft's ``global_shape(forward_output)``, ``dtype(...)`` and
        ``pencil`` (a list ``[input_pencil, output_pencil]``, or a method).
    forward_output : bool
        Spectral-space (output) layout if True, physical-space (input) layout otherwise.
    val : Number
        Initial value.
    rank : int
        Tensor rank: ``rank`` leading axes of length ``pfft.dimensions`` (a vector field for
        1, a matrix field for 2).
    view : bool
        Return the plain ``numpy.ndarray`` view (``.base`` is the DistArray).

    Returns
    -------
    DistArray or numpy.ndarray
        Global shape ``(d,) * rank + pfft.global_shape(forward_output)``, in the arena.
    """
    global_shape = tuple(pfft.global_shape(forward_output))
    pencils = pfft.pencil
    p0 = pencils(forward_output) if callable(pencils) else pencils[forward_output]
    dtype = pfft.dtype(forward_output)
    rank = operator.index(rank)
    if rank < 0:
        raise ValueError(f"zcoll.fft.newDistArray: rank={rank} must not be negative")
    # The PFFT's own pencil where it knows the grid's communicator: arrays of one PFFT then
    # share pencils, and the transfers that redistribute keeps on them.
    comm = getattr(pfft, "comm", None)
    pencil = (
        p0 if p0.comm is not None or comm is None else Pencil(p0.subcomm, p0.shape, p0.axis, comm)
    )
    z = _allocate(DistArray, pencil, (len(global_shape),) * rank, dtype, val, None)
    return z.v if view else z


def Function(*args, **kwargs):  # noqa: N802
    """Deprecated in mpi4py-fft: :func:`newDistArray` (``tensor=`` is ``rank=1``)."""
    warnings.warn("Function() is deprecated; use newDistArray().", FutureWarning, stacklevel=2)
    if "tensor" in kwargs:
        kwargs["rank"] = 1
        del kwargs["tensor"]
    return newDistArray(*args, **kwargs)
