"""``alltoallv``, ``allgatherv`` and the neighbourhood collectives against the MPI library's.

For every nominal block size and every method -- mpi4py's ``comm.Alltoallv`` /
``comm.Allgatherv`` / ``comm.Neighbor_alltoall`` ... on plain NumPy arrays, then zcoll with
each (block order, copy mode) on arena arrays -- the latency of a call, warm (OSU) or cold
(TPDS'18 Fig. 9), timed as ``alltoall`` is (:class:`~zcoll.bench.collectives.Timer`).

The blocks are uneven, as the ``v`` collectives are for: every count (bytes; the buffers are
``uint8``) is drawn uniformly from ``--spread`` (0.5 to 1.5 times the nominal block by
default), and a ``--zeros`` fraction of them is 0, from a generator seeded by ``--seed`` and
the block size, the same on every rank (so the counts agree between senders and receivers):

* ``alltoallv``: a P x P matrix of counts, entry (i, j) what rank i sends rank j;
* ``allgatherv``: one count per rank;
* ``neighbor_alltoall``, ``neighbor_allgather``: every block the nominal size;
* ``neighbor_alltoallv``: one count per dimension, for the blocks to and from both neighbours
  along it (the faces of a block of a structured grid: edges of different lengths);
* ``neighbor_allgatherv``: one count per rank, what it sends each of its neighbours.

The neighbourhood collectives run on a periodic Cartesian communicator, ``--topology 2d``
(``MPI.Compute_dims(P, 2)``, the default), ``3d``, or explicit dimensions such as ``4x2``:
2 x dims neighbours in MPI's order (per dimension, the negative then the positive one).

The table shows per block size each method's latency, the fastest zcoll method, MPI's
latency over the fastest method's and over ``auto``'s; the summary, their geometric means over
blocks of at most 16 KiB and over larger ones.
"""

from __future__ import annotations

import argparse
import functools
import math
import socket
import sys
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _context
from zcoll._registry import (
    ALLGATHERV,
    ALLTOALLV,
    AUTO,
    NEIGHBOR_ALLGATHER,
    NEIGHBOR_ALLGATHERV,
    NEIGHBOR_ALLTOALL,
    NEIGHBOR_ALLTOALLV,
)

from . import collectives
from .collectives import (
    ALL_ORDERS,
    IRREGULAR_AGGREGATION_METHODS,
    BlockCase,
    Call,
    Timer,
    add_size_options,
    add_timing_options,
    aggregated_call,
    best_order,
    measure_block,
    parse_copy_modes,
    parse_orders,
    zcoll_methods,
)
from .common import (
    KIB,
    MIB,
    MPI_METHOD,
    Reporter,
    command_line,
    common_metadata,
    format_size,
    geomean,
    mpi_library,
    node_layout,
    now_iso,
    powers_of_two,
    times,
    where,
)
from .output import write_outputs

__all__ = [
    "FIELDS",
    "NEIGHBOR_COMMANDS",
    "VCOLLECTIVE_COMMANDS",
    "VCase",
    "add_vcollective_options",
    "cartesian_dims",
    "draw_counts",
    "finish_vcollective_args",
    "run_vcollective",
]

#: The subcommands of this module: the irregular collectives, then the neighbourhood ones.
NEIGHBOR_COMMANDS = (NEIGHBOR_ALLTOALL, NEIGHBOR_ALLGATHER, NEIGHBOR_ALLTOALLV, NEIGHBOR_ALLGATHERV)
VCOLLECTIVE_COMMANDS = (ALLTOALLV, ALLGATHERV, *NEIGHBOR_COMMANDS)
SMALL_BLOCKS = 16 * KIB  # summary: geometric means over blocks <= this, and over larger ones
DEFAULT_SPREAD = (0.5, 1.5)
DEFAULT_ZEROS = 0.1
DEFAULT_SEED = 2018
#: The JSON/CSV columns: alltoall's, then the bytes all ranks receive per call, and the
#: neighbourhood collectives' process grid ("4x2"; None for alltoallv, allgatherv).
FIELDS = (*collectives.FIELDS, "received_bytes", "topology")
MPI_NAMES = {
    ALLTOALLV: "Alltoallv",
    ALLGATHERV: "Allgatherv",
    NEIGHBOR_ALLTOALL: "Neighbor_alltoall",
    NEIGHBOR_ALLGATHER: "Neighbor_allgather",
    NEIGHBOR_ALLTOALLV: "Neighbor_alltoallv",
    NEIGHBOR_ALLGATHERV: "Neighbor_allgatherv",
}


