"""``crossover``: ``copy="auto"`` against every fixed copy mode and ``comm.Alltoall``, at the
cache boundary.

For each block size -- powers of two from 64 KiB to 16 MiB, and the sizes at which the node's
data (the send and receive buffers of all its ranks, ``2 * ranks per node * P * block``) is 1/2,
3/4, 1, 3/2 and 2 times the last-level cache -- an alltoall on arena buffers (``zcoll.empty``)
with ``copy="temporal"``, ``"streaming"``, ``"hybrid"`` (the default threshold T) and
``"auto"``, and ``comm.Alltoall`` on plain NumPy arrays, all timed in the same run: rounds of
one short timed loop per method (each loop: warm-up calls, barrier, the slowest rank's mean per
call), the methods' sequence rotated from round to round so none always follows the same one.
Each method's fastest loop is its time: other processes on the node's cores only ever add
time, so the fastest of many short loops estimates the speed on a quiet machine; the medians
of the per-round ratios are printed beside as a check. Before the rounds, ``copy="auto"`` runs
long enough to finish its run-time refinement, so what is timed is what it settled on.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _context, _settings
from zcoll._registry import ALLTOALL, AUTO, HYBRID, STREAMING, TEMPORAL

from .common import (
    KIB,
    MIB,
    MPI_METHOD,
    Reporter,
    command_line,
    common_metadata,
    format_size,
    measure,
    median,
    node_layout,
    now_iso,
    parse_sizes,
    powers_of_two,
    where,
)
from .output import write_outputs

__all__ = [
    "BLOCKS",
    "FIXED_MODES",
    "LLC_FRACTIONS",
    "TARGETS",
    "add_options",
    "block_sizes",
    "compare",
    "run_crossover",
]

BLOCKS = tuple(powers_of_two(64 * KIB, 16 * MIB))
LLC_FRACTIONS = (0.5, 0.75, 1.0, 1.5, 2.0)  # node data / LLC
FIXED_MODES = (TEMPORAL, STREAMING, HYBRID)
METHODS = (*FIXED_MODES, AUTO, MPI_METHOD)
ROUNDS = 15
SAMPLE_SECONDS = 0.01  # default target length of one timed loop
WARMUP = 5  # untimed calls before each timed loop (the cache state of the last method fades)
MIN_CALLS = 3  # per timed loop
SETTLE_CALLS = 80  # copy="auto" calls before the rounds: more than its refinement times
# (up to 2 x 16 with ordinary stores, 3 per hybrid threshold: 74 for T = 16 MiB)
BLOCK_GRAIN = 4 * KIB  # LLC-fraction block sizes are rounded down to this
#: Targets of issue 11: auto's speed / the best fixed mode's, and / comm.Alltoall's.
TARGETS = {"best_fixed": 0.95, "mpi": 1.5}
QUICK_SIZES, QUICK_ROUNDS = (64 * KIB, 256 * KIB), 3  # --quick
FIELDS = (
    "collective",
    "P",
    "block_bytes",
    "node_bytes",
    "llc_fraction",
    "method",
    "latency_us",
    "min_us",
    "max_us",
    "iterations",
    "rounds",
)


def parse_fractions(text: str) -> list[float]:
    """Parse a comma-separated list of positive node-data / LLC fractions (``"0.5,1,2"``), or
    ``"none"``."""
    if text.strip().lower() == "none":
        return []
    try:
        values = sorted({float(item) for item in text.split(",") if item.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"fractions must be positive, got {text!r}")
    return values


def node_bytes(block: int, p: int, node_size: int) -> int:
    """What one alltoall reads and writes on a node: every node rank's send and receive."""
    return 2 * node_size * p * block


