"""``fft``: ``zcoll.fft.PFFT`` against ``mpi4py_fft.PFFT`` for cubic 3D transforms.

mpi4py-fft is optional (``pip install ".[bench]"``): without it zcoll is timed alone, and the
report says why.
"""

from __future__ import annotations

import argparse
import gc
import math
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np
from mpi4py import MPI

from .common import (
    Reporter,
    all_ok,
    command_line,
    common_metadata,
    geomean,
    mpi_library,
    node_layout,
    now_iso,
    ratio,
    times,
    where,
)
from .output import write_outputs

__all__ = ["FFT_FIELDS", "fft_grid_dims", "parse_fft_sizes", "parse_grid", "run_fft"]

FFT_DTYPES = ("complex128", "float64", "complex64", "float32")
FFT_SIZES = (32, 64, 128)  # default cube edges
FFT_MIN_ITERATIONS = 3  # the time budget never cuts a measurement below this ...
FFT_MAX_ITERATIONS = 1000  # ... nor lets it grow above this
FFT_ITERATIONS = 10  # with --time-budget 0 and no --iterations
FFT_TIME_BUDGET = 1.0  # default seconds per case, over all its rounds
FFT_ROUNDS = 5  # default alternating rounds (medians reported)
ZCOLL_FFT, MPI4PY_FFT = "zcoll", "mpi4py-fft"
#: --rank 1: zcoll with components="fused" / "separate" (the main zcoll row is "auto")
ZCOLL_MODES = {"fused": "zcoll-fused", "separate": "zcoll-separate"}
#: --check: largest relative 2-norm difference accepted, by the precision of the dtype
FFT_TOLERANCE = {"double": 1e-10, "single": 1e-5}


class FFTTimes(TypedDict):
    """What :func:`time_fft` measures: seconds per pair (``fft`` / ``transpose`` None when
    unknown) and the loop's counts."""

    total: float
    fft: float | None
    transpose: float | None
    iterations: int
    warmup: int
    rounds: int


FFT_FIELDS = (
    "benchmark",
    "P",
    "N",
    "dtype",
    "rank",
    "grid",
    "method",
    "backend",
    "arrays",
    "total_ms",
    "fft_ms",
    "transpose_ms",
    "iterations",
    "warmup",
    "rounds",
)


