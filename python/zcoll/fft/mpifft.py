"""Parallel FFTs (mpi4py-fft's ``mpi4py_fft.mpifft``) on zcoll's shared-memory transposes.

The object model is mpi4py-fft's: a :class:`PFFT` holds one serial transform object per group
of axes (``xfftn``, :class:`zcoll.fft.libfft.FFT`) and one global redistribution between
consecutive groups (``transfer``, :class:`zcoll.fft.pencil.Transfer`); ``forward`` and
``backward`` are :class:`Transform` objects that run them in turn and expose the arrays and
pencils at both ends. The pencils, and so every rank's ``local_slice()``, are mpi4py-fft's for
every argument combination.

What differs is underneath: every array of the plan lives in the node's shared arena and each
redistribution is a persistent :class:`~zcoll.fft.pencil.TransferPlan` between two of them --
one strided copy per element on a node -- made at construction. A call given arrays of its own
reads and writes them directly (mpi4py-fft copies them through the plan's arrays), and a field
with leading component axes (a vector or tensor :class:`~zcoll.fft.distarray.DistArray`) moves
all components through one transpose per stage.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from math import prod
from numbers import Number
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import _core
from .._arena import local_bytes
from .._collectives import _option_error
from .._context import Context, has_context, lookup
from .._pool import pool_for
from .._registry import AUTO
from .._settings import current, settings
from .._transport import allgather_bounded, barrier_bounded, wait_bounded
from ._mpi_runs import ColdCalls, MpiRuns
from .libfft import FFT, planned_arrays
from .pencil import Pencil, Subcomm, TransferPlan, arena_arrays, carve, carved_bytes, transfer_init

#: components="auto" fuses the components of a field while one stage's fused arrays on a rank
#: fit in this many times a core's L2: measured on a 2-core EPYC (L2 1 MiB), fused was 0.5-0.95x
#: the time of separate components up to 2.7-3.1 MB and 1.06-1.34x from 6.1 MB on.
FUSE_L2_MULTIPLE = 4
COMPONENT_MODES = (AUTO, "fused", "separate")

__all__ = ["PFFT", "Transform"]


class Transform:
    """One direction of a :class:`PFFT`: serial transforms with a redistribution between each.

    ``fft.forward`` and ``fft.backward`` are the two instances of a plan. Call one with an
    input array (else the plan's :attr:`input_array` is transformed) and optionally an output
    array (else the result is written to, and returned as, the plan's :attr:`output_array`,
    overwritten by the next call, as in mpi4py-fft).

    Parameters
    ----------
    xfftn : sequence
        The serial transform objects, in the order this direction runs them.
    transfer : sequence
        The redistributions between them (one fewer).
    pencil : sequence of Pencil
        Input and output pencil.
    """

    def __init__(self, xfftn, transfer, pencil, *, plan: PFFT | None = None, inverse=False):
        if len(xfftn) != len(transfer) + 1 or len(pencil) != 2:
            raise ValueError("a Transform needs one more serial transform than transfers")
        self._xfftn = tuple(xfftn)
        self._transfer = tuple(transfer)
        self._pencil = tuple(pencil)
        self._plan = plan
        self._inverse = inverse

    @property
    def input_array(self) -> np.ndarray:
        """The plan's input array (transformed when the call is given none)."""
        return self._xfftn[0].input_array

    @property
    def output_array(self) -> np.ndarray:
        """The plan's output array (the result when the call is given none)."""
        return self._xfftn[-1].output_array

    @property
    def input_pencil(self) -> Pencil:
        return self._pencil[0]

    @property
    def output_pencil(self) -> Pencil:
        return self._pencil[1]

    def __call__(self, input_array=None, output_array=None, **kw):
        """Collective: run the transform.

        Parameters
        ----------
        input_array : array_like, optional
            This rank's part: shape ``input_pencil.subshape``, or that shape after leading
            component axes (all components are transformed together). Not modified. Cast to
            the plan's dtype if it has another one.
        output_array : numpy.ndarray, optional
            Where to write the result (shape ``output_pencil.subshape``, after the same
            leading axes as the input).
        normalize : bool, optional
            Scale by 1/N (N the number of points transformed). Default: True forward, False
            backward, as in mpi4py-fft.

        Returns
        -------
        numpy.ndarray
            `output_array`, or the plan's output array.
        """
        plan = self._plan
        if plan is None:  # a Transform built by hand: mpi4py-fft's plain loop
            return self._call_parts(input_array, output_array, **kw)
        if input_array is None and output_array is None and not kw:
            return plan._run_own(self._inverse)
        return plan._run(self._inverse, input_array, output_array, kw)

    def _call_parts(self, input_array, output_array, **kw):
        if input_array is not None:
            self.input_array[...] = input_array
        for i, move in enumerate(self._transfer):
            self._xfftn[i](**kw)
            move(self._xfftn[i].output_array, self._xfftn[i + 1].input_array)
        self._xfftn[-1](**kw)
        if output_array is None:
            return self.output_array
        output_array[...] = self.output_array
        return output_array


@dataclass
class _Stage:
    """One group of axes: its serial transform, and the redistribution to the next group."""

    fft: FFT
    pencil_in: Pencil
    pencil_out: Pencil
    transfer: Any = None  # Transfer to the next stage (None for the last)
    moves: bool = False  # the transfer is over more than one rank (else the layout stays)
    plans: tuple[TransferPlan, TransferPlan] | None = None  # (forward, backward), made lazily
    # (forward, backward) through MPI, while the plan's calls are cold (ColdCalls)
    cold: tuple[Callable[[], None], Callable[[], None]] | None = None


@dataclass
class _Batch:
    """Arrays and transposes for fields with leading component axes of one shape."""

    lead: tuple[int, ...]
    inputs: list[np.ndarray] = field(default_factory=list)  # per stage, forward input layout
    outputs: list[np.ndarray] = field(default_factory=list)  # per stage, forward output layout
    plans: list[tuple[TransferPlan, TransferPlan] | None] = field(default_factory=list)


class PFFT:
    """Parallel FFT of a distributed array, mpi4py-fft's ``PFFT`` on zcoll's transposes.

    Collective over `comm`. Arguments and attributes are mpi4py-fft's; the pencils (every
    rank's ``local_slice()``) are the same as mpi4py-fft's for every combination of them.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm or Subcomm
        Intracommunicator, or a :class:`~zcoll.fft.pencil.Subcomm` giving the process grid.
    shape : sequence of int, optional
        Global shape of the input array (taken from `darray` when None).
    axes : None, int, sequence of int or sequence of sequences of int
        Axes to transform, the last first. A sequence of sequences groups axes transformed by
        one serial call (all but the last group may hold several axes).
    dtype : numpy dtype
        float32/float64/longdouble: real-to-complex (the last axis transformed shrinks to
        ``n // 2 + 1``); complex64/complex128/clongdouble: complex-to-complex.
    grid : sequence of int, optional
        Processes along each axis (padded with 1s; values <= 0 are wildcards). ``(-1,)``: slabs
        over axis 0. Default: every axis but those of the first group distributed.
    padding : False, number or sequence of numbers
        Padding factor per axis (the 3/2 rule: 1.5) for single-axis groups: the input array
        is ``floor(n * factor)`` long there; forward truncates, backward zero-pads.
    collapse : bool
        Transform all axes that are local on input with one serial call (mpi4py-fft's
        `collapse`; it changes the pencils, exactly as in mpi4py-fft).
    backend : {"fftw", "pyfftw", "numpy", "scipy", "mkl_fft"}
        Serial transform library (see :class:`zcoll.fft.libfft.FFT`). "fftw" is
        :mod:`zcoll.fft.fftw`, FFTW through pyFFTW.
    transforms : dict, optional
        Serial transforms per group of axes: ``{axes: (forward, backward)}``, e.g. real-to-real
        ``(functools.partial(zcoll.fft.fftw.dctn, type=3), ...)``.
    darray : DistArray, optional
        Take the shape, dtype and distribution from this array.
    order, copy : str
        Block order and stores of the transposes (as for :func:`zcoll.alltoall`).
    components : {"auto", "fused", "separate"}
        How ``forward``/``backward`` move a field with leading component axes (a vector or
        tensor field, ``newDistArray(..., rank=1)``): "fused" transforms all components in one
        serial call per stage and one transpose per stage (one node barrier per stage, not
        one per component); "separate" runs them one after another, so each component's
        data stays in the cores' caches from stage to stage; "auto" fuses while the fused
        arrays of a stage on one rank fit in ``FUSE_L2_MULTIPLE`` x a core's L2 cache (fused
        is up to 2x faster below, separate up to 1.3x faster above on the machine measured;
        see docs/performance.md).
    **kw
        Passed to the serial transforms (``threads``, ``planner_effort``, ...), except
        ``slab`` (deprecated in mpi4py-fft, accepted as there): True or an axis puts all
        ranks on one axis (True: the axis after the one transformed last, cyclically).

    Notes
    -----
    ``forward`` scales by 1/N and ``backward`` does not (``normalize=`` to change that).
    ``forward()``/``backward()`` with no arguments take a precomputed path (no argument
    checks). Calls are collective over `comm`, except for a plan with no transposes (every
    transformed axis local on every rank), which never communicates, as mpi4py-fft's: its
    argument errors are raised on the rank that made them only.
    :attr:`timings` accumulates seconds spent in serial transforms and in transposes.
    :meth:`destroy` (collective) frees the transposes and the sub-communicators.
    """

    def __init__(
        self,
        comm,
        shape: Sequence[int] | None = None,
        axes=None,
        dtype=float,
        grid: Sequence[int] | None = None,
        padding=False,
        collapse: bool = False,
        backend: str = "fftw",
        transforms: dict | None = None,
        darray=None,
        *,
        order: str = AUTO,
        copy: str = AUTO,
        components: str = AUTO,
        **kw,
    ) -> None:
        base = comm[0] if isinstance(comm, Subcomm) else comm
        if not isinstance(base, MPI.Comm):
            raise TypeError(
                f"zcoll.fft.PFFT: comm must be an mpi4py communicator or a Subcomm, got {comm!r}"
            )
        problem = None
        try:
            spec = _Spec.parse(comm, shape, axes, dtype, grid, padding, darray, order, copy, kw)
        except (TypeError, ValueError) as exc:
            spec, problem = None, exc
        if components not in COMPONENT_MODES and problem is None:
            problem = ValueError(f"components must be one of {COMPONENT_MODES}, got {components!r}")
        options = (
            transforms, backend, collapse, (order, copy, components), sorted(kw.items(), key=str)
        )  # fmt: skip
        pool = None if spec is None else _small_and_pooled(comm, spec)
        local = _agree_everywhere(comm, spec, problem, options, pool is not None)
        assert spec is not None
        self.axes = spec.axes
        self.collapse = collapse
        self.backend = backend
        self._order, self._copy = order, copy
        self.components = components
        self._lead_outputs: dict[tuple, np.ndarray] = {}
        self._fuse_choice: dict[tuple[int, ...], bool] = {}
        self.subcomm = _make_subcomm(comm, spec, darray)
        self._alloc_comm = _allocation_comm(comm, self.subcomm)
        # The pool from whose arena this rank makes the plan's arrays alone (_arrays), until
        # the cold calls end; None: every array is a collective arena allocation. Whether
        # some came from private memory instead is checked before plans run on them.
        self._local_pool = pool if local else None
        self._private_arrays = False
        try:
            self._build(spec, collapse, backend, transforms, kw)
        except Exception:
            if isinstance(self.subcomm, Subcomm) and not isinstance(comm, Subcomm):
                self.subcomm.destroy()
            raise
        self.timings = {"fft": 0.0, "transpose": 0.0}
        self._batches: dict[tuple[int, ...], _Batch] = {}
        self._planned = False  # the transposes' plans are made by the first call past cold
        self._error_context: Any = None
        self._agree_each_call = False
        self._own_steps: dict[bool, tuple] = {}
        self._cold = self._cold_calls()

    # -- construction -------------------------------------------------------------------------

    @property
    def _context(self) -> Context:
        """The grid communicator's context (made collectively on its first use)."""
        return lookup(self._alloc_comm)

    def _allocate(self, shape, dtype) -> np.ndarray:
        return self._arrays([(tuple(shape), dtype)])[0]

    def _arrays(self, specs) -> list[np.ndarray]:
        """Arrays of these (shape, dtype) specs, carved from one allocation: for a small plan
        until its calls end cold, this rank's own, with no communication (a plan made and run
        a few times makes no context and passes no barrier for them): in the arena of the
        node pool of the grid's communicator's context (made or to be derived), or private;
        else collective arena arrays (one node barrier, and the context made if need be)."""
        if self._local_pool is None:
            return arena_arrays(self._alloc_comm, specs)
        raw, pool = local_bytes(self._local_pool, carved_bytes(specs))
        self._private_arrays |= pool is None
        return carve(raw, specs)

    def _build(self, spec: _Spec, collapse: bool, backend: str, transforms, kw) -> None:
        axes = [list(group) for group in spec.axes]
        if collapse:
            axes = _collapsed(axes, self.subcomm)
        self.axes = tuple(tuple(group) for group in axes)
        shape, dtype = list(spec.shape), spec.dtype
        padding = spec.padding
        stages: list[_Stage] = []
        pencil = Pencil(self.subcomm, shape, self.axes[-1][-1], comm=self._alloc_comm)
        self._check_fits(pencil)
        arrays = self._stage_arrays(pencil, dtype, padding, backend, transforms)
        for i, group in enumerate(reversed(self.axes)):
            if i > 0:
                target = pencil.pencil(group[-1])
                self._check_fits(target)
                stages[-1].transfer = pencil.transfer(
                    target, dtype, order=self._order, copy=self._copy, staging=False
                )
                pencil = target
            allocator = self._allocate if arrays is None else _reusing(self._allocate, *arrays[i])
            xfftn = FFT(
                pencil.subshape, group, dtype, padding, backend=backend,
                transforms=transforms, allocator=allocator, prepare=False, **kw,
            )  # fmt: skip
            out = xfftn.forward.output_array
            after = pencil
            if out.shape[group[-1]] != shape[group[-1]] or out.dtype != dtype:
                shape[group[-1]] = out.shape[group[-1]]
                dtype = out.dtype
                after = Pencil(pencil.subcomm, shape, group[-1], comm=self._alloc_comm)
                self._check_fits(after)
            # mpi4py-fft's serial objects share U (forward in, backward out) and V.
            assert xfftn.backward.output_array is xfftn.forward.input_array
            assert xfftn.backward.input_array is xfftn.forward.output_array
            stages.append(_Stage(xfftn, pencil, after))
            pencil = after
        for here in stages[:-1]:
            assert here.transfer is not None
            here.moves = here.transfer.comm.size > 1
        self._stages = stages
        self._ends = {  # per direction: the stages in order, and its input/output arrays' specs
            inverse: (order, *(x.shape for x in ends), *(x.dtype for x in ends))
            for inverse, order in ((False, stages), (True, stages[::-1]))
            for ends in [(_side(order[0].fft, inverse, "input"),
                          _side(order[-1].fft, inverse, "output"))]
        }  # fmt: skip
        self._runs = self._local_runs(spec, transforms, backend, kw)
        # Plan each stage's serial transform now unless a transform over a run of stages
        # replaces it (then it is planned on its first run, if ever: FFTW's planner measures).
        replaced = {i for (d, a), (k, _) in self._runs.items() if d == "f" for i in range(a, k + 1)}
        for i, stage in enumerate(stages):
            if i not in replaced:
                stage.fft.prepare()
        self._scale_once = all(s.fft.scales for s in stages)
        self._total_scale = prod(s.fft.scale for s in stages)
        self.xfftn = [s.fft for s in stages]
        self.transfer = [s.transfer for s in stages[:-1]]
        self.pencil = [stages[0].pencil_in, stages[-1].pencil_out]
        self._input_shape = tuple(spec.shape)
        self._output_shape = tuple(shape)
        self.forward = Transform(
            [s.fft.forward for s in stages],
            [t.forward for t in self.transfer],
            self.pencil,
            plan=self,
        )
        self.backward = Transform(
            [s.fft.backward for s in reversed(stages)],
            [t.backward for t in reversed(self.transfer)],
            self.pencil[::-1],
            plan=self,
            inverse=True,
        )

    def _stage_arrays(
        self, pencil: Pencil, dtype, padding, backend: str, transforms
    ) -> list[list[np.ndarray]] | None:
        """Every stage's arrays, allocated together (one node barrier instead of one per
        array): per stage, those its serial transform will ask for, found by following the
        pencils as :meth:`_build` does. None where some stage's are not known in advance
        (custom transforms, 'mkl_fft', a rank without data): then each is allocated when
        asked for."""
        specs = self._stage_specs(pencil, dtype, padding, backend, transforms)
        if specs is None:
            return None
        flat = iter(self._arrays([spec for stage in specs for spec in stage]))
        return [[next(flat) for _ in stage] for stage in specs]

    def _stage_specs(self, pencil: Pencil, dtype, padding, backend: str, transforms):
        """Per stage, the (shape, dtype) of the arrays its serial transform will ask for (see
        :meth:`_stage_arrays`); None where they are not known in advance. The pencils made to
        follow the layout are dropped with their partners (a cycle each) before returning."""
        shape = list(pencil.shape)
        specs: list[list] = []
        made: list[Pencil] = []
        try:
            for i, group in enumerate(reversed(self.axes)):
                if i > 0:
                    pencil = pencil.pencil(group[-1])
                if pencil.too_small():  # the same on every rank: _build raises there
                    return None
                planned = planned_arrays(
                    pencil.subshape, group, dtype, padding, backend, transforms
                )
                if planned is None:
                    return None
                specs.append(planned)
                out_shape, out_dtype = planned[-1]
                if out_shape[group[-1]] != shape[group[-1]] or out_dtype != dtype:
                    shape[group[-1]] = out_shape[group[-1]]
                    dtype = out_dtype
                    pencil = Pencil(pencil.subcomm, shape, group[-1], comm=self._alloc_comm)
                    made.append(pencil)
            return specs
        finally:
            for p in made:
                p.forget_partners()

    def _cold_calls(self) -> ColdCalls | None:
        """The first calls' transposes through MPI, while the set-up they would need -- a
        context for some transpose's communicator, and the plans -- costs more than they do
        (ZCOLL_COLD_RUNS, else ``_core.cold_plan_runs``: ski rental, as for a Transfer,
        _mpi_runs). None when every transpose's communicator has a context already, or there
        is no transpose."""
        pairs = [(here, there) for here, there in zip(self._stages, self._stages[1:]) if here.moves]
        # Arrays of this rank's own stay with MPI until the contexts are known to share them.
        local = self._local_pool is not None
        if not pairs or (not local and all(has_context(h.transfer.comm) for h, _ in pairs)):
            return None
        limit = current("cold_runs").value
        if limit is None:
            # The same on every rank of the grid (the count decides when every rank makes the
            # contexts): the global arrays' bytes per grid rank, not this rank's share.
            size = self._alloc_comm.size
            moved = [prod(h.pencil_out.shape) * h.transfer.dtype.itemsize // size for h, _ in pairs]
            limit = _core.cold_plan_runs(moved)
        if limit == 0 and not local:
            return None
        for here, there in pairs:
            t = here.transfer
            a, b = here.fft.forward.output_array, there.fft.forward.input_array
            runs = MpiRuns(t.comm, t.dtype, t.shape, (t.subshapeA, t.subshapeB), (t.axisA, t.axisB))
            here.cold = (functools.partial(runs.exchange, a, b, 0, "zcoll.fft.PFFT"),
                         functools.partial(runs.exchange, b, a, 1, "zcoll.fft.PFFT"))  # fmt: skip
        return ColdCalls(self._alloc_comm, limit)

    def _local_runs(self, spec: _Spec, transforms, backend: str, kw) -> dict:
        """Serial transforms over runs of consecutive stages with no transpose between them
        (their redistribution is over one rank, as for the first two stages of a slab plan):
        one backend call over all their axes, from the run's first input to its last output,
        instead of one call per stage (FFTW's 2-D plans were up to 1.5x faster than two 1-D
        passes here). Keyed ("f", first stage) and ("b", last stage); the layouts, and every
        stage's own transform object, stay mpi4py-fft's."""
        stages = self._stages
        n = len(stages)
        runs: dict = {}
        if spec.padding is not False or transforms is not None or backend == "mkl_fft":
            return runs
        a = 0
        while a < n:
            k = a
            while k + 1 < n and not stages[k].moves:
                k += 1
            if k > a:
                U = stages[a].fft.forward.input_array
                V = stages[k].fft.forward.output_array
                axes = tuple(ax for g in self.axes[n - 1 - k : n - a] for ax in g)
                fft = FFT(U.shape, axes, U.dtype, False, backend=backend,
                          allocator=_reusing(self._allocate, U, V), **kw)  # fmt: skip
                if fft.scales and fft.forward.output_array.shape == V.shape:
                    runs[("f", a)] = (k, fft)
                    runs[("b", k)] = (a, fft)
            a = k + 1
        return runs

    def _check_fits(self, pencil: Pencil) -> None:
        if why := pencil.too_small():
            dims = tuple(c.size for c in self.subcomm)
            raise ValueError(f"zcoll.fft.PFFT: grid {dims} too large: {why}")

    # -- mpi4py-fft's query API ---------------------------------------------------------------

    def shape(self, forward_output: bool = True) -> tuple[int, ...]:
        """This rank's local shape of the output (spectral) or input (physical) array."""
        return self.pencil[1 if forward_output else 0].subshape

    def global_shape(self, forward_output: bool = False) -> tuple[int, ...]:
        """Global shape of the output (spectral) or input (physical) array."""
        return self._output_shape if forward_output else self._input_shape

    def local_slice(self, forward_output: bool = True) -> tuple[slice, ...]:
        """Where this rank's part lies in the global output (or input) array."""
        p = self.pencil[1 if forward_output else 0]
        return tuple(slice(s, s + n) for s, n in zip(p.substart, p.subshape))

    def dtype(self, forward_output: bool = False) -> np.dtype:
        """dtype of the output (spectral) or input (physical) array."""
        return (self.forward.output_array if forward_output else self.forward.input_array).dtype

    @property
    def dimensions(self) -> int:
        """The number of dimensions of the transformed arrays."""
        return len(self._input_shape)

    def explain(self) -> dict[str, object]:
        """Local: how the plan is laid out, and how its next call will run.

        Returns
        -------
        dict
            ``grid``, the processes along each axis; ``backend``; ``stages``, per group of
            axes in forward order, ``axes`` and this rank's ``input``/``output`` (shape,
            dtype); ``transposes``, per redistribution between stages in forward order,
            ``from_axis``, ``to_axis``, ``ranks`` and ``through``: "none" (over one rank: the
            layout stays), "MPI" (Ialltoallw of subarray datatypes: a cold call), "not yet
            planned" (zcoll's plans are made by the next call) or "zcoll" with ``plan``, the
            forward TransferPlan's :meth:`~zcoll.fft.TransferPlan.explain`; ``next_call``,
            "through MPI" (``cold_calls_left`` more calls, fewer where a call needs zcoll's
            set-up first; None: for good, some rank's arrays cannot take zcoll's plans),
            "zcoll" (unless that is found at the call) or "local" (no transpose); ``errors``,
            how a rank's bad arguments reach its peers in that call: "local" (nothing
            communicates), "the call's agreement over MPI" (cold), "the transposes' node
            context" (no synchronisation of its own), "one node barrier per call" or "one
            agreement across nodes per call" ("at the first call": decided by it).
        """
        cold = self._cold
        moving = [s for s in self._stages if s.moves]
        if not moving:
            next_call, errors = "local", "local"
        elif cold is not None and not (cold.calls >= cold.limit and not cold.forever):
            next_call, errors = "through MPI", "the call's agreement over MPI"
        else:
            next_call = "zcoll"
            errors = self._errors_route() if self._planned else "at the first call"
        groups = zip(reversed(self.axes), self._stages)
        explained: dict[str, object] = {
            "grid": tuple(c.Get_size() for c in self.pencil[0].subcomm),
            "backend": self.backend,
            "stages": [self._stage_explained(axes, s) for axes, s in groups],
            "transposes": [self._transpose_explained(s, next_call) for s in self._stages[:-1]],
            "next_call": next_call,
            "errors": errors,
        }
        if next_call == "through MPI":
            assert cold is not None
            explained["cold_calls_left"] = None if cold.forever else cold.limit - cold.calls
        return explained

    @staticmethod
    def _stage_explained(axes, stage: _Stage) -> dict[str, object]:
        forward = stage.fft.forward
        return {"axes": tuple(axes), "input": _spec(forward.input_array),
                "output": _spec(forward.output_array)}  # fmt: skip

    def _transpose_explained(self, stage: _Stage, next_call: str) -> dict[str, object]:
        t = stage.transfer
        entry: dict[str, object] = {"from_axis": t.axisA, "to_axis": t.axisB,
                                    "ranks": t.comm.Get_size()}  # fmt: skip
        if not stage.moves:
            entry["through"] = "none"
        elif next_call == "through MPI":
            entry["through"] = "MPI"
        elif stage.plans is None:
            entry["through"] = "not yet planned"
        else:
            entry["through"] = "zcoll"
            entry["plan"] = stage.plans[0].explain()
        return entry

    def _errors_route(self) -> str:
        """``explain()``'s errors once the transposes are planned (see :meth:`_agreement`)."""
        if self._error_context is None:
            return "local"
        if not self._agree_each_call:
            return "the transposes' node context"
        if self._context.multi_node:
            return "one agreement across nodes per call"
        return "one node barrier per call"

    # -- transforms --------------------------------------------------------------------------

    def _run_own(self, inverse: bool) -> np.ndarray:
        """``forward()``/``backward()``: the plan's own arrays, nothing to check; the steps
        (serial transforms bound to their arrays, transposes) are made on the first call."""
        if self._cold is not None and self._cold_call(inverse, None, False):
            stages = self._ends[inverse][0]
            return self._run_one(stages, inverse, None, None, not inverse)
        own = self._own_steps.get(inverse)
        if own is None:
            self._plan_transposes()
            own = self._own_steps[inverse] = self._bind_own(inverse)
        steps, out = own
        timings, clock = self.timings, time.perf_counter
        start = clock()
        for key, step in steps:
            step()
            now = clock()
            timings[key] += now - start
            start = now
        return out

    def _bind_own(self, inverse: bool) -> tuple[list[tuple[str, Callable[[], object]]], np.ndarray]:
        """The steps of :meth:`_run_own`, and the array it returns."""
        stages = self._stages[::-1] if inverse else self._stages
        steps: list[tuple[str, Callable[[], object]]] = []
        out = _side(stages[-1].fft, inverse, "output")
        if self._agree_each_call:
            raise_together = self._context.raise_together
            steps.append(
                ("transpose", functools.partial(raise_together, _call_name(inverse), None))
            )
        for step in self._route(stages, inverse, None, None):
            if not isinstance(step, tuple):  # a transpose
                steps.append(("transpose", step))
                continue
            fft, src, dst, scratch, last = step
            normalize, factor = self._scaling(not inverse, last)
            steps.append(("fft", fft.bind(src, dst, inverse, normalize, scratch, factor)))
        return steps, out

    def _plan_transposes(self) -> None:
        """Collective, at the first forward or backward call (every rank makes it): the
        persistent plans of the transposes, and where errors are agreed. A plan made and
        destroyed without a call has agreed on nothing beyond its arguments."""
        if self._planned:
            return
        for here, there in zip(self._stages, self._stages[1:]):
            if here.moves:
                a, b = here.fft.forward.output_array, there.fft.forward.input_array
                forward = here.transfer.forward_init(a, b)
                here.plans = (forward, here.transfer.inverse_init(forward, b, a, 1))
        self._error_context, self._agree_each_call = self._agreement()
        self._planned = True

    def _cold_call(self, inverse: bool, error: Exception | None, warm: bool) -> bool:
        """Collective while the calls are cold: whether this one's transposes go through MPI.

        One agreement: a rank's error raises the first failing rank's error on every rank; a
        call that needs zcoll's set-up (`warm`: fused components) ends the cold calls on every
        rank, and so does the rule's count (the same on every rank, so without agreeing)."""
        cold = self._cold
        assert cold is not None
        name = f"zcoll.{_call_name(inverse)}"
        if cold.calls >= cold.limit and self._warm_up(name):
            return False
        code = ColdCalls.ERROR if error is not None else ColdCalls.WARM if warm else ColdCalls.RUN
        code = cold.agree(code, name)
        if code == ColdCalls.ERROR:
            cold.raise_first(name, error)
        if code == ColdCalls.WARM and self._warm_up(name):
            return False
        cold.calls += 1
        return True

    def _warm_up(self, name: str) -> bool:
        """Collective: end the cold calls, making the contexts of the transposes'
        communicators (their plans come with the call, _plan_transposes). False on every rank,
        and the calls stay with MPI for good, where some rank's arrays lie elsewhere than in
        the arena of those contexts' node pool (arrays made before any context: _arrays)."""
        cold = self._cold
        assert cold is not None
        if cold.forever:
            return False
        contexts = [lookup(s.transfer.comm) for s in self._stages if s.moves]
        pool = self._local_pool
        shared = pool is None or (
            not self._private_arrays and all(ctx.pool is pool for ctx in contexts)
        )
        if cold.agree(ColdCalls.RUN if shared else ColdCalls.WARM, name) != ColdCalls.RUN:
            cold.forever = True
            return False
        self._cold = None
        self._local_pool = None  # arrays made from now on are the grid context's
        for stage in self._stages:
            stage.cold = None
        return True

    def _agreement(self) -> tuple[Any, bool]:
        """Where the ranks learn of one rank's bad arguments to forward/backward, and whether
        that costs a synchronisation of its own: (context, agree_each_call).

        - A plan with no transposes (every transformed axis local everywhere) never
          communicates, as mpi4py-fft's: its calls are local and so are their errors (None).
        - Where every transpose runs on one node context spanning all the plan's ranks (slab
          grids, one node), a rank's error is published there and its peers raise it at their
          first transpose: no synchronisation of its own.
        - Otherwise (pencil grids, several nodes) one node barrier, or one agreement across
          nodes, at the start of every call."""
        contexts = {id(p._ctx): p._ctx for s in self._stages for p in s.plans or ()}
        if not contexts:
            return None, False
        only = next(iter(contexts.values())) if len(contexts) == 1 else None
        if only is not None and only.size == self._context.size and not only.multi_node:
            return only, False
        return self._context, True

    def _run(self, inverse: bool, input_array, output_array, kw) -> np.ndarray:
        normalize = bool(kw.pop("normalize", not inverse))
        error: Exception | None = None
        if kw:
            error = TypeError(f"unexpected keyword argument(s) {sorted(kw)}")
        stages, src_shape, dst_shape, src_dtype, dst_dtype = self._ends[inverse]
        src, lead = None, ()  # type: tuple[np.ndarray | None, tuple[int, ...]]
        if error is None and input_array is not None:
            src, lead, error = _input(input_array, src_shape, src_dtype)
        if error is None:
            error = _output_problem(output_array, lead, dst_shape, dst_dtype)
        fuses = error is None and bool(lead) and self._fuses(lead)
        cold = self._cold is not None and self._cold_call(inverse, error, fuses)
        if not cold:
            self._warm_checks(inverse, error)
        if fuses and not cold:
            return self._run_batch(inverse, src, output_array, lead, normalize)
        if lead:
            out = output_array
            if out is None:
                out = self._lead_output(lead, inverse, dst_shape, dst_dtype)
            assert src is not None  # leading axes come from an input array
            for k in np.ndindex(*lead):
                self._run_one(stages, inverse, src[k], out[k], normalize)
            return out
        return self._run_one(stages, inverse, src, output_array, normalize)

    def _warm_checks(self, inverse: bool, error: Exception | None) -> None:
        """Collective where the call communicates: the transposes' plans made (the first call
        past cold), and every rank raises the first failing rank's error."""
        self._plan_transposes()
        name = _call_name(inverse)
        if error is not None and self._error_context is None:
            raise type(error)(f"zcoll.{name}: {error}")
        if error is not None:
            self._error_context.fail(name, error)
        if self._agree_each_call:
            self._context.raise_together(name, None)

    def _fuses(self, lead: tuple[int, ...]) -> bool:
        """Whether a field with leading axes `lead` goes through the fused path."""
        if self.components != AUTO:
            return self.components == "fused"
        fused = self._fuse_choice.get(lead)
        if fused is None:
            largest = max(s.fft.forward.input_array.nbytes + s.fft.forward.output_array.nbytes
                          for s in self._stages)  # fmt: skip
            fused = prod(lead) * largest <= FUSE_L2_MULTIPLE * settings().l2_bytes
            self._fuse_choice[lead] = fused
        return fused

    def _lead_output(self, lead, inverse: bool, shape, dtype) -> np.ndarray:
        """The plan's own output array for fields with leading axes `lead` (the result of a
        call given no output array, overwritten by the next such call)."""
        key = (lead, inverse)
        out = self._lead_outputs.get(key)
        if out is None:
            out = self._lead_outputs[key] = self._allocate(lead + tuple(shape), dtype)
        return out

    def _run_one(self, stages, inverse: bool, src, output_array, normalize: bool) -> np.ndarray:
        """One field (no leading axes) through every stage of this direction."""
        dst = output_array
        for step in self._route(stages, inverse, src, output_array):
            if not isinstance(step, tuple):  # a transpose
                self._timed("transpose", step)
            else:
                fft, src, dst, scratch, last = step
                self._serial(fft, src, dst, inverse, normalize, scratch, last)
        return dst

    def _route(self, stages, inverse: bool, src, output_array) -> Iterator:
        """The steps of one field through this direction, in order: a serial transform
        ``(fft, src, dst, scratch, last)`` (`scratch`: `src` may be destroyed) or a transpose
        (a TransferPlan, or while the calls are cold its run through MPI)."""
        # The plan's own input array may be destroyed (FFTW's complex-to-real transforms do,
        # as in mpi4py-fft, which plans them so); an array the caller passed never is.
        destroyable = src is None
        if src is None:
            src = _side(stages[0].fft, inverse, "input")
        last = len(stages) - 1
        i = 0
        while True:
            fft, j = stages[i].fft, i  # j: the stage (of this direction) whose output is written
            run = self._runs.get(("b", last - i) if inverse else ("f", i))
            if run is not None:
                fft, j = run[1], (last - run[0] if inverse else run[0])
            if j == last and output_array is not None:
                dst = output_array
            else:
                dst = _side(stages[j].fft, inverse, "output")
            yield fft, src, dst, i > 0 or destroyable, j == last
            if j == last:
                return
            link = stages[j + 1] if inverse else stages[j]  # the stage owning the transfer
            if not link.moves:
                # Over a communicator of one rank the layout does not change (mpi4py-fft
                # copies): the next stage reads this stage's output where it is.
                src = dst
            else:
                steps = link.cold if self._cold is not None else link.plans
                assert steps is not None  # plans: made by _plan_transposes
                yield steps[1 if inverse else 0]
                src = _side(stages[j + 1].fft, inverse, "input")
            i = j + 1

    def _run_batch(self, inverse: bool, src, output_array, lead, normalize) -> np.ndarray:
        """Fields with leading component axes: every stage transforms all components in one
        serial call, and every transpose moves all of them in one exchange."""
        batch = self._batch(lead)
        last = len(self._stages) - 1
        i, first = (last if inverse else 0), True  # i: the stage, by its forward index
        while True:
            fft, j = self._stages[i].fft, i  # j: the stage whose output is written
            run = self._runs.get(("b" if inverse else "f", i))
            if run is not None:
                fft, j = run[1], run[0]
            done = j == (0 if inverse else last)
            dst: np.ndarray = (batch.inputs if inverse else batch.outputs)[j]
            if done and output_array is not None:
                dst = output_array
            self._serial(fft, src, dst, inverse, normalize, not first, done)
            if done:
                return dst
            nxt = j - 1 if inverse else j + 1
            plans = batch.plans[nxt if inverse else j]
            if plans is None:
                src = dst  # the layout does not change over one rank (see _move)
            else:
                self._timed("transpose", plans[1 if inverse else 0])
                src = (batch.outputs if inverse else batch.inputs)[nxt]
            i, first = nxt, False

    def _batch(self, lead: tuple[int, ...]) -> _Batch:
        """The arrays and transposes for components of shape `lead` (collective, made on the
        first call that needs them)."""
        batch = self._batches.get(lead)
        if batch is not None:
            return batch
        batch = _Batch(lead)
        k = len(lead)
        for stage in self._stages:
            batch.inputs.append(self._allocate(lead + stage.fft.forward.input_array.shape,
                                               stage.fft.forward.input_array.dtype))  # fmt: skip
            batch.outputs.append(self._allocate(lead + stage.fft.forward.output_array.shape,
                                                stage.fft.forward.output_array.dtype))  # fmt: skip
        for i, stage in enumerate(self._stages[:-1]):
            if not stage.moves:
                batch.plans.append(None)
                continue
            t = stage.transfer
            a, b = batch.outputs[i], batch.inputs[i + 1]
            shape = lead + tuple(t.shape)
            batch.plans.append((
                transfer_init(t.comm, a, b, shape, t.axis_a + k, t.axis_b + k,
                              order=self._order, copy=self._copy),
                transfer_init(t.comm, b, a, shape, t.axis_b + k, t.axis_a + k,
                              order=self._order, copy=self._copy),
            ))  # fmt: skip
        batch.plans.append(None)
        self._batches[lead] = batch
        return batch

    def _serial(
        self, fft: FFT, src, dst, inverse: bool, normalize: bool, scratch: bool, last: bool
    ) -> None:
        """One serial transform; `scratch`: `src` is the plan's intermediate array, which the
        transform may destroy. Where every stage's backend takes a factor, the whole 1/N is
        applied by the last stage (one pass over the data instead of one per stage, as
        mpi4py-fft does)."""
        t0 = time.perf_counter()
        lead = src.ndim - fft.forward.input_array.ndim  # shapes were checked by _run
        scaled, factor = self._scaling(normalize, last)
        fft.run(src, dst, inverse, scaled, scratch, factor, lead)
        self.timings["fft"] += time.perf_counter() - t0

    def _scaling(self, normalize: bool, last: bool) -> tuple[bool, Any]:
        """(normalize, factor) for one serial transform (see :meth:`_serial`)."""
        if self._scale_once:
            return False, (self._total_scale if normalize and last else 1.0)
        return normalize, None

    def _timed(self, key: str, func, *args) -> None:
        t0 = time.perf_counter()
        func(*args)
        self.timings[key] += time.perf_counter() - t0

    def reset_timings(self) -> None:
        """Set :attr:`timings` back to zero."""
        self.timings = dict.fromkeys(self.timings, 0.0)

    def destroy(self) -> None:
        """Collective: free the transposes and the sub-communicators (as mpi4py-fft, also a
        Subcomm passed as `comm`)."""
        for stage in self._stages:
            for plan in stage.plans or ():
                plan.free()
        for batch in self._batches.values():
            for plans in batch.plans:
                for plan in plans or ():
                    plan.free()
        self._batches.clear()
        for t in self.transfer:
            t.destroy()
        if isinstance(self.subcomm, Subcomm):
            self.subcomm.destroy()
        self._break_cycles()

    def _break_cycles(self) -> None:
        """Drop the references that make the plan's objects a cycle (the transforms' back
        references, the serial transforms' to themselves, pencils to their partners), so that
        the plan, its arrays and their arena memory go with the last reference from outside
        -- the next plan of a loop reuses that memory -- not at a garbage collection."""
        self.forward._plan = self.backward._plan = None
        self._own_steps.clear()
        ffts = [s.fft for s in self._stages] + [fft for _, fft in self._runs.values()]
        for fft in {id(f): f for f in ffts}.values():
            fft.release()
        for stage in self._stages:
            stage.cold = None
            for pencil in (stage.pencil_in, stage.pencil_out):
                pencil.forget_partners()


def _spec(a: np.ndarray) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of `a`, as ``explain()`` gives an array."""
    return tuple(a.shape), a.dtype.name


def _call_name(inverse: bool) -> str:
    """The name errors of a forward or backward call give."""
    return "fft.backward" if inverse else "fft.forward"


def _side(fft: FFT, inverse: bool, end: str) -> np.ndarray:
    """The `end` ("input"/"output") array of `fft` in the direction run."""
    obj = fft.backward if inverse else fft.forward
    return obj.input_array if end == "input" else obj.output_array


def _input(a, shape, dtype) -> tuple[np.ndarray | None, tuple[int, ...], Exception | None]:
    """This rank's input as an array of `dtype`, its leading component shape, and what is
    wrong with it (None when nothing)."""
    a = np.asarray(a)
    k = a.ndim - len(shape)
    if k < 0 or a.shape[k:] != tuple(shape):
        return (
            None,
            (),
            ValueError(
                f"input_array has shape {a.shape}; this rank's part has shape {tuple(shape)} "
                "(after any leading component axes)"
            ),
        )
    if a.dtype != dtype:
        if not np.can_cast(a.dtype, dtype, "same_kind"):
            return None, (), TypeError(f"input_array has dtype {a.dtype}, the plan {dtype}")
        a = a.astype(dtype)
    return a, tuple(a.shape[:k]), None


def _output_problem(out, lead, shape, dtype) -> Exception | None:
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        return TypeError("output_array must be a numpy.ndarray")
    expected = tuple(lead) + tuple(shape)
    if out.shape != expected or out.dtype != dtype:
        return ValueError(
            f"output_array has shape {out.shape} and dtype {out.dtype}; expected {expected} "
            f"and {dtype}"
        )
    if not out.flags.writeable:
        return ValueError("output_array is read-only")
    return None


@dataclass
class _Spec:
    """The plan's arguments, checked and normalised (mpi4py-fft's rules, errors not asserts)."""

    shape: tuple[int, ...]
    axes: tuple[tuple[int, ...], ...]
    dtype: np.dtype
    dims: list[int] | None  # grid as Subcomm dims; None: from comm / darray
    padding: Any

    @classmethod
    def parse(cls, comm, shape, axes, dtype, grid, padding, darray, order, copy, kw) -> _Spec:
        slab = kw.pop("slab", False)  # mpi4py-fft's deprecated keyword, not the backend's
        if shape is None:
            if darray is None:
                raise ValueError("shape is required unless darray is given")
            shape = darray.pencil.shape
        try:
            shape = tuple(operator.index(n) for n in shape)
        except TypeError:
            raise TypeError(f"shape must be a sequence of ints, got {shape!r}") from None
        ndim = len(shape)
        if ndim < 1 or min(shape) < 1:
            raise ValueError(f"shape must have positive lengths, got {shape}")
        groups = _axis_groups(axes, ndim, darray)
        if darray is not None:
            dt = np.dtype(darray.dtype)
        else:
            dt = np.dtype(dtype)
            if dt.char not in "fdgFDG":
                raise TypeError(
                    f"dtype must be float32, float64, longdouble or their complex types, got {dt}"
                )
        shape, padding = _padded(shape, groups, padding)
        dims = None
        if (
            slab is not False
            and slab is not None
            and (grid is not None or isinstance(comm, Subcomm))
        ):
            raise ValueError("slab= (deprecated) cannot be combined with grid= or a Subcomm")
        if darray is None and grid is not None:
            if isinstance(comm, Subcomm):
                raise ValueError("grid cannot be combined with a Subcomm as comm")
            grid = tuple(int(g) for g in grid)
            if len(grid) > ndim:
                raise ValueError(f"grid {grid} has more entries than the {ndim} axes")
            dims = [max(0, g) for g in grid] + [1] * (ndim - len(grid))
        elif darray is None and not isinstance(comm, Subcomm):
            dims = _default_dims(ndim, groups, slab, comm.Get_size())
        if isinstance(comm, Subcomm) and darray is None:
            if len(comm) != ndim:
                raise ValueError(f"the Subcomm has {len(comm)} communicators for {ndim} axes")
            if any(comm[ax].Get_size() != 1 for ax in groups[-1]):
                raise ValueError(f"the Subcomm distributes axes {groups[-1]}, transformed first")
        if darray is not None and any(darray.commsizes[ax] != 1 for ax in groups[-1]):
            raise ValueError("set axes so that the axes transformed first are aligned in darray")
        if dims is not None:
            fixed = [d for d in dims if d > 0]
            size = comm.Get_size()
            if size % prod(fixed) or (0 not in dims and prod(fixed) != size):
                raise ValueError(f"a process grid {tuple(dims)} does not fit {size} ranks")
        if dims is not None and (spread := [ax for ax in groups[-1] if dims[ax] > 1]):
            raise ValueError(
                f"the grid {tuple(dims)} distributes axis {spread[0]}, which is transformed first"
            )
        if err := _option_error(order, copy):
            raise err
        return cls(shape, groups, dt, dims, padding)

    def summary(self) -> tuple:
        return (self.shape, self.axes, str(self.dtype), self.dims, repr(self.padding))


def _default_dims(ndim: int, groups, slab, size: int) -> list[int]:
    """mpi4py-fft's grid without grid=: wildcards except the axes transformed first, or with
    the deprecated slab= all ranks on one axis (True: the one after the last transformed)."""
    if slab is False or slab is None:
        dims = [0] * ndim
        for ax in groups[-1]:
            dims[ax] = 1
        return dims
    if slab is True:
        axis = (groups[-1][-1] + 1) % ndim
    else:
        try:
            axis = operator.index(slab)
        except TypeError:
            raise TypeError(f"slab must be a bool or an axis, got {slab!r}") from None
        if not -ndim <= axis < ndim:
            raise ValueError(f"slab axis {slab} does not fit {ndim} dimensions")
        axis %= ndim
    dims = [1] * ndim
    dims[axis] = size
    return dims


def _axis_groups(axes, ndim: int, darray) -> tuple[tuple[int, ...], ...]:
    """mpi4py-fft's `axes` forms as a tuple of groups of non-negative axes."""
    if axes is None:
        order = list(range(ndim))
        if darray is not None:  # the aligned axis of darray is transformed first
            order = [int(a) for a in np.roll(order, ndim - 1 - darray.alignment)]
        raw: list = order
    elif isinstance(axes, (int, np.integer)):
        raw = [int(axes)]
    else:
        raw = list(axes)
    if not raw:
        raise ValueError("axes must name at least one axis")
    groups = []
    for item in raw:
        group = [item] if isinstance(item, (int, np.integer)) else list(item)
        if not group or not all(isinstance(a, (int, np.integer)) for a in group):
            raise ValueError(f"axes {axes!r}: each entry must be an int or a sequence of ints")
        if any(not -ndim <= a < ndim for a in group):
            raise ValueError(f"axes {axes!r} do not fit {ndim} dimensions")
        normalized = tuple(int(a) % ndim for a in group)
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"axes {axes!r} repeat an axis")
        groups.append(normalized)
    flat = [a for group in groups for a in group]
    if len(set(flat)) != len(flat):
        raise ValueError(f"axes {axes!r} transform an axis twice")
    return tuple(groups)