def draw_counts(block: int, shape, spread=DEFAULT_SPREAD, zeros=DEFAULT_ZEROS, seed=DEFAULT_SEED):
    """Uneven counts around `block`: uniform integers in ``[spread[0] * block, spread[1] *
    block]`` (rounded inwards, at least 0), each 0 with probability `zeros`. The generator is
    seeded by (`seed`, `block`): the same array on every rank."""
    rng = np.random.default_rng([seed, block])
    low = max(0, math.ceil(spread[0] * block))
    high = max(low, math.floor(spread[1] * block))
    counts = rng.integers(low, high + 1, size=shape, dtype=np.int64)
    counts[rng.random(shape) < zeros] = 0
    return counts


def displacements(counts) -> list[int]:
    """Packed displacements: the exclusive prefix sum of `counts`."""
    return [int(x) for x in np.concatenate(([0], np.cumsum(counts)[:-1]))] if len(counts) else []


def cartesian_dims(nranks: int, topology: str) -> list[int]:
    """The process grid of ``--topology``: ``2d``/``3d`` (``MPI.Compute_dims``) or ``AxB...``."""
    if topology in ("2d", "3d"):
        return list(MPI.Compute_dims(nranks, int(topology[0])))
    dims = [int(d) for d in topology.split("x")]
    if math.prod(dims) != nranks:
        raise ValueError(f"--topology {topology} has {math.prod(dims)} ranks, not {nranks}")
    return dims


def parse_topology(text: str) -> str:
    """Check ``--topology``: 2d, 3d, or dimensions such as 4x2 (their product is checked later,
    against the number of ranks)."""
    text = text.strip().lower()
    if text in ("2d", "3d"):
        return text
    try:
        dims = [int(d) for d in text.split("x")]
    except ValueError:
        dims = []
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"not a topology: {text!r} (2d, 3d or e.g. 4x2)")
    return text


def _parse_spread(text: str) -> tuple[float, float]:
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not LOW,HIGH: {text!r}") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"need 0 <= LOW <= HIGH: {text!r}")
    return low, high


def _zcoll_call(fn, comm, send, recv, order: str, copy: str):
    """`fn(comm, send, recv, order=, copy=)` as a user writes it (a C partial when both are
    "auto"; see :func:`zcoll.bench.collectives._plain_call`)."""
    if order == AUTO and copy == AUTO:
        return functools.partial(fn, comm, send, recv)
    return lambda: fn(comm, send, recv, order=order, copy=copy)