def parse_fft_sizes(text: str) -> list[int]:
    """Parse a comma-separated list of cube edges (``"64,128,256"``), sorted, duplicates removed."""
    try:
        sizes = sorted({int(item) for item in text.split(",") if item.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"--sizes needs positive integers, got {text!r}")
    return sizes


def parse_grid(text: str) -> tuple[int, ...] | None:
    """Parse ``--grid``: ``none`` (the library default), ``slab``, ``pencil`` or ``AxB[xC]``.

    Returns the `grid` argument both PFFTs get: None, ``(-1,)`` (slabs over axis 0),
    ``(0, 0)`` (pencils: axes 0 and 1 distributed, ``MPI.Compute_dims`` picks the sizes) or
    the given process counts (0 or negative: chosen by ``MPI.Compute_dims``).
    """
    word = text.strip().lower()
    if word in ("none", "default"):
        return None
    if word == "slab":
        return (-1,)
    if word == "pencil":
        return (0, 0)
    try:
        grid = tuple(int(item) for item in word.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a grid: {text!r} (none, slab, pencil, or process counts such as 2x1 or 2x2x1)"
        ) from None
    if len(grid) > 3:
        raise argparse.ArgumentTypeError(f"a grid for a 3D transform has at most 3 axes: {text!r}")
    return grid


def fft_grid_dims(nranks: int, grid: tuple[int, ...] | None) -> tuple[int, ...]:
    """The process grid both libraries build for a 3D transform over all axes.

    Raises
    ------
    ValueError
        If `grid` distributes axis 2 (transformed first, so it must be whole) or does not fit
        `nranks`.
    """
    dims = [0, 0, 1] if grid is None else [max(0, g) for g in grid] + [1] * (3 - len(grid))
    if dims[2] != 1:
        raise ValueError(f"grid {grid} distributes axis 2, which must be whole (use e.g. 2x1)")
    fixed = math.prod(d for d in dims if d > 0)
    if nranks % fixed or (0 not in dims and fixed != nranks):
        raise ValueError(f"grid {grid} does not fit {nranks} ranks")
    return tuple(MPI.Compute_dims(nranks, dims))


def grid_label(dims) -> str:
    """``"2x2x1 (pencils)"``, ``"4x1x1 (slabs)"`` or ``"1x1x1 (serial)"``."""
    kind = {0: "serial", 1: "slabs"}.get(sum(d > 1 for d in dims), "pencils")
    return f"{'x'.join(map(str, dims))} ({kind})"


def fft_field(local_slice, n: int, dtype) -> np.ndarray:
    """This rank's part of a test input: a smooth sin/cos field plus seeded noise.

    The noise of each plane ``i`` of axis 0 comes from ``default_rng([2024, i])``, so the global
    field is the same for any number of ranks and any decomposition.
    """
    dtype = np.dtype(dtype)
    x, y, z = (2 * np.pi / n * np.arange(s.start, s.stop) for s in local_slice)
    smooth = np.sin(x)[:, None, None] * np.cos(2 * y)[None, :, None] + np.cos(3 * z)[None, None, :]
    field = np.empty(smooth.shape, dtype)
    for k, i in enumerate(range(local_slice[0].start, local_slice[0].stop)):
        rng = np.random.default_rng([2024, i])
        noise = rng.standard_normal((n, n))[local_slice[1:]]
        if dtype.kind == "c":
            noise = noise + 1j * rng.standard_normal((n, n))[local_slice[1:]]
        field[k] = smooth[k] + 0.1 * noise
    return field


class _Timed:
    """A callable that adds the seconds each call of `fn` takes to ``timings[key]``.

    Every other attribute is `fn`'s, so it can stand in for mpi4py-fft's serial FFT objects
    (whose ``input_array`` / ``output_array`` its ``Transform`` reads) and Transfer methods.
    """

    def __init__(self, fn, timings: dict[str, float], key: str) -> None:
        self._fn, self._timings, self._key = fn, timings, key

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._fn(*args, **kwargs)
        finally:
            self._timings[self._key] += time.perf_counter() - start

    def __getattr__(self, name):
        return getattr(self._fn, name)


class _FFTCase:
    """A plan with its arrays; a pair is forward then backward (explicit arrays, or the
    plan's own ones where `explicit` is False).

    A vector field (``rank=1``: ``u`` and ``u_hat`` with a leading axis of 3 components) goes
    through one call per direction where `whole`, else one call per component (mpi4py-fft's
    only way: its transforms take scalar fields)."""

    explicit = True
    whole = False
    plan: Any  # zcoll.fft.PFFT or mpi4py_fft.PFFT
    u: np.ndarray
    u_hat: np.ndarray

    def forward(self) -> np.ndarray:
        if not self.explicit:
            return self.plan.forward()
        if self.whole or self.u.ndim == 3:
            return self.plan.forward(self.u, self.u_hat)
        for u, u_hat in zip(self.u, self.u_hat):
            self.plan.forward(u, u_hat)
        return self.u_hat

    def backward(self) -> None:
        if not self.explicit:
            self.plan.backward()
        elif self.whole or self.u.ndim == 3:
            self.plan.backward(self.u_hat, self.u)
        else:
            for u, u_hat in zip(self.u, self.u_hat):
                self.plan.backward(u_hat, u)

    def pair(self) -> None:
        self.forward()
        self.backward()

    def output_slice(self) -> tuple[slice, ...]:
        return self.plan.local_slice(True)

    def destroy(self) -> None:
        self.plan.destroy()


class ZcollFFTCase(_FFTCase):
    """A ``zcoll.fft.PFFT`` plan with arena arrays ``u`` (physical) and ``u_hat`` (spectral).

    One pair is ``forward(u, u_hat)`` then ``backward(u_hat, u)``: the caller's arrays, no
    allocation; for a vector field (`rank` 1) all components in one call, which the plan runs
    as its `components` mode says (fused, separate, or auto). The split comes from the plan's
    own ``timings``.
    """

    whole = True

    def __init__(self, comm, n: int, dtype, grid, backend: str, rank=0, components="auto") -> None:
        from zcoll.fft import PFFT, newDistArray

        self.backend, self.arrays = backend, "explicit"
        self.method = ZCOLL_MODES.get(components, ZCOLL_FFT)
        self.plan = PFFT(
            comm, (n, n, n), dtype=dtype, grid=grid, backend=backend, components=components
        )
        self.u = newDistArray(self.plan, forward_output=False, rank=rank)
        self.u[...] = fft_field(self.plan.local_slice(False), n, dtype)
        self.u_hat = newDistArray(self.plan, forward_output=True, rank=rank)

    @property
    def timings(self) -> dict[str, float]:
        return self.plan.timings

    def reset_timings(self) -> None:
        self.plan.reset_timings()


class Mpi4pyFFTCase(_FFTCase):
    """An ``mpi4py_fft.PFFT`` plan, timed the same way, with its transposes timed separately.

    ``arrays="internal"``: one pair is ``forward()`` then ``backward()`` on the plan's own
    arrays (no copies: mpi4py-fft's fastest use). ``"explicit"``: ``forward(u, u_hat)`` then
    ``backward(u_hat, u)`` with the caller's arrays, as zcoll is called, which adds the copies
    mpi4py-fft makes into its input and out of its output array.

    The split: the plan's ``forward`` / ``backward`` (``mpi4py_fft.mpifft.Transform``) call
    their serial FFT objects (``_xfftn``) and redistributions (``_transfer``, the bound
    ``forward``/``backward`` methods of ``plan.transfer``, each one ``MPI_Alltoallw`` with
    subarray datatypes) in sequence; each is wrapped in a :class:`_Timed`, which measures the
    calls made inside the timed loop itself, as zcoll's own ``timings`` do. If a version of
    mpi4py-fft lacks these attributes, the split is reported as unknown.
    """

    method = MPI4PY_FFT

    def __init__(self, comm, n: int, dtype, grid, backend: str, arrays: str, rank=0) -> None:
        import mpi4py_fft

        self.backend, self.arrays = backend, arrays
        self.explicit = arrays != "internal"
        self.plan = mpi4py_fft.PFFT(comm, (n, n, n), dtype=dtype, grid=grid, backend=backend)
        self.timings = {"fft": 0.0, "transpose": 0.0}
        transforms = (self.plan.forward, self.plan.backward)
        self.split = all(hasattr(t, "_xfftn") and hasattr(t, "_transfer") for t in transforms)
        if self.split:
            for t in transforms:
                t._xfftn = tuple(_Timed(f, self.timings, "fft") for f in t._xfftn)
                t._transfer = tuple(_Timed(f, self.timings, "transpose") for f in t._transfer)
        lead = (3,) * rank
        if arrays == "internal" and not rank:
            self.u, self.u_hat = self.plan.forward.input_array, self.plan.forward.output_array
        else:  # a vector field always goes through the caller's arrays, a component at a time
            self.explicit, self.arrays = True, "explicit"
            self.u = np.zeros((*lead, *self.plan.shape(False)), dtype)
            self.u_hat = np.zeros(
                (*lead, *self.plan.shape(True)), self.plan.forward.output_array.dtype
            )
        self.u[...] = fft_field(self.plan.local_slice(False), n, dtype)

    def reset_timings(self) -> None:
        self.timings.update(dict.fromkeys(self.timings, 0.0))


def _relative_difference(comm, mine: np.ndarray, mine_slice, ref: np.ndarray, ref_slice) -> float:
    """Collective: ``||mine - ref|| / ||ref||`` over the global arrays (2-norms), on every rank.

    Compares locally when every rank holds the same part of both; otherwise gathers both
    global arrays on rank 0.
    """
    same = mine_slice == ref_slice and mine.shape == ref.shape
    if comm.allreduce(same, op=MPI.LAND):
        diff = mine.astype(np.complex128) - ref
        sums = np.array([np.vdot(diff, diff).real, np.vdot(ref, ref).real])
        comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
    else:
        parts = comm.gather((mine_slice, mine, ref_slice, ref), root=0)
        sums = np.zeros(2)
        if comm.rank == 0:
            shape = tuple(max(s.stop for s in axis) for axis in zip(*(p[0] for p in parts)))
            shape = mine.shape[: mine.ndim - len(shape)] + shape  # leading component axes
            a, b = np.zeros(shape, np.complex128), np.zeros(shape, np.complex128)
            for a_slice, a_part, b_slice, b_part in parts:
                a[(Ellipsis,) + tuple(a_slice)] = a_part
                b[(Ellipsis,) + tuple(b_slice)] = b_part
            sums[:] = np.vdot(a - b, a - b).real, np.vdot(b, b).real
        comm.Bcast(sums, root=0)
    return math.sqrt(sums[0] / sums[1]) if sums[1] > 0 else math.sqrt(sums[0])


def check_fft(comm, zc: ZcollFFTCase, mc: Mpi4pyFFTCase | None, dtype) -> list[str]:
    """Compare zcoll's forward result with mpi4py-fft's, and zcoll's round trip with its input.

    Collective; returns the same list of failures (empty if all is well) on every rank.
    """
    single = np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.complex64))
    tolerance = FFT_TOLERANCE["single" if single else "double"]
    failures = []
    if mc is not None:
        z, m = zc.forward(), mc.forward()
        error = _relative_difference(comm, z, zc.output_slice(), m, mc.output_slice())
        if not error <= tolerance:
            failures.append(f"forward differs from mpi4py-fft's by {error:.2e} (relative)")
    before = np.array(zc.u)
    zc.pair()
    error = _relative_difference(comm, zc.u, (), before, ())
    if not error <= tolerance:
        failures.append(f"backward(forward(u)) differs from u by {error:.2e} (relative)")
    return failures


