"""Serial FFTs over some axes of an array, with mpi4py-fft's interface (``mpi4py_fft.libfft``).

:class:`FFT` plans a forward and a backward transform between two arrays it owns,
``forward.input_array`` and ``forward.output_array`` (``backward`` the reverse), with any of
mpi4py-fft's backends: ``'fftw'`` (the default), ``'pyfftw'`` (``pyfftw.builders``),
``'numpy'``, ``'scipy'`` and ``'mkl_fft'``. Values, array shapes and types, normalization and
padding are mpi4py-fft's.

``'fftw'`` runs FFTW's plans. The complex and real-complex transforms run on mpi4py-fft's
compiled FFTW module when mpi4py-fft is installed -- the FFTW library it was built against,
usually the system's, which is newer than the one pyFFTW's wheels bundle (3.3.10 against
3.3.5 on Debian 12) and measured 6-15 % faster on the pencil FFT's transforms -- and on
pyFFTW's otherwise; so a program moved from mpi4py-fft keeps its FFTW. The planner interface
(:mod:`zcoll.fft.fftw`, used for ``transforms=``) is pyFFTW's either way. ``'pyfftw'`` always
uses pyFFTW.

Two additions serve zcoll's parallel transforms: an ``allocator`` for the object's own arrays
(so that they can live in zcoll's shared-memory arena), and :meth:`FFT.execute`, which
transforms any given arrays of the planned shapes, or of those shapes with leading component
axes, without copying through the object's arrays.

Padding follows mpi4py-fft to the letter, including its test for the real transform's last
retained mode: that mode is doubled (forward) or halved (backward) when the *length of the
truncated spectrum* ``N//2+1`` is even, where ``N`` is the truncated length of the real
input (mpi4py-fft compares ``forward.output_array.shape[axis] % 2``).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from math import prod
from typing import Any

import numpy as np

from . import fftw
from ._backends import (
    FftwLibBackend,
    NumpyBackend,
    PyfftwBackend,
    ScipyBackend,
    mpi4py_fftw,
)

__all__ = ["FFT", "FFTBase"]

Allocator = Callable[[tuple, np.dtype], np.ndarray]


def _nothing() -> None:
    pass


def _one(index: int) -> slice:
    """The slice of the one element at `index` (negative counts from the end): a view where
    an integer index would give a scalar on 1-D arrays."""
    return slice(index, index + 1 or None)


#: Keyword arguments every backend accepts at construction (mpi4py-fft passes them on, and
#: ignores those a backend has no use for).
BACKEND_OPTIONS = (
    "threads", "planner_effort", "overwrite_input", "auto_align_input", "auto_contiguous",
    "avoid_copy",
)  # fmt: skip
#: Keyword arguments a backend's transforms accept at call time, besides ``normalize``.
CALL_OPTIONS: dict[str, tuple[str, ...]] = {
    "fftw": ("implicit",),
    "pyfftw": ("criteria_checking",),
    "numpy": (),
    "scipy": (),
    "mkl_fft": (),
}
#: The backend names :class:`FFT` and :class:`~zcoll.fft.PFFT` accept (mpi4py-fft's).
BACKENDS: tuple[str, ...] = tuple(CALL_OPTIONS)


def _default_allocator(shape: tuple, dtype: np.dtype) -> np.ndarray:
    return fftw.aligned(shape, dtype=dtype)


@functools.cache
def _engine(
    backend: str, threads: int, effort: str | None, on_mpi4py_fft: bool
) -> NumpyBackend | PyfftwBackend:
    """The engine of `backend` with these options, one per process (`on_mpi4py_fft`: 'fftw'
    runs on mpi4py-fft's FFTW module): engines hold no state of their own but remembered array
    pairs (their plans are in the process-wide cache)."""
    if backend == "numpy":
        return NumpyBackend()
    if backend == "scipy":
        return ScipyBackend(threads)
    assert effort is not None
    if backend == "fftw" and on_mpi4py_fft:
        return FftwLibBackend(threads=threads, planner_effort=effort)
    return PyfftwBackend(threads=threads, planner_effort=effort)


def _check_support(backend: str, dtype: np.dtype) -> None:
    """Raise ImportError for a missing backend package, TypeError for a precision it lacks."""
    if backend == "mkl_fft":
        try:
            importlib.import_module("mkl_fft")
        except ImportError as exc:
            raise ImportError(
                "zcoll.fft: backend 'mkl_fft' needs the mkl_fft package, which is not installed "
                "(pip install mkl_fft); backends 'fftw', 'pyfftw', 'numpy' and 'scipy' need no "
                "extra package"
            ) from exc
        if dtype.char in "gG":
            raise TypeError(f"backend 'mkl_fft' does not support dtype {dtype} (long double)")
    elif backend == "fftw" and (lib := mpi4py_fftw()) is not None:
        # The engine then runs on mpi4py-fft's compiled module (_make_engine): importing pyFFTW
        # only to ask it would cost a process 0.5 s (pyFFTW imports scipy.fftpack).
        if dtype.char.upper() not in lib.fftlib:
            raise TypeError(f"backend 'fftw': mpi4py-fft's FFTW build does not support {dtype}")
    elif backend in ("fftw", "pyfftw"):
        try:
            import pyfftw
        except ImportError as exc:
            raise ImportError(
                f"zcoll.fft: backend {backend!r} needs the pyFFTW package (pip install pyfftw)"
            ) from exc
        precision = {"f": "32", "d": "64", "g": "ld"}[dtype.char.lower()]
        if precision not in pyfftw._supported_types:
            raise TypeError(f"backend {backend!r}: this pyFFTW build does not support {dtype}")
    elif backend == "numpy" and dtype.char in "gG" and int(np.__version__.split(".")[0]) < 2:
        raise TypeError(f"backend 'numpy' supports dtype {dtype} from NumPy 2.0 on")


def _padding_factor(padding, axes: Sequence[int]) -> float:
    if padding is False:
        return 1.0
    return padding[axes[-1]] if _is_sequence(padding) else padding


def _spectrum_spec(shape, axes, dtype: np.dtype, real: bool) -> tuple[list[int], np.dtype]:
    """Shape and type of the (padded) forward output of a default transform."""
    out = list(shape)
    if real:
        out[axes[-1]] = out[axes[-1]] // 2 + 1
    return out, np.dtype(dtype.char.upper())


def _released(*args, **kwargs) -> np.ndarray:
    raise ValueError("zcoll.fft: this serial transform belongs to a destroyed PFFT")


def _is_sequence(x) -> bool:
    """Whether `x` has at least one dimension, as ``np.ndim(x) > 0`` (a list or tuple
    answered at once: shapes and axes are, and np.ndim costs a conversion to an array)."""
    return isinstance(x, (list, tuple)) or (not isinstance(x, (int, float)) and np.ndim(x) > 0)


def _truncated_shape(shape, axis: int, factor: float, real: bool) -> tuple[int, ...]:
    """Shape of the forward output truncated from the padded spectrum."""
    tshape = list(shape)
    tshape[axis] = int(np.round(shape[axis] / factor))
    if real:
        tshape[axis] = tshape[axis] // 2 + 1
    return tuple(tshape)


def planned_arrays(
    shape, axes, dtype, padding, backend: str, transforms: dict | None
) -> list[tuple[tuple[int, ...], np.dtype]] | None:
    """The (shape, dtype) of each array ``FFT(shape, axes, dtype, padding, backend,
    transforms)`` asks its allocator for, in order -- input, spectrum, truncated spectrum when
    padded -- so that a caller can allocate them all at once; None where the transforms are
    not the default ones (the planners decide their arrays) or the arguments are invalid."""
    try:
        base = FFTBase(shape, axes, dtype, padding)
    except (TypeError, ValueError):
        return None
    if backend not in CALL_OPTIONS or backend == "mkl_fft":
        return None
    if transforms is not None and tuple(base.axes) in transforms:
        return None
    real = base.real_transform and backend != "scipy"
    vshape, vdtype = _spectrum_spec(base.shape, base.axes, base.dtype, real)
    specs = [(tuple(base.shape), base.dtype), (tuple(vshape), vdtype)]
    factor = _padding_factor(padding, base.axes)
    if abs(factor - 1.0) > 1e-8:
        specs.append((_truncated_shape(base.shape, base.axes[-1], factor, real), vdtype))
    return specs


class _Transform:
    """mpi4py-fft's serial transform wrapper: ``forward`` and ``backward`` of :class:`FFT`.

    Calling it copies a given input array into :attr:`input_array`, transforms, and copies
    the result into a given output array (else returns :attr:`output_array`).
    """

    def __init__(self, xfftn: Callable[..., np.ndarray], input_array, output_array) -> None:
        self._xfftn = xfftn
        self._input_array = input_array
        self._output_array = output_array
        self.__doc__ = xfftn.__doc__

    @property
    def input_array(self) -> np.ndarray:
        return self._input_array

    @property
    def output_array(self) -> np.ndarray:
        return self._output_array

    @property
    def xfftn(self) -> Callable[..., np.ndarray]:
        return self._xfftn

    def __call__(
        self,
        input_array: np.ndarray | None = None,
        output_array: np.ndarray | None = None,
        **options: Any,
    ) -> np.ndarray:
        """Transform `input_array` (or :attr:`input_array`) and return the output array.

        Parameters
        ----------
        input_array : numpy.ndarray, optional
            Copied into :attr:`input_array` first; it is never modified.
        output_array : numpy.ndarray, optional
            Receives a copy of the result.
        options : dict
            ``normalize`` (default True forward, False backward), and the call options of the
            backend (``implicit`` for 'fftw', ``criteria_checking`` for 'pyfftw').

        Returns
        -------
        numpy.ndarray
            `output_array` if given, else :attr:`output_array`.
        """
        if input_array is not None and input_array is not self._input_array:
            self._input_array[...] = input_array
        self._xfftn(**options)
        if output_array is not None and output_array is not self._output_array:
            output_array[...] = self._output_array
            return output_array
        return self._output_array


class _Step:
    """An unnormalised transform between two arrays (mpi4py-fft's ``fwd``/``bck``)."""

    def __init__(self, run: Callable[..., Any], input_array, output_array, M: float) -> None:
        self._run = run
        self.input_array = input_array
        self.output_array = output_array
        self._M = M

    def get_normalization(self) -> float:
        """Return the normalization factor of the transform pair."""
        return self._M

    def __call__(self, input_array=None, output_array=None, **kw: Any) -> np.ndarray:
        src = self.input_array if input_array is None else input_array
        dst = self.output_array if output_array is None else output_array
        self._run(src, dst, **kw)
        return dst


class _FuncStep:
    """A NumPy-style function (``f(a, s=..., axes=...)``) run as an unnormalised step."""

    def __init__(self, func, input_array, output_array, scale: float, opt: dict) -> None:
        self.xfftn = func
        self.input_array = input_array
        self.output_array = output_array
        self.M = scale
        self.opt = opt
        self.__doc__ = func.__doc__

    def __call__(self, *args: Any, **kw: Any) -> np.ndarray:
        out = self.output_array
        result = self.xfftn(self.input_array, **self.opt, **kw)
        if out.dtype.kind == "f" and np.iscomplexobj(result):
            result = result.real
        out[...] = result
        if abs(self.M - 1) > 1e-8:
            out *= self.M
        return out


class _BuilderStep:
    """A ``pyfftw.builders`` object as a step; the backward one without pyFFTW's 1/N."""

    def __init__(self, obj, backward: bool) -> None:
        self.xfftn = obj
        self._backward = backward
        self.__doc__ = obj.__doc__

    @property
    def input_array(self) -> np.ndarray:
        return self.xfftn.input_array

    @property
    def output_array(self) -> np.ndarray:
        return self.xfftn.output_array

    def __call__(self, input_array=None, output_array=None, **kw: Any) -> np.ndarray:
        if self._backward:
            kw["normalise_idft"] = False
        return self.xfftn(input_array, output_array, **kw)


class FFTBase:
    """Base class for serial FFTs: the arguments, and padding's truncation and zero-padding.

    Parameters
    ----------
    shape : int or sequence of ints
        Shape of the input array planned for (with padding: the padded shape).
    axes : None, int or sequence of ints, optional
        Axes to transform over; None: all axes.
    dtype : numpy.dtype, optional
        Type of the input array: float32, float64, long double or their complex types.
    padding : bool, number or sequence of numbers, optional
        False: no padding. A number: the padding factor of the transformed axis. A sequence:
        one factor per axis of the array, of which that of the last transformed axis is used.
    """

    def __init__(self, shape, axes=None, dtype: Any = float, padding: Any = False) -> None:
        shape = [int(n) for n in shape] if _is_sequence(shape) else [int(shape)]
        if not shape or min(shape) <= 0:
            raise ValueError(f"shape must have one or more positive lengths, got {shape}")
        ndim = len(shape)
        if axes is None:
            axes = list(range(ndim))
        else:
            axes = [int(a) for a in axes] if _is_sequence(axes) else [int(axes)]
            if not axes or any(not -ndim <= a < ndim for a in axes):
                raise ValueError(f"axes {axes} do not fit {ndim} dimensions")
            axes = [a + ndim if a < 0 else a for a in axes]
            if len(set(axes)) != len(axes):
                raise ValueError(f"axes {axes} repeat an axis")
        dtype = np.dtype(dtype)
        if dtype.char not in "fdgFDG":
            raise TypeError(f"dtype must be float32, float64, long double or complex, got {dtype}")
        self.shape = shape
        self.axes = axes
        self.dtype = dtype
        self.padding = padding
        self.real_transform = dtype.kind == "f"
        self.padding_factor: float = 1

    def _truncation_forward(self, padded_array, trunc_array, lead: int = 0) -> None:
        """Truncate a spectrum of padded length to the unpadded one (`lead` leading axes)."""
        self._truncation_plan(padded_array, trunc_array, lead)()

    def _padding_backward(self, trunc_array, padded_array, lead: int = 0) -> None:
        """Zero-pad a spectrum of unpadded length to the padded one (`lead` leading axes)."""
        self._padding_plan(trunc_array, padded_array, lead)()

    def _truncation_plan(self, padded_array, trunc_array, lead: int = 0) -> Callable[[], None]:
        """:meth:`_truncation_forward` of these two arrays as a call with no arguments, its
        views made once: the step of a transform that runs on the same arrays again and
        again."""
        if self.padding_factor <= 1.0 + 1e-8:
            return _nothing
        axis = self.axes[-1] + lead
        N = trunc_array.shape[axis]
        s: list[Any] = [slice(None)] * trunc_array.ndim
        if self.real_transform:
            s[axis] = slice(0, N)
            head = padded_array[tuple(s)]
            s[axis] = _one(N - 1)
            last = trunc_array[tuple(s)] if N % 2 == 0 else None

            def truncate_real() -> None:
                np.copyto(trunc_array, head)
                if last is not None:
                    last.imag = 0
                    last.real *= 2

            return truncate_real
        s[axis] = slice(0, N // 2 + 1)
        low = (trunc_array[tuple(s)], padded_array[tuple(s)])
        s[axis] = slice(-(N // 2), None) if N // 2 else slice(0, 0)
        high = (trunc_array[tuple(s)], padded_array[tuple(s)])

        def truncate_complex() -> None:
            trunc_array.fill(0)
            np.copyto(*low)
            np.add(*high, out=high[0])

        return truncate_complex

    def _padding_plan(self, trunc_array, padded_array, lead: int = 0) -> Callable[[], None]:
        """:meth:`_padding_backward` of these two arrays as a call with no arguments (see
        :meth:`_truncation_plan`)."""
        if self.padding_factor <= 1.0 + 1e-8:
            return _nothing
        axis = self.axes[-1] + lead
        N = trunc_array.shape[axis]
        halved: list[np.ndarray] = []
        if self.real_transform:
            s: list[Any] = [slice(0, n) for n in trunc_array.shape]
            copies = [(padded_array[tuple(s)], trunc_array)]
            s[axis] = _one(N - 1)
            if N % 2 == 0:
                halved.append(padded_array[tuple(s)])
        else:
            su: list[Any] = [slice(None)] * trunc_array.ndim
            su[axis] = slice(0, N // 2 + 1)
            copies = [(padded_array[tuple(su)], trunc_array[tuple(su)])]
            if N // 2:
                su[axis] = slice(-(N // 2), None)
                copies.append((padded_array[tuple(su)], trunc_array[tuple(su)]))
            if N % 2 == 0:
                su[axis] = _one(N // 2)
                halved.append(padded_array[tuple(su)])
                su[axis] = _one(-(N // 2))
                halved.append(padded_array[tuple(su)])
        real_nyquist = self.real_transform

        def pad() -> None:
            padded_array.fill(0)
            for dst, src in copies:
                np.copyto(dst, src)
            for view in halved:
                if real_nyquist:
                    view.imag = 0
                view *= 0.5

        return pad


class FFT(FFTBase):
    """Serial forward and backward FFTs over some axes of an array (mpi4py-fft's ``FFT``).

    Parameters
    ----------
    shape : int or sequence of ints
        Shape of the input array planned for. With padding, the padded shape: the forward
        output is truncated to ``round(shape[axis] / padding)`` modes along the transformed
        axis (``//2+1`` of them for a real transform).
    axes : None, int or sequence of ints, optional
        Axes to transform over; None: all axes. A real-to-complex transform halves the last.
    dtype : numpy.dtype, optional
        Type of the input array: float32, float64, long double (backends 'fftw', 'pyfftw',
        'numpy' on NumPy 2, 'scipy') or their complex types.
    padding : bool, number or sequence of numbers, optional
        False: no padding. A number: the padding factor (one axis transformed only). A
        sequence: one factor per axis of the array; that of the last transformed axis is used.
    backend : str, optional
        ``'fftw'`` (default; :mod:`zcoll.fft.fftw`), ``'pyfftw'`` (``pyfftw.builders``),
        ``'numpy'``, ``'scipy'`` (complex ``fftn`` also for real input, so that
        ``real_transform`` is False and the spectrum is full-length, as in mpi4py-fft) or
        ``'mkl_fft'``.
    transforms : None or dict, optional
        ``{axes tuple: (forward planner, backward planner)}``; if ``tuple(axes)`` is a key,
        its pair replaces the default (rfftn/irfftn for real input, fftn/ifftn for complex).
        Planners are called as the backend's defaults are: for 'fftw' the planners of
        :mod:`zcoll.fft.fftw` (for instance ``functools.partial(fftw.dctn, type=3)``), for
        'pyfftw' ``pyfftw.builders`` functions, else NumPy-style functions
        (``scipy.fftpack`` ones, which take ``shape=``, for 'scipy').
    allocator : callable, optional
        ``allocator(shape, dtype) -> numpy.ndarray`` returns each array the object owns
        (``forward.input_array``, ``forward.output_array``, the padded spectrum), C-ordered;
        zcoll passes one that allocates in its shared-memory arena. For 'fftw' and 'pyfftw'
        the arrays must be aligned as pyFFTW's ``simd_alignment`` (32 bytes; the arena's are
        64). Default: 32-byte-aligned NumPy arrays, as mpi4py-fft.
    prepare : bool, optional
        Plan the default transforms now, on the object's own arrays (default); False plans
        each on its first run instead (:meth:`prepare` plans them later), for an object that
        may never run (a PFFT stage that a transform over several stages' axes replaces).
    kw : dict
        Options of the backend, among ``threads``, ``planner_effort`` (``'FFTW_MEASURE'``
        default for 'fftw'), ``overwrite_input``, ``auto_align_input``, ``auto_contiguous``,
        ``avoid_copy``; a backend ignores those it has no use for, as in mpi4py-fft.

    Attributes
    ----------
    forward, backward
        Transform objects with ``input_array``, ``output_array`` and
        ``__call__(input_array=None, output_array=None, normalize=..., **kw)``; ``normalize``
        defaults to True for ``forward`` (multiply by :attr:`M`) and False for ``backward``.
    M : float
        The normalization factor, ``1/prod(shape[axes])`` for Fourier transforms (that of the
        planner, :func:`zcoll.fft.fftw.get_normalization`, for 'fftw' with ``transforms``).
    padding_factor : float
    real_transform : bool
        Whether the forward transform is real-to-complex (halved last axis).

    Raises
    ------
    TypeError
        For an unknown keyword argument, or a dtype the backend does not support.
    ValueError
        For an unknown backend, bad shape or axes, or padding over more than one axis.
    ImportError
        If the backend's package is not installed.
    """

    def __init__(
        self,
        shape,
        axes=None,
        dtype: Any = float,
        padding: Any = False,
        backend: str = "fftw",
        transforms: dict | None = None,
        allocator: Allocator | None = None,
        *,
        prepare: bool = True,
        **kw: Any,
    ) -> None:
        FFTBase.__init__(self, shape, axes, dtype, padding)
        if backend not in CALL_OPTIONS:
            raise ValueError(f"backend must be one of {sorted(CALL_OPTIONS)}, got {backend!r}")
        unknown = sorted(set(kw) - set(BACKEND_OPTIONS))
        if unknown:
            raise TypeError(
                f"FFT got unexpected keyword argument(s) {unknown}; backend options are "
                f"{list(BACKEND_OPTIONS)}"
            )
        _check_support(backend, self.dtype)
        self.backend = backend
        self._options = dict(kw)
        self._transforms = transforms
        self._allocator = _default_allocator if allocator is None else allocator
        self._custom_allocator = allocator is not None
        self._call_options = frozenset(CALL_OPTIONS[backend]) | {"normalize"}
        self._scratch: dict[tuple, np.ndarray] = {}
        self._subs: dict[tuple, FFT] = {}
        if backend == "scipy":
            self.real_transform = False

        self.padding_factor = _padding_factor(padding, self.axes)
        padded = abs(self.padding_factor - 1.0) > 1e-8
        if padded and len(self.axes) != 1:
            raise ValueError(f"padding needs exactly one transformed axis, got axes {self.axes}")

        key = tuple(self.axes)
        self._pair = transforms[key] if transforms is not None and key in transforms else None
        if self._pair is None and backend == "mkl_fft":
            mkl = importlib.import_module("mkl_fft._numpy_fft")
            self._pair = (mkl.rfftn, mkl.irfftn) if self.real_transform else (mkl.fftn, mkl.ifftn)
        self._engine = self._make_engine() if self._pair is None else None
        planner = self._plan_default if self._pair is None else self._plan_custom
        self.fwd: Any
        self.bck: Any
        self._held_plans: list = []
        self.fwd, self.bck = planner()
        if prepare:
            self.prepare()
        U, V = self.fwd.input_array, self.fwd.output_array
        n = prod(self.shape[a] for a in self.axes)
        if backend == "fftw" and self._pair is not None:
            self.M = self.fwd.get_normalization()
        else:
            self.M = 1.0 / n
        # The factor execute() applies: for long double with FFTW, 1/n in long double rather
        # than the double M (which is what mpi4py-fft multiplies by).
        self._scale: Any = self.M
        if isinstance(self._engine, PyfftwBackend) and self.dtype.char in "gG":
            self._scale = np.longdouble(1) / n
        if padded:
            trunc = self._get_truncarray(self.shape, V.dtype)
            self.forward = _Transform(self._forward, U, trunc)
            self.backward = _Transform(self._backward, trunc, U)
        else:
            self.forward = _Transform(self._forward, U, V)
            self.backward = _Transform(self._backward, V, U)
        self._unpadded = self.forward.output_array is self.fwd.output_array

    def _make_engine(self) -> NumpyBackend | PyfftwBackend:
        """The engine of the default transforms: for 'fftw' mpi4py-fft's compiled FFTW module
        when mpi4py-fft is installed (the FFTW it was built against), else pyFFTW's."""
        opts = self._options
        threads = int(opts.get("threads", 1))
        if self.backend in ("numpy", "scipy"):
            return _engine(self.backend, threads, None, False)
        if self.backend == "fftw":
            effort = opts.get("planner_effort", "FFTW_MEASURE")
        else:
            import pyfftw

            effort = opts.get("planner_effort", pyfftw.config.PLANNER_EFFORT)
        if effort not in fftw.flag_dict:
            raise ValueError(f"unknown planner_effort {effort!r}")
        return _engine(self.backend, threads, effort, mpi4py_fftw() is not None)

    def _spectrum_spec(self, shape: Sequence[int]) -> tuple[list[int], np.dtype]:
        """Shape and type of the (padded) forward output of the default transform."""
        return _spectrum_spec(shape, self.axes, self.dtype, self.real_transform)

    def _plan_default(self) -> tuple[_Step, _Step]:
        U = self._allocator(tuple(self.shape), self.dtype)
        vshape, vdtype = self._spectrum_spec(self.shape)
        V = self._allocator(tuple(vshape), vdtype)
        M = 1.0 / prod(self.shape[a] for a in self.axes)
        fwd = _Step(lambda src, dst, **kw: self._default(src, dst, False, 1.0), U, V, M)
        bck = _Step(lambda src, dst, **kw: self._default(src, dst, True, 1.0), V, U, M)
        return fwd, bck

    def release(self) -> None:
        """Drop the object's references to itself -- its steps ``fwd``/``bck`` and the
        functions its transforms call -- so that it goes with its last reference from outside
        instead of at the next garbage collection (its arrays too, and their arena memory).
        For an object that is not run again (the serial transforms of a destroyed PFFT);
        ``forward``/``backward`` keep their arrays, and calling them raises."""
        for transform in (self.forward, self.backward):
            transform._xfftn = _released
        self.fwd = self.bck = None
        self._allocator = _default_allocator  # a PFFT's allocator refers to the PFFT
        self._subs.clear()

    def prepare(self) -> None:
        """Plan the default transforms now, on the object's own arrays (which the planner may
        overwrite), if not planned yet; nothing for custom transforms (planned when made)."""
        engine = self._engine
        if engine is None or self._held_plans:
            return
        U, V = self.fwd.input_array, self.fwd.output_array
        # The FFT holds its plans, so that they outlive their eviction from the plan cache.
        self._held_plans = [engine.prepare(U, V, self.axes, False)]
        if not (self.dtype.kind == "f" and not self.real_transform):
            self._held_plans.append(engine.prepare(V, U, self.axes, True))

    def _plan_custom(self) -> tuple[Any, Any]:
        plan_fwd, plan_bck = self._pair  # type: ignore[misc]
        shape, axes, dtype = self.shape, self.axes, self.dtype
        s = tuple(shape[a] for a in axes)
        U = self._allocator(tuple(shape), dtype)
        U.fill(0)
        opts = self._options
        if self.backend == "fftw":
            effort = opts.get("planner_effort", "FFTW_MEASURE")
            overwrite = opts.get("overwrite_input", "FFTW_DESTROY_INPUT")
            if effort not in fftw.flag_dict or overwrite not in fftw.flag_dict:
                raise ValueError(f"unknown FFTW flag in {effort!r}, {overwrite!r}")
            flags: tuple[int, ...] = (fftw.flag_dict[effort], fftw.flag_dict[overwrite])
            threads = int(opts.get("threads", 1))
            fwd = plan_fwd(U, s=s, axes=axes, threads=threads, flags=flags)
            if self._custom_allocator:
                V = self._allocator(fwd.output_array.shape, fwd.output_array.dtype)
                fwd = plan_fwd(U, s=s, axes=axes, threads=threads, flags=flags, output_array=V)
            U.fill(0)
            if self.real_transform:
                flags = (fftw.flag_dict[effort],)
            bck = plan_bck(
                fwd.output_array, s=s, axes=axes, threads=threads, flags=flags, output_array=U
            )
            return fwd, bck
        if self.backend == "pyfftw":
            popts: dict[str, Any] = dict(
                avoid_copy=True, overwrite_input=True, auto_align_input=True,
                auto_contiguous=True, threads=1,
            )  # fmt: skip
            popts.update(opts)
            xfwd = plan_fwd(U, s=s, axes=axes, **popts)
            U.fill(0)
            if self.real_transform:
                del popts["overwrite_input"]
            V = xfwd.output_array
            if self._custom_allocator:
                V = self._allocator(V.shape, V.dtype)
            xbck = plan_bck(V, s=s, axes=axes, **popts)
            V.fill(0)
            try:
                xfwd.update_arrays(U, V)
                xbck.update_arrays(V, U)
            except ValueError as exc:
                raise ValueError(
                    f"backend 'pyfftw': the allocator's arrays do not fit the plans ({exc})"
                ) from exc
            return _BuilderStep(xfwd, False), _BuilderStep(xbck, True)
        opt = {"shape" if self.backend == "scipy" else "s": s, "axes": axes}
        V0 = np.asarray(plan_fwd(U, **opt))
        if self.backend == "numpy":
            V0 = V0.astype(dtype.char.upper())
        V = self._allocator(V0.shape, V0.dtype)
        return (
            _FuncStep(plan_fwd, U, V, 1, dict(opt)),
            _FuncStep(plan_bck, V, U, prod(s), dict(opt)),
        )

    def _get_truncarray(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        tshape = _truncated_shape(shape, self.axes[-1], self.padding_factor, self.real_transform)
        return self._allocator(tshape, np.dtype(dtype))

    def _check_call_options(self, kw: dict) -> None:
        unknown = sorted(set(kw) - self._call_options)
        if unknown:
            raise TypeError(
                f"unexpected keyword argument(s) {unknown} for a transform of backend "
                f"{self.backend!r} (it takes {sorted(self._call_options)})"
            )

    def _forward(self, **kw: Any) -> np.ndarray:
        self._check_call_options(kw)
        normalize = kw.pop("normalize", True)
        out = self.forward.output_array
        if self._engine is not None:
            V = self.fwd.output_array
            self._default(self.fwd.input_array, V, False, self._scale if normalize else 1.0)
            self._truncation_forward(V, out)
            return out
        self.fwd(None, None, **kw)
        self._truncation_forward(self.fwd.output_array, out)
        if normalize:
            out *= self.M
        return out

    def _backward(self, **kw: Any) -> np.ndarray:
        self._check_call_options(kw)
        normalize = kw.pop("normalize", False)
        out = self.backward.output_array
        self._padding_backward(self.backward.input_array, self.bck.input_array)
        if self._engine is not None:
            # mpi4py-fft's 'fftw' backward overwrites its input array; pyFFTW's builders do not.
            destroy = (
                self.backend == "fftw" or self.bck.input_array is not self.backward.input_array
            )
            self._default(
                self.bck.input_array, out, True, self._scale if normalize else 1.0, 0, destroy
            )
            return out
        self.bck(None, None, **kw)
        if normalize:
            out *= self.M
        return out

    def _work(self, tag: str, shape: Sequence[int], dtype: Any) -> np.ndarray:
        key = (tag, tuple(shape), np.dtype(dtype).char)
        a = self._scratch.get(key)
        if a is None:
            a = self._scratch[key] = fftw.aligned(tuple(shape), dtype=dtype)
        return a

    def _default(
        self, src, dst, inverse: bool, factor: float, lead: int = 0, destroy: bool = True
    ) -> None:
        """The default transform src -> dst, times `factor` (`lead` leading axes)."""
        engine = self._engine
        assert engine is not None
        axes = self.axes if lead == 0 else [a + lead for a in self.axes]
        if not inverse:
            if self.real_transform:
                engine.r2c(src, dst, axes, factor)
            else:
                engine.c2c(src, dst, axes, False, factor)
        elif self.real_transform:
            if not destroy and isinstance(engine, PyfftwBackend):
                work = self._work("c2r", src.shape, src.dtype)
                work[...] = src
                src = work
            engine.c2r(src, dst, axes, factor)
        elif dst.dtype.kind == "f":
            work = self._work("c2c", src.shape, src.dtype)
            engine.c2c(src, work, axes, True, factor)
            dst[...] = work.real
        else:
            engine.c2c(src, dst, axes, True, factor)

    def _sub(self, lead_shape: tuple) -> FFT:
        """An FFT like this one for arrays with leading axes `lead_shape` (cached)."""
        sub = self._subs.get(lead_shape)
        if sub is None:
            lead = len(lead_shape)
            axes = tuple(a + lead for a in self.axes)
            transforms = None if self._pair is None else {axes: self._pair}
            padding = self.padding_factor if self.padding_factor != 1.0 else False
            sub = self._subs[lead_shape] = FFT(
                lead_shape + tuple(self.shape), axes, self.dtype, padding, self.backend,
                transforms, **self._options,
            )  # fmt: skip
        return sub

    @property
    def scales(self) -> bool:
        """Whether :meth:`execute` takes any `factor` (the default transforms of every
        backend but 'mkl_fft'): a parallel FFT then scales once, not once per stage."""
        return self._engine is not None

    @property
    def scale(self) -> Any:
        """The normalization factor 1/M, in the precision of the transform."""
        return self._scale

    def execute(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        *,
        inverse: bool,
        normalize: bool,
        destroy_input: bool = False,
        factor: Any = None,
    ) -> np.ndarray:
        """Transform `src` into `dst` directly: zcoll's fast entry for its parallel FFTs.

        Gives the values of ``forward(src, dst, normalize=normalize)`` (``inverse=False``) or
        ``backward(src, dst, normalize=normalize)`` (``inverse=True``), padding, transforms and
        normalization included, without copying through the object's own arrays where the
        backend can avoid it; the normalization is folded into the transform where the
        backend can.

        Parameters
        ----------
        src, dst : numpy.ndarray
            Forward: ``src`` of the shape and type of ``forward.input_array``, ``dst`` of
            ``forward.output_array``; inverse: those of ``backward``. Either may have extra
            leading axes (components of a vector or tensor field, for instance ``(3, *shape)``),
            the same in both: one backend call transforms all components (plans and work
            arrays are cached per shape). They must not overlap.
        inverse : bool
            Backward transform if True.
        normalize : bool
            Multiply by :attr:`M`.
        destroy_input : bool, optional
            Allow the transform to overwrite `src` (FFTW's complex-to-real transforms do,
            which otherwise costs a copy); `src` is never modified when False.
        factor : number, optional
            Multiply by this instead (`normalize` ignored); only where :attr:`scales` is True.

        Returns
        -------
        numpy.ndarray
            `dst`.

        Raises
        ------
        ValueError
            If the shapes do not fit.
        TypeError
            If the dtypes are not those planned for.
        """
        ref = self.backward if inverse else self.forward
        ins, outs = ref.input_array, ref.output_array
        lead = src.ndim - ins.ndim
        if lead < 0 or src.shape[lead:] != ins.shape or dst.shape != src.shape[:lead] + outs.shape:
            raise ValueError(
                f"execute(inverse={inverse}) needs src of shape (..., *{ins.shape}) and dst of "
                f"shape (..., *{outs.shape}) with the same leading axes; got {src.shape} and "
                f"{dst.shape}"
            )
        if src.dtype != ins.dtype or dst.dtype != outs.dtype:
            raise TypeError(
                f"execute(inverse={inverse}) needs src of dtype {ins.dtype} and dst of dtype "
                f"{outs.dtype}; got {src.dtype} and {dst.dtype}"
            )
        if self._engine is None and factor is not None:
            raise ValueError("execute(factor=...) needs a backend that scales (see scales)")
        return self.run(src, dst, inverse, normalize, destroy_input, factor, lead)

    def bind(self, src, dst, inverse: bool, normalize: bool, destroy_input: bool, factor):
        """A call with no arguments that does ``run(src, dst, ...)`` (no leading axes): for
        zcoll's parallel FFTs, which transform the same arrays again and again. Where the
        backend can, the plan runs on the arrays directly, with no Python in between (with
        padding: the plan on a padded work array, and truncation or zero-padding by views made
        once)."""
        fallback = functools.partial(
            self.run, src, dst, inverse, normalize, destroy_input, factor, 0
        )
        if self._engine is None:
            return fallback
        if factor is None:
            factor = self._scale if normalize else 1.0
        if self._unpadded:
            return self._bind_default(src, dst, inverse, factor, destroy_input) or fallback
        V = self.fwd.output_array
        padded = self._work("padded", V.shape, V.dtype)
        if inverse:
            transform = self._bind_default(padded, dst, True, factor, True)
            steps = (self._padding_plan(src, padded), transform)
        else:
            transform = self._bind_default(src, padded, False, factor, destroy_input)
            steps = (transform, self._truncation_plan(padded, dst))
        if transform is None:
            return fallback
        first, second = steps

        def run_both() -> None:
            first()
            second()

        return run_both

    def _bind_default(self, src, dst, inverse: bool, factor, destroy_input: bool):
        """The default transform src -> dst bound by the engine, or None where it cannot be
        (a complex transform into a real array; a c2r that must keep its input)."""
        assert self._engine is not None
        real_out = inverse and not self.real_transform and dst.dtype.kind == "f"
        if real_out or (inverse and self.real_transform and not destroy_input):
            return None
        direction = "FFTW_BACKWARD" if inverse else "FFTW_FORWARD"
        return self._engine.bind(src, dst, self.axes, direction, factor)

    def run(self, src, dst, inverse: bool, normalize: bool, destroy_input: bool, factor, lead: int):
        """:meth:`execute` without its argument checks, for callers whose arrays are right by
        construction (zcoll's parallel FFTs: their own arrays, or ones they checked)."""
        if self._engine is None:
            obj = self if lead == 0 else self._sub(src.shape[:lead])
            (obj.backward if inverse else obj.forward)(src, dst, normalize=normalize)
            return dst
        if factor is None:
            factor = self._scale if normalize else 1.0
        if self._unpadded:
            self._default(src, dst, inverse, factor, lead, destroy_input)
            return dst
        V = self.fwd.output_array
        padded = self._work("padded", src.shape[:lead] + V.shape, V.dtype)
        if inverse:
            self._padding_backward(src, padded, lead)
            self._default(padded, dst, True, factor, lead)
        else:
            self._default(src, padded, False, factor, lead)
            self._truncation_forward(padded, dst, lead)
        return dst