def _reusing(allocate, *arrays):
    """An allocator that hands out `arrays` (each once, to the first request of its shape and
    dtype) before it allocates."""
    pool = list(arrays)

    def allocator(shape, dtype) -> np.ndarray:
        for k, a in enumerate(pool):
            if a.shape == tuple(shape) and a.dtype == np.dtype(dtype):
                return pool.pop(k)
        return allocate(shape, dtype)

    return allocator


def _padded(shape, groups, padding):
    """mpi4py-fft's padding: single-axis groups with a factor > 1 get floor(n * factor)
    points; returns the new shape and the exact factors (a list), or False."""
    if padding is False or padding is None:
        return shape, False
    if isinstance(padding, Number) and not isinstance(padding, bool):
        factors = [float(padding)] * len(shape)  # type: ignore[arg-type]
    else:
        try:
            factors = [float(p) for p in padding]
        except TypeError:
            raise TypeError(
                f"padding must be False, a number or a sequence, got {padding!r}"
            ) from None
    if len(factors) != len(shape):
        raise ValueError(f"padding has {len(factors)} factors for {len(shape)} axes")
    if min(factors) <= 0:
        raise ValueError(f"padding factors must be positive, got {factors}")
    shape = list(shape)
    for group in groups:
        ax = group[0]
        if len(group) == 1 and factors[ax] > 1.0 + 1e-6:
            old = float(shape[ax])
            shape[ax] = int(np.floor(shape[ax] * factors[ax]))
            factors[ax] = shape[ax] / old
    return tuple(shape), factors