def _iterations(comm, case, args) -> int:
    """Run ``--warmup`` untimed pairs of `case`; return the pairs per timed loop: ``--iterations``,
    else ``--time-budget`` split over the rounds / the cost of one pilot pair (timed after a
    barrier), between FFT_MIN_ITERATIONS and FFT_MAX_ITERATIONS. Collective."""
    for _ in range(_warmup(args)):
        case.pair()
    if args.iterations is not None:
        return args.iterations
    if args.time_budget <= 0:
        return FFT_ITERATIONS
    comm.Barrier()
    start = MPI.Wtime()
    case.pair()
    pilot = comm.allreduce(MPI.Wtime() - start, op=MPI.MAX)
    budget = args.time_budget / _rounds(args)
    affordable = round(budget / pilot) if pilot > 0 else FFT_MAX_ITERATIONS
    return min(FFT_MAX_ITERATIONS, max(FFT_MIN_ITERATIONS, affordable))


def _warmup(args) -> int:
    return 1 if args.warmup is None else args.warmup


def _rounds(args) -> int:
    return getattr(args, "rounds", None) or FFT_ROUNDS


def _timed_loop(comm, case, iterations: int) -> np.ndarray:
    """Seconds per pair of one timed loop: [total, fft, transpose], each the largest over the
    ranks of that rank's mean. Collective."""
    case.reset_timings()
    comm.Barrier()
    start = MPI.Wtime()
    for _ in range(iterations):
        case.pair()
    elapsed = MPI.Wtime() - start
    per_pair = np.array([elapsed, case.timings["fft"], case.timings["transpose"]]) / iterations
    comm.Allreduce(MPI.IN_PLACE, per_pair, op=MPI.MAX)
    return per_pair


