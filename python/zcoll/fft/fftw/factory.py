"""FFTW plans on pyFFTW, with the interface of mpi4py-fft's compiled ``fftw_xfftn.FFT``.

mpi4py-fft compiles one extension per precision (``fftwf_xfftn``, ``fftw_xfftn``,
``fftwl_xfftn``); here one pure-Python class, :class:`FFT`, drives a :class:`pyfftw.FFTW` plan
for every precision pyFFTW was built with, and :func:`get_fftw_lib` returns a small object per
precision that stands for such an extension module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

import numpy as np

from .utilities import (
    C2R,
    FFTW_BACKWARD,
    FFTW_CONSERVE_MEMORY,
    FFTW_DESTROY_INPUT,
    FFTW_ESTIMATE,
    FFTW_EXHAUSTIVE,
    FFTW_FORWARD,
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
)

__all__ = [
    "FFT", "cleanup", "export_wisdom", "fftlib", "forget_wisdom", "get_fftw_lib",
    "get_planned_FFT", "import_wisdom", "set_timelimit",
]  # fmt: skip

_FLAG_NAMES = {
    FFTW_DESTROY_INPUT: "FFTW_DESTROY_INPUT",
    FFTW_UNALIGNED: "FFTW_UNALIGNED",
    FFTW_CONSERVE_MEMORY: "FFTW_CONSERVE_MEMORY",
    FFTW_EXHAUSTIVE: "FFTW_EXHAUSTIVE",
    FFTW_PRESERVE_INPUT: "FFTW_PRESERVE_INPUT",
    FFTW_PATIENT: "FFTW_PATIENT",
    FFTW_ESTIMATE: "FFTW_ESTIMATE",
    FFTW_WISDOM_ONLY: "FFTW_WISDOM_ONLY",
}
_EFFORTS = ("FFTW_ESTIMATE", "FFTW_MEASURE", "FFTW_PATIENT", "FFTW_EXHAUSTIVE", "FFTW_WISDOM_ONLY")
_R2R_NAMES = {
    FFTW_R2HC: "FFTW_R2HC",
    FFTW_REDFT00: "FFTW_REDFT00",
    FFTW_REDFT01: "FFTW_REDFT01",
    FFTW_REDFT10: "FFTW_REDFT10",
    FFTW_REDFT11: "FFTW_REDFT11",
    FFTW_RODFT00: "FFTW_RODFT00",
    FFTW_RODFT01: "FFTW_RODFT01",
    FFTW_RODFT10: "FFTW_RODFT10",
    FFTW_RODFT11: "FFTW_RODFT11",
}
# pyFFTW's names for its precisions, and the order of export_wisdom()'s tuple.
_PYFFTW_TYPES = {"F": "32", "D": "64", "G": "ld"}
_WISDOM_ORDER = ("D", "F", "G")

_timelimit: float | None = None


def _pyfftw() -> Any:
    import pyfftw

    return pyfftw


def _flag_names(flags: int | Sequence[int]) -> list[str]:
    bits = 0
    for f in [flags] if isinstance(flags, (int, np.integer)) else flags:
        bits |= int(f)
    # FFTW preserves the input unless told otherwise; pyFFTW has no name for the flag.
    names = [n for b, n in _FLAG_NAMES.items() if bits & b and b != FFTW_PRESERVE_INPUT]
    if not any(n in _EFFORTS for n in names):
        names.append("FFTW_MEASURE")
    return names


def _direction(kind: Sequence[int]) -> str | list[str]:
    first = kind[0]
    if first in (FFTW_FORWARD, R2C):
        return "FFTW_FORWARD"
    if first in (FFTW_BACKWARD, C2R):
        return "FFTW_BACKWARD"
    try:
        return [_R2R_NAMES[k] for k in kind]
    except KeyError as exc:
        raise ValueError(f"unsupported FFTW transform kind {exc.args[0]!r}") from None


class FFT:
    """One planned FFTW transform between two arrays (mpi4py-fft's ``fftw_xfftn.FFT``).

    Parameters
    ----------
    input_array : numpy.ndarray
        Real or complex input array, planned for (its contents may be overwritten).
    output_array : numpy.ndarray
        Real or complex output array.
    axes : sequence of ints, optional
        The axes to transform over; a real-to-complex transform halves the last.
    kind : int or sequence of ints, optional
        ``FFTW_FORWARD``/``C2C_FORWARD`` (-1), ``FFTW_BACKWARD``/``C2C_BACKWARD`` (1), ``R2C``
        (-2), ``C2R`` (2) or real-to-real kinds (``FFTW_REDFT00`` ... ``FFTW_RODFT11``), one per
        axis.
    threads : int, optional
        Number of threads used by the transform.
    flags : int or sequence of ints, optional
        FFTW planner flags (``FFTW_MEASURE``, ``FFTW_DESTROY_INPUT``, ...), or-ed together.
    normalization : float, optional
        The factor :meth:`__call__` multiplies by when asked to normalize.
    """

    def __init__(
        self,
        input_array: np.ndarray,
        output_array: np.ndarray,
        axes: Sequence[int] = (-1,),
        kind: int | Sequence[int] = FFTW_FORWARD,
        threads: int = 1,
        flags: int | Sequence[int] = FFTW_MEASURE,
        normalization: float = 1.0,
    ) -> None:
        pyfftw = _pyfftw()
        kinds = [kind] if isinstance(kind, (int, np.integer)) else list(kind)
        ndim = input_array.ndim
        axes = tuple(int(a) + ndim if a < 0 else int(a) for a in axes)
        opts: dict[str, Any] = {}
        if _timelimit is not None:
            opts["planning_timelimit"] = _timelimit
        self._plan = pyfftw.FFTW(
            input_array, output_array, axes=axes, direction=_direction(kinds),
            flags=_flag_names(flags), threads=int(threads), **opts,
        )  # fmt: skip
        self.kind = int(kinds[0])
        self._input_array = input_array
        self._output_array = output_array
        self._bound = (input_array, output_array)
        self._M = float(normalization)

    @property
    def input_array(self) -> np.ndarray:
        """The array the transform was planned with (or last given to update_arrays)."""
        return self._input_array

    @property
    def output_array(self) -> np.ndarray:
        """The array the transform writes when no output array is given."""
        return self._output_array

    def get_normalization(self) -> float:
        """Return the internally set normalization factor."""
        return self._M

    def print_plan(self) -> None:
        """Print a description of the planned transform."""
        p = self._plan
        print(
            f"pyfftw plan: {p.input_shape} {p.input_dtype} -> {p.output_shape} "
            f"{p.output_dtype}, axes {p.axes}, direction {p.direction}, flags {p.flags}"
        )

    def destroy(self) -> None:
        """Release the plan (pyFFTW frees it with the object; kept for compatibility)."""

    def update_arrays(self, input_array: np.ndarray, output_array: np.ndarray) -> None:
        """Replace the internal arrays by others of the same shape, strides, type, alignment.

        Raises
        ------
        ValueError
            If an array does not match the planned one.
        """
        self._bind(input_array, output_array)
        self._input_array = input_array
        self._output_array = output_array

    def _bind(self, input_array: np.ndarray, output_array: np.ndarray) -> None:
        if self._bound[0] is not input_array or self._bound[1] is not output_array:
            for new, old, what in ((input_array, self._input_array, "input_array"),
                                   (output_array, self._output_array, "output_array")):  # fmt: skip
                if new.dtype != old.dtype:
                    raise ValueError(f"{what} has dtype {new.dtype}, planned for {old.dtype}")
            self._plan.update_arrays(input_array, output_array)
            self._bound = (input_array, output_array)

    def _fits(self, a: np.ndarray, ref: np.ndarray, alignment: int) -> bool:
        return (
            a.shape == ref.shape
            and a.strides == ref.strides
            and a.dtype == ref.dtype
            and a.__array_interface__["data"][0] % alignment == 0
        )

    def __call__(
        self,
        input_array: np.ndarray | None = None,
        output_array: np.ndarray | None = None,
        implicit: bool = True,
        normalize: bool = False,
        **kw: Any,
    ) -> np.ndarray:
        """Compute the transform and return the output array.

        Parameters
        ----------
        input_array : numpy.ndarray, optional
            If not given, the internal input array is transformed.
        output_array : numpy.ndarray, optional
            If not given, the internal output array is written.
        implicit : bool, optional
            If True, the plan is applied to `input_array` itself when its shape, strides, type
            and alignment allow (it may then be overwritten unless planned with
            ``FFTW_PRESERVE_INPUT``); otherwise `input_array` is first copied into the internal
            input array, which always preserves it.
        normalize : bool, optional
            If True, multiply the result by :meth:`get_normalization`.
        kw : dict, optional
            Ignored (accepted as mpi4py-fft does).

        Returns
        -------
        numpy.ndarray
            The output array.
        """
        if not implicit:
            if input_array is not None and input_array is not self._input_array:
                self._input_array[...] = input_array
            self._bind(self._input_array, self._output_array)
            self._plan.execute()
            if normalize:
                self._output_array *= self._M
            if output_array is not None:
                output_array[...] = self._output_array
                return output_array
            return self._output_array
        if input_array is None:
            input_array = self._input_array
        elif input_array is not self._input_array and not self._fits(
            input_array, self._input_array, self._plan.input_alignment
        ):
            self._input_array[...] = input_array
            input_array = self._input_array
        if output_array is None:
            output_array = self._output_array
        elif not self._fits(output_array, self._output_array, self._plan.output_alignment):
            raise ValueError(
                "output_array must have the shape, strides, dtype and alignment of the planned "
                f"output array ({self._output_array.shape}, {self._output_array.dtype})"
            )
        self._bind(input_array, output_array)
        self._plan.execute()
        if normalize:
            output_array *= self._M
        return output_array


class _FFTWLib:
    """Stands for one of mpi4py-fft's compiled modules, for one precision."""

    def __init__(self, char: str) -> None:
        self.char = char
        self.FFT = FFT
        self.__name__ = {"F": "fftwf_xfftn", "D": "fftw_xfftn", "G": "fftwl_xfftn"}[char]

    def __repr__(self) -> str:
        return f"<zcoll.fft.fftw library {self.__name__} (pyFFTW)>"

    def alignment_of(self, input_array: np.ndarray) -> int:
        return int(input_array.__array_interface__["data"][0] % _pyfftw().simd_alignment)

    def export_wisdom(self, filename: bytes | str) -> int:
        wisdom = _pyfftw().export_wisdom()[_WISDOM_ORDER.index(self.char)]
        with open(os.fsdecode(filename), "wb") as f:
            f.write(wisdom)
        return 1

    def import_wisdom(self, filename: bytes | str) -> int:
        with open(os.fsdecode(filename), "rb") as f:
            wisdom = f.read()
        parts = [b""] * 3
        parts[_WISDOM_ORDER.index(self.char)] = wisdom
        ok = _pyfftw().import_wisdom(tuple(parts))
        return int(bool(ok[_WISDOM_ORDER.index(self.char)]))

    def forget_wisdom(self) -> None:
        _pyfftw().forget_wisdom()

    def set_timelimit(self, limit: float) -> None:
        set_timelimit(limit)

    def cleanup(self) -> None:
        """pyFFTW frees FFTW's memory with its plans; nothing else to release."""


def get_fftw_lib(dtype: Any) -> _FFTWLib | None:
    """Return the FFTW library object for a precision, or None where pyFFTW lacks it.

    Parameters
    ----------
    dtype : numpy.dtype
        Data precision (real or complex).

    Returns
    -------
    object or None
        An object with ``FFT``, ``export_wisdom``, ``import_wisdom``, ``forget_wisdom``,
        ``set_timelimit`` and ``cleanup``, standing for mpi4py-fft's ``fftwf_xfftn``,
        ``fftw_xfftn`` or ``fftwl_xfftn``.
    """
    char = np.dtype(dtype).char.upper()
    if char not in _PYFFTW_TYPES:
        return None
    try:
        pyfftw = _pyfftw()
    except ImportError:
        return None
    if _PYFFTW_TYPES[char] not in pyfftw._supported_types:
        return None
    return _FFTWLib(char)


class _Libraries(MutableMapping):
    """:data:`fftlib`, filled at its first use: importing zcoll.fft then imports neither pyFFTW
    nor the SciPy modules pyFFTW imports (about 0.13 s of a program's start)."""

    def __init__(self) -> None:
        self._libs: dict[str, _FFTWLib] | None = None

    def _filled(self) -> dict[str, _FFTWLib]:
        if self._libs is None:
            found = {t.upper(): get_fftw_lib(t) for t in "fdg"}
            self._libs = {t: lib for t, lib in found.items() if lib is not None}
        return self._libs

    def __getitem__(self, key: str) -> _FFTWLib:
        return self._filled()[key]

    def __setitem__(self, key: str, lib: _FFTWLib) -> None:
        self._filled()[key] = lib

    def __delitem__(self, key: str) -> None:
        del self._filled()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._filled())

    def __len__(self) -> int:
        return len(self._filled())

    def __repr__(self) -> str:
        return repr(self._filled())


