"""zcoll.fft: pencil-decomposed parallel FFTs whose global transposes run in shared memory.

The package is mpi4py-fft's (``mpi4py_fft``) module for module -- ``mpifft``, ``pencil``,
``distarray``, ``libfft``, ``fftw``, ``io`` -- so switching is a change of import::

    from zcoll.fft import PFFT, newDistArray      # was: from mpi4py_fft import ...

    fft = PFFT(MPI.COMM_WORLD, (N, N, N), dtype=np.complex128)
    u = newDistArray(fft, forward_output=False)   # this rank's part of the input
    u_hat = fft.forward(u)                        # the plan's output array, scaled by 1/N^3
    u2 = fft.backward(u_hat, newDistArray(fft, False))

Each global transpose is one exchange of strided sub-blocks between arena arrays: packing,
moving and unpacking fused into one copy per element on a node (blocks between nodes go by
MPI). A field with leading component axes (``newDistArray(..., rank=1)``) moves all its
components through one transpose per stage. :class:`Transfer` exposes a redistribution on its
own.
"""

from __future__ import annotations

from . import distarray, fftw, io, libfft, mpifft, pencil
from .distarray import DistArray, Function, newDistArray
from .fftw import fftlib
from .io import HDF5File, NCFile, generate_xdmf
from .libfft import BACKENDS
from .mpifft import PFFT
from .pencil import Pencil, Subcomm, Transfer, TransferPlan, transfer, transfer_init

__all__ = [
    "BACKENDS",
    "PFFT",
    "DistArray",
    "Function",
    "HDF5File",
    "NCFile",
    "Pencil",
    "Subcomm",
    "Transfer",
    "TransferPlan",
    "distarray",
    "fftlib",
    "fftw",
    "generate_xdmf",
    "io",
    "libfft",
    "mpifft",
    "newDistArray",
    "pencil",
    "transfer",
    "transfer_init",
]