class VCase(BlockCase):
    """The buffers and calls of every method for one collective and nominal block size.

    zcoll's buffers live in the node's arena, each rank filling its own; MPI gets plain NumPy
    arrays with the same data. Buffer specifications are mpi4py's (``[array, (counts,
    displs)]``), in bytes. An ``alltoall`` :class:`~zcoll.bench.collectives.BlockCase` in all
    but its buffers and calls, timed and checked as one (``check``: every method's receive
    buffer, first set to the complement of MPI's result, must equal MPI's bit for bit; the
    blocks tile the receive buffers, so every byte must be written).
    """

    def __init__(self, comm, collective: str, block: int, methods, args, rng) -> None:
        self.comm, self.collective, self.block = comm, collective, block
        self.plans = {}  # no persistent plans here
        self.requests = []
        self.mpi_persistent_missing = None
        size, rank = comm.size, comm.rank
        draw = functools.partial(
            draw_counts, block, spread=args.spread, zeros=args.zeros, seed=args.seed
        )
        neighbours = _neighbours(comm) if collective in NEIGHBOR_COMMANDS else []
        regular = collective in (NEIGHBOR_ALLTOALL, NEIGHBOR_ALLGATHER)
        if collective == ALLTOALLV:
            matrix = draw((size, size))
            send_counts, recv_counts = matrix[rank], matrix[:, rank]
        elif collective == ALLGATHERV:
            per_rank = draw(size)
            send_counts, recv_counts = per_rank[rank : rank + 1], per_rank
        elif collective == NEIGHBOR_ALLTOALL:
            send_counts = recv_counts = np.full(len(neighbours), block)
        elif collective == NEIGHBOR_ALLGATHER:
            send_counts, recv_counts = np.array([block]), np.full(len(neighbours), block)
        elif collective == NEIGHBOR_ALLTOALLV:
            per_dim = draw(len(neighbours) // 2)
            send_counts = recv_counts = np.repeat(per_dim, 2)
        else:  # NEIGHBOR_ALLGATHERV
            per_rank = draw(size)
            send_counts = per_rank[rank : rank + 1]
            recv_counts = np.array([per_rank[r] for r in neighbours], np.int64)
        send_counts = [int(c) for c in send_counts]
        recv_counts = [int(c) for c in recv_counts]
        nsend, nrecv = sum(send_counts), sum(recv_counts)
        if regular:  # neighbor_alltoall / neighbor_allgather: arrays of blocks
            send_shape = (len(neighbours), block) if collective == NEIGHBOR_ALLTOALL else (block,)
            recv_shape: tuple[int, ...] = (len(neighbours), block)
        else:
            send_shape, recv_shape = (nsend,), (nrecv,)
        self.zsend = zcoll.empty(comm, send_shape, np.uint8)
        self.zsend[...] = rng.integers(0, 256, size=send_shape, dtype=np.uint8)
        self.zrecv = zcoll.zeros(comm, recv_shape, np.uint8)
        self.msend = np.array(self.zsend)
        self.mrecv = np.zeros(recv_shape, np.uint8)
        self.received_bytes = comm.allreduce(nrecv)
        zsend: object = self.zsend  # the arrays, or buffer specifications [array, (c, d)]
        zrecv: object = self.zrecv
        msend: object = self.msend
        mrecv: object = self.mrecv
        if collective in (ALLGATHERV, NEIGHBOR_ALLGATHERV):  # one send block, counts in recv
            recv_spec = (recv_counts, displacements(recv_counts))
            zrecv, mrecv = [self.zrecv, recv_spec], [self.mrecv, recv_spec]
        elif not regular:
            send_spec = (send_counts, displacements(send_counts))
            recv_spec = (recv_counts, displacements(recv_counts))
            zsend, zrecv = [self.zsend, send_spec], [self.zrecv, recv_spec]
            msend, mrecv = [self.msend, send_spec], [self.mrecv, recv_spec]
        mpi = functools.partial(getattr(comm, MPI_NAMES[collective]), msend, mrecv)
        self.calls = {MPI_METHOD: Call(mpi, (self.msend, self.mrecv), self.mrecv)}
        fn = getattr(zcoll, collective)
        for m in methods:
            call = _zcoll_call(fn, comm, zsend, zrecv, m.order, m.copy)
            if m.aggregate is not None:  # --between-nodes: forced one way
                call = aggregated_call(call, m.aggregate, comm, None)
            self.calls[m.name] = Call(call, (self.zsend, self.zrecv), self.zrecv)


def _neighbours(comm) -> list[int]:
    """The ranks of a Cartesian communicator's neighbours in MPI's order (per dimension, the
    negative then the positive one)."""
    ranks = []
    for axis in range(comm.Get_dim()):
        negative, positive = comm.Shift(axis, 1)
        ranks += [negative, positive]
    return ranks


# --- reporting ---------------------------------------------------------------------------------


def _width(names: Sequence[str]) -> int:
    return max([10, *(len(n) + 2 for n in names)])


def table_header(names: Sequence[str]) -> str:
    """Column titles: latencies in µs, then the fastest zcoll method and the speedups."""
    width = _width(names)
    titles = "".join(f"{name:>{width}}" for name in names)
    return f"{'block':>9}{'MPI (us)':>11}{titles}{'best':>{width}}{'MPI/best':>10}{'MPI/auto':>10}"


def table_row(block: int, latencies: dict[str, float], names: Sequence[str]) -> str:
    width = _width(names)
    best = best_order(latencies)
    cells = "".join(f"{latencies[name]:{width}.2f}" for name in names)
    mpi = latencies[MPI_METHOD]
    auto = times(mpi / latencies[AUTO]) if AUTO in latencies else "n/a"
    return (
        f"{format_size(block):>9}{mpi:11.2f}{cells}{best:>{width}}"
        f"{times(mpi / latencies[best]):>10}{auto:>10}"
    )


def summarise(by_block: dict[int, dict[str, float]]) -> dict[str, float | None]:
    """Geometric means of MPI / fastest zcoll method (``speedup_*``) and of MPI / auto
    (``auto_speedup_*``) over blocks <= 16 KiB (``*_small``) and larger ones (``*_large``);
    None where no block (or no auto) falls in a range."""
    ranges = {"small": lambda b: b <= SMALL_BLOCKS, "large": lambda b: b > SMALL_BLOCKS}
    out: dict[str, float | None] = {}
    for label, within in ranges.items():
        blocks = [b for b in by_block if within(b)]
        out[f"speedup_{label}"] = geomean(
            by_block[b][MPI_METHOD] / by_block[b][best_order(by_block[b])] for b in blocks
        )
        out[f"auto_speedup_{label}"] = geomean(
            by_block[b][MPI_METHOD] / by_block[b][AUTO] for b in blocks if AUTO in by_block[b]
        )
    return out


# --- the subcommand ----------------------------------------------------------------------------


def run_vcollective(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """Sweep nominal block sizes and methods for ``args.command`` and report. Collective over
    `comm`; returns 0, or 1 (on every rank) if ``--check`` found a difference, 2 if
    ``--topology`` does not fit the ranks."""
    collective = args.command
    neighbourhood = collective in NEIGHBOR_COMMANDS
    report = Reporter(comm, args.progress)
    topology = None
    bench_comm = comm
    if neighbourhood:
        try:
            dims = cartesian_dims(comm.size, args.topology)
        except ValueError as exc:
            report(f"zcoll.bench: {exc}", file=sys.stderr)
            return 2
        assert isinstance(comm, MPI.Intracomm), "an intracommunicator"
        bench_comm = comm.Create_cart(dims, periods=[True] * len(dims), reorder=False)
        topology = "x".join(map(str, dims))
    try:
        return _run(comm, bench_comm, args, report, topology)
    finally:
        if bench_comm is not comm:
            bench_comm.Free()


def _run(comm, bench_comm, args, report: Reporter, topology: str | None) -> int:
    collective = args.command
    layout = node_layout(comm)
    now, command = now_iso(), command_line(args)
    timer = Timer(bench_comm, args, layout[2])
    if args.between_nodes and _context.context(comm).multi_node:
        args.methods = [*args.methods, *IRREGULAR_AGGREGATION_METHODS]
    names = [m.name for m in args.methods]
    uneven = collective not in (NEIGHBOR_ALLTOALL, NEIGHBOR_ALLGATHER)
    mpi_call = f"comm.{MPI_NAMES[collective]}"
    report(f"# zcoll.bench {collective} | {now} | host {socket.gethostname()} | {command}")
    report(
        f"# zcoll.{collective} vs {mpi_call}; latency in us per call, {args.method} "
        f"(max over ranks of the mean); P={comm.size}"
    )
    if topology is not None:
        report(f"# periodic Cartesian grid {topology}: {2 * len(topology.split('x'))} neighbours")
    if uneven:
        low, high = args.spread
        report(
            f"# uneven blocks: counts uniform in [{low:g}, {high:g}] x block, {args.zeros:.0%} "
            f"of them 0 (seed {args.seed}); 'block' is the nominal size"
        )
    report(table_header(names))
    rng = np.random.default_rng([args.seed, comm.rank])
    rows: list[dict] = []
    by_block: dict[int, dict[str, float]] = {}
    report.start(len(args.sizes) * (1 + len(names)), collective)
    try:
        for block in args.sizes:
            case = VCase(bench_comm, collective, block, args.methods, args, rng)
            if args.check:
                failed = case.check()
                if failed:
                    report.close()
                    report(
                        f"zcoll.bench: check failed: {collective} with {', '.join(failed)} "
                        f"differs from MPI's result for {format_size(block)} blocks at "
                        f"P={comm.size}",
                        file=sys.stderr,
                    )
                    return 1
            block_rows = measure_block(case, timer, args, report)
            for row in block_rows:
                row["received_bytes"] = case.received_bytes
                row["topology"] = topology
            rows += block_rows
            by_block[block] = {row["method"]: row["latency_us"] for row in block_rows}
            report(table_row(block, by_block[block], names))
    finally:
        report.close()
    summary = summarise(by_block)
    small, large = f"blocks <= {format_size(SMALL_BLOCKS)}", f"> {format_size(SMALL_BLOCKS)}"
    report(
        f"geomean speedup over MPI of the best method: {small}: "
        f"{times(summary['speedup_small'])}, {large}: {times(summary['speedup_large'])}"
    )
    if AUTO in names:
        report(
            f"geomean speedup over MPI of auto: {small}: "
            f"{times(summary['auto_speedup_small'])}, {large}: "
            f"{times(summary['auto_speedup_large'])}"
        )
    report(where(comm, layout))
    report(f"MPI library: {mpi_library()}")
    if comm.rank == 0:
        metadata = {
            "collective": collective,
            **common_metadata(comm, args, layout, now, command),
            "bench_method": args.method,
            "mpi_call": mpi_call,
            "orders": list(args.orders),
            "copy_modes": list(args.copies),
            "topology": topology,
            "periodic": topology is not None,
            "spread": list(args.spread) if uneven else None,
            "zeros": args.zeros if uneven else None,
            "seed": args.seed,
            "small_blocks": SMALL_BLOCKS,
            **{f"geomean_{key}": value for key, value in summary.items()},
        }
        write_outputs(args, rows, metadata, FIELDS)
    return 0


def add_vcollective_options(parser: argparse.ArgumentParser) -> None:
    """The options of the subcommands of this module (output options are added elsewhere)."""
    add_size_options(parser, "nominal block sizes (default: powers of two, 8 B to 1 MiB)")
    parser.add_argument(
        "--orders",
        type=parse_orders,
        default=list(ALL_ORDERS),
        help=f"zcoll block orders to time (default: {','.join(ALL_ORDERS)})",
    )
    parser.add_argument(
        "--copy",
        dest="copies",
        type=parse_copy_modes,
        default=[AUTO],
        metavar="MODE[,MODE...]",
        help="zcoll copy mode(s); several give one method per (order, mode) (default auto)",
    )
    parser.add_argument(
        "--topology",
        type=parse_topology,
        default="2d",
        help="neighbourhood collectives: the periodic Cartesian grid, 2d or 3d "
        "(MPI.Compute_dims) or dimensions such as 4x2 (default 2d)",
    )
    parser.add_argument(
        "--spread",
        type=_parse_spread,
        default=DEFAULT_SPREAD,
        metavar="LOW,HIGH",
        help="uneven counts: uniform in [LOW, HIGH] x block (default 0.5,1.5)",
    )
    parser.add_argument(
        "--zeros",
        type=float,
        default=DEFAULT_ZEROS,
        metavar="FRACTION",
        help=f"uneven counts: the fraction set to 0 (default {DEFAULT_ZEROS:g})",
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help=f"of the counts (default {DEFAULT_SEED})"
    )
    add_timing_options(parser)
    parser.add_argument(
        "--between-nodes",
        action="store_true",
        help="on a communicator spanning several nodes (or virtual nodes: --virtual-node-size), "
        "also time every block between nodes carried in the round's messages (xn:aggregated) "
        "and every one rank to rank (xn:direct); auto follows the size rule per block",
    )
    parser.set_defaults(persistent=False)


def finish_vcollective_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Defaults and checks argparse cannot express (``parser.error`` on misuse)."""
    if args.sizes and (args.min or args.max):
        parser.error("--sizes cannot be combined with --min/--max")
    if not args.sizes:
        args.sizes = powers_of_two(args.min or 8, args.max or MIB)
        if not args.sizes:
            parser.error("no power of two lies between --min and --max")
    if not 0 <= args.zeros <= 1:
        parser.error("--zeros must lie between 0 and 1")
    try:
        cartesian_dims(MPI.COMM_WORLD.size, args.topology)
    except ValueError as exc:
        parser.error(str(exc))
    args.methods = zcoll_methods(args.orders, args.copies)
