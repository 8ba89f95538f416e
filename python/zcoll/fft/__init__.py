"""zcoll.fft: pencil-decomposed parallel FFTs whose global transposes run in shared memory.

The API follows mpi4py-fft, so switching is a change of import::

    from zcoll.fft import PFFT, newDistArray      # was: from mpi4py_fft import ...

    fft = PFFT(MPI.COMM_WORLD, (N, N, N), dtype=np.complex128)
    u = newDistArray(fft, forward_output=False)   # this rank's part of the input
    u_hat = fft.forward(u)                        # a new array, scaled by 1/N^3
    u2 = fft.backward(u_hat)

Each global transpose is one exchange of strided sub-blocks between arena arrays: packing,
moving and unpacking fused into one copy per element on a node (blocks between nodes go by
MPI). :class:`Transfer` exposes such a redistribution on its own.
"""

from __future__ import annotations

from ._backends import BACKENDS
from .distarray import DistArray, newDistArray
from .mpifft import PFFT
from .pencil import Pencil, Subcomm, Transfer, TransferPlan, transfer, transfer_init

__all__ = [
    "BACKENDS",
    "PFFT",
    "DistArray",
    "Pencil",
    "Subcomm",
    "Transfer",
    "TransferPlan",
    "newDistArray",
    "transfer",
    "transfer_init",
]