def _collapsed(axes: list[list[int]], subcomm) -> list[list[int]]:
    """mpi4py-fft's collapse: every group local on input joins the first-transformed one."""
    groups: list[list[int]] = [[]]
    for group in reversed(axes):
        if all(subcomm[a].Get_size() == 1 for a in group):
            for a in reversed(group):
                groups[0].insert(0, a)
        else:
            groups.insert(0, group)
    return groups


def _make_subcomm(comm, spec: _Spec, darray):
    if darray is not None:
        return darray.subcomm[len(darray.subcomm) - len(spec.shape) :]
    if isinstance(comm, Subcomm):
        return comm
    assert spec.dims is not None
    # Collective: after the bounded agreement, before Create_cart and Sub, which block.
    barrier_bounded(comm, "zcoll.fft.PFFT (making its Subcomm)")
    return Subcomm(comm, spec.dims)


def _allocation_comm(comm, subcomm) -> MPI.Comm:
    """A communicator over the whole grid for the plan's arena arrays."""
    if isinstance(comm, MPI.Comm):
        return comm
    grid = getattr(subcomm, "comm", None)
    if isinstance(grid, MPI.Comm) and grid != MPI.COMM_NULL:
        return grid
    raise ValueError("zcoll.fft.PFFT: this Subcomm does not know the communicator of its grid")


