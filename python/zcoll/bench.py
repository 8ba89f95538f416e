"""Latency of zcoll's collectives against MPI's, in the style of the OSU micro-benchmarks,
of zcoll.fft's parallel FFT against mpi4py-fft's, and bandwidth of zcoll's copy kernels.

Run it under MPI::

    mpiexec -n 8 python -m zcoll.bench alltoall
    mpiexec -n 8 python -m zcoll.bench allgather --sizes 8,4K,1M --orders row,hilbert --check
    mpiexec -n 8 python -m zcoll.bench alltoall --max 64K --json a2a.json --csv a2a.csv
    mpiexec -n 4 python -m zcoll.bench fft --sizes 64,128,256 --backend pyfftw --check
    mpiexec -n 2 python -m zcoll.bench copy --sizes 64K,16M --json copy.json

For every block size (bytes per block, i.e. per pair of ranks) and every method -- the MPI
library's ``comm.Alltoall`` / ``comm.Allgather`` on plain NumPy arrays, then zcoll with each
block order on arena arrays -- every rank runs warm-up calls, meets the others at a barrier and
times a loop of calls with ``MPI.Wtime``; the latency reported is the largest per-call average
over the ranks. Iteration counts shrink as blocks grow and are capped by a time budget per
measurement, so a whole sweep stays short. Only rank 0 prints.

``fft`` times forward+backward pairs of a cubic 3D transform with ``zcoll.fft.PFFT`` and with
``mpi4py_fft.PFFT`` (same shape, dtype and process grid) and splits each into local FFT time
and global transpose time; see :func:`run_fft`.

``copy`` measures the bandwidth of memcpy, HINT's hybrid copy and each streaming kernel against
``np.copyto``, on one rank and on all ranks at once; see :func:`run_copy`.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import gc
import json
import math
import os
import re
import shlex
import socket
import sys
import time
from typing import Callable

import mpi4py
import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _core

__all__ = ["main"]

KIB = 1024
MIB = 1024 * KIB
MPI_METHOD = "MPI"
MEMCPY_METHOD = "memcpy"
BANDWIDTH_BLOCKS = 256 * 1024  # blocks from this size also time a memcpy of what a rank receives
ALL_ORDERS = (*zcoll.ORDERS, "auto")
SMALL_BLOCKS = 16 * KIB  # summary: geometric mean over blocks <= this ...
LARGE_BLOCKS = 64 * KIB  # ... and over blocks >= this
MIN_ITERATIONS = 10  # the time budget never cuts a measurement below this
MAX_ITERATIONS = 10_000  # default for tiny exchanges ...
FULL_COUNT_BYTES = 40 * KIB  # ... while a rank's P * block is at most this; fewer above
LARGE_ITERATIONS = 50  # default floor, reached near P * block = 8 MiB (1 MiB blocks at P=8)

_SIZE = re.compile(r"\s*(\d+)\s*([kmg]?)(i?b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "K": KIB, "M": MIB, "G": 1024 * MIB}
_FIELDS = ("collective", "P", "block_bytes", "method", "latency_us", "iterations", "warmup")


class CheckError(RuntimeError):
    """A zcoll result differed from MPI's (raised on every rank)."""


# --- sizes and options -------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """Parse a byte count such as ``"8"``, ``"4K"``, ``"1M"`` or ``"64KiB"`` (binary units).

    Parameters
    ----------
    text : str
        Digits, optionally followed by K, M or G (case-insensitive) and an optional B or iB.

    Returns
    -------
    int
        The number of bytes, at least 1.

    Raises
    ------
    argparse.ArgumentTypeError
        If `text` is not a size or is zero.
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 8, 64, 4K, 1M)")
    value = int(match[1]) * _UNITS[match[2].upper()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"a block size must be at least 1 byte, got {text!r}")
    return value


def parse_sizes(text: str) -> list[int]:
    """Parse a comma-separated list of sizes (see :func:`parse_size`), sorted, duplicates removed.

    Parameters
    ----------
    text : str
        For example ``"8,64,4K,1M"``.

    Returns
    -------
    list of int
        Block sizes in bytes, ascending.
    """
    sizes = sorted({parse_size(item) for item in text.split(",") if item.strip()})
    if not sizes:
        raise argparse.ArgumentTypeError("--sizes needs at least one size")
    return sizes


