"""Serial FFTs along one axis of a local array: numpy.fft, scipy.fft or pyFFTW.

zcoll does not compute FFTs itself; a backend runs each local 1D transform of the pencil
algorithm. Every call writes into a given output array (in place when it is the input) and
multiplies the result by `factor`.
"""

from __future__ import annotations

import inspect

import numpy as np

__all__ = ["BACKENDS", "get_backend"]

_FORWARD, _INVERSE = "fwd", "inv"


def _norm(direction: str, factor: float, n: int) -> str | None:
    """The numpy `norm` that multiplies by `factor`, or None if none does."""
    if factor == 1.0:
        return "backward" if direction == _FORWARD else "forward"
    if factor == 1.0 / n:
        return "forward" if direction == _FORWARD else "backward"
    return None


class NumpyBackend:
    """numpy.fft (pocketfft); writes straight into the output array on NumPy >= 2."""

    name = "numpy"
    #: True: every 1D transform folds its own 1/n into the transform for free.
    folds_scaling = True

    def __init__(self, **_options) -> None:
        self._module = np.fft
        self._has_out = "out" in inspect.signature(np.fft.fft).parameters

    def _call(self, func, a, out, length, direction, factor, **kw):
        norm = _norm(direction, factor, length)
        if self._has_out:
            func(a, norm=norm or "backward", out=out, **kw)
        else:
            out[...] = func(a, norm=norm or "backward", **kw)
        if norm is None:
            out *= factor if direction == _FORWARD else factor * length
        return out

    def c2c(self, a, out, axis, inverse, factor=1.0):
        func = self._module.ifft if inverse else self._module.fft
        return self._call(
            func, a, out, a.shape[axis], _INVERSE if inverse else _FORWARD, factor, axis=axis
        )

    def r2c(self, a, out, axis, factor=1.0):
        return self._call(self._module.rfft, a, out, a.shape[axis], _FORWARD, factor, axis=axis)

    def c2r(self, a, out, axis, n, factor=1.0):
        return self._call(self._module.irfft, a, out, n, _INVERSE, factor, axis=axis, n=n)


class ScipyBackend(NumpyBackend):
    """scipy.fft (pocketfft with `workers` threads); results are copied into the output."""

    name = "scipy"

    def __init__(self, threads: int = 1, **_options) -> None:
        import scipy.fft

        self._module = _ScipyWithWorkers(scipy.fft, threads)
        self._has_out = False


class _ScipyWithWorkers:
    def __init__(self, module, workers: int) -> None:
        self._m, self._w = module, workers

    def __getattr__(self, name):
        func = getattr(self._m, name)
        return lambda *args, **kw: func(*args, workers=self._w, **kw)


class PyfftwBackend:
    """pyFFTW: FFTW plans made once per (shapes, strides, alignment, axis, kind) and reused.

    Plans are measured (``FFTW_MEASURE`` by default) on scratch arrays, so planning never
    touches the caller's data. Scaling is applied as one multiplication on the output.
    """

    name = "pyfftw"
    folds_scaling = False

    def __init__(self, threads: int = 1, planner_effort: str = "FFTW_MEASURE", **_options):
        import pyfftw

        self._fftw = pyfftw
        self._threads = threads
        self._effort = planner_effort
        self._plans: dict = {}

    def _plan(self, a, out, axis, direction):
        aligned = all(self._fftw.is_byte_aligned(x, self._fftw.simd_alignment) for x in (a, out))
        key = (
            a.shape,
            a.strides,
            a.dtype,
            out.shape,
            out.strides,
            out.dtype,
            axis,
            direction,
            aligned,
            a is out,
        )
        plan = self._plans.get(key)
        if plan is None:
            scratch_in = self._fftw.empty_aligned(a.shape, a.dtype)
            scratch_out = scratch_in if a is out else self._fftw.empty_aligned(out.shape, out.dtype)
            flags = [self._effort] + ([] if aligned else ["FFTW_UNALIGNED"])
            if direction == "FFTW_BACKWARD" and a.dtype.kind == "c" and out.dtype.kind == "f":
                flags.append("FFTW_DESTROY_INPUT")  # c2r: only ever called on zcoll work arrays
            plan = self._fftw.FFTW(
                scratch_in,
                scratch_out,
                axes=(axis,),
                direction=direction,
                flags=flags,
                threads=self._threads,
            )
            self._plans[key] = plan
        return plan

    def _run(self, a, out, axis, direction, factor):
        # Plans are made for C-ordered arrays, and FFTW compares strides exactly.
        if not _c_strided(out):
            out[...] = self._run(a, np.empty(out.shape, out.dtype), axis, direction, factor)
            return out
        if not _c_strided(a):
            a = np.array(a, order="C")
        plan = self._plan(a, out, axis, direction)
        plan.update_arrays(a, out)
        plan.execute()
        if factor != 1.0:
            out *= factor
        return out

    def c2c(self, a, out, axis, inverse, factor=1.0):
        return self._run(a, out, axis, "FFTW_BACKWARD" if inverse else "FFTW_FORWARD", factor)

    def r2c(self, a, out, axis, factor=1.0):
        return self._run(a, out, axis, "FFTW_FORWARD", factor)

    def c2r(self, a, out, axis, n, factor=1.0):
        if out.shape[axis] != n:
            raise ValueError(f"c2r output has {out.shape[axis]} points along axis {axis}, not {n}")
        return self._run(a, out, axis, "FFTW_BACKWARD", factor)


def _c_strided(a: np.ndarray) -> bool:
    """Whether `a` has exactly the strides of a new C-ordered array of its shape."""
    stride, expected = a.itemsize, []
    for n in reversed(a.shape):
        expected.append(stride)
        stride *= n
    return a.strides == tuple(reversed(expected))


BACKENDS = {"numpy": NumpyBackend, "scipy": ScipyBackend, "pyfftw": PyfftwBackend}


def get_backend(name: str, **options):
    """The backend called `name` ("numpy", "scipy" or "pyfftw"), made with `options`."""
    if name not in BACKENDS:
        raise ValueError(f"zcoll.fft: backend must be one of {sorted(BACKENDS)}, got {name!r}")
    try:
        return BACKENDS[name](**options)
    except ImportError as exc:
        raise ImportError(
            f"zcoll.fft: backend {name!r} needs the {name} package ({exc}); "
            f"install it (pip install {name}) or use backend='numpy'"
        ) from exc
