"""What ``python -m zcoll.tune`` and ``python -m zcoll.bench`` share: byte sizes (parsing and
formatting), OSU-style iteration counts, the warm timing loop and its time budget, the node
layout, and rank 0's reporter with its progress bar.

Kept out of :mod:`zcoll.bench` so that the tuner does not import the benchmark package.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Callable

import numpy as np
from mpi4py import MPI

from . import _node, _settings

__all__ = [
    "KIB",
    "MIB",
    "MIN_ITERATIONS",
    "REWRITE",
    "Reporter",
    "after_rewrite",
    "budget_iterations",
    "default_iterations",
    "format_size",
    "measure",
    "node_layout",
    "parse_choices",
    "parse_size",
    "parse_sizes",
    "powers_of_two",
]

KIB = 1024
MIB = 1024 * KIB
MIN_ITERATIONS = 10  # the time budget never cuts a warm measurement below this
MAX_ITERATIONS = 10_000  # default for tiny exchanges ...
FULL_COUNT_BYTES = 40 * KIB  # ... while a rank's P * block is at most this; fewer above
LARGE_ITERATIONS = 50  # default floor, reached near P * block = 8 MiB (1 MiB blocks at P=8)

_SIZE = re.compile(r"\s*(\d+)\s*([kmg]?)(i?b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "K": KIB, "M": MIB, "G": 1024 * MIB}


# --- sizes and iteration counts ----------------------------------------------------------------


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


#: The name under which a fresh-input sweep times the send buffer's rewrite alone, to subtract
#: it from every method's time.
REWRITE = "rewrite"


def after_rewrite(send, source, fn: Callable[[], object]) -> Callable[[], None]:
    """`fn` with `send` rewritten from `source` first: a reduction on input just written, as a
    program makes it. In a loop over one unchanged buffer, the algorithms that read peers in
    place would find those lines still in their caches."""

    def call() -> None:
        np.copyto(send, source)
        fn()

    return call


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


# --- the node and rank 0's voice ---------------------------------------------------------------


def node_layout(comm: MPI.Comm) -> tuple[int, int, float]:
    """Return (number of nodes, CPUs per node, ranks per CPU on the busiest machine; nodes of
    one machine share its CPUs); collective."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    leader = node.rank == 0
    node.Free()
    cpus = _settings.machine()["cpus"].value
    nodes = comm.allreduce(int(leader))
    return nodes, cpus, comm.allreduce(_node.machine_ranks(comm) / cpus, op=MPI.MAX)


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