def _small_and_pooled(comm, spec: _Spec) -> Any:
    """Local: the node pool from which this rank could make the plan's arrays alone
    (PFFT._arrays), or None: where a bound of their bytes per rank, the same on every rank,
    is at most ``_core.cold_array_bytes``, the pool of the context of `comm` (the grid's
    communicator), or of the context it would be derived from."""
    world = comm if isinstance(comm, MPI.Comm) else getattr(comm, "comm", None)
    if not isinstance(world, MPI.Comm):
        return None
    spectral = np.result_type(spec.dtype, np.complex64).itemsize
    padded = prod(max(1.0, f) for f in spec.padding) if spec.padding else 1.0
    bound = prod(spec.shape) * padded * spectral * (len(spec.axes) + 1) / world.size
    if bound > _core.cold_array_bytes:
        return None
    return lookup(world).pool if has_context(world) else pool_for(world, settings())


def _agree_everywhere(comm, spec, problem, options, local: bool) -> bool:
    """Raise the first rank's argument error on every rank, or an error if ranks disagree;
    else return whether every rank's `local` is True (_small_and_pooled).

    One Iallreduce(MAX) of [error flag, digest, -digest, -local], its wait bounded, settles the
    common case (no rank has an error and every rank's arguments hash alike: the maximum digest
    equals the minimum); only then does every rank see every rank's arguments, to name the
    first culprit."""
    world = comm if isinstance(comm, MPI.Comm) else getattr(comm, "comm", comm[0])
    transforms, backend, collapse, exchange, keywords = options
    keys = None if transforms is None else sorted(map(repr, transforms))
    keywords = [(k, repr(v)) for k, v in keywords]
    mine = None if spec is None else (spec.summary(), keys, backend, bool(collapse), exchange,
                                      keywords)  # fmt: skip
    err = None if problem is None else (type(problem).__name__, str(problem))
    digest = int.from_bytes(hashlib.blake2b(repr(mine).encode(), digest_size=7).digest(), "little")
    summary = np.array([err is not None, digest, -digest, -int(local)], dtype=np.int64)
    what = "zcoll.fft.PFFT (agreeing on the plan)"
    wait_bounded(world.Iallreduce(MPI.IN_PLACE, summary, op=MPI.MAX), world.rank, what, (summary,))
    if summary[0] == 0 and summary[1] == -summary[2]:
        return bool(summary[3] == -1)
    everyone = allgather_bounded(world, (mine, err), what)
    for rank, (_, e) in enumerate(everyone):
        if e:
            cls = TypeError if e[0] == "TypeError" else ValueError
            raise cls(f"[rank {rank}] zcoll.fft.PFFT: {e[1]}")
    for rank, (args, _) in enumerate(everyone):
        if args != everyone[0][0]:
            raise ValueError(
                "zcoll.fft.PFFT: ranks disagree on the plan: rank 0 has (shape, axes, dtype, "
                "grid, padding), transforms, backend, collapse, (order, copy), keywords = "
                f"{everyone[0][0]}, "
                f"rank {rank} "
                f"has {args}"
            )
    return False  # not reached: equal arguments hash alike
