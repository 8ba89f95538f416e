"""FFTW constants and byte-aligned arrays, as in ``mpi4py_fft.fftw.utilities``.

The integer values are mpi4py-fft's (FFTW's own for the flags and real-to-real kinds, and
mpi4py-fft's for the complex kinds ``C2C_FORWARD``, ``C2C_BACKWARD``, ``R2C`` and ``C2R``).
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

__all__ = [
    "C2C_BACKWARD", "C2C_FORWARD", "C2R", "FFTW_BACKWARD", "FFTW_CONSERVE_MEMORY",
    "FFTW_DESTROY_INPUT", "FFTW_DHT", "FFTW_ESTIMATE", "FFTW_EXHAUSTIVE", "FFTW_FORWARD",
    "FFTW_HC2R", "FFTW_MEASURE", "FFTW_PATIENT", "FFTW_PRESERVE_INPUT", "FFTW_R2HC",
    "FFTW_REDFT00", "FFTW_REDFT01", "FFTW_REDFT10", "FFTW_REDFT11", "FFTW_RODFT00",
    "FFTW_RODFT01", "FFTW_RODFT10", "FFTW_RODFT11", "FFTW_UNALIGNED", "FFTW_WISDOM_ONLY",
    "R2C", "aligned", "aligned_like", "get_alignment",
]  # fmt: skip

FFTW_FORWARD = -1
FFTW_R2HC = 0
FFTW_BACKWARD = 1
FFTW_HC2R = 1
FFTW_DHT = 2
FFTW_REDFT00 = 3
FFTW_REDFT01 = 4
FFTW_REDFT10 = 5
FFTW_REDFT11 = 6
FFTW_RODFT00 = 7
FFTW_RODFT01 = 8
FFTW_RODFT10 = 9
FFTW_RODFT11 = 10

C2C_FORWARD = -1
C2C_BACKWARD = 1
R2C = -2
C2R = 2

FFTW_MEASURE = 0
FFTW_DESTROY_INPUT = 1
FFTW_UNALIGNED = 2
FFTW_CONSERVE_MEMORY = 4
FFTW_EXHAUSTIVE = 8
FFTW_PRESERVE_INPUT = 16
FFTW_PATIENT = 32
FFTW_ESTIMATE = 64
FFTW_WISDOM_ONLY = 2097152


def get_alignment(array: np.ndarray) -> int:
    """Return the alignment of `array`'s data in bytes, the largest power of two up to 32.

    Parameters
    ----------
    array : numpy.ndarray
        The array whose first byte is looked at.

    Returns
    -------
    int
        1, 2, 4, 8, 16 or 32.
    """
    addr = array.__array_interface__["data"][0]
    n = 32
    while n > 1 and addr % n:
        n //= 2
    return n


def aligned(shape: Any, n: int = 32, dtype: Any = "d", fill: Any = None) -> np.ndarray:
    """Return a new C-ordered array whose data starts on an `n`-byte boundary.

    Parameters
    ----------
    shape : int or sequence of ints
        Shape of the returned array.
    n : int, optional
        The byte-alignment.
    dtype : numpy.dtype, optional
        Type of the returned array.
    fill : None or number, optional
        If a number, the array is filled with it; otherwise it is left uninitialised.

    Returns
    -------
    numpy.ndarray
        The byte-aligned array.
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(k) for k in np.atleast_1d(shape))
    nbytes = prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + n, dtype=np.uint8)
    offset = (-raw.__array_interface__["data"][0]) % n
    b = raw[offset : offset + nbytes].view(dtype).reshape(shape)
    if fill is not None:
        b[...] = fill
    return b


def aligned_like(z: np.ndarray, fill: Any = None) -> np.ndarray:
    """Return a new array with the shape, dtype and byte-alignment of `z`.

    Parameters
    ----------
    z : numpy.ndarray
        The array whose shape, type and alignment are copied.
    fill : None or number, optional
        If a number, the array is filled with it; otherwise it is left uninitialised.

    Returns
    -------
    numpy.ndarray
        The byte-aligned array.
    """
    return aligned(z.shape, n=get_alignment(z), dtype=z.dtype, fill=fill)