def block_sizes(
    blocks: Sequence[int], fractions: Sequence[float], p: int, node_size: int, llc: int
) -> list[int]:
    """`blocks`, and for each of `fractions` the block size at which the node's data is that
    fraction of `llc` (rounded down to ``BLOCK_GRAIN``, at least one grain); sorted, unique."""
    per_block = node_bytes(1, p, node_size)
    at_fractions = (
        max(BLOCK_GRAIN, int(f * llc / per_block) // BLOCK_GRAIN * BLOCK_GRAIN) for f in fractions
    )
    return sorted({*blocks, *at_fractions})


@dataclass
class Comparison:
    """One block size's verdict: the fastest fixed mode, auto's speed against it and against
    MPI as the ratio of each method's fastest loop (contention only ever adds time, so a
    method's fastest loop estimates its speed on a quiet machine) and, as a check, as the
    median of the per-round ratios."""

    best_fixed: str
    vs_best: float  # best fixed mode's fastest time / auto's (>= 1: auto as fast)
    vs_mpi: float  # MPI's fastest time / auto's
    vs_best_rounds: float  # median over rounds of best fixed time / auto time
    vs_mpi_rounds: float

    def meets(self) -> bool:
        return self.vs_best >= TARGETS["best_fixed"] and self.vs_mpi >= TARGETS["mpi"]


def _round_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    return median([n / d for n, d in zip(numerators, denominators)])


def compare(seconds: dict[str, list[float]]) -> Comparison:
    """Auto against the fastest fixed mode and MPI, from per-round times (method -> seconds
    per call in each round, rounds aligned)."""
    best = min(FIXED_MODES, key=lambda m: min(seconds[m]))
    auto = min(seconds[AUTO])
    return Comparison(
        best,
        min(seconds[best]) / auto,
        min(seconds[MPI_METHOD]) / auto,
        _round_ratios(seconds[best], seconds[AUTO]),
        _round_ratios(seconds[MPI_METHOD], seconds[AUTO]),
    )


class Case:
    """The buffers and calls of one block size: zcoll on arena arrays, MPI on NumPy arrays."""

    def __init__(self, comm: MPI.Comm, block: int, rng) -> None:
        shape = (comm.size, block)
        self.comm = comm
        self.zsend = zcoll.empty(comm, shape, np.uint8)
        self.zsend[...] = rng.integers(0, 256, size=shape, dtype=np.uint8)
        self.zrecv = zcoll.zeros(comm, shape, np.uint8)
        self.msend, self.mrecv = np.array(self.zsend), np.zeros(shape, np.uint8)

    def call(self, method: str):
        if method == MPI_METHOD:
            return lambda: self.comm.Alltoall(self.msend, self.mrecv)
        return lambda: zcoll.alltoall(self.comm, self.zsend, self.zrecv, copy=method)

    def check(self) -> bool:
        """Every zcoll mode's result equals MPI's on every rank (receive buffer poisoned first)."""
        self.call(MPI_METHOD)()
        ok = True
        for method in (*FIXED_MODES, AUTO):
            np.invert(self.mrecv, out=self.zrecv)
            self.call(method)()
            ok &= bool(np.array_equal(self.zrecv, self.mrecv))
        return bool(self.comm.allreduce(ok, op=MPI.LAND))


def auto_plan(comm: MPI.Comm, block: int) -> str:
    """What copy="auto" settled on for these blocks: ``temporal``, ``hybrid T=64 KiB``, or each
    rank's distinct choice joined by `` / `` (ranks refine on their own); collective."""
    mode, threshold = _context.context(comm).core.auto_copy_plan(block, comm.size * block)
    label = mode if mode != HYBRID else f"{mode} T={format_size(threshold)}"
    labels = list(dict.fromkeys(comm.allgather(label)))
    return " / ".join(labels)


def time_rounds(case: Case, rounds: int, calls: int) -> dict[str, list[float]]:
    """Seconds per call of every method in each of `rounds` rounds; collective."""
    seconds: dict[str, list[float]] = {m: [] for m in METHODS}
    fns = {m: case.call(m) for m in METHODS}
    for r in range(rounds):
        k = r % len(METHODS)
        for method in METHODS[k:] + METHODS[:k]:
            seconds[method].append(measure(fns[method], calls, WARMUP, case.comm))
    return seconds


def calls_per_loop(case: Case, seconds: float) -> int:
    """Calls per timed loop: about `seconds` of the slower of temporal and streaming (the
    slowest mode, in cache and out of it); the same on every rank."""
    per_call = max(measure(case.call(m), 3, 1, case.comm) for m in (TEMPORAL, STREAMING))
    return max(MIN_CALLS, int(seconds / per_call))


def rows_of(comm, block: int, nbytes: int, llc: int, seconds, calls: int) -> list[dict]:
    """The JSON/CSV rows of one block size, one per method."""
    rows = []
    for method, values in seconds.items():
        rows.append(
            {
                "collective": ALLTOALL,
                "P": comm.size,
                "block_bytes": block,
                "node_bytes": nbytes,
                "llc_fraction": nbytes / llc,
                "method": method,
                "latency_us": median(values) * 1e6,
                "min_us": min(values) * 1e6,
                "max_us": max(values) * 1e6,
                "iterations": calls,
                "rounds": len(values),
            }
        )
    return rows


def table_header() -> list[str]:
    modes = "".join(f"{m:>11}" for m in METHODS)
    return [
        "# us per call, each method's fastest of the rounds; auto/best = the fastest fixed",
        "# mode's time / auto's, auto/MPI = comm.Alltoall's / auto's, then in brackets the",
        "# median of the per-round ratios. Targets: auto/best >= "
        f"{TARGETS['best_fixed']}, auto/MPI >= {TARGETS['mpi']}; '*' marks a miss.",
        f"{'block':>9}{'node/LLC':>9}{modes}  {'best':<10}{'auto/best':>14}{'auto/MPI':>14}"
        "  copy='auto' uses",
    ]


def table_row(block: int, fraction: float, seconds, c: Comparison, plan: str) -> str:
    cells = "".join(f"{min(seconds[m]) * 1e6:11.1f}" for m in METHODS)
    best = f"{c.vs_best:.2f} [{c.vs_best_rounds:.2f}]"
    mpi = f"{c.vs_mpi:.2f} [{c.vs_mpi_rounds:.2f}]"
    mark = " " if c.meets() else "*"
    return (
        f"{format_size(block):>9}{fraction:9.2f}{cells}  {c.best_fixed:<10}{best:>14}{mpi:>14}"
        f" {mark}{plan}"
    )


def run_crossover(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """Sweep the block sizes; print one row per size and the targets met. Collective.

    Returns 0, or 1 (on every rank) if a zcoll result differed from MPI's.
    """
    layout = node_layout(comm)
    now, command = now_iso(), command_line(args)
    node_size = _context.context(comm).node_size
    llc = _settings.machine()["llc_bytes"].value
    sizes = block_sizes(args.sizes, args.fractions, comm.size, node_size, llc)
    say = Reporter(comm, args.progress)
    say(f"# zcoll.bench crossover | {now} | host {socket.gethostname()} | {command}")
    size = f"node data = 2 x {node_size} x P x block"
    say(f"# alltoall, P={comm.size}, LLC {format_size(llc)}; {size}")
    for line in table_header():
        say(line)
    rng = np.random.default_rng(comm.rank)
    rows: list[dict] = []
    summary: list[dict] = []
    say.start(len(sizes), "crossover")
    try:
        for block in sizes:
            case = Case(comm, block, rng)
            auto = case.call(AUTO)
            for _ in range(SETTLE_CALLS):
                auto()
            if args.check and not case.check():
                say.close()
                say(
                    f"zcoll.bench crossover: a result differs from MPI's at {format_size(block)}",
                    file=sys.stderr,
                )
                return 1
            calls = calls_per_loop(case, args.time_budget)
            seconds = time_rounds(case, args.rounds, calls)
            nbytes = node_bytes(block, comm.size, node_size)
            verdict, plan = compare(seconds), auto_plan(comm, block)
            rows += rows_of(comm, block, nbytes, llc, seconds, calls)
            summary.append(
                {
                    "block_bytes": block,
                    "llc_fraction": nbytes / llc,
                    "auto_copy": plan,
                    "best_fixed": verdict.best_fixed,
                    "auto_vs_best": verdict.vs_best,
                    "auto_vs_mpi": verdict.vs_mpi,
                    "auto_vs_best_rounds": verdict.vs_best_rounds,
                    "auto_vs_mpi_rounds": verdict.vs_mpi_rounds,
                    "meets_targets": verdict.meets(),
                }
            )
            say.step(format_size(block))
            say(table_row(block, nbytes / llc, seconds, verdict, plan))
            del case
    finally:
        say.close()
    met = sum(s["meets_targets"] for s in summary)
    say(f"targets met at {met} of {len(summary)} block sizes")
    say(where(comm, layout))
    if comm.rank == 0:
        metadata = {
            "collective": ALLTOALL,
            "benchmark": "crossover",
            **common_metadata(comm, args, layout, now, command),
            "llc_bytes": llc,
            "node_size": node_size,
            "rounds": args.rounds,
            "targets": TARGETS,
        }
        write_outputs(args, rows, metadata, FIELDS, {"summary": summary})
    return 0


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``crossover`` (output options are added elsewhere)."""
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=list(BLOCKS),
        help="block sizes besides the LLC fractions' (default: powers of two, 64 KiB to 16 MiB)",
    )
    parser.add_argument(
        "--fractions",
        type=parse_fractions,
        default=list(LLC_FRACTIONS),
        metavar="F,F,...",
        help="also the block sizes at which the node's data is these fractions of the LLC "
        f"(default {','.join(map(str, LLC_FRACTIONS))}; 'none' for no extra size)",
    )
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"timed rounds per block size (default {ROUNDS})"
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=SAMPLE_SECONDS,
        metavar="SECONDS",
        help=f"length of one timed loop (default {SAMPLE_SECONDS:g})",
    )
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="do not compare each mode's result with MPI's first",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="64 KiB and 256 KiB blocks only, 3 rounds (seconds; for tests)",
    )


def finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Apply ``--quick`` and check what argparse cannot."""
    if args.quick:
        args.sizes, args.fractions, args.rounds = list(QUICK_SIZES), [], QUICK_ROUNDS
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.time_budget <= 0:
        parser.error("--time-budget must be positive")
