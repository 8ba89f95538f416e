"""Latency of zcoll's collectives against MPI's, in the style of the OSU micro-benchmarks.

Run it under MPI::

    mpiexec -n 8 python -m zcoll.bench alltoall
    mpiexec -n 8 python -m zcoll.bench allgather --sizes 8,4K,1M --orders row,hilbert --check
    mpiexec -n 8 python -m zcoll.bench alltoall --max 64K --json a2a.json --csv a2a.csv

For every block size (bytes per block, i.e. per pair of ranks) and every method -- the MPI
library's ``comm.Alltoall`` / ``comm.Allgather`` on plain NumPy arrays, then zcoll with each
block order on arena arrays -- every rank runs warm-up calls, meets the others at a barrier and
times a loop of calls with ``MPI.Wtime``; the latency reported is the largest per-call average
over the ranks. Iteration counts shrink as blocks grow and are capped by a time budget per
measurement, so a whole sweep stays short. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import json
import math
import os
import re
import shlex
import socket
import sys
from typing import Callable

import mpi4py
import numpy as np
from mpi4py import MPI

import zcoll

__all__ = ["main"]

KIB = 1024
MIB = 1024 * KIB
MPI_METHOD = "MPI"
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
        calls[order] = functools.partial(zcoll_fn, comm, zsend, zrecv, order=order)

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
    """Return the fastest zcoll method in `latencies` (method -> µs, MPI included)."""
    return min((m for m in latencies if m != MPI_METHOD), key=latencies.__getitem__)


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


def write_outputs(args, rows: list[dict], metadata: dict) -> None:
    """Write the raw rows (and metadata, for JSON) to ``--json`` / ``--csv`` if requested."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"metadata": metadata, "results": rows}, f, indent=2)
            f.write("\n")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=_FIELDS)
            writer.writeheader()
            writer.writerows(rows)


# --- subcommands -------------------------------------------------------------------------------


def run_collective(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """Sweep block sizes and orders for ``args.command`` (alltoall or allgather) and report.

    Collective over `comm`. Returns 0, or 1 (on every rank) if ``--check`` found a difference.
    """
    collective, root = args.command, comm.rank == 0
    nodes, cpus, oversubscription = node_layout(comm)
    library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0].strip()
    now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    command = shlex.join(["python", "-m", "zcoll.bench", *args.argv])
    crowded = f", {oversubscription:g} ranks per CPU" if oversubscription > 1 else ""
    say = functools.partial(print, flush=True) if root else lambda *a, **k: None

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

    speedups = geomean_speedups(by_block)
    say(
        f"geomean speedup of best order over MPI: blocks <= {format_size(SMALL_BLOCKS)}: "
        f"{_times(speedups['small'])}, blocks >= {format_size(LARGE_BLOCKS)}: "
        f"{_times(speedups['large'])}"
    )
    where = f"{_plural(comm.size, 'rank')} on {_plural(nodes, 'node')}"
    say(f"P = {where}, {cpus} CPUs per node{crowded}")
    say(f"MPI library: {library}")
    if root:
        metadata = {
            "collective": collective,
            "P": comm.size,
            "nodes": nodes,
            "cpus_per_node": cpus,
            "ranks_per_cpu": oversubscription,
            "date": now,
            "host": socket.gethostname(),
            "command": command,
            "mpi_library": library,
            "versions": {
                "zcoll": zcoll.__version__,
                "mpi4py": mpi4py.__version__,
                "numpy": np.__version__,
                "python": sys.version.split()[0],
            },
            "environment": {k: v for k, v in os.environ.items() if k.startswith("ZCOLL_")},
            "time_budget_s": args.time_budget,
            "checked": args.check,
            "geomean_speedup_small": speedups["small"],
            "geomean_speedup_large": speedups["large"],
        }
        write_outputs(args, rows, metadata)
    return 0


#: Subcommand name -> (function(comm, args) -> exit status, help). Add e.g. "copy" or "fft" here.
COMMANDS: dict[str, tuple[Callable[[MPI.Comm, argparse.Namespace], int], str]] = {
    "alltoall": (run_collective, "zcoll.alltoall vs comm.Alltoall"),
    "allgather": (run_collective, "zcoll.allgather vs comm.Allgather"),
}


class _RootParser(argparse.ArgumentParser):
    """An argument parser that prints help and errors on rank 0 only (all ranks still exit)."""

    def _print_message(self, message, file=None):
        if MPI.COMM_WORLD.rank == 0:
            super()._print_message(message, file)


def _parser() -> argparse.ArgumentParser:
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
        "--check", action="store_true", help="first compare each order's result with MPI's"
    )
    common.add_argument("--json", metavar="FILE", help="write raw results and metadata as JSON")
    common.add_argument("--csv", metavar="FILE", help="write raw results as CSV")

    parser = _RootParser(
        prog="python -m zcoll.bench",
        description="OSU-style latency of zcoll collectives against the MPI library's.",
        epilog="Run under MPI, e.g.: mpiexec -n 8 python -m zcoll.bench alltoall",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, text) in COMMANDS.items():
        commands.add_parser(name, parents=[common], help=text, description=text)
    return parser


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
    except SystemExit as exc:
        return int(exc.code or 0)
    args.argv = argv
    function, _ = COMMANDS[args.command]
    return function(MPI.COMM_WORLD, args)


if __name__ == "__main__":
    sys.exit(main())
