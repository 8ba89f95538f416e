"""Serial FFTs over some axes of a local array: numpy.fft, scipy.fft or pyFFTW.

zcoll does not compute FFTs itself; a backend runs each local transform of the pencil
algorithm, over one axis or over several axes that are all local (mpi4py-fft's `collapse`).
Every call writes into a given output array (in place when it is the input) and multiplies the
result by `factor`. Real-to-complex transforms act on the last of their axes.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections import OrderedDict
from math import prod
from typing import Any

import numpy as np

__all__ = [
    "FftwLibBackend",
    "NumpyBackend",
    "PlanCache",
    "PyfftwBackend",
    "ScipyBackend",
    "plan_cache",
]


def _norm(inverse: bool, factor: float, n: int) -> str | None:
    """The numpy `norm` that multiplies by `factor` for a transform of `n` points, or None."""
    if factor == 1.0:
        return "forward" if inverse else "backward"
    if factor == 1.0 / n:
        return "backward" if inverse else "forward"
    return None


#: Pairs of arrays a pyFFTW/FFTW engine remembers as checked (see PyfftwBackend._run_checked).
BOUND_ARRAYS = 64
#: Bounds of the process-wide cache of FFTW plans (see PlanCache): plans, and bytes of the
#: arrays they were made on, which a kept plan keeps alive.
PLAN_CACHE_PLANS = 64
PLAN_CACHE_BYTES = 64 << 20


class _Planned:
    """An FFTW plan, and the aligned scratch arrays that inputs it cannot take as they are
    go through (made at the first such input: most plans never need them). `lock` is held by
    a run that rebinds the plan's arrays or uses the scratch arrays: a cached plan serves every
    transform of its shapes in the process, and two threads must not interleave there."""

    def __init__(self, plan, nbytes: int) -> None:
        self.plan = plan
        self.nbytes = nbytes
        self.scratch: tuple[np.ndarray, np.ndarray] | None = None
        self.lock = threading.Lock()


class PlanCache:
    """Process-wide FFTW plans, least recently used evicted first.

    A plan is keyed on everything FFTW's planner sees -- the library, shapes, dtypes, axes,
    direction, whether in place, planner flags and threads -- and is only made on, and run on,
    C-ordered SIMD-aligned arrays (others are copied through its scratch arrays), so a plan of
    one key fits every array pair of that key. A plan keeps the arrays it was planned on alive,
    hence the bound on their bytes besides the one on the number of plans.

    The bounds govern only what the cache alone keeps alive: a plan that an FFT object still
    holds (:meth:`PyfftwBackend.prepare` hands it back to be kept) is found by its key even
    after it has been evicted, so a transform whose plans together exceed the bound in bytes
    never makes its plans again at every call.

    Attributes
    ----------
    hits, misses : int
        Look-ups that found a plan, and plans made.
    """

    def __init__(self, max_plans: int = PLAN_CACHE_PLANS, max_bytes: int = PLAN_CACHE_BYTES):
        self.max_plans = max_plans
        self.max_bytes = max_bytes
        self._plans: OrderedDict[tuple, _Planned] = OrderedDict()
        self._held: weakref.WeakValueDictionary[tuple, _Planned] = weakref.WeakValueDictionary()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, key: tuple) -> _Planned | None:
        entry = self._plans.get(key)
        if entry is not None:
            self._plans.move_to_end(key)
        else:
            entry = self._held.get(key)  # evicted, but still held by an FFT
        if entry is not None:
            self.hits += 1
        return entry

    def put(self, key: tuple, entry: _Planned) -> None:
        self.misses += 1
        old = self._plans.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._plans[key] = entry
        self._held[key] = entry
        self._bytes += entry.nbytes
        while len(self._plans) > 1 and (
            len(self._plans) > self.max_plans or self._bytes > self.max_bytes
        ):
            _, evicted = self._plans.popitem(last=False)
            self._bytes -= evicted.nbytes

    def clear(self) -> None:
        self._plans.clear()
        self._held.clear()
        self._bytes = 0


#: The FFTW plans of every 'fftw' and 'pyfftw' engine in this process.
plan_cache = PlanCache()
#: Held while a plan is looked up or made: FFTW's planner is not thread-safe, and a plan is
#: now made at a transform's first call, which may run in any thread.
_planning = threading.Lock()


class NumpyBackend:
    """numpy.fft (pocketfft); writes straight into the output array on NumPy >= 2."""

    name = "numpy"
    #: True: every transform folds its own 1/n into the transform for free.
    folds_scaling = True

    def __init__(self) -> None:
        self._module: Any = np.fft  # or scipy.fft with workers (ScipyBackend): fftn, rfftn, ...
        self._has_out = "out" in inspect.signature(np.fft.fftn).parameters

    def _call(self, func, a, out, n: int, inverse: bool, factor: float, **kw):
        norm = _norm(inverse, factor, n)
        # numpy's unscaled single-precision transforms run through its double-precision loop
        # (it passes the factor 1 as a Python int): scale inside, then undo, is 2-5x faster.
        undo = 1.0
        if norm is None or (factor == 1.0 and out.dtype.char in "fF" and n > 1):
            norm, undo = ("backward" if inverse else "forward"), factor * n
        if self._has_out:
            func(a, norm=norm, out=out, **kw)
        else:
            out[...] = func(a, norm=norm, **kw)
        if undo != 1.0:
            out *= out.real.dtype.type(undo)
        return out

    def prepare(self, a, out, axes, inverse) -> Any:
        """Make ready for transforms of arrays like `a` into `out` (nothing to plan here);
        returns what the caller keeps for as long as it transforms such arrays."""
        return None

    def bind(self, a, out, axes, direction: str, factor: float):
        """A call with no arguments that transforms `a` into `out` times `factor`, as
        c2c/r2c/c2r would (`direction` "FFTW_FORWARD" or "FFTW_BACKWARD"), for arrays a
        caller transforms again and again; None where this backend has no faster way than
        those methods."""
        return None

    def c2c(self, a, out, axes, inverse, factor=1.0):
        func = self._module.ifftn if inverse else self._module.fftn
        n = prod(a.shape[ax] for ax in axes)
        return self._call(func, a, out, n, inverse, factor, axes=axes)

    def r2c(self, a, out, axes, factor=1.0):
        n = prod(a.shape[ax] for ax in axes)
        return self._call(self._module.rfftn, a, out, n, False, factor, axes=axes)

    def c2r(self, a, out, axes, factor=1.0):
        s = [out.shape[ax] for ax in axes]
        return self._call(self._module.irfftn, a, out, prod(s), True, factor, s=s, axes=axes)


class ScipyBackend(NumpyBackend):
    """scipy.fft (pocketfft with `threads` workers); results are copied into the output."""

    name = "scipy"

    def __init__(self, threads: int = 1) -> None:
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
    """pyFFTW: FFTW plans made once per (shapes, axes, kind, flags) in the process-wide
    :data:`plan_cache` and reused.

    Plans are measured (``FFTW_MEASURE`` by default) on the arrays :meth:`prepare` is given
    (new ones) or on scratch arrays, so planning never touches the caller's data. Scaling is
    applied as one multiplication on the output.
    """

    name = "pyfftw"
    folds_scaling = False

    def __init__(self, threads: int = 1, planner_effort: str = "FFTW_MEASURE") -> None:
        import pyfftw

        self._fftw = pyfftw
        self._threads = threads
        self._effort = planner_effort
        self._bound: dict = {}

    def _plan(self, a, out, axes, direction, *, on_arrays: bool = False) -> _Planned:
        """The plan for arrays like `a` and `out`, from the process-wide cache or made now:
        on `a` and `out` themselves with `on_arrays` (arrays whose contents may be lost: FFTW's
        planner overwrites them) where they fit a plan as they are, else on scratch arrays."""
        key = (type(self).__name__, a.shape, a.dtype.str, out.shape, out.dtype.str, axes,
               direction, a is out, self._effort, self._threads)  # fmt: skip
        with _planning:  # FFTW's planner and the cache serve one thread at a time
            return self._cached_plan(key, a, out, axes, direction, on_arrays)

    def _cached_plan(self, key, a, out, axes, direction, on_arrays: bool) -> _Planned:
        entry = plan_cache.get(key)
        if entry is None:
            fits = on_arrays and all(_c_strided(x) and self._aligned(x) for x in (a, out))
            src, dst = (a, out) if fits else self._scratch_pair(a, out)
            nbytes = src.nbytes + (0 if dst is src else dst.nbytes)
            entry = _Planned(self._make_plan(src, dst, axes, direction), nbytes)
            if not fits:
                entry.scratch = (src, dst)
            plan_cache.put(key, entry)
        return entry

    def _scratch(self, entry: _Planned, a, out) -> tuple[np.ndarray, np.ndarray]:
        """The aligned scratch arrays of `entry` for arrays like `a` and `out`."""
        if entry.scratch is None:
            entry.scratch = self._scratch_pair(a, out)
        return entry.scratch

    def _scratch_pair(self, a, out) -> tuple[np.ndarray, np.ndarray]:
        """New aligned arrays like `a` and `out` (one array when the transform is in place)."""
        src = self._empty(a.shape, a.dtype)
        return src, src if a is out else self._empty(out.shape, out.dtype)

    def _empty(self, shape, dtype) -> np.ndarray:
        return self._fftw.empty_aligned(shape, dtype)

    def _make_plan(self, a, out, axes, direction):
        return self._fftw.FFTW(
            a, out, axes=axes, direction=direction, flags=[self._effort], threads=self._threads
        )

    def _execute(self, plan, a, out) -> None:
        plan.update_arrays(a, out)
        plan.execute()

    def prepare(self, a, out, axes, inverse) -> _Planned:
        """Plan now (not at the first call) for transforms of arrays like `a` into `out`, on
        `a` and `out` themselves (new arrays, whose contents the planner may overwrite). The
        plan is returned to be kept: while it is held, every transform of its key finds it."""
        direction = "FFTW_BACKWARD" if inverse else "FFTW_FORWARD"
        axes = tuple(axes)
        entry = self._plan(a, out, axes, direction, on_arrays=True)
        if all(_c_strided(x) and self._aligned(x) for x in (a, out)):
            self._remember((id(a), id(out), axes, direction), a, out, entry)  # first runs too
        return entry

    def _aligned(self, x) -> bool:
        return bool(self._fftw.is_byte_aligned(x, self._fftw.simd_alignment))

    def bind(self, a, out, axes, direction: str, factor: float):
        """See :meth:`NumpyBackend.bind`: the plan itself, run on `a` and `out`, where they
        fit it as they are (C-ordered and SIMD-aligned); None where they do not."""
        if not (_c_strided(a) and _c_strided(out) and self._aligned(a) and self._aligned(out)):
            return None
        run = self._bound_plan(self._plan(a, out, tuple(axes), direction), a, out)
        if factor == 1.0:
            return run
        scale = out.real.dtype.type(factor)

        def run_scaled() -> None:
            run()
            np.multiply(out, scale, out=out)

        return run_scaled

    def _bound_plan(self, entry: _Planned, a, out):
        plan, lock = entry.plan, entry.lock

        def run() -> None:
            with lock:  # pyFFTW's plan holds the arrays it runs on
                plan.update_arrays(a, out)
                plan.execute()

        return run

    def _run(self, a, out, axes, direction, factor):
        key = (id(a), id(out), tuple(axes), direction)
        bound = self._bound.get(key)
        if bound is not None and bound[0]() is a and bound[1]() is out:
            entry = bound[2]  # the same arrays as before: checked then
            with entry.lock:
                self._execute(entry.plan, a, out)
        else:
            self._run_checked(a, out, axes, direction, key)
        if factor != 1.0:
            out *= out.real.dtype.type(factor)
        return out

    def _run_checked(self, a, out, axes, direction, key) -> None:
        """A transform of arrays not seen before: strides and alignment checked, copies
        through the plan's own arrays where they do not fit it. Arrays that fit are
        remembered (weakly: a call never keeps an array alive) so that the next call with the
        same two arrays goes straight to the plan."""
        # Plans are made for C-ordered arrays, and FFTW compares strides exactly.
        if not _c_strided(out):
            out[...] = self._run(a, np.empty(out.shape, out.dtype), axes, direction, 1.0)
            return
        if not _c_strided(a):
            a = np.array(a, order="C")
        entry = self._plan(a, out, tuple(axes), direction)
        # Arrays that are not SIMD-aligned (NumPy's own are 16-byte aligned) go through the
        # plan's aligned scratch arrays, as mpi4py-fft copies through its own: a copy, never a
        # plan made inside the caller's time step.
        with entry.lock:
            if a is out:
                src = dst = a if self._aligned(a) else self._scratch(entry, a, out)[0]
            else:
                src = a if self._aligned(a) else self._scratch(entry, a, out)[0]
                dst = out if self._aligned(out) else self._scratch(entry, a, out)[1]
            if src is not a:
                np.copyto(src, a)
            self._execute(entry.plan, src, dst)
            if dst is not out:
                np.copyto(out, dst)
        if dst is out and src is a and id(a) == key[0]:
            self._remember(key, a, out, entry)

    def _remember(self, key, a, out, entry: _Planned) -> None:
        """The next transform of `a` into `out` goes straight to `entry`'s plan (weakly held:
        a call never keeps an array alive)."""
        if len(self._bound) >= BOUND_ARRAYS:
            self._bound.clear()
        self._bound[key] = (weakref.ref(a), weakref.ref(out), entry)

    def c2c(self, a, out, axes, inverse, factor=1.0):
        return self._run(a, out, axes, "FFTW_BACKWARD" if inverse else "FFTW_FORWARD", factor)

    def r2c(self, a, out, axes, factor=1.0):
        return self._run(a, out, axes, "FFTW_FORWARD", factor)

    def c2r(self, a, out, axes, factor=1.0):
        # FFTW's c2r destroys its input: zcoll only passes its own work arrays here.
        return self._run(a, out, axes, "FFTW_BACKWARD", factor)


class FftwLibBackend(PyfftwBackend):
    """mpi4py-fft's own FFTW module (``mpi4py_fft.fftw``): the FFTW library mpi4py-fft was
    built against, typically the system's, which can be newer and faster than the one pyFFTW's
    wheels bundle. Plans and scratch arrays as for :class:`PyfftwBackend`; a plan runs on the
    caller's arrays through mpi4py-fft's implicit call (FFTW's new-array execute)."""

    name = "fftw"

    def __init__(self, threads: int = 1, planner_effort: str = "FFTW_MEASURE") -> None:
        lib = mpi4py_fftw()
        if lib is None:
            raise ImportError("mpi4py-fft's FFTW module is not installed")
        self._lib = lib
        self._threads = threads
        self._effort = planner_effort
        self._flags = (lib.flag_dict[planner_effort],)
        self._bound: dict = {}

    def _empty(self, shape, dtype) -> np.ndarray:
        return self._lib.aligned(shape, n=32, dtype=dtype)  # mpi4py-fft's largest alignment

    def _make_plan(self, a, out, axes, direction):
        lib = self._lib
        if a.dtype.kind == "f":
            planner, s = lib.rfftn, None
        elif out.dtype.kind == "f":
            planner, s = lib.irfftn, [out.shape[ax] for ax in axes]
        else:
            planner, s = (lib.ifftn if direction == "FFTW_BACKWARD" else lib.fftn), None
        return planner(
            a, s=s, axes=tuple(axes), threads=self._threads, flags=self._flags, output_array=out
        )

    def _aligned(self, x) -> bool:
        return x.ctypes.data % 32 == 0

    def _execute(self, plan, a, out) -> None:
        plan(a, out, implicit=True, normalize=False)

    def _bound_plan(self, entry: _Planned, a, out):
        run, lock = functools.partial(entry.plan, a, out, True, False), entry.lock

        def locked() -> None:  # implicit, not normalized; one thread per plan at a time
            with lock:
                run()

        return locked


_MPI4PY_FFTW: list = []  # [module or None], filled by the first look


def mpi4py_fftw():
    """mpi4py-fft's compiled FFTW module, or None where mpi4py-fft is not installed.

    The first look decides; ``tools/mpi4py_fft_shim.py`` looks before it makes the name
    ``mpi4py_fft`` mean zcoll.fft, so a shimmed program still finds the real module.
    """
    if not _MPI4PY_FFTW:
        try:
            from mpi4py_fft import fftw
        except ImportError:
            fftw = None
        if fftw is not None and not fftw.__name__.startswith("mpi4py_fft"):
            fftw = None  # zcoll.fft.fftw under the shim, looked up too late
        _MPI4PY_FFTW.append(fftw)
    return _MPI4PY_FFTW[0]


def _c_strided(a: np.ndarray) -> bool:
    """Whether `a` has exactly the strides of a new C-ordered array of its shape."""
    stride, expected = a.itemsize, []
    for n in reversed(a.shape):
        expected.append(stride)
        stride *= n
    return a.strides == tuple(reversed(expected))
