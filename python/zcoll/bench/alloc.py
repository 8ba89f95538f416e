"""``alloc``: allocate+free of a NumPy array with the shared heap against NumPy's default
allocator, 64 B to 1 GiB, on every rank at once (rank 0 reports the medians over ranks).

Each measurement alternates the two allocators in rounds (the fastest loop of each counts), so
drift on a shared machine hits both alike. ``--touch`` also writes one byte per page, the cost
a program pays when it fills the array (first-touch page faults, the same for both).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import zcoll

from .common import KIB, MIB, format_size, parse_sizes

__all__ = ["ALLOC_SIZES", "add_options", "run_alloc"]

#: Default sizes: 64 B to 1 GiB in steps of 16.
ALLOC_SIZES = tuple(64 * 16**k for k in range(7))
ALLOC_ROUNDS = 5
PAGE = 4 * KIB


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=list(ALLOC_SIZES),
        help="bytes per array (default: 64 B to 1 GiB in steps of 16)",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=0.05,
        metavar="SECONDS",
        help="timed allocations per loop, in seconds (default 0.05)",
    )
    parser.add_argument("--touch", action="store_true", help="write one byte per page, too")


def _loop(nbytes: int, touch: bool, iterations: int) -> float:
    """Seconds per allocate(+touch)+free of `nbytes`, over `iterations`."""
    start = time.perf_counter()
    for _ in range(iterations):
        a = np.empty(nbytes, np.uint8)
        if touch:
            a[::PAGE] = 1
        del a
    return (time.perf_counter() - start) / iterations


def _iterations(nbytes: int, touch: bool, budget: float) -> int:
    once = _loop(nbytes, touch, 1)
    return max(1, min(100_000, int(budget / max(once, 1e-7))))


def measure(nbytes: int, touch: bool, budget: float) -> tuple[float, float]:
    """(default, heap) seconds per cycle: the fastest of ALLOC_ROUNDS alternating loops."""
    n = _iterations(nbytes, touch, budget)
    best = [float("inf"), float("inf")]
    for _ in range(ALLOC_ROUNDS):
        with zcoll.use_shared_heap(False):
            best[0] = min(best[0], _loop(nbytes, touch, n))
        with zcoll.use_shared_heap():
            best[1] = min(best[1], _loop(nbytes, touch, n))
    return best[0], best[1]


def run_alloc(comm: MPI.Comm, args: argparse.Namespace) -> int:
    rows = []
    for nbytes in args.sizes:
        comm.Barrier()
        default, heap = measure(nbytes, args.touch, args.time_budget)
        both = comm.gather((default, heap), root=0)
        if both is not None:
            d = float(np.median([x[0] for x in both]))
            h = float(np.median([x[1] for x in both]))
            rows.append((nbytes, d, h))
    if comm.rank == 0:
        what = "allocate + touch + free" if args.touch else "allocate + free"
        print(f"# {what} of np.empty(n, uint8), {comm.size} rank(s) at once; median over ranks")
        print(f"{'bytes':>10} {'default us':>11} {'heap us':>9} {'heap/default':>13}")
        for nbytes, d, h in rows:
            print(f"{format_size(nbytes):>10} {d * 1e6:11.3f} {h * 1e6:9.3f} {h / d:13.2f}")
        print(f"# sizes >= {format_size(MIB)}: a segment each (memfd; up to 32 MiB kept for reuse)")
    return 0
