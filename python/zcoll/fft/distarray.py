"""Distributed arrays (mpi4py-fft's ``mpi4py_fft.distarray``): a rank's part of a global array."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from .._arena import empty
from .._context import lookup
from .pencil import Pencil

if TYPE_CHECKING:
    from .mpifft import PFFT

__all__ = ["DistArray", "newDistArray"]


class DistArray(np.ndarray):
    """This rank's part of a distributed array (mpi4py-fft's ``DistArray``), a NumPy array.

    Made by :func:`newDistArray`; lives in the node's shared arena. Besides everything an
    ndarray does it knows its pencil: :attr:`global_shape`, :attr:`substart`,
    :attr:`alignment`, :meth:`local_slice`, and can :meth:`redistribute` itself.
    """

    _pencil: Pencil | None = None

    def __array_finalize__(self, obj) -> None:
        self._pencil = getattr(obj, "_pencil", None)

    @property
    def pencil(self) -> Pencil:
        pencil = self._pencil
        assert pencil is not None, "a DistArray made by newDistArray (or a view of one)"
        return pencil

    @property
    def global_shape(self) -> tuple[int, ...]:
        return self.pencil.shape

    @property
    def substart(self) -> tuple[int, ...]:
        return self.pencil.substart

    @property
    def alignment(self) -> int:
        """The axis every rank holds whole."""
        return self.pencil.axis

    @property
    def subcomm(self) -> tuple[MPI.Comm, ...]:
        return self.pencil.subcomm

    @property
    def commsizes(self) -> tuple[int, ...]:
        return tuple(c.size for c in self.pencil.subcomm)

    def local_slice(self) -> tuple[slice, ...]:
        """Where this rank's part lies in the global array."""
        return self.pencil.local_slice()

    def redistribute(self, axis: int, out: DistArray | None = None) -> DistArray:
        """Collective: the same global array aligned in `axis` (a new arena array unless `out`).

        One global transpose over the communicator that distributes `axis`; a copy when
        `axis` is not distributed.
        """
        target = self.pencil.pencil(axis)
        if out is None:
            out = _new(target, self.dtype)
        error = None
        if not isinstance(out, np.ndarray) or out.shape != target.subshape:
            error = ValueError(
                f"out must be an array of this rank's shape {target.subshape} aligned in axis "
                f"{target.axis}"
            )
        assert target.comm is not None  # a DistArray's pencils come with their communicator
        lookup(target.comm).raise_together("fft.redistribute", error)
        if target.subcomm[self.alignment].size == 1:
            out[...] = self
            return out
        self.pencil.transfer(target, self.dtype).forward(self, out)
        return out


def _new(pencil: Pencil, dtype) -> DistArray:
    """Collective over the grid: an arena array of `pencil`'s local shape."""
    assert pencil.comm is not None  # PFFT's pencils come with their communicator
    a = empty(pencil.comm, pencil.subshape, dtype).view(DistArray)
    a._pencil = pencil
    return a


def newDistArray(
    pfft: PFFT,
    forward_output: bool = True,
    val=0,
    rank: int = 0,  # noqa: N802
    view: bool = False,
) -> DistArray:
    """Collective: a new arena array distributed like `pfft`'s output (or input).

    Parameters
    ----------
    pfft : PFFT
    forward_output : bool
        Spectral-space (output) layout if True, physical-space (input) layout otherwise.
    val : scalar
        Initial value.
    rank, view : int, bool
        Accepted for mpi4py-fft compatibility; only scalar fields (``rank=0``) are supported.
    """
    if rank != 0:
        raise ValueError("zcoll.fft.newDistArray: only rank=0 (scalar) arrays are supported")
    a = _new(pfft.pencil(forward_output), pfft.dtype(forward_output))
    a[...] = val
    return a
