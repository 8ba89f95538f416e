"""Pencil-decomposed parallel FFT (mpi4py-fft's ``mpi4py_fft.mpifft``) on zcoll's shared-memory
transposes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import numpy as np
from mpi4py import MPI

from .._collectives import _option_error
from .._context import lookup
from .._registry import AUTO
from ._backends import check_backend, get_backend
from .distarray import DistArray, _new
from .pencil import Pencil, Subcomm, Transfer, TransferPlan, fitting_dims

__all__ = ["PFFT"]

_REAL = {
    np.dtype(np.float32): np.dtype(np.complex64),
    np.dtype(np.float64): np.dtype(np.complex128),
}
_COMPLEX = tuple(_REAL.values())


@dataclass
class _Step:
    kind: str  # "r2c" | "c2c" | "transfer"
    axes: tuple[int, ...]  # transformed axes (r2c: on the last one); transfer: the new alignment
    pencil: Pencil  # pencil of the step's output
    dtype: np.dtype  # dtype of the step's output
    transfer: Transfer | None = None
    # transfer steps: the persistent transposes between the plan's work arrays, (forward,
    # backward), made at construction
    plans: tuple[TransferPlan, TransferPlan] | None = None


class PFFT:
    """Parallel FFT of a distributed array (the API of mpi4py-fft's ``PFFT``).

    Collective over `comm`. The array is split over a Cartesian grid of processes (pencils by
    default); each global transpose between the 1D FFTs runs on zcoll's ordered
    shared-memory exchange, one strided copy per element on a node, and MPI between nodes.
    Every transpose runs between the plan's own arena work arrays, so each is a persistent
    :class:`~zcoll.fft.TransferPlan` made here (checks, agreement, schedule, copy mode and the
    peers' addresses settled once): a transform runs them without any of that work.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Intracommunicator.
    shape : sequence of int
        Global shape of the input (physical-space) array; 2 or more dimensions.
    axes : sequence of int, optional
        Axes to transform, transformed in reverse order (the last one first, and it must be
        aligned in the input). Default: all axes.
    dtype : numpy dtype
        float32/float64 give real-to-complex transforms (the first transformed axis shrinks to
        ``n // 2 + 1``); complex64/complex128 give complex-to-complex.
    grid : sequence of int, optional
        Processes along each axis of the input array (padded with 1s; values <= 0 are filled
        in by ``MPI.Compute_dims``). Default: every axis but the first transformed one
        distributed (pencils in 3D); ``(-1,)`` is a slab decomposition over axis 0.
    backend : {"numpy", "scipy", "pyfftw"}
        Serial FFT library for the local transforms.
    collapse : bool
        Transform consecutive axes that are local to every rank with one multi-dimensional
        call of the backend (mpi4py-fft's `collapse`, which defaults to False there): the
        same result with fewer passes over memory.
    order : str
        Block order of the global transposes (as for :func:`zcoll.alltoall`).
    copy : str
        Stores of the transposes' copies (as for :func:`zcoll.alltoall`).
    **backend_options
        Passed to the backend: ``threads`` (scipy, pyfftw), ``planner_effort`` (pyfftw).
        Any other keyword (mpi4py-fft's ``padding``, ``transforms``, ``darray``, ...) raises
        TypeError.

    Notes
    -----
    ``forward`` scales by ``1/prod(n)`` by default and ``backward`` does not, as in
    mpi4py-fft. Without an output array each call returns a new arena array, so a result is
    never overwritten by a later call. :attr:`timings` accumulates seconds spent in local FFTs
    and in transposes. Call :meth:`destroy` (collective) to free the plan's transposes and
    communicators.
    """

    def __init__(
        self,
        comm: MPI.Intracomm,
        shape: Sequence[int],
        axes: Sequence[int] | None = None,
        dtype=float,
        grid: Sequence[int] | None = None,
        backend: str = "numpy",
        *,
        collapse: bool = True,
        order: str = AUTO,
        copy: str = AUTO,
        **backend_options,
    ) -> None:
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"zcoll.fft.PFFT: comm must be an mpi4py communicator, got {comm!r}")
        self.comm = comm
        problem = self._agree(
            comm, shape, axes, dtype, grid, backend, (order, copy), backend_options
        )
        if problem:
            raise problem
        shape = tuple(int(n) for n in shape)
        ndim = len(shape)
        self.axes = tuple(a % ndim for a in (range(ndim) if axes is None else axes))
        dtype = np.dtype(dtype)
        self.backend = get_backend(backend, **backend_options)
        self.subcomm = Subcomm(comm, _grid_dims(comm.size, shape, self.axes, grid))
        try:
            self._plan(shape, dtype, order, copy, bool(collapse))
        except Exception:
            self.subcomm.destroy()
            raise
        self.timings = {"fft": 0.0, "transpose": 0.0}

    @staticmethod
    def _agree(
        comm, shape, axes, dtype, grid, backend, exchange_options, options
    ) -> Exception | None:
        """Check the arguments locally, then make sure all ranks passed the same ones."""
        try:
            shape = tuple(int(n) for n in shape)
            ndim = len(shape)
            if ndim < 2 or min(shape) < 1:
                raise ValueError(f"shape must have 2 or more positive lengths, got {shape}")
            axes_ = tuple(range(ndim)) if axes is None else tuple(int(a) for a in axes)
            if not axes_ or any(not -ndim <= a < ndim for a in axes_):
                raise ValueError(f"axes {axes_} do not fit {ndim} dimensions")
            if len({a % ndim for a in axes_}) != len(axes_):
                raise ValueError(f"axes {axes_} repeat an axis")
            dt = np.dtype(dtype)
            if dt not in _REAL and dt not in _COMPLEX:
                raise TypeError(
                    f"dtype must be float32, float64, complex64 or complex128, got {dt}"
                )
            grid_ = None if grid is None else tuple(int(g) for g in grid)
            if grid_ is not None:
                _grid_dims(comm.size, shape, tuple(a % ndim for a in axes_), grid_)
            check_backend(backend, options)
            if option_error := _option_error(*exchange_options):
                raise option_error
            mine = (shape, axes_, str(dt), grid_, backend, exchange_options)
            error: str | None = None
        except (TypeError, ValueError) as exc:
            mine, error = None, f"{type(exc).__name__}: {exc}"
        everyone = comm.allgather((mine, error))
        for rank, (_, err) in enumerate(everyone):
            if err:
                kind, _, text = err.partition(": ")
                cls = TypeError if kind == "TypeError" else ValueError
                return cls(f"[rank {rank}] zcoll.fft.PFFT: {text}")
        for rank, (args, _) in enumerate(everyone):
            if args != everyone[0][0]:
                return ValueError(
                    f"zcoll.fft.PFFT: ranks disagree on the plan: rank 0 has (shape, axes, dtype, "
                    f"grid, backend, (order, copy)) = {everyone[0][0]}, rank {rank} has {args}"
                )
        return None

    def _plan(self, shape, dtype, order, copy, collapse: bool) -> None:
        """The steps of a forward transform: FFTs, with a transfer before each FFT whose
        axis is distributed (mpi4py-fft's sequence of pencils)."""
        pencil = Pencil(self.subcomm, shape, self.axes[-1], self.comm)
        self._input_pencil, self._input_dtype = pencil, dtype
        steps: list[_Step] = []
        for i, axis in enumerate(reversed(self.axes)):
            moved = False
            if i > 0:
                target = pencil.pencil(axis)
                if pencil.subcomm[axis].size > 1:
                    move = pencil.transfer(target, dtype, order=order, copy=copy, staging=False)
                    steps.append(_Step("transfer", (axis,), target, dtype, move))
                    moved = True
                pencil = target
            if i == 0 and dtype in _REAL:
                pencil, dtype = pencil.reshaped(axis, shape[axis] // 2 + 1), _REAL[dtype]
                steps.append(_Step("r2c", (axis,), pencil, dtype))
            elif i > 0 and collapse and not moved:  # same layout: one call for both
                last = steps[-1]
                steps[-1] = _Step(last.kind, (axis, *last.axes), pencil, dtype)
            else:
                steps.append(_Step("c2c", (axis,), pencil, dtype))
        for p in (self._input_pencil, *(s.pencil for s in steps)):
            if why := p.too_small():
                raise ValueError(f"zcoll.fft.PFFT: grid {self.subcomm.dims} too large: {why}")
        self._steps = steps
        self._output_pencil, self._output_dtype = pencil, dtype
        # Arena work array of each step's output layout; a c2c step works in place in its
        # predecessor's array. The last step writes the caller's output instead, except that a
        # lone c2r needs an array of its own (it may destroy its input).
        self._work: list[DistArray | None] = []
        for i, step in enumerate(steps):
            if i > 0 and step.kind == "c2c":
                self._work.append(self._work[-1])
            elif i < len(steps) - 1 or (i == 0 and step.kind == "r2c"):
                self._work.append(_new(step.pencil, step.dtype))
            else:
                self._work.append(None)
        # Every transfer step reads the previous step's work array and writes its own (the last
        # step is an FFT), so both directions are persistent plans between fixed arrays.
        for i, step in enumerate(steps):
            if step.transfer is not None:
                before, after = self._work[i - 1], self._work[i]
                assert before is not None and after is not None  # 0 < i < len(steps) - 1
                step.plans = (
                    step.transfer.forward_init(before, after),
                    step.transfer.backward_init(after, before),
                )
        self._scales = self._normalizing_factors(shape)
        self._unscaled = [1.0] * len(steps)
        self._context = lookup(self.comm)

    def _normalizing_factors(self, shape) -> tuple[list[float], list[float]]:
        """Scale factor of each step of a normalised forward and backward transform.

        A backend that folds scaling into its transforms for free scales each FFT step by its
        own 1/n; otherwise 1/prod(n) is applied once, by the FFT step that writes the result
        (the last step forward; step 0, whose inverse runs last, backward)."""
        steps = self._steps
        if self.backend.folds_scaling:
            scales = [
                1.0 if s.kind == "transfer" else 1.0 / prod(shape[a] for a in s.axes) for s in steps
            ]
            return scales, scales
        total = 1.0 / prod(shape[a] for a in self.axes)
        forward, backward = [1.0] * len(steps), [1.0] * len(steps)
        forward[-1] = backward[0] = total
        return forward, backward

    # -- mpi4py-fft's query API ---------------------------------------------------------------

    def shape(self, forward_output: bool = True) -> tuple[int, ...]:
        """This rank's local shape of the output (spectral) or input (physical) array."""
        return (self._output_pencil if forward_output else self._input_pencil).subshape

    def global_shape(self, forward_output: bool = False) -> tuple[int, ...]:
        """Global shape of the output (spectral) or input (physical) array."""
        return (self._output_pencil if forward_output else self._input_pencil).shape

    def local_slice(self, forward_output: bool = True) -> tuple[slice, ...]:
        """Where this rank's part lies in the global output (or input) array."""
        return (self._output_pencil if forward_output else self._input_pencil).local_slice()

    def dtype(self, forward_output: bool = False) -> np.dtype:
        """dtype of the output (spectral) or input (physical) array."""
        return self._output_dtype if forward_output else self._input_dtype

    def pencil(self, forward_output: bool = False) -> Pencil:
        return self._output_pencil if forward_output else self._input_pencil

    @property
    def dimensions(self) -> int:
        return len(self._input_pencil.shape)

    # -- transforms --------------------------------------------------------------------------

    def forward(self, input_array=None, output_array=None, normalize: bool = True) -> DistArray:
        """Collective: FFT of the physical-space array; returns the spectral-space array.

        Parameters
        ----------
        input_array : array_like
            This rank's part, of shape ``shape(False)`` and dtype ``dtype(False)``.
        output_array : numpy.ndarray, optional
            Where to write the result (shape ``shape(True)``); a new arena array otherwise.
        normalize : bool
            Divide by the number of points transformed (mpi4py-fft's default for forward).
        """
        return self._transform(input_array, output_array, normalize, inverse=False)

    def backward(self, input_array=None, output_array=None, normalize: bool = False):
        """Collective: inverse FFT of the spectral-space array (not scaled by default)."""
        return self._transform(input_array, output_array, normalize, inverse=True)

    def _transform(self, input_array, output_array, normalize, inverse):
        name = "backward" if inverse else "forward"
        src_pencil = self._output_pencil if inverse else self._input_pencil
        dst_pencil = self._input_pencil if inverse else self._output_pencil
        src_dtype = self._output_dtype if inverse else self._input_dtype
        dst_dtype = self._input_dtype if inverse else self._output_dtype
        a, error = _input_problem(input_array, src_pencil, src_dtype)
        error = error or _output_problem(output_array, dst_pencil, dst_dtype)
        self._context.raise_together(f"fft.{name}", error)  # one node barrier when all is well
        if output_array is None:
            output_array = _new(dst_pencil, dst_dtype)
        factors = self._scales[inverse] if normalize else self._unscaled
        if inverse:
            self._run_backward(a, output_array, factors)
        else:
            self._run_forward(a, output_array, factors)
        return output_array

    def _timed(self, key: str, func, *args) -> None:
        t0 = time.perf_counter()
        func(*args)
        self.timings[key] += time.perf_counter() - t0

    def _run_forward(self, a, out, factors) -> None:
        be = self.backend
        last = len(self._steps) - 1
        for i, step in enumerate(self._steps):
            dst = out if i == last else self._work[i]
            if step.kind == "transfer":
                assert step.plans is not None  # made at construction
                plan = step.plans[0]
                assert a is plan.src and dst is plan.dst  # the work arrays it was made on
                self._timed("transpose", plan)
            elif step.kind == "r2c":
                self._timed("fft", be.r2c, a, dst, step.axes, factors[i])
            else:
                self._timed("fft", be.c2c, a, dst, step.axes, False, factors[i])
            a = dst

    def _run_backward(self, a, out, factors) -> None:
        be = self.backend
        for i in range(len(self._steps) - 1, -1, -1):
            step = self._steps[i]
            # Step i's inverse writes the layout step i read: step i-1's output, or the input.
            dst = out if i == 0 else self._work[i - 1]
            if step.kind == "transfer":
                assert step.plans is not None  # made at construction
                plan = step.plans[1]
                assert a is plan.src and dst is plan.dst  # the work arrays it was made on
                self._timed("transpose", plan)
            elif step.kind == "r2c":
                work = self._work[0]
                assert work is not None  # an r2c step is step 0, with a work array of its own
                if a is not work:
                    work[...] = a  # c2r may destroy its input
                    a = work
                self._timed("fft", be.c2r, a, dst, step.axes, factors[i])
            else:
                self._timed("fft", be.c2c, a, dst, step.axes, True, factors[i])
            a = dst

    def reset_timings(self) -> None:
        self.timings = dict.fromkeys(self.timings, 0.0)

    def destroy(self) -> None:
        """Collective: free the plan's transposes and communicators."""
        for step in self._steps:
            for plan in step.plans or ():
                plan.free()
        self.subcomm.destroy()


def _input_problem(a, pencil: Pencil, dtype) -> tuple[np.ndarray | None, Exception | None]:
    """This rank's input as an array, and what is wrong with it (None when nothing)."""
    if a is None:
        return None, ValueError("input_array is required")
    a = np.asarray(a)
    if a.shape != pencil.subshape:
        return a, ValueError(
            f"input_array has shape {a.shape}, this rank's part has shape {pencil.subshape}"
        )
    if a.dtype != dtype:
        return a, TypeError(f"input_array has dtype {a.dtype}, the plan expects {dtype}")
    return a, None


def _output_problem(out, pencil: Pencil, dtype) -> Exception | None:
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        return TypeError("output_array must be a numpy.ndarray")
    if out.shape != pencil.subshape or out.dtype != dtype:
        return ValueError(
            f"output_array has shape {out.shape} and dtype {out.dtype}; expected "
            f"{pencil.subshape} and {dtype}"
        )
    if not out.flags.writeable:
        return ValueError("output_array is read-only")
    return None


def _grid_dims(size: int, shape, axes, grid) -> list[int]:
    ndim = len(shape)
    first = axes[-1]
    if grid is None:
        dims = [0] * ndim
        dims[first] = 1
        return dims
    grid = list(grid)
    if len(grid) > ndim:
        raise ValueError(f"grid {tuple(grid)} has more entries than the {ndim} axes")
    dims = grid + [1] * (ndim - len(grid))
    if dims[first] != 1:
        raise ValueError(
            f"grid {tuple(grid)} distributes axis {first}, which is transformed first and must "
            "be whole on every rank (see `axes`)"
        )
    fitting_dims(size, dims)
    return dims
