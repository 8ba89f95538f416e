"""``copy``: bandwidth of zcoll's copy kernels -- memcpy, HINT's hybrid copy, each streaming
kernel -- against ``np.copyto``, on one rank and on all ranks at once.
"""

from __future__ import annotations

import argparse
import gc
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

from zcoll import _core, _settings
from zcoll._registry import HYBRID, PORTABLE, STREAMING, TEMPORAL

from .common import (
    KIB,
    MIB,
    Reporter,
    all_ok,
    command_line,
    common_metadata,
    format_size,
    node_layout,
    now_iso,
    plural,
    ranks_on_node,
    ratio,
    times,
    where,
)
from .output import write_outputs

__all__ = ["COPY_FIELDS", "CopyMethod", "copy_methods", "run_copy"]

#: Default sizes of ``copy``: 4 KiB to 256 MiB in steps of 4.
COPY_SIZES = tuple(4 * KIB * 4**k for k in range(9))
COPY_TIME_BUDGET = 0.3  # default seconds of timed copies per measurement (over COPY_LOOPS)
COPY_LOOPS = 3  # timed loops per measurement; the fastest counts
COPY_MIN_ITERATIONS = 2  # per timed loop
COPY_MAX_ITERATIONS = 1_000_000
COPYTO, MEMCPY = "copyto", "memcpy"  # method names of this bench
COPY_FIELDS = (
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
        from hwloc, zcoll's fallback L2 size (512 KiB) / ranks on the node.
    """
    ranks_here = ranks_on_node(comm)
    l2, source = _settings.machine()["l2_bytes"]
    known = "L2" if source == "hwloc" else "L2 unknown:"
    return max(1, l2 // ranks_here), f"{known} {format_size(l2)} / {plural(ranks_here, 'rank')}"


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
        CopyMethod(MEMCPY, TEMPORAL, None),
        CopyMethod(HYBRID, HYBRID, default_isa, threshold),
    ]
    methods += [
        CopyMethod(f"nt-{isa}", STREAMING, isa) for isa in _core.copy_isas() if isa != PORTABLE
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
    best: dict[str, float] | None = None
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
    assert best is not None  # COPY_LOOPS >= 1
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
    streaming = [v for m, v in gbps.items() if m not in (COPYTO, MEMCPY)]
    best_nt = ratio(max(streaming), gbps.get(MEMCPY)) if streaming else None
    return f"{format_size(size):>9}{cells}{best:>10}{times(best_nt):>9}"


def memcpy_bound(comm: MPI.Comm, args, nbytes: int) -> dict[str, float]:
    """Out-of-cache memcpy bandwidth: temporal copies of `nbytes` (several times the LLC), on one
    rank and on all at once (GB/s, aggregate). Collective."""
    src, dst = _aligned_empty(nbytes), _aligned_empty(nbytes)
    src.fill(0x5A)
    dst.fill(0)
    method = CopyMethod(MEMCPY, TEMPORAL, None)
    bound = {"bytes": nbytes, "one": time_copy(comm, method, dst, src, args, 1)["gbps_aggregate"]}
    if comm.size > 1:
        bound["all"] = time_copy(comm, method, dst, src, args, comm.size)["gbps_aggregate"]
    del src, dst
    gc.collect()
    return bound


def measure_size(comm, args, size: int, methods, phases, say: Reporter, rows: list) -> dict | None:
    """Time every method at one size, on rank 0 alone and on all ranks (`phases`).

    Appends one row per (method, phase) to `rows`. Returns ``{ranks: {method: result}}``, or
    None (on every rank) if ``--check`` found a wrong copy. Collective.
    """
    src, dst = _aligned_empty(size), _aligned_empty(size)
    src[...] = np.arange(size, dtype=np.uint64).astype(np.uint8)  # touched, not zero pages
    dst.fill(0)
    results: dict[int, dict[str, dict]] = {ranks: {} for ranks in phases}
    default_isa = _core.active_copy_isa()
    for method in methods:
        if method.isa is not None:
            _core.select_copy_isa(method.isa)
        try:
            for ranks in phases:
                if args.check:
                    dst.fill(0)
                r = time_copy(comm, method, dst, src, args, ranks)
                copied = not args.check or comm.rank >= ranks or np.array_equal(dst, src)
                if not all_ok(comm, copied):
                    return None
                results[ranks][method.name] = r
                rows.append(copy_row(comm, size, method, ranks, r))
                say.step(f"{format_size(size)} {method.name}")
        finally:
            _core.select_copy_isa(default_isa)
    return results


def copy_row(comm, size: int, method: CopyMethod, ranks: int, result: dict) -> dict:
    """One JSON/CSV row of the copy benchmark."""
    return {
        "benchmark": "copy",
        "P": comm.size,
        "ranks": ranks,
        "size_bytes": size,
        "method": method.name,
        "mode": method.mode or "numpy",
        "isa": method.isa,
        "threshold": method.threshold if method.mode == HYBRID else None,
        **result,
    }


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
    say = Reporter(comm, args.progress)
    layout = node_layout(comm)
    now, command = now_iso(), command_line(args)
    default_isa = _core.active_copy_isa()
    if args.threshold is not None:
        threshold, why = args.threshold, "--threshold"
    else:
        threshold, why = hybrid_threshold(comm)
    methods = copy_methods(threshold, default_isa)
    bound_bytes = max(64 * MIB, 4 * _settings.machine()["llc_bytes"].value)
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
    rows: list[dict] = []
    tables: dict[int, list[tuple[int, dict[str, dict]]]] = {ranks: [] for ranks in phases}
    say.start(len(args.sizes) * len(methods) * len(phases), "copy")
    try:
        for size in args.sizes:
            results = measure_size(comm, args, size, methods, phases, say, rows)
            if results is None:
                say.close()
                say(f"zcoll.bench copy: a copy of {format_size(size)} was wrong", file=sys.stderr)
                return 1
            for ranks in phases:
                tables[ranks].append((size, results[ranks]))
            if comm.size == 1:
                if size == args.sizes[0]:
                    say(copy_table_header(methods))
                gbps = {name: r["gbps_aggregate"] for name, r in results[1].items()}
                say(copy_table_row(size, gbps, methods))
    finally:
        say.close()

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

    bound = memcpy_bound(comm, args, bound_bytes) if args.bound else None
    if bound is not None:
        everyone = (
            f"; all {comm.size} ranks {bound['all']:.2f} GB/s aggregate" if "all" in bound else ""
        )
        say(
            f"memcpy bound (memcpy of {format_size(bound_bytes)}, out of cache): 1 rank "
            f"{bound['one']:.2f} GB/s{everyone} (streaming stores skip the read for ownership: "
            "2 bytes of memory traffic per byte copied instead of 3)"
        )
    say(where(comm, layout))
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
        write_outputs(args, rows, metadata, COPY_FIELDS)
    return 0