def time_fft(comm, cases: Sequence[Any], args) -> list[FFTTimes]:
    """Time forward+backward pairs of each of `cases` in alternating rounds.

    Each case gets its warm-up and loop length (:func:`_iterations`); then ``--rounds``
    rounds each time one loop of every case, the order of the cases reversed every other
    round, so slow drifts of the machine (other load, clock) fall on all of them alike.
    Collective over `comm`.

    Returns
    -------
    list of dict
        Per case: ``total``, ``fft``, ``transpose``: the median over the rounds of the seconds
        per pair (each the largest over the ranks of that rank's mean; ``fft``/``transpose``
        None when unknown); ``iterations`` (per round); ``warmup``; ``rounds``.
    """
    counts = [_iterations(comm, case, args) for case in cases]
    samples: list[list[np.ndarray]] = [[] for _ in cases]
    for r in range(_rounds(args)):
        order = range(len(cases)) if r % 2 == 0 else reversed(range(len(cases)))
        for k in order:
            samples[k].append(_timed_loop(comm, cases[k], counts[k]))
    results: list[FFTTimes] = []
    for case, count, rows in zip(cases, counts, samples):
        total, fft, transpose = np.median(np.array(rows), axis=0)
        split = getattr(case, "split", True)
        results.append({
            "total": float(total),
            "fft": float(fft) if split else None,
            "transpose": float(transpose) if split else None,
            "iterations": count,
            "warmup": _warmup(args),
            "rounds": len(rows),
        })  # fmt: skip
    return results


def _ms(seconds: float | None, width: int) -> str:
    return f"{'n/a':>{width}}" if seconds is None else f"{seconds * 1e3:{width}.2f}"


def fft_table_header() -> list[str]:
    """The two title lines of the fft table (ms per forward+backward pair)."""
    return [
        f"{'':11}{'------------ zcoll ------------':>32}{'--------- mpi4py-fft ----------':>33}"
        f"{'- mpi4py-fft/zcoll -':>22}",
        f"{'N':>5}{'iters':>6}{'total':>11}{'fft':>10}{'transpose':>11}"
        f"{'total':>12}{'fft':>10}{'transpose':>11}{'total':>11}{'transpose':>11}",
    ]


