"""What every subcommand of ``python -m zcoll.bench`` shares: size parsing and formatting,
iteration counts, the warm (OSU) and cold-cache (TPDS'18 Fig. 9) timing loops, run metadata,
the rank-0 reporter with its progress bar, and the ``--json`` / ``--csv`` writers.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import re
import shlex
import socket
import sys
from collections.abc import Sequence
from statistics import median
from typing import Callable

import mpi4py
import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _tuning

__all__ = [
    "CacheFlusher",
    "Reporter",
    "budget_cold_iterations",
    "budget_iterations",
    "common_metadata",
    "default_iterations",
    "format_size",
    "measure",
    "measure_cold",
    "median",
    "mpi_library",
    "node_layout",
    "parse_size",
    "parse_sizes",
    "powers_of_two",
    "ranks_on_node",
    "write_outputs",
]

KIB = 1024
MIB = 1024 * KIB
MIN_ITERATIONS = 10  # the time budget never cuts a warm measurement below this
MAX_ITERATIONS = 10_000  # default for tiny exchanges ...
FULL_COUNT_BYTES = 40 * KIB  # ... while a rank's P * block is at most this; fewer above
LARGE_ITERATIONS = 50  # default floor, reached near P * block = 8 MiB (1 MiB blocks at P=8)
COLD_ITERATIONS = 20  # cold-cache default: each iteration flushes tens of MiB
COLD_MIN_ITERATIONS = 5  # the time budget never cuts a cold measurement below this
FLUSH_FACTOR = 2  # a node's ranks together sweep this many times its last-level cache
BENCH_METHODS = ("warm", "cold")

_SIZE = re.compile(r"\s*(\d+)\s*([kmg]?)(i?b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "K": KIB, "M": MIB, "G": 1024 * MIB}


# --- sizes -------------------------------------------------------------------------------------


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


def parse_choices(text: str, choices: Sequence[str], what: str) -> list[str]:
    """Parse a comma-separated list of names among `choices`, keeping the given sequence.

    Raises
    ------
    argparse.ArgumentTypeError
        If the list is empty or names something outside `choices` (`what` names the option).
    """
    names = list(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    unknown = [name for name in names if name not in choices]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {unknown}; choose among {', '.join(choices)}"
        )
    return names


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


# --- warm timing (OSU) -------------------------------------------------------------------------


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


# --- cold-cache timing (TPDS'18 Fig. 9) --------------------------------------------------------


def ranks_on_node(comm: MPI.Comm) -> int:
    """How many ranks of `comm` share this rank's node (memory); collective."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    size = node.size
    node.Free()
    return size