#: The FFTW library of each precision pyFFTW was built with ("F", "D", "G"), as mpi4py-fft's
#: ``fftw.fftlib``.
fftlib: MutableMapping[str, _FFTWLib] = _Libraries()


def get_planned_FFT(
    input_array: np.ndarray,
    output_array: np.ndarray,
    axes: Sequence[int] = (-1,),
    kind: int | Sequence[int] = FFTW_FORWARD,
    threads: int = 1,
    flags: int | Sequence[int] = (FFTW_MEASURE,),
    normalization: float = 1.0,
) -> FFT:
    """Return a planned transform object (see :class:`FFT` for the parameters).

    Raises
    ------
    TypeError
        If pyFFTW has no FFTW library for the precision of `input_array`.
    """
    char = input_array.dtype.char.upper()
    if char not in fftlib:
        raise TypeError(f"no FFTW library for dtype {input_array.dtype} in this pyFFTW build")
    return fftlib[char].FFT(input_array, output_array, axes, kind, threads, flags, normalization)


def _rank() -> str:
    from mpi4py import MPI

    return str(MPI.COMM_WORLD.Get_rank())


def export_wisdom(filename: str) -> None:
    """Export FFTW wisdom, one file per precision: ``Fn_``, ``Dn_``, ``Gn_`` + `filename`.

    Parameters
    ----------
    filename : str
        Name of the file; n in the prefix is the rank in ``MPI.COMM_WORLD``.
    """
    rank = _rank()
    for key, lib in fftlib.items():
        lib.export_wisdom(key + rank + "_" + filename)


def import_wisdom(filename: str) -> None:
    """Import FFTW wisdom written by :func:`export_wisdom` with the same MPI configuration.

    Parameters
    ----------
    filename : str
        Name given to :func:`export_wisdom`.

    Raises
    ------
    RuntimeError
        If the wisdom of a precision could not be imported.
    """
    rank = _rank()
    for key, lib in fftlib.items():
        if lib.import_wisdom(key + rank + "_" + filename) != 1:
            raise RuntimeError(f"Not able to import wisdom {filename}")


def forget_wisdom() -> None:
    """Forget all FFTW wisdom accumulated so far."""
    _pyfftw().forget_wisdom()


def set_timelimit(limit: float) -> None:
    """Set the time limit in seconds for planning the transforms made from now on.

    Parameters
    ----------
    limit : number
        The limit; a negative number means none.
    """
    global _timelimit
    _timelimit = None if limit < 0 else float(limit)


def cleanup() -> None:
    """Release FFTW's memory (pyFFTW does so with its plans; kept for compatibility)."""