def fft_table_row(n: int, z: Mapping[str, Any], m: Mapping[str, Any] | None) -> str:
    """One line of the fft table: zcoll's and mpi4py-fft's times (ms) and their ratios."""
    m = m or {"total": None, "fft": None, "transpose": None}
    total, transpose = ratio(m["total"], z["total"]), ratio(m["transpose"], z["transpose"])
    return (
        f"{n:>5}{z['iterations']:>6}{_ms(z['total'], 11)}{_ms(z['fft'], 10)}"
        f"{_ms(z['transpose'], 11)}{_ms(m['total'], 12)}{_ms(m['fft'], 10)}"
        f"{_ms(m['transpose'], 11)}{times(total):>11}{times(transpose):>11}"
    )


def run_fft(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """Time ``zcoll.fft.PFFT`` against ``mpi4py_fft.PFFT`` for cubic N^3 transforms.

    For each N, both plans get the same shape, dtype and process grid (``--grid``), and the
    same input field. Each is timed as forward+backward pairs (``forward`` normalised,
    ``backward`` not, both libraries' defaults) in alternating rounds (:func:`time_fft`): per
    round a barrier and a timed loop, the largest per-pair mean over the ranks; the median
    over the rounds is reported. Each library's time is split into local FFTs and global
    transposes measured inside the same loop: zcoll's from ``PFFT.timings``, mpi4py-fft's by
    wrapping its serial transforms and Transfer methods (see :class:`Mpi4pyFFTCase`). The
    split's parts are also maxima over the ranks, so they need not add up to the total, which
    also holds argument checks, scaling and (mpi4py-fft, explicit arrays) copies.

    Collective over `comm`. Returns 0, 1 (on every rank) if ``--check`` failed, 2 if the grid
    does not fit.
    """
    say = Reporter(comm, args.progress)
    try:
        dims = fft_grid_dims(comm.size, args.grid)
    except ValueError as exc:
        say(f"zcoll.bench fft: {exc}", file=sys.stderr)
        return 2
    layout = node_layout(comm)
    now, command = now_iso(), command_line(args)
    dtype = np.dtype(args.dtype)
    reference = args.mpi4py_fft_backend != "none"
    why_not = ""
    if reference:
        try:
            import mpi4py_fft  # noqa: F401
        except ImportError as exc:
            reference, why_not = False, f"mpi4py-fft not available ({exc})"
    else:
        why_not = "mpi4py-fft not run (--mpi4py-fft-backend none)"
    versions = _fft_versions()
    than = (
        f"mpi4py-fft {versions.get('mpi4py_fft', '')} backend {args.mpi4py_fft_backend} "
        f"({'explicit arrays, a call per component' if args.rank else args.mpi4py_fft_arrays})"
        if reference
        else why_not
    )

    say(f"# zcoll.bench fft | {now} | host {socket.gethostname()} | {command}")
    field = "a 3-component N^3" if args.rank else "an N^3"
    say(f"# ms per forward+backward pair of {field} {dtype} transform (max over ranks of the")
    say(f"# mean of a timed loop; median of {_rounds(args)} alternating rounds)")
    if args.rank:
        say("# zcoll: all components in one call")
    say("# fft / transpose: the parts of it spent in local FFTs / in transposes")
    say(f"# P={comm.size}, grid {grid_label(dims)}, zcoll backend {args.backend}; vs {than}")
    for line in fft_table_header():
        say(line)
    rows: list[dict[str, Any]] = []
    ratios: dict[str, list[float | None]] = {
        "total": [], "transpose": [], "fused/separate": [], "auto/best": []
    }  # fmt: skip
    say.start(len(args.sizes), "fft")
    try:
        status = _sweep(comm, args, dtype, dims, reference, say, rows, ratios)
    finally:
        say.close()
    if status:
        return status
    geomeans = {key: geomean(values) for key, values in ratios.items()}
    if reference:
        say(
            f"geomean mpi4py-fft/zcoll: total {times(geomeans['total'])}, "
            f"transpose {times(geomeans['transpose'])}"
        )
    if args.rank:
        say(
            f"geomean zcoll components fused / separate {geomeans['fused/separate']:.2f}, "
            f"auto / the better of them {geomeans['auto/best']:.2f}"
        )
    say(where(comm, layout))
    say(f"MPI library: {mpi_library()}")
    if comm.rank == 0:
        metadata = {
            "benchmark": "fft",
            **common_metadata(comm, args, layout, now, command),
            "dtype": str(dtype),
            "rank": args.rank,
            "grid": list(dims),
            "grid_option": args.grid_text,
            "zcoll_backend": args.backend,
            "mpi4py_fft_backend": args.mpi4py_fft_backend if reference else None,
            "mpi4py_fft_arrays": args.mpi4py_fft_arrays if reference else None,
            "mpi4py_fft_missing": why_not or None,
            "geomean_ratio_total": geomeans["total"],
            "geomean_ratio_transpose": geomeans["transpose"],
            "geomean_fused_over_separate": geomeans["fused/separate"] if args.rank else None,
            "geomean_auto_over_best": geomeans["auto/best"] if args.rank else None,
        }
        metadata["versions"].update(versions)
        write_outputs(args, rows, metadata, FFT_FIELDS)
    return 0


def _sweep(comm, args, dtype, dims, reference: bool, say: Reporter, rows, ratios) -> int:
    """The loop over N of :func:`run_fft`: fills `rows` and `ratios`; returns 0, or 1 if
    ``--check`` failed (on every rank)."""
    for n in args.sizes:
        try:
            zc = ZcollFFTCase(comm, n, dtype, args.grid, args.backend, args.rank)
        except (ValueError, ImportError) as exc:  # raised on every rank
            say(f"{n:>5}  skipped: {exc}")
            continue
        mc = None
        if reference:
            try:
                mc = Mpi4pyFFTCase(
                    comm, n, dtype, args.grid, args.mpi4py_fft_backend, args.mpi4py_fft_arrays,
                    args.rank,
                )  # fmt: skip
                ok = True
            except Exception as exc:
                ok, error = False, exc
            if not all_ok(comm, ok):
                if mc is not None:
                    mc.destroy()
                mc = None
                why = f"{type(error).__name__}: {error}" if not ok else "failed on another rank"
                say(f"# mpi4py-fft skipped for N={n}: {why}")
        if args.check:
            failures = check_fft(comm, zc, mc, dtype)
            if failures:
                say(
                    f"zcoll.bench fft: check failed for N={n}: {'; '.join(failures)}",
                    file=sys.stderr,
                )
                return 1
        modes = [  # --rank 1: both fixed choices that components="auto" picks from
            ZcollFFTCase(comm, n, dtype, args.grid, args.backend, args.rank, mode)
            for mode in (ZCOLL_MODES if args.rank else ())
        ]
        cases = [c for c in (zc, mc, *modes) if c is not None]
        results = dict(zip((c.method for c in cases), time_fft(comm, cases, args)))
        say.step(f"N={n}")
        z, m = results[ZCOLL_FFT], results.get(MPI4PY_FFT)
        say(fft_table_row(n, z, m))
        if modes:
            fused, separate = (results[ZCOLL_MODES[k]]["total"] for k in ("fused", "separate"))
            auto_ratio = z["total"] / min(fused, separate)
            ratios["fused/separate"].append(fused / separate)
            ratios["auto/best"].append(auto_ratio)
            say(
                f"{'':5}components fused {_ms(fused, 0)} ms, separate {_ms(separate, 0)} ms: "
                f"fused/separate {fused / separate:.2f}, auto/better {auto_ratio:.2f}"
            )
        if m is not None:
            ratios["total"].append(ratio(m["total"], z["total"]))
            ratios["transpose"].append(ratio(m["transpose"], z["transpose"]))
        for case in cases:
            r = results[case.method]
            rows.append(
                {
                    "benchmark": "fft",
                    "P": comm.size,
                    "N": n,
                    "dtype": str(dtype),
                    "rank": args.rank,
                    "grid": "x".join(map(str, dims)),
                    "method": case.method,
                    "backend": case.backend,
                    "arrays": case.arrays,
                    "total_ms": r["total"] * 1e3,
                    "fft_ms": None if r["fft"] is None else r["fft"] * 1e3,
                    "transpose_ms": None if r["transpose"] is None else r["transpose"] * 1e3,
                    "iterations": r["iterations"],
                    "warmup": r["warmup"],
                    "rounds": r["rounds"],
                }
            )
            case.destroy()
        del zc, mc, modes, cases
        gc.collect()
    return 0


def _fft_versions() -> dict[str, str]:
    """Versions of the optional FFT packages that import."""
    versions = {}
    for module in ("mpi4py_fft", "pyfftw", "scipy"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:
            pass
    return versions