def parse_orders(text: str) -> list[str]:
    """Parse a comma-separated list of zcoll block orders, keeping the given sequence.

    Parameters
    ----------
    text : str
        For example ``"row,hilbert,auto"``.

    Returns
    -------
    list of str
        Orders among ``zcoll.ORDERS`` and ``"auto"``.
    """
    orders = list(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    unknown = [order for order in orders if order not in ALL_ORDERS]
    if unknown or not orders:
        raise argparse.ArgumentTypeError(
            f"unknown order(s) {unknown}; choose among {', '.join(ALL_ORDERS)}"
        )
    return orders


def powers_of_two(smallest: int, largest: int) -> list[int]:
    """Return the powers of two between `smallest` and `largest` bytes, inclusive."""
    size = 1 << (smallest - 1).bit_length()
    sizes = []
    while size <= largest:
        sizes.append(size)
        size *= 2
    return sizes


def format_size(nbytes: int) -> str:
    """Format a byte count as ``"8 B"``, ``"4 KiB"`` or ``"1 MiB"`` (exact units only)."""
    for unit, scale in (("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def default_iterations(block: int, nranks: int, oversubscription: float = 1.0) -> int:
    """OSU-like iteration count: many calls for small exchanges, fewer for large ones.

    Parameters
    ----------
    block : int
        Bytes per block.
    nranks : int
        Ranks in the communicator; each rank moves about ``nranks * block`` bytes per call.
    oversubscription : float, optional
        Ranks per CPU on the busiest node; counts are divided by it when above 1.

    Returns
    -------
    int
        10000 while ``nranks * block`` <= 40 KiB, then inversely proportional to it down to 50
        (1 MiB blocks at P=8), divided by the oversubscription, and never below 10.
    """
    scaled = MAX_ITERATIONS * FULL_COUNT_BYTES / max(block * nranks, FULL_COUNT_BYTES)
    count = max(LARGE_ITERATIONS, scaled) / max(oversubscription, 1.0)
    return max(MIN_ITERATIONS, round(count))


# --- measurement -------------------------------------------------------------------------------


def measure(fn: Callable[[], object], iterations: int, warmup: int, comm: MPI.Comm) -> float:
    """Time a collective call, OSU style.

    Collective over `comm`: every rank calls `fn` ``warmup`` times, meets the others at a
    barrier, then times ``iterations`` calls with ``MPI.Wtime``.

    Parameters
    ----------
    fn : callable
        Runs the collective once; takes no arguments.
    iterations : int
        Timed calls, at least 1; must be the same on every rank.
    warmup : int
        Untimed calls before the barrier; must be the same on every rank.
    comm : mpi4py.MPI.Comm
        The communicator `fn` runs on.

    Returns
    -------
    float
        Seconds per call: the largest over the ranks of each rank's average.
    """
    for _ in range(warmup):
        fn()
    comm.Barrier()
    start = MPI.Wtime()
    for _ in range(iterations):
        fn()
    elapsed = MPI.Wtime() - start
    return comm.allreduce(elapsed / iterations, op=MPI.MAX)


def budget_iterations(fn: Callable[[], object], iterations: int, budget: float, comm) -> int:
    """Cut `iterations` so that the timed loop takes about `budget` seconds (0: no cut).

    A short pilot measurement (one warm-up call, up to five timed ones) estimates a call's cost;
    as :func:`measure` returns the maximum over the ranks, every rank gets the same count. The
    count is never cut below ``min(iterations, MIN_ITERATIONS)``.
    """
    if budget <= 0:
        return iterations
    per_call = measure(fn, min(iterations, 5), 1, comm)
    affordable = int(budget / per_call) if per_call > 0 else iterations
    return max(min(iterations, MIN_ITERATIONS), min(iterations, affordable))


def check_orders(comm, collective: str, orders, zsend, zrecv, msend, mrecv) -> list[str]:
    """Run MPI once, then each zcoll order once, and compare the results bit for bit.

    `zrecv` is first set to the complement of MPI's result, so every byte must be written.
    Collective; returns the same list, of the orders that differ on some rank, on every rank.
    """
    getattr(comm, collective.capitalize())(msend, mrecv)
    failed = []
    for order in orders:
        np.invert(mrecv, out=zrecv)
        getattr(zcoll, collective)(comm, zsend, zrecv, order=order)
        if not comm.allreduce(bool(np.array_equal(zrecv, mrecv)), op=MPI.LAND):
            failed.append(order)
    return failed


def measure_block(comm, collective: str, block: int, orders, args, rng, oversubscription):
    """Measure MPI and every zcoll order for one block size.

    Returns
    -------
    list of dict
        One row per method (keys as in ``_FIELDS``), MPI first.
    """
    nranks = comm.size
    send_shape = (nranks, block) if collective == "alltoall" else (block,)
    recv_shape = (nranks, block)
    # zcoll's buffers live in the node's arena; each rank fills (first-touches) its own.
    zsend = zcoll.empty(comm, send_shape, np.uint8)
    zsend[...] = rng.integers(0, 256, size=send_shape, dtype=np.uint8)
    zrecv = zcoll.zeros(comm, recv_shape, np.uint8)
    # MPI gets ordinary NumPy arrays with the same data, as an mpi4py program would have.
    msend = np.array(zsend)
    mrecv = np.zeros(recv_shape, np.uint8)

    if args.check:
        failed = check_orders(comm, collective, orders, zsend, zrecv, msend, mrecv)
        if failed:
            raise CheckError(
                f"{collective} with order(s) {', '.join(failed)} differs from MPI's result "
                f"for {format_size(block)} blocks at P={nranks}"
            )

    calls = {MPI_METHOD: functools.partial(getattr(comm, collective.capitalize()), msend, mrecv)}
    zcoll_fn = getattr(zcoll, collective)
    for order in orders:
        calls[order] = functools.partial(zcoll_fn, comm, zsend, zrecv, order=order, copy=args.copy)
    if block >= BANDWIDTH_BLOCKS:
        # The physical limit: every rank memcpys what it receives (P blocks), all at once.
        src, dst = np.array(mrecv), np.empty_like(mrecv)
        calls[MEMCPY_METHOD] = functools.partial(_core.copy, dst, src, "temporal")

    rows = []
    for method, fn in calls.items():
        iterations = args.iterations or default_iterations(block, nranks, oversubscription)
        iterations = budget_iterations(fn, iterations, args.time_budget, comm)
        warmup = args.warmup if args.warmup is not None else max(2, iterations // 10)
        seconds = measure(fn, iterations, warmup, comm)
        rows.append(
            {
                "collective": collective,
                "P": nranks,
                "block_bytes": block,
                "method": method,
                "latency_us": seconds * 1e6,
                "iterations": iterations,
                "warmup": warmup,
            }
        )
    return rows


# --- reporting ---------------------------------------------------------------------------------


def best_order(latencies: dict[str, float]) -> str:
    """Return the fastest zcoll method in `latencies` (method -> µs, MPI and memcpy included)."""
    orders = (m for m in latencies if m not in (MPI_METHOD, MEMCPY_METHOD))
    return min(orders, key=latencies.__getitem__)


def bandwidth_row(comm, block: int, latencies: dict[str, float]) -> str | None:
    """Bytes each rank receives per second with the best order, against a memcpy of as many
    bytes on every rank at once in the same run (None without a memcpy measurement), and the
    copy mode copy="auto" uses for such calls on this rank (after the sweep's tuning)."""
    if MEMCPY_METHOD not in latencies:
        return None
    best = best_order(latencies)
    received = comm.size * block
    zcoll_gbps = received / latencies[best] / 1e3
    memcpy_gbps = received / latencies[MEMCPY_METHOD] / 1e3
    mode, threshold = zcoll._context.context(comm).core.auto_copy_plan(block, received)
    auto = mode if mode == "temporal" else f"{mode} T={format_size(threshold)}"
    return (
        f"{format_size(block):>9}{best:>10}{zcoll_gbps:10.2f}{memcpy_gbps:10.2f}"
        f"{zcoll_gbps / memcpy_gbps:9.0%}   {auto}"
    )


def table_header(orders) -> str:
    """Column titles of the results table (latencies in µs)."""
    titles = "".join(f"{order:>10}" for order in orders)
    return f"{'block':>9}{'MPI (us)':>11}{titles}{'best':>9}{'speedup':>9}"


def table_row(block: int, latencies: dict[str, float], orders) -> str:
    """One line of the results table: latencies, best order, MPI latency / best latency."""
    best = best_order(latencies)
    cells = "".join(f"{latencies[order]:10.2f}" for order in orders)
    speedup = latencies[MPI_METHOD] / latencies[best]
    return f"{format_size(block):>9}{latencies[MPI_METHOD]:11.2f}{cells}{best:>9}{speedup:8.2f}x"


def geomean_speedups(by_block: dict[int, dict[str, float]]) -> dict[str, float | None]:
    """Geometric means of MPI latency / best zcoll latency for small and for large blocks.

    Returns
    -------
    dict
        ``{"small": ..., "large": ...}`` over blocks <= 16 KiB and >= 64 KiB; None if no block
        falls in a range.
    """
    ranges = {"small": lambda b: b <= SMALL_BLOCKS, "large": lambda b: b >= LARGE_BLOCKS}
    result = {}
    for name, within in ranges.items():
        logs = [
            math.log(lat[MPI_METHOD] / lat[best_order(lat)])
            for block, lat in by_block.items()
            if within(block)
        ]
        result[name] = math.exp(sum(logs) / len(logs)) if logs else None
    return result


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def node_layout(comm: MPI.Comm) -> tuple[int, int, float]:
    """Return (number of nodes, CPUs per node, ranks per CPU on the busiest node); collective."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    leader, ranks_here = node.rank == 0, node.size
    node.Free()
    cpus = os.cpu_count() or 1
    nodes = comm.allreduce(int(leader))
    return nodes, cpus, comm.allreduce(ranks_here / cpus, op=MPI.MAX)


def write_outputs(args, rows: list[dict], metadata: dict, fields=_FIELDS) -> None:
    """Write the raw rows (and metadata, for JSON) to ``--json`` / ``--csv`` if requested."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"metadata": metadata, "results": rows}, f, indent=2)
            f.write("\n")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)


def mpi_library() -> str:
    """First line of the MPI library's version string."""
    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0].strip()


def common_metadata(comm: MPI.Comm, args, layout, now: str, command: str) -> dict:
    """Metadata every subcommand records: ranks, nodes, host, date, command, versions."""
    nodes, cpus, oversubscription = layout
    return {
        "P": comm.size,
        "nodes": nodes,
        "cpus_per_node": cpus,
        "ranks_per_cpu": oversubscription,
        "date": now,
        "host": socket.gethostname(),
        "command": command,
        "mpi_library": mpi_library(),
        "versions": {
            "zcoll": zcoll.__version__,
            "mpi4py": mpi4py.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
        },
        "environment": {k: v for k, v in os.environ.items() if k.startswith("ZCOLL_")},
        "time_budget_s": args.time_budget,
        "checked": args.check,
    }


def _root_printer(comm: MPI.Comm) -> Callable[..., None]:
    if comm.rank == 0:
        return functools.partial(print, flush=True)
    return lambda *a, **k: None


def _where(comm: MPI.Comm, layout) -> str:
    nodes, cpus, oversubscription = layout
    crowded = f", {oversubscription:g} ranks per CPU" if oversubscription > 1 else ""
    where = f"{_plural(comm.size, 'rank')} on {_plural(nodes, 'node')}"
    return f"P = {where}, {cpus} CPUs per node{crowded}"


# --- fft ---------------------------------------------------------------------------------------

FFT_DTYPES = ("complex128", "float64", "complex64", "float32")
FFT_SIZES = (32, 64, 128)  # default cube edges
FFT_MIN_ITERATIONS = 3  # the time budget never cuts a measurement below this ...
FFT_MAX_ITERATIONS = 1000  # ... nor lets it grow above this
FFT_ITERATIONS = 10  # with --time-budget 0 and no --iterations
FFT_TIME_BUDGET = 1.0  # default seconds per timed loop
ZCOLL_FFT, MPI4PY_FFT = "zcoll", "mpi4py-fft"
#: --check: largest relative 2-norm difference accepted, by the precision of the dtype
FFT_TOLERANCE = {"double": 1e-10, "single": 1e-5}
_FFT_FIELDS = (
    "benchmark",
    "P",
    "N",
    "dtype",
    "grid",
    "method",
    "backend",
    "arrays",
    "total_ms",
    "fft_ms",
    "transpose_ms",
    "iterations",
    "warmup",
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
    plan's own ones where `explicit` is False)."""

    explicit = True

    def forward(self) -> np.ndarray:
        if not self.explicit:
            return self.plan.forward()
        return self.plan.forward(self.u, self.u_hat)

    def pair(self) -> None:
        self.forward()
        if self.explicit:
            self.plan.backward(self.u_hat, self.u)
        else:
            self.plan.backward()

    def output_slice(self) -> tuple[slice, ...]:
        return self.plan.local_slice(True)

    def destroy(self) -> None:
        self.plan.destroy()


class ZcollFFTCase(_FFTCase):
    """A ``zcoll.fft.PFFT`` plan with arena arrays ``u`` (physical) and ``u_hat`` (spectral).

    One pair is ``forward(u, u_hat)`` then ``backward(u_hat, u)``: the caller's arrays, no
    allocation. The split comes from the plan's own ``timings``.
    """

    method = ZCOLL_FFT

    def __init__(self, comm, n: int, dtype, grid, backend: str) -> None:
        from zcoll.fft import PFFT, newDistArray

        self.backend, self.arrays = backend, "explicit"
        self.plan = PFFT(comm, (n, n, n), dtype=dtype, grid=grid, backend=backend)
        self.u = newDistArray(self.plan, forward_output=False)
        self.u[...] = fft_field(self.plan.local_slice(False), n, dtype)
        self.u_hat = newDistArray(self.plan, forward_output=True)

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

    def __init__(self, comm, n: int, dtype, grid, backend: str, arrays: str) -> None:
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
        if arrays == "internal":
            self.u, self.u_hat = self.plan.forward.input_array, self.plan.forward.output_array
        else:
            self.u = np.zeros(self.plan.shape(False), dtype)
            self.u_hat = np.zeros_like(self.plan.forward.output_array)
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
            a, b = np.zeros(shape, np.complex128), np.zeros(shape, np.complex128)
            for a_slice, a_part, b_slice, b_part in parts:
                a[a_slice], b[b_slice] = a_part, b_part
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


def time_fft(comm, case, args) -> dict[str, float | int | None]:
    """Time forward+backward pairs of `case`, as :func:`measure` times a collective.

    Every rank runs ``--warmup`` untimed pairs; without ``--iterations`` one more pair, timed
    after a barrier, sets the count (``--time-budget`` / its cost, between 3 and 1000). Then a
    barrier and the timed loop. Collective over `comm`.

    Returns
    -------
    dict
        ``total``, ``fft``, ``transpose``: seconds per pair, each the largest over the ranks of
        that rank's mean (``transpose``/``fft`` None when unknown); ``iterations``;
        ``warmup``.
    """
    warmup = 1 if args.warmup is None else args.warmup
    for _ in range(warmup):
        case.pair()
    iterations = args.iterations
    if iterations is None:
        if args.time_budget > 0:
            comm.Barrier()
            start = MPI.Wtime()
            case.pair()
            pilot = comm.allreduce(MPI.Wtime() - start, op=MPI.MAX)
            affordable = round(args.time_budget / pilot) if pilot > 0 else FFT_MAX_ITERATIONS
            iterations = min(FFT_MAX_ITERATIONS, max(FFT_MIN_ITERATIONS, affordable))
        else:
            iterations = FFT_ITERATIONS
    case.reset_timings()
    comm.Barrier()
    start = MPI.Wtime()
    for _ in range(iterations):
        case.pair()
    elapsed = MPI.Wtime() - start
    split = getattr(case, "split", True)
    per_pair = np.array([elapsed, case.timings["fft"], case.timings["transpose"]]) / iterations
    comm.Allreduce(MPI.IN_PLACE, per_pair, op=MPI.MAX)
    return {
        "total": float(per_pair[0]),
        "fft": float(per_pair[1]) if split else None,
        "transpose": float(per_pair[2]) if split else None,
        "iterations": iterations,
        "warmup": warmup,
    }


def _ms(seconds: float | None, width: int) -> str:
    return f"{'n/a':>{width}}" if seconds is None else f"{seconds * 1e3:{width}.2f}"


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def fft_table_header() -> list[str]:
    """The two title lines of the fft table (ms per forward+backward pair)."""
    return [
        f"{'':11}{'------------ zcoll ------------':>32}{'--------- mpi4py-fft ----------':>33}"
        f"{'- mpi4py-fft/zcoll -':>22}",
        f"{'N':>5}{'iters':>6}{'total':>11}{'fft':>10}{'transpose':>11}"
        f"{'total':>12}{'fft':>10}{'transpose':>11}{'total':>11}{'transpose':>11}",
    ]


def fft_table_row(n: int, z: dict, m: dict | None) -> str:
    """One line of the fft table: zcoll's and mpi4py-fft's times (ms) and their ratios."""
    m = m or {"total": None, "fft": None, "transpose": None}
    total, transpose = _ratio(m["total"], z["total"]), _ratio(m["transpose"], z["transpose"])
    return (
        f"{n:>5}{z['iterations']:>6}{_ms(z['total'], 11)}{_ms(z['fft'], 10)}"
        f"{_ms(z['transpose'], 11)}{_ms(m['total'], 12)}{_ms(m['fft'], 10)}"
        f"{_ms(m['transpose'], 11)}{_times(total):>11}{_times(transpose):>11}"
    )


def _geomean(values) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _all_ok(comm, ok: bool) -> bool:
    return comm.allreduce(bool(ok), op=MPI.LAND)


def run_fft(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """Time ``zcoll.fft.PFFT`` against ``mpi4py_fft.PFFT`` for cubic N^3 transforms.

    For each N, both plans get the same shape, dtype and process grid (``--grid``), and the
    same input field. Each is timed as forward+backward pairs (``forward`` normalised,
    ``backward`` not, both libraries' defaults): warm-up, barrier, timed loop, the largest
    per-pair mean over the ranks. Each library's time is split into local FFTs and global
    transposes measured inside the same loop: zcoll's from ``PFFT.timings``, mpi4py-fft's by
    wrapping its serial transforms and Transfer methods (see :class:`Mpi4pyFFTCase`). The
    split's parts are also maxima over the ranks, so they need not add up to the total, which
    also holds argument checks, scaling and (mpi4py-fft, explicit arrays) copies.

    Collective over `comm`. Returns 0, 1 (on every rank) if ``--check`` failed, 2 if the grid
    does not fit.
    """
    say = _root_printer(comm)
    try:
        dims = fft_grid_dims(comm.size, args.grid)
    except ValueError as exc:
        say(f"zcoll.bench fft: {exc}", file=sys.stderr)
        return 2
    layout = node_layout(comm)
    now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    command = shlex.join(["python", "-m", "zcoll.bench", *args.argv])
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
        f"({args.mpi4py_fft_arrays} arrays)"
        if reference
        else why_not
    )

    say(f"# zcoll.bench fft | {now} | host {socket.gethostname()} | {command}")
    say(f"# ms per forward+backward pair of an N^3 {dtype} transform (max over ranks of the mean")
    say("# of a timed loop); fft / transpose: the parts of it spent in local FFTs / in transposes")
    say(f"# P={comm.size}, grid {grid_label(dims)}, zcoll backend {args.backend}; vs {than}")
    for line in fft_table_header():
        say(line)
    rows, ratios = [], {"total": [], "transpose": []}
    for n in args.sizes:
        try:
            zc = ZcollFFTCase(comm, n, dtype, args.grid, args.backend)
        except (ValueError, ImportError) as exc:  # raised on every rank
            say(f"{n:>5}  skipped: {exc}")
            continue
        mc = None
        if reference:
            try:
                mc = Mpi4pyFFTCase(
                    comm, n, dtype, args.grid, args.mpi4py_fft_backend, args.mpi4py_fft_arrays
                )
                ok = True
            except Exception as exc:
                ok, error = False, exc
            if not _all_ok(comm, ok):
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
        results = {ZCOLL_FFT: time_fft(comm, zc, args)}
        if mc is not None:
            results[MPI4PY_FFT] = time_fft(comm, mc, args)
        z, m = results[ZCOLL_FFT], results.get(MPI4PY_FFT)
        say(fft_table_row(n, z, m))
        if m is not None:
            ratios["total"].append(_ratio(m["total"], z["total"]))
            ratios["transpose"].append(_ratio(m["transpose"], z["transpose"]))
        for case in (zc, mc):
            if case is None:
                continue
            r = results[case.method]
            rows.append(
                {
                    "benchmark": "fft",
                    "P": comm.size,
                    "N": n,
                    "dtype": str(dtype),
                    "grid": "x".join(map(str, dims)),
                    "method": case.method,
                    "backend": case.backend,
                    "arrays": case.arrays,
                    "total_ms": r["total"] * 1e3,
                    "fft_ms": None if r["fft"] is None else r["fft"] * 1e3,
                    "transpose_ms": None if r["transpose"] is None else r["transpose"] * 1e3,
                    "iterations": r["iterations"],
                    "warmup": r["warmup"],
                }
            )
            case.destroy()
        del zc, mc
        gc.collect()

    geomeans = {key: _geomean(values) for key, values in ratios.items()}
    if reference:
        say(
            f"geomean mpi4py-fft/zcoll: total {_times(geomeans['total'])}, "
            f"transpose {_times(geomeans['transpose'])}"
        )
    say(_where(comm, layout))
    say(f"MPI library: {mpi_library()}")
    if comm.rank == 0:
        metadata = {
            "benchmark": "fft",
            **common_metadata(comm, args, layout, now, command),
            "dtype": str(dtype),
            "grid": list(dims),
            "grid_option": args.grid_text,
            "zcoll_backend": args.backend,
            "mpi4py_fft_backend": args.mpi4py_fft_backend if reference else None,
            "mpi4py_fft_arrays": args.mpi4py_fft_arrays if reference else None,
            "geomean_ratio_total": geomeans["total"],
            "geomean_ratio_transpose": geomeans["transpose"],
        }
        metadata["versions"].update(versions)
        write_outputs(args, rows, metadata, _FFT_FIELDS)
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


# --- copy --------------------------------------------------------------------------------------

#: Default sizes of ``copy``: 4 KiB to 256 MiB in steps of 4.
COPY_SIZES = tuple(4 * KIB * 4**k for k in range(9))
COPY_TIME_BUDGET = 0.3  # default seconds of timed copies per measurement (over COPY_LOOPS)
COPY_LOOPS = 3  # timed loops per measurement; the fastest counts
COPY_MIN_ITERATIONS = 2  # per timed loop
COPY_MAX_ITERATIONS = 1_000_000
COPY_FALLBACK_L2 = 512 * KIB  # hybrid threshold numerator when hwloc knows no L2
COPYTO, TEMPORAL, HYBRID = "copyto", "memcpy", "hybrid"
_COPY_FIELDS = (
    "benchmark",
    "P",
    "ranks",
    "size_bytes",
    "method",
    "mode",
    "isa",
    "threshold",
    "gbps_per_rank",
    "gbps_aggregate",
    "iterations",
)


def _aligned_empty(nbytes: int) -> np.ndarray:
    """Uninitialised uint8 array of `nbytes` starting on a 64-byte (cache-line) boundary."""
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + nbytes]


def _wait_idle(comm: MPI.Comm) -> None:
    """Barrier that polls with short sleeps, leaving the CPUs to the ranks still working."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.0005)


def hybrid_threshold(comm: MPI.Comm) -> tuple[int, str]:
    """HINT's initial hybrid threshold: L2 size / ranks on this node; collective.

    Returns
    -------
    tuple
        The threshold in bytes and how it was obtained (for the report). Without an L2 size
        from hwloc, 512 KiB / ranks on the node.
    """
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    ranks_here = node.size
    node.Free()
    l2 = int(_core.machine_topology().get("l2", 0))
    if l2 > 0:
        return max(1, l2 // ranks_here), f"L2 {format_size(l2)} / {_plural(ranks_here, 'rank')}"
    return max(1, COPY_FALLBACK_L2 // ranks_here), (
        f"L2 unknown: {format_size(COPY_FALLBACK_L2)} / {_plural(ranks_here, 'rank')}"
    )


class CopyMethod:
    """One way to copy: NumPy's ``np.copyto`` or ``_core.copy`` with a mode and kernel.

    ``run(dst, src, k)`` copies `src` into `dst` `k` times (``_core.copy`` loops in C++, so the
    Python call is paid once; ``np.copyto`` once per copy).
    """

    def __init__(self, name: str, mode: str | None, isa: str | None, threshold: int = 0):
        self.name, self.mode, self.isa, self.threshold = name, mode, isa, threshold

    def run(self, dst: np.ndarray, src: np.ndarray, k: int) -> None:
        if self.mode is None:
            for _ in range(k):
                np.copyto(dst, src)
        else:
            _core.copy(dst, src, self.mode, self.threshold, repeat=k)


def copy_methods(threshold: int, default_isa: str) -> list[CopyMethod]:
    """copyto, memcpy, hybrid (default kernel), then streaming with each streaming kernel."""
    methods = [
        CopyMethod(COPYTO, None, None),
        CopyMethod(TEMPORAL, "temporal", None),
        CopyMethod(HYBRID, "hybrid", default_isa, threshold),
    ]
    methods += [
        CopyMethod(f"nt-{isa}", "streaming", isa) for isa in _core.copy_isas() if isa != "portable"
    ]
    return methods


def _copy_seconds(method: CopyMethod, dst, src, iterations: int) -> float:
    start = time.perf_counter()
    method.run(dst, src, iterations)
    return time.perf_counter() - start


def _pilot_seconds(method: CopyMethod, dst, src) -> float:
    """Seconds per copy, from enough copies to take about 10 ms."""
    k = 1
    while True:
        elapsed = _copy_seconds(method, dst, src, k)
        if elapsed >= 0.01 or k >= COPY_MAX_ITERATIONS:
            return elapsed / k
        k = min(COPY_MAX_ITERATIONS, k * 4 if elapsed < 0.001 else k * 2)


def _copy_iterations(args, per_copy: float) -> int:
    if args.iterations:
        return args.iterations
    affordable = args.time_budget / COPY_LOOPS / per_copy if per_copy > 0 else COPY_MAX_ITERATIONS
    return int(min(COPY_MAX_ITERATIONS, max(COPY_MIN_ITERATIONS, affordable)))


def time_copy(comm: MPI.Comm, method: CopyMethod, dst, src, args, ranks: int) -> dict:
    """Bandwidth of `method` on rank 0 alone (`ranks` 1, the others idle) or on all ranks.

    Collective over `comm`. The copying ranks warm up (``--warmup`` copies, default 1), run a
    pilot that sets the iteration count (``--time-budget``, the same on every rank: from the
    slowest rank's pilot), then, COPY_LOOPS times, meet at a barrier and time a loop of copies.
    The fastest loop counts: its aggregate bandwidth (bytes copied by all copying ranks / the
    slowest rank's time) and the mean over those ranks of each one's own bandwidth.

    Returns
    -------
    dict
        ``gbps_aggregate``, ``gbps_per_rank``, ``iterations`` (per loop), on every rank.
    """
    if ranks == comm.size:
        return _time_copy_on(comm, method, dst, src, args)
    # rank 0 alone; the others wait without spinning
    result = _time_copy_on(MPI.COMM_SELF, method, dst, src, args) if comm.rank == 0 else None
    _wait_idle(comm)
    return comm.bcast(result, root=0)


def _time_copy_on(comm: MPI.Comm, method: CopyMethod, dst, src, args) -> dict:
    nbytes = dst.nbytes
    warmup = 1 if args.warmup is None else args.warmup
    if warmup:
        method.run(dst, src, warmup)
    per_copy = comm.allreduce(_pilot_seconds(method, dst, src), op=MPI.MAX)
    iterations = _copy_iterations(args, per_copy)
    best = None
    for _ in range(COPY_LOOPS):
        comm.Barrier()
        elapsed = _copy_seconds(method, dst, src, iterations)
        slowest = comm.allreduce(elapsed, op=MPI.MAX)
        mine = nbytes * iterations / elapsed / 1e9
        loop = {
            "gbps_aggregate": comm.size * nbytes * iterations / slowest / 1e9,
            "gbps_per_rank": comm.allreduce(mine) / comm.size,
        }
        if best is None or loop["gbps_aggregate"] > best["gbps_aggregate"]:
            best = loop
    return {**best, "iterations": iterations}


def _gbps(value: float | None, width: int = 10) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}.2f}"


def copy_table_header(methods: list[CopyMethod]) -> str:
    titles = "".join(f"{m.name:>10}" for m in methods)
    return f"{'size':>9}{titles}{'best':>10}{'best NT':>9}"


def copy_table_row(size: int, gbps: dict[str, float], methods: list[CopyMethod]) -> str:
    """Bandwidths, the fastest method, and best streaming (hybrid or nt-*) / memcpy."""
    cells = "".join(_gbps(gbps.get(m.name)) for m in methods)
    best = max(gbps, key=gbps.__getitem__)
    streaming = [v for m, v in gbps.items() if m not in (COPYTO, TEMPORAL)]
    ratio = _ratio(max(streaming), gbps.get(TEMPORAL)) if streaming else None
    return f"{format_size(size):>9}{cells}{best:>10}{_times(ratio):>9}"


def memcpy_bound(comm: MPI.Comm, args, nbytes: int) -> dict[str, float]:
    """Out-of-cache memcpy bandwidth: temporal copies of `nbytes` (several times the LLC), on one
    rank and on all at once (GB/s, aggregate). Collective."""
    src, dst = _aligned_empty(nbytes), _aligned_empty(nbytes)
    src.fill(0x5A)
    dst.fill(0)
    method = CopyMethod(TEMPORAL, "temporal", None)
    bound = {"bytes": nbytes, "one": time_copy(comm, method, dst, src, args, 1)["gbps_aggregate"]}
    if comm.size > 1:
        bound["all"] = time_copy(comm, method, dst, src, args, comm.size)["gbps_aggregate"]
    del src, dst
    gc.collect()
    return bound


def run_copy(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """Bandwidth of zcoll's copy kernels: memcpy, hybrid, each streaming kernel, np.copyto.

    For every size, each rank allocates its own 64-byte-aligned source and destination (plain
    NumPy memory, touched first) and each method copies the source into the destination again
    and again (warm: the same buffers). GB/s is bytes copied / time. Measured first on rank 0
    alone (the other ranks idle, sleeping), then, under mpiexec, on every rank at once, each
    copying its own buffers: aggregate (all bytes / the slowest rank's time) and per rank. A
    "memcpy bound" line gives the out-of-cache memcpy bandwidth (several times the L3 size).
    Every result is checked against the source.

    Collective over `comm`. Returns 0, or 1 (on every rank) if a copy was wrong.
    """
    say = _root_printer(comm)
    layout = node_layout(comm)
    now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    command = shlex.join(["python", "-m", "zcoll.bench", *args.argv])
    default_isa = _core.active_copy_isa()
    if args.threshold is not None:
        threshold, why = args.threshold, "--threshold"
    else:
        threshold, why = hybrid_threshold(comm)
    methods = copy_methods(threshold, default_isa)
    l3 = int(_core.machine_topology().get("l3", 0))
    bound_bytes = max(64 * MIB, 4 * l3)
    phases = [1] if comm.size == 1 else [1, comm.size]

    say(f"# zcoll.bench copy | {now} | host {socket.gethostname()} | {command}")
    kernels = ", ".join(_core.copy_isas())
    say("# GB/s = bytes copied / time, warm (the same buffers again and again), best of")
    say(
        f"# {COPY_LOOPS} timed loops. copyto: np.copyto (NumPy's memcpy, one Python call per copy);"
    )
    say("# memcpy: temporal stores; hybrid: HINT's, the first T bytes temporal, the rest")
    say(f"# streaming, T = {format_size(threshold)} ({why}); nt-ISA: streaming (non-temporal)")
    say(f"# stores with that kernel. Kernels on this CPU: {kernels}; default {default_isa}.")
    say("# best NT: the best of hybrid and nt-* / memcpy (above 1: streaming wins).")
    rows, tables = [], {ranks: [] for ranks in phases}
    for size in args.sizes:
        src, dst = _aligned_empty(size), _aligned_empty(size)
        src[...] = np.arange(size, dtype=np.uint64).astype(np.uint8)  # touched, not zero pages
        dst.fill(0)
        results = {ranks: {} for ranks in phases}
        for method in methods:
            if method.isa is not None:
                _core.select_copy_isa(method.isa)
            try:
                for ranks in phases:
                    if args.check:
                        dst.fill(0)
                    r = time_copy(comm, method, dst, src, args, ranks)
                    copied = not args.check or comm.rank >= ranks or np.array_equal(dst, src)
                    if not _all_ok(comm, copied):
                        say(
                            f"zcoll.bench copy: {method.name} copied {format_size(size)} wrong",
                            file=sys.stderr,
                        )
                        return 1
                    results[ranks][method.name] = r
                    rows.append(
                        {
                            "benchmark": "copy",
                            "P": comm.size,
                            "ranks": ranks,
                            "size_bytes": size,
                            "method": method.name,
                            "mode": method.mode or "numpy",
                            "isa": method.isa,
                            "threshold": method.threshold if method.mode == "hybrid" else None,
                            **r,
                        }
                    )
            finally:
                _core.select_copy_isa(default_isa)
        for ranks in phases:
            tables[ranks].append((size, results[ranks]))
        if comm.size == 1:
            if size == args.sizes[0]:
                say(copy_table_header(methods))
            gbps = {name: r["gbps_aggregate"] for name, r in results[1].items()}
            say(copy_table_row(size, gbps, methods))
        del src, dst
        gc.collect()

    if comm.size > 1:
        titles = {
            "one": "rank 0 alone (the others idle), GB/s",
            "aggregate": f"all {comm.size} ranks at once, aggregate GB/s (all bytes / slowest "
            "rank's time)",
            "per_rank": f"all {comm.size} ranks at once, GB/s per rank (mean over the ranks)",
        }
        for key, ranks, field in (
            ("one", 1, "gbps_aggregate"),
            ("aggregate", comm.size, "gbps_aggregate"),
            ("per_rank", comm.size, "gbps_per_rank"),
        ):
            say(f"## {titles[key]}")
            say(copy_table_header(methods))
            for size, results in tables[ranks]:
                say(copy_table_row(size, {n: r[field] for n, r in results.items()}, methods))

    bound = memcpy_bound(comm, args, bound_bytes)
    everyone = (
        f"; all {comm.size} ranks {bound['all']:.2f} GB/s aggregate" if "all" in bound else ""
    )
    say(
        f"memcpy bound (memcpy of {format_size(bound_bytes)}, out of cache): 1 rank "
        f"{bound['one']:.2f} GB/s{everyone} (streaming stores skip the read for ownership: 2 bytes "
        "of memory traffic per byte copied instead of 3)"
    )
    say(_where(comm, layout))
    if comm.rank == 0:
        metadata = {
            "benchmark": "copy",
            **common_metadata(comm, args, layout, now, command),
            "copy_isas": list(_core.copy_isas()),
            "default_isa": default_isa,
            "hybrid_threshold": threshold,
            "hybrid_threshold_source": why,
            "memcpy_bound_gbps": bound,
        }
        write_outputs(args, rows, metadata, _COPY_FIELDS)
    return 0


# --- subcommands -------------------------------------------------------------------------------


def run_collective(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """Sweep block sizes and orders for ``args.command`` (alltoall or allgather) and report.

    Collective over `comm`. Returns 0, or 1 (on every rank) if ``--check`` found a difference.
    """
    collective = args.command
    layout = node_layout(comm)
    oversubscription = layout[2]
    now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    command = shlex.join(["python", "-m", "zcoll.bench", *args.argv])
    say = _root_printer(comm)

    say(f"# zcoll.bench {collective} | {now} | host {socket.gethostname()} | {command}")
    say(f"# latency in us per call (max over ranks of the mean of a timed loop); P={comm.size}")
    say(table_header(args.orders))
    rng = np.random.default_rng(comm.rank)
    rows, by_block = [], {}
    for block in args.sizes:
        try:
            block_rows = measure_block(
                comm, collective, block, args.orders, args, rng, oversubscription
            )
        except CheckError as exc:
            say(f"zcoll.bench: check failed: {exc}", file=sys.stderr)
            return 1
        rows += block_rows
        by_block[block] = {row["method"]: row["latency_us"] for row in block_rows}
        say(table_row(block, by_block[block], args.orders))

    bandwidth = [bandwidth_row(comm, b, lat) for b, lat in by_block.items()]
    if any(bandwidth):
        say(f"# GB/s each rank receives, best order vs memcpy of the same bytes (copy={args.copy})")
        say(f"{'block':>9}{'best':>10}{'zcoll':>10}{'memcpy':>10}{'ratio':>9}   copy='auto' uses")
        for line in filter(None, bandwidth):
            say(line)

    speedups = geomean_speedups(by_block)
    say(
        f"geomean speedup of best order over MPI: blocks <= {format_size(SMALL_BLOCKS)}: "
        f"{_times(speedups['small'])}, blocks >= {format_size(LARGE_BLOCKS)}: "
        f"{_times(speedups['large'])}"
    )
    say(_where(comm, layout))
    say(f"MPI library: {mpi_library()}")
    if comm.rank == 0:
        metadata = {
            "collective": collective,
            **common_metadata(comm, args, layout, now, command),
            "geomean_speedup_small": speedups["small"],
            "geomean_speedup_large": speedups["large"],
        }
        write_outputs(args, rows, metadata)
    return 0


#: Subcommand name -> (function(comm, args) -> exit status, help), with its options in
#: ``_OPTIONS``.
COMMANDS: dict[str, tuple[Callable[[MPI.Comm, argparse.Namespace], int], str]] = {
    "alltoall": (run_collective, "zcoll.alltoall vs comm.Alltoall"),
    "allgather": (run_collective, "zcoll.allgather vs comm.Allgather"),
    "fft": (run_fft, "zcoll.fft.PFFT vs mpi4py_fft.PFFT (3D, forward+backward)"),
    "copy": (run_copy, "copy bandwidth: memcpy, hybrid and streaming kernels, np.copyto"),
}


class _RootParser(argparse.ArgumentParser):
    """An argument parser that prints help and errors on rank 0 only (all ranks still exit)."""

    def _print_message(self, message, file=None):
        if MPI.COMM_WORLD.rank == 0:
            super()._print_message(message, file)


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="write raw results and metadata as JSON")
    parser.add_argument("--csv", metavar="FILE", help="write raw results as CSV")


def _collective_options() -> argparse.ArgumentParser:
    common = _RootParser(add_help=False)
    sizes = common.add_argument_group("block sizes (default: powers of two, 8 B to 1 MiB)")
    sizes.add_argument("--sizes", type=parse_sizes, help="list of block sizes, e.g. 8,64,4K,1M")
    sizes.add_argument("--min", type=parse_size, help="smallest power-of-two block (default 8)")
    sizes.add_argument("--max", type=parse_size, help="largest power-of-two block (default 1M)")
    common.add_argument(
        "--orders",
        type=parse_orders,
        default=list(ALL_ORDERS),
        help=f"zcoll block orders to time (default: {','.join(ALL_ORDERS)})",
    )
    common.add_argument(
        "--iterations", type=int, help="timed calls per measurement (default: scaled by size)"
    )
    common.add_argument(
        "--warmup", type=int, help="untimed calls first (default: 10%% of iterations, >= 2)"
    )
    common.add_argument(
        "--time-budget",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="cap on a measurement's timed loop, in seconds; 0: no cap (default 0.5)",
    )
    common.add_argument(
        "--copy",
        choices=["auto", *zcoll.COPY_MODES],
        default="auto",
        help="copy mode of zcoll's block copies (default auto)",
    )
    common.add_argument(
        "--check", action="store_true", help="first compare each order's result with MPI's"
    )
    _add_output_options(common)
    return common


def _fft_options() -> argparse.ArgumentParser:
    from zcoll.fft import BACKENDS

    options = _RootParser(add_help=False)
    options.add_argument(
        "--sizes",
        type=parse_fft_sizes,
        default=list(FFT_SIZES),
        metavar="N,N,...",
        help="cube edges: each N gives an N x N x N transform "
        f"(default {','.join(map(str, FFT_SIZES))})",
    )
    options.add_argument(
        "--dtype",
        choices=FFT_DTYPES,
        default="complex128",
        help="input dtype; float32/float64 give real-to-complex transforms (default complex128)",
    )
    options.add_argument(
        "--grid",
        dest="grid_text",
        default="none",
        metavar="GRID",
        help="process grid: none (library default: pencils over axes 0 and 1), slab, pencil, "
        "or counts per axis such as 2x1 or 2x2x1 (default none)",
    )
    options.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="numpy",
        help="zcoll's serial FFT library (default numpy)",
    )
    options.add_argument(
        "--mpi4py-fft-backend",
        default="fftw",
        metavar="NAME",
        help="mpi4py-fft's serial FFT backend: fftw, pyfftw, numpy, scipy, ...; "
        "none: time zcoll alone (default fftw)",
    )
    options.add_argument(
        "--mpi4py-fft-arrays",
        choices=("internal", "explicit"),
        default="internal",
        help="internal: mpi4py-fft's forward()/backward() on its own arrays, no copies; "
        "explicit: forward(u, u_hat)/backward(u_hat, u), as zcoll is called (default internal)",
    )
    options.add_argument(
        "--iterations",
        type=int,
        help="timed forward+backward pairs (default: --time-budget / cost of one, 3 to 1000)",
    )
    options.add_argument("--warmup", type=int, help="untimed pairs first (default 1)")
    options.add_argument(
        "--time-budget",
        type=float,
        default=FFT_TIME_BUDGET,
        metavar="SECONDS",
        help="target length of each timed loop when --iterations is not given; "
        f"0: {FFT_ITERATIONS} pairs (default {FFT_TIME_BUDGET:g})",
    )
    options.add_argument(
        "--check",
        action="store_true",
        help="first compare zcoll's forward result with mpi4py-fft's, and its round trip "
        "with the input (relative 2-norm, 1e-10; 1e-5 in single precision)",
    )
    _add_output_options(options)
    return options


def _copy_options() -> argparse.ArgumentParser:
    options = _RootParser(add_help=False)
    options.add_argument(
        "--sizes",
        type=parse_sizes,
        default=list(COPY_SIZES),
        help="bytes per copy, e.g. 4K,1M,64M (default: 4 KiB to 256 MiB in steps of 4)",
    )
    options.add_argument(
        "--threshold",
        type=parse_size,
        help="hybrid: temporal bytes at the start of each copy (default: L2 / ranks per node)",
    )
    options.add_argument(
        "--iterations", type=int, help="copies per timed loop (default: from --time-budget)"
    )
    options.add_argument("--warmup", type=int, help="untimed copies first (default 1)")
    options.add_argument(
        "--time-budget",
        type=float,
        default=COPY_TIME_BUDGET,
        metavar="SECONDS",
        help=f"timed copies per measurement, over its {COPY_LOOPS} loops, in seconds "
        f"(default {COPY_TIME_BUDGET:g})",
    )
    options.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="do not compare each copy with its source",
    )
    _add_output_options(options)
    return options


#: Subcommand name -> function returning a parent parser with its options.
_OPTIONS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "alltoall": _collective_options,
    "allgather": _collective_options,
    "fft": _fft_options,
    "copy": _copy_options,
}


def _parser() -> argparse.ArgumentParser:
    parser = _RootParser(
        prog="python -m zcoll.bench",
        description="OSU-style latency of zcoll collectives against the MPI library's, and "
        "zcoll.fft against mpi4py-fft.",
        epilog="Run under MPI, e.g.: mpiexec -n 8 python -m zcoll.bench alltoall",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, text) in COMMANDS.items():
        commands.add_parser(name, parents=[_OPTIONS[name]()], help=text, description=text)
    return parser


def _finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks and defaults that argparse cannot express (calls ``parser.error`` on misuse)."""
    if args.command == "fft":
        try:
            args.grid = parse_grid(args.grid_text)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"argument --grid: {exc}")
    elif args.command == "copy":
        if args.time_budget <= 0 and args.iterations is None:
            parser.error("copy needs --time-budget > 0 or --iterations")
    else:
        if args.sizes and (args.min or args.max):
            parser.error("--sizes cannot be combined with --min/--max")
        if not args.sizes:
            args.sizes = powers_of_two(args.min or 8, args.max or MIB)
            if not args.sizes:
                parser.error("no power of two lies between --min and --max")
    if args.iterations is not None and args.iterations < 1:
        parser.error("--iterations must be at least 1")
    if args.warmup is not None and args.warmup < 0:
        parser.error("--warmup must be at least 0")


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m zcoll.bench COMMAND [options]``; see ``--help``.

    Parameters
    ----------
    argv : list of str, optional
        Arguments after the program name; ``sys.argv[1:]`` by default.

    Returns
    -------
    int
        Exit status, the same on every rank: 0 on success, 1 if a check failed, 2 on a usage
        error.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    try:  # argparse reports a usage error by raising SystemExit(2), on every rank
        args = parser.parse_args(argv)
        _finish_args(parser, args)
    except SystemExit as exc:
        return int(exc.code or 0)
    args.argv = argv
    function, _ = COMMANDS[args.command]
    return function(MPI.COMM_WORLD, args)


if __name__ == "__main__":
    sys.exit(main())
