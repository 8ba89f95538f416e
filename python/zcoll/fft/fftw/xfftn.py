"""Planners for FFTW transforms with mpi4py-fft's signatures (``mpi4py_fft.fftw.xfftn``).

Each planner returns a :class:`~zcoll.fft.fftw.factory.FFT` object; it does not compute the
transform. Outputs are unnormalised, as FFTW computes them; ``get_normalization()`` of the
returned object is the factor that makes a forward-backward pair the identity (see
:func:`get_normalization`). Planning may overwrite the input array.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any, Union

import numpy as np

from .factory import FFT, get_planned_FFT
from .utilities import (
    C2C_BACKWARD,
    C2C_FORWARD,
    C2R,
    FFTW_BACKWARD,
    FFTW_CONSERVE_MEMORY,
    FFTW_DESTROY_INPUT,
    FFTW_DHT,
    FFTW_ESTIMATE,
    FFTW_EXHAUSTIVE,
    FFTW_FORWARD,
    FFTW_HC2R,
    FFTW_MEASURE,
    FFTW_PATIENT,
    FFTW_PRESERVE_INPUT,
    FFTW_R2HC,
    FFTW_REDFT00,
    FFTW_REDFT01,
    FFTW_REDFT10,
    FFTW_REDFT11,
    FFTW_RODFT00,
    FFTW_RODFT01,
    FFTW_RODFT10,
    FFTW_RODFT11,
    FFTW_UNALIGNED,
    FFTW_WISDOM_ONLY,
    R2C,
    aligned,
    aligned_like,
    get_alignment,
)

__all__ = [
    "C2C_BACKWARD", "C2C_FORWARD", "C2R", "FFTW_BACKWARD", "FFTW_CONSERVE_MEMORY",
    "FFTW_DESTROY_INPUT", "FFTW_DHT", "FFTW_ESTIMATE", "FFTW_EXHAUSTIVE", "FFTW_FORWARD",
    "FFTW_HC2R", "FFTW_MEASURE", "FFTW_PATIENT", "FFTW_PRESERVE_INPUT", "FFTW_R2HC",
    "FFTW_REDFT00", "FFTW_REDFT01", "FFTW_REDFT10", "FFTW_REDFT11", "FFTW_RODFT00",
    "FFTW_RODFT01", "FFTW_RODFT10", "FFTW_RODFT11", "FFTW_UNALIGNED", "FFTW_WISDOM_ONLY",
    "R2C", "aligned", "aligned_like", "dct_type", "dctn", "dst_type", "dstn", "fftn",
    "flag_dict", "get_alignment", "get_normalization", "get_planned_FFT", "hfftn", "idct_type",
    "idctn", "idst_type", "idstn", "ifftn", "ihfftn", "inverse", "irfftn", "rfftn",
]  # fmt: skip

flag_dict = {
    "FFTW_FORWARD": FFTW_FORWARD,
    "FFTW_BACKWARD": FFTW_BACKWARD,
    "FFTW_REDFT00": FFTW_REDFT00,
    "FFTW_REDFT01": FFTW_REDFT01,
    "FFTW_REDFT10": FFTW_REDFT10,
    "FFTW_REDFT11": FFTW_REDFT11,
    "FFTW_RODFT00": FFTW_RODFT00,
    "FFTW_RODFT01": FFTW_RODFT01,
    "FFTW_RODFT10": FFTW_RODFT10,
    "FFTW_RODFT11": FFTW_RODFT11,
    "FFTW_MEASURE": FFTW_MEASURE,
    "FFTW_DESTROY_INPUT": FFTW_DESTROY_INPUT,
    "FFTW_UNALIGNED": FFTW_UNALIGNED,
    "FFTW_CONSERVE_MEMORY": FFTW_CONSERVE_MEMORY,
    "FFTW_EXHAUSTIVE": FFTW_EXHAUSTIVE,
    "FFTW_PRESERVE_INPUT": FFTW_PRESERVE_INPUT,
    "FFTW_PATIENT": FFTW_PATIENT,
    "FFTW_ESTIMATE": FFTW_ESTIMATE,
    "FFTW_WISDOM_ONLY": FFTW_WISDOM_ONLY,
    "FFTW_R2HC": FFTW_R2HC,
    "FFTW_HC2R": FFTW_HC2R,
    "FFTW_DHT": FFTW_DHT,
}

dct_type = {1: FFTW_REDFT00, 2: FFTW_REDFT10, 3: FFTW_REDFT01, 4: FFTW_REDFT11}
idct_type = {1: FFTW_REDFT00, 2: FFTW_REDFT01, 3: FFTW_REDFT10, 4: FFTW_REDFT11}
dst_type = {1: FFTW_RODFT00, 2: FFTW_RODFT10, 3: FFTW_RODFT01, 4: FFTW_RODFT11}
idst_type = {1: FFTW_RODFT00, 2: FFTW_RODFT01, 3: FFTW_RODFT10, 4: FFTW_RODFT11}

_Flags = Union[int, Sequence[int]]


def _check_dtype(a: np.ndarray, chars: str, what: str) -> None:
    if a.dtype.char not in chars:
        kind = "real" if chars == "fdg" else "complex"
        raise TypeError(f"{what} needs a {kind} input array, got dtype {a.dtype}")


def _check_same_shape(a: np.ndarray, out: np.ndarray) -> None:
    if a.shape != out.shape:
        raise ValueError(f"output_array has shape {out.shape}, expected {a.shape}")


def _halved(a: np.ndarray, axes: Sequence[int], out: np.ndarray | None) -> np.ndarray:
    """The output of a real-to-complex transform of `a` (new, or `out` checked)."""
    n = a.shape[axes[-1]] // 2 + 1
    if out is None:
        shape = list(a.shape)
        shape[axes[-1]] = n
        return aligned(shape, n=get_alignment(a), dtype=a.dtype.char.upper())
    if out.shape[axes[-1]] != n:
        raise ValueError(f"output_array must have length {n} along axis {axes[-1]}")
    return out


def _c2r_output(
    a: np.ndarray, s: Sequence[int] | None, axes: Sequence[int], out: np.ndarray | None
) -> np.ndarray:
    """The output of a complex-to-real transform of `a` (new, or `out` checked)."""
    shape = list(a.shape)
    if s is not None:
        if len(s) != len(axes):
            raise ValueError(f"s ({tuple(s)}) must have one length per axis ({tuple(axes)})")
        for n, axis in zip(s, axes):
            shape[axis] = int(n)
    else:
        shape[axes[-1]] = 2 * shape[axes[-1]] - 2
    if shape[axes[-1]] // 2 + 1 != a.shape[axes[-1]]:
        raise ValueError(
            f"an output length {shape[axes[-1]]} along axis {axes[-1]} does not fit an input "
            f"length {a.shape[axes[-1]]}"
        )
    if out is None:
        return aligned(shape, n=get_alignment(a), dtype=a.dtype.char.lower())
    if list(out.shape) != shape:
        raise ValueError(f"output_array has shape {out.shape}, expected {tuple(shape)}")
    return out


def _fourier_norm(shape: Sequence[int], axes: Sequence[int]) -> float:
    return 1.0 / prod(int(shape[a]) for a in axes)


def fftn(
    input_array: np.ndarray,
    s: Sequence[int] | None = None,
    axes: Sequence[int] = (-1,),
    threads: int = 1,
    flags: _Flags = (FFTW_MEASURE,),
    output_array: np.ndarray | None = None,
) -> FFT:
    """Return a complex-to-complex forward transform object.

    Parameters
    ----------
    input_array : complex numpy.ndarray
    s : sequence of ints, optional
        Not used; accepted for compatibility with NumPy.
    axes : sequence of ints, optional
        Axes over which to compute the FFT.
    threads : int, optional
        Number of threads used in computing the FFT.
    flags : sequence of ints, optional
        FFTW planner flags (``FFTW_MEASURE``, ``FFTW_ESTIMATE``, ``FFTW_DESTROY_INPUT``, ...).
    output_array : complex numpy.ndarray, optional
        Output array, of the shape and type of `input_array`.

    Returns
    -------
    FFT
        The planned transform; normalization ``1/prod(shape[axes])``.
    """
    _check_dtype(input_array, "FDG", "fftn")
    if output_array is None:
        output_array = aligned(input_array.shape, get_alignment(input_array), input_array.dtype)
    else:
        _check_same_shape(input_array, output_array)
    M = _fourier_norm(input_array.shape, axes)
    return get_planned_FFT(input_array, output_array, axes, C2C_FORWARD, threads, flags, M)


def ifftn(
    input_array: np.ndarray,
    s: Sequence[int] | None = None,
    axes: Sequence[int] = (-1,),
    threads: int = 1,
    flags: _Flags = (FFTW_MEASURE,),
    output_array: np.ndarray | None = None,
) -> FFT:
    """Return a complex-to-complex inverse (unnormalised) transform object.

    Parameters are those of :func:`fftn`.

    Returns
    -------
    FFT
        The planned transform; normalization ``1/prod(shape[axes])``.
    """
    _check_dtype(input_array, "FDG", "ifftn")
    if output_array is None:
        output_array = aligned_like(input_array)
    else:
        _check_same_shape(input_array, output_array)
    M = _fourier_norm(input_array.shape, axes)
    return get_planned_FFT(input_array, output_array, axes, C2C_BACKWARD, threads, flags, M)


def rfftn(
    input_array: np.ndarray,
    s: Sequence[int] | None = None,
    axes: Sequence[int] = (-1,),
    threads: int = 1,
    flags: _Flags = (FFTW_MEASURE,),
    output_array: np.ndarray | None = None,
) -> FFT:
    """Return a real-to-complex forward transform object.

    The output has length ``N//2+1`` along ``axes[-1]``. Other parameters are those of
    :func:`fftn`.

    Returns
    -------
    FFT
        The planned transform; normalization ``1/prod(shape[axes])``.
    """
    _check_dtype(input_array, "fdg", "rfftn")
    output_array = _halved(input_array, axes, output_array)
    M = _fourier_norm(input_array.shape, axes)
    return get_planned_FFT(input_array, output_array, axes, R2C, threads, flags, M)


def irfftn(
    input_array: np.ndarray,
    s: Sequence[int] | None = None,
    axes: Sequence[int] = (-1,),
    threads: int = 1,
    flags: _Flags = (FFTW_MEASURE,),
    output_array: np.ndarray | None = None,
) -> FFT:
    """Return a complex-to-real inverse (unnormalised) transform object.

    Parameters
    ----------
    input_array : complex numpy.ndarray
    s : sequence of ints, optional
        Output lengths along `axes`; without it the length along ``axes[-1]`` is taken to be
        even, ``2*(n-1)``.
    axes, threads, output_array
        As for :func:`fftn`.
    flags : sequence of ints, optional
        As for :func:`fftn`, but ``FFTW_PRESERVE_INPUT`` is not possible: the transform
        overwrites its input.

    Returns
    -------
    FFT
        The planned transform; normalization ``1/prod(output shape[axes])``.
    """
    _check_dtype(input_array, "FDG", "irfftn")
    if FFTW_PRESERVE_INPUT in ([flags] if isinstance(flags, (int, np.integer)) else flags):
        raise ValueError("irfftn cannot be planned with FFTW_PRESERVE_INPUT")
    output_array = _c2r_output(input_array, s, axes, output_array)
    M = _fourier_norm(output_array.shape, axes)
    return get_planned_FFT(input_array, output_array, axes, C2R, threads, flags, M)


def _r2r(
    name: str,
    table: dict[int, int],
    input_array: np.ndarray,
    axes: Sequence[int],
    type: int,
    threads: int,
    flags: _Flags,
    output_array: np.ndarray | None,
) -> FFT:
    _check_dtype(input_array, "fdg", name)
    if type not in table:
        raise ValueError(f"{name}: type must be 1, 2, 3 or 4, got {type!r}")
    if output_array is None:
        output_array = aligned_like(input_array)
    else:
        _check_same_shape(input_array, output_array)
    kind = [table[type]] * len(axes)
    M = get_normalization(kind, input_array.shape, axes)
    return get_planned_FFT(input_array, output_array, axes, kind, threads, flags, M)


def dctn(
    input_array: np.ndarray,
    s: Sequence[int] | None = None,
    axes: Sequence[int] = (-1,),
    type: int = 2,
    threads: int = 1,
    flags: _Flags = (FFTW_MEASURE,),
    output_array: np.ndarray | None = None,
) -> FFT:
    """Return a discrete cosine transform object (FFTW's REDFT kinds, unnormalised).

    Parameters
    ----------
    input_array : real numpy.ndarray
    s : sequence of ints, optional
        Not used; accepted for compatibility with NumPy.
    axes : sequence of ints, optional
        Axes over which to compute the transform.
    type : int, optional
        1: ``FFTW_REDFT00``, 2: ``FFTW_REDFT10``, 3: ``FFTW_REDFT01``, 4: ``FFTW_REDFT11``
        (``scipy.fft.dctn`` of that type with ``norm=None``).
    threads, flags, output_array
        As for :func:`fftn`.

    Returns
    -------
    FFT
        The planned transform; normalization from :func:`get_normalization`.
    """
    return _r2r("dctn", dct_type, input_array, axes, type, threads, flags, output_array)


def idctn(
    input_array: np.ndarray,
    s: Sequence[int] | None = None,
    axes: Sequence[int] = (-1,),
    type: int = 2,
    threads: int = 1,
    flags: _Flags = (FFTW_MEASURE,),
    output_array: np.ndarray | None = None,
) -> FFT:
    """Return an inverse discrete cosine transform object (unnormalised).

    `type` is that of the forward transform it inverts: 1: ``FFTW_REDFT00``, 2:
    ``FFTW_REDFT01``, 3: ``FFTW_REDFT10``, 4: ``FFTW_REDFT11``. Other parameters are those of
    :func:`dctn`.

    Returns
    -------
    FFT
        The planned transform; normalization from :func:`get_normalization`.
    """
    return _r2r("idctn", idct_type, input_array, axes, type, threads, flags, output_array)


def dstn(
    input_array: np.ndarray,
    s: Sequence[int] | None = None,
    axes: Sequence[int] = (-1,),
    type: int = 2,
    threads: int = 1,
    flags: _Flags = (FFTW_MEASURE,),
    output_array: np.ndarray | None = None,
) -> FFT:
    """Return a discrete sine transform object (FFTW's RODFT kinds, unnormalised).

    `type` 1: ``FFTW_RODFT00``, 2: ``FFTW_RODFT10``, 3: ``FFTW_RODFT01``, 4: ``FFTW_RODFT11``.
    Other parameters are those of :func:`dctn`.

    Returns
    -------
    FFT
        The planned transform; normalization from :func:`get_normalization`.
    """
    return _r2r("dstn", dst_type, input_array, axes, type, threads, flags, output_array)


def idstn(
    input_array: np.ndarray,
    s: Sequence[int] | None = None,
    axes: Sequence[int] = (-1,),
    type: int = 2,
    threads: int = 1,
    flags: _Flags = (FFTW_MEASURE,),
    output_array: np.ndarray | None = None,
) -> FFT:
    """Return an inverse discrete sine transform object (unnormalised).

    `type` is that of the forward transform it inverts: 1: ``FFTW_RODFT00``, 2:
    ``FFTW_RODFT01``, 3: ``FFTW_RODFT10``, 4: ``FFTW_RODFT11``. Other parameters are those of
    :func:`dctn`.

    Returns
    -------
    FFT
        The planned transform; normalization from :func:`get_normalization`.
    """
    return _r2r("idstn", idst_type, input_array, axes, type, threads, flags, output_array)


def ihfftn(
    input_array: np.ndarray,
    s: Sequence[int] | None = None,
    axes: Sequence[int] = (-1,),
    threads: int = 1,
    flags: _Flags = (FFTW_MEASURE,),
    output_array: np.ndarray | None = None,
) -> FFT:
    """Return the transform object for the inverse of :func:`hfftn`.

    As mpi4py-fft, this is FFTW's real-to-complex transform (equal to :func:`rfftn`,
    unnormalised). Parameters are those of :func:`rfftn`.

    Returns
    -------
    FFT
        The planned transform; normalization ``1/prod(shape[axes])``.
    """
    _check_dtype(input_array, "fdg", "ihfftn")
    output_array = _halved(input_array, axes, output_array)
    M = get_normalization(R2C, input_array.shape, axes)
    return get_planned_FFT(input_array, output_array, axes, R2C, threads, flags, M)


def hfftn(
    input_array: np.ndarray,
    s: Sequence[int] | None = None,
    axes: Sequence[int] = (-1,),
    threads: int = 1,
    flags: _Flags = (FFTW_MEASURE,),
    output_array: np.ndarray | None = None,
) -> FFT:
    """Return the transform object for an array with Hermitian symmetry.

    As mpi4py-fft, this is FFTW's complex-to-real transform (equal to :func:`irfftn`,
    unnormalised; it overwrites its input). Parameters are those of :func:`irfftn`.

    Returns
    -------
    FFT
        The planned transform; normalization ``1/prod(output shape[axes])``.
    """
    _check_dtype(input_array, "FDG", "hfftn")
    output_array = _c2r_output(input_array, s, axes, output_array)
    M = get_normalization(C2R, output_array.shape, axes)
    return get_planned_FFT(input_array, output_array, axes, C2R, threads, flags, M)


def get_normalization(
    kind: int | Sequence[int], shape: Sequence[int], axes: Sequence[int]
) -> float:
    """Return the normalization factor of a multidimensional transform.

    The factor is the inverse of the product over `axes` of, for Fourier transforms, ``N``,
    and for real-to-real kinds: ``FFTW_REDFT00``: ``2(N-1)``, ``FFTW_RODFT00``: ``2(N+1)``,
    the other REDFT and RODFT kinds: ``2N``, where N is the length of the forward
    transform's input along the axis.

    Parameters
    ----------
    kind : int or sequence of ints
        The kind of transform along each axis.
    shape : sequence of ints
        Shape of the input of the forward transform.
    axes : sequence of ints
        The axes transformed over.

    Returns
    -------
    float
        ``1 / prod(factors)``.
    """
    kinds = [kind] * len(axes) if isinstance(kind, (int, np.integer)) else list(kind)
    if len(kinds) != len(axes):
        raise ValueError(f"one kind per axis needed: kinds {kinds}, axes {tuple(axes)}")
    M = 1
    for knd, axis in zip(kinds, axes):
        N = int(shape[axis])
        if knd == FFTW_RODFT00:
            M *= 2 * (N + 1)
        elif knd == FFTW_REDFT00:
            M *= 2 * (N - 1)
        elif knd in (FFTW_RODFT01, FFTW_RODFT10, FFTW_RODFT11,
                     FFTW_REDFT01, FFTW_REDFT10, FFTW_REDFT11):  # fmt: skip
            M *= 2 * N
        else:
            M *= N
    return 1.0 / M


inverse: dict[Any, Any] = {
    FFTW_RODFT11: FFTW_RODFT11,
    FFTW_REDFT11: FFTW_REDFT11,
    FFTW_RODFT01: FFTW_RODFT10,
    FFTW_RODFT10: FFTW_RODFT01,
    FFTW_REDFT01: FFTW_REDFT10,
    FFTW_REDFT10: FFTW_REDFT01,
    FFTW_RODFT00: FFTW_RODFT00,
    FFTW_REDFT00: FFTW_REDFT00,
    rfftn: irfftn,
    irfftn: rfftn,
    fftn: ifftn,
    ifftn: fftn,
    dctn: idctn,
    idctn: dctn,
    dstn: idstn,
    idstn: dstn,
    hfftn: ihfftn,
    ihfftn: hfftn,
}