class CacheFlusher:
    """A private buffer whose sweep (read and write every byte) evicts this rank's caches.

    The ranks of a node sweep ``FLUSH_FACTOR`` times the last-level cache between them (the
    LLC is shared, and they all flush at once, before a barrier), each at least
    ``FLUSH_FACTOR`` times its core's L2 (private). Cache sizes come from hwloc. Collective
    over `comm` (counts the ranks on each node).
    """

    def __init__(self, comm: MPI.Comm) -> None:
        l2, llc = _tuning.cache_bytes()
        share = FLUSH_FACTOR * llc // ranks_on_node(comm)
        nbytes = max(share, FLUSH_FACTOR * l2, 64 * KIB)
        self.buffer = np.ones(-(-nbytes // 8), np.uint64)  # touched now: no zero pages later

    @property
    def nbytes(self) -> int:
        """Bytes swept per flush."""
        return self.buffer.nbytes

    def flush(self) -> None:
        """Read and write the whole buffer: what was cached before is evicted."""
        np.add(self.buffer, 1, out=self.buffer)


def touch(buffers: Sequence[np.ndarray]) -> int:
    """Read every byte of `buffers` (this rank's own send and receive buffers), sequentially.

    Returns a checksum, so the reads cannot be optimised away.
    """
    total = 0
    for buf in buffers:
        flat = buf.reshape(-1).view(np.uint8)
        words = flat.size // 8
        if flat.ctypes.data % 8 == 0 and words:
            total += int(flat[: words * 8].view(np.uint64).sum(dtype=np.uint64))
        total += int(flat[words * 8 :].sum())
    return total


def measure_cold(
    fn: Callable[[], object],
    iterations: int,
    warmup: int,
    comm: MPI.Comm,
    buffers: Sequence[np.ndarray],
    flusher: CacheFlusher,
) -> float:
    """Time a collective call with cold caches, as TPDS'18 Fig. 9 does.

    Collective over `comm`. After ``warmup`` untimed calls, every iteration: each rank sweeps
    its flush buffer (evicting everything), meets the others at a barrier (so no rank's flush
    evicts what another has just brought in), reads its own `buffers` sequentially (its send
    and receive buffers: in its own caches, as after the owner wrote them), meets the others
    again, then times one call.

    Returns
    -------
    float
        Seconds per call: the largest over the ranks of each rank's mean per-call time.
    """
    for _ in range(warmup):
        fn()
    total = 0.0
    for _ in range(iterations):
        flusher.flush()
        comm.Barrier()
        touch(buffers)
        comm.Barrier()
        start = MPI.Wtime()
        fn()
        total += MPI.Wtime() - start
    return comm.allreduce(total / iterations, op=MPI.MAX)


def budget_cold_iterations(iterations: int, budget: float, per_iteration: float) -> int:
    """Cut a cold measurement's `iterations` so that it takes about `budget` seconds (0: no cut).

    `per_iteration` is the cost of a whole cold iteration (flush, barriers, touch and call),
    the same on every rank. Never cut below ``min(iterations, COLD_MIN_ITERATIONS)``.
    """
    if budget <= 0 or per_iteration <= 0:
        return iterations
    affordable = int(budget / per_iteration)
    return max(min(iterations, COLD_MIN_ITERATIONS), min(iterations, affordable))


def cold_iteration_seconds(comm, fn, buffers, flusher: CacheFlusher) -> float:
    """Wall time of one whole cold iteration (the largest over the ranks); collective."""
    start = MPI.Wtime()
    measure_cold(fn, 1, 0, comm, buffers, flusher)
    return comm.allreduce(MPI.Wtime() - start, op=MPI.MAX)


# --- run metadata ------------------------------------------------------------------------------


def node_layout(comm: MPI.Comm) -> tuple[int, int, float]:
    """Return (number of nodes, CPUs per node, ranks per CPU on the busiest node); collective."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    leader, ranks_here = node.rank == 0, node.size
    node.Free()
    cpus = os.cpu_count() or 1
    nodes = comm.allreduce(int(leader))
    return nodes, cpus, comm.allreduce(ranks_here / cpus, op=MPI.MAX)


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


def now_iso() -> str:
    """The local date and time, to the second, with the UTC offset."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def command_line(args) -> str:
    """The command that reproduces this run."""
    return shlex.join(["python", "-m", "zcoll.bench", *args.argv])


def where(comm: MPI.Comm, layout) -> str:
    """``P = 4 ranks on 1 node, 2 CPUs per node, 2 ranks per CPU``."""
    nodes, cpus, oversubscription = layout
    crowded = f", {oversubscription:g} ranks per CPU" if oversubscription > 1 else ""
    ranks = plural(comm.size, "rank")
    return f"P = {ranks} on {plural(nodes, 'node')}, {cpus} CPUs per node{crowded}"


def plural(count: int, word: str) -> str:
    """``"1 rank"``, ``"2 ranks"``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def times(value: float | None) -> str:
    """A ratio as ``"1.23x"``, or ``"n/a"``."""
    return "n/a" if value is None else f"{value:.2f}x"


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """`numerator` / `denominator`, or None when either is missing (or the denominator is 0)."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def geomean(values) -> float | None:
    """Geometric mean of the values that are set and nonzero; None if there are none."""
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def all_ok(comm: MPI.Comm, ok: bool) -> bool:
    """Whether `ok` holds on every rank (the same answer on every rank)."""
    return comm.allreduce(bool(ok), op=MPI.LAND)


# --- output ------------------------------------------------------------------------------------


def _progress_stream():
    """The terminal a progress bar may draw on: stderr if it is one, else stdout if it is one
    (under mpiexec, rank 0's stdout may be a terminal while its stderr is a pipe), else None."""
    for stream in (sys.stderr, sys.stdout):
        isatty = getattr(stream, "isatty", None)
        if isatty is not None and isatty():
            return stream
    return None


class Reporter:
    """Rank 0's voice: prints lines and, in a terminal, a tqdm progress bar over a sweep.

    Other ranks never print. The bar appears only on rank 0, only when `progress` is set,
    tqdm imports and a terminal is attached (see :func:`_progress_stream`); lines printed
    while it is shown go through ``tqdm.write`` so the two do not garble each other.
    """

    def __init__(self, comm: MPI.Comm, progress: bool = True) -> None:
        self.root = comm.rank == 0
        self.progress = progress and self.root
        self.bar = None

    def __call__(self, *parts, file=None) -> None:
        """Print like ``print(*parts)`` on rank 0 (stdout unless `file` is given)."""
        if not self.root:
            return
        file = file or sys.stdout
        if self.bar is not None:
            self.bar.write(" ".join(map(str, parts)), file=file)
            file.flush()
        else:
            print(*parts, file=file, flush=True)

    def start(self, total: int, description: str) -> None:
        """Show a bar of `total` steps (no-op where there is no bar)."""
        stream = _progress_stream() if self.progress else None
        if stream is None:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, desc=description, file=stream, leave=False, unit="step")

    def step(self, label: str = "") -> None:
        """Advance the bar by one step; `label` says what was just measured."""
        if self.bar is not None:
            if label:
                self.bar.set_postfix_str(label, refresh=False)
            self.bar.update()

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def write_outputs(
    args, rows: list[dict], metadata: dict, fields=None, extra: dict | None = None
) -> None:
    """Write the raw rows (and metadata, for JSON) to ``--json`` / ``--csv``, and draw them
    into ``--plot`` (see :func:`~zcoll.bench.plotting.save_plot`), where requested.

    `fields` are the CSV columns (default: the keys of the first row); `extra` adds top-level
    keys to the JSON document besides ``metadata`` and ``results``. Call it on one rank only.
    """
    if fields is None:
        fields = list(rows[0]) if rows else []
    document = {"metadata": metadata, "results": rows, **(extra or {})}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    if getattr(args, "plot", None):
        from .plotting import save_plot

        save_plot(document, args.plot)
