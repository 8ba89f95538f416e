"""``alltoallv``, ``allgatherv`` and the neighbourhood collectives against the MPI library's.

For every nominal block size and every method -- mpi4py's ``comm.Alltoallv`` /
``comm.Allgatherv`` / ``comm.Neighbor_alltoall`` ... on plain NumPy arrays, then zcoll with
each (block order, copy mode) on arena arrays (``--buffers``: on plain or shared-heap NumPy
arrays, or on several kinds side by side, as ``alltoall`` does) -- the latency of a call, warm
(OSU) or cold (TPDS'18 Fig. 9), timed as ``alltoall`` is
(:class:`~zcoll.bench.collectives.Timer`).

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
blocks of at most 16 KiB and over larger ones. With several kinds of ``--buffers`` every method
runs on each (``NAME@KIND``), the ``auto`` column is the first kind's, and the summary adds a
line per kind as ``alltoall``'s does (:func:`~zcoll.bench.collectives.speedups_by_buffers`).
"""

from __future__ import annotations

import argparse
import functools
import math
import socket
import sys
from collections.abc import Sequence
from dataclasses import replace

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
    BLOCK_RANGES,
    IRREGULAR_AGGREGATION_METHODS,
    BlockCase,
    Call,
    Timer,
    add_size_options,
    add_timing_options,
    aggregated_call,
    best_order,
    buffers_summary_line,
    measure_block,
    parse_copy_modes,
    parse_orders,
    speedups_by_buffers,
    zcoll_methods,
)
from .common import (
    KIB,
    MIB,
    MPI_METHOD,
    Reporter,
    add_buffers_option,
    command_line,
    common_metadata,
    format_size,
    geomean,
    kind_name,
    make_buffers,
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

    zcoll's buffers are of the kinds its `methods` name (arena, numpy, heap: see
    :func:`~zcoll.bench.common.make_buffers`), a send and a receive array of each; MPI gets
    plain NumPy arrays; all hold the same data. Buffer specifications are mpi4py's
    (``[array, (counts, displs)]``), in bytes. An ``alltoall``
    :class:`~zcoll.bench.collectives.BlockCase` in all but its buffers and calls, timed and
    checked as one (``check``: every method's receive buffer, first set to the complement of
    MPI's result, must equal MPI's bit for bit; the blocks tile the receive buffers, so every
    byte must be written).
    """

    def __init__(self, comm, collective: str, block: int, methods, args, rng) -> None:
        self.comm, self.collective, self.block = comm, collective, block
        self.plans = {}  # no persistent plans here
        self.requests = []
        self.mpi_persistent_missing = None
        send_counts, recv_counts = call_counts(
            comm, collective, block, args.spread, args.zeros, args.seed
        )
        nrecv = sum(recv_counts)
        send_shape, recv_shape = buffer_shapes(collective, block, send_counts, recv_counts)
        data = rng.integers(0, 256, size=send_shape, dtype=np.uint8)
        self.msend = np.array(data)
        self.mrecv = np.zeros(recv_shape, np.uint8)
        self.received_bytes = comm.allreduce(nrecv)
        send_spec = (send_counts, displacements(send_counts))
        recv_spec = (recv_counts, displacements(recv_counts))
        specify = functools.partial(_specs, collective, send_spec, recv_spec)
        msend, mrecv = specify(self.msend, self.mrecv)
        mpi = functools.partial(getattr(comm, MPI_NAMES[collective]), msend, mrecv)
        self.calls = {MPI_METHOD: Call(mpi, (self.msend, self.mrecv), self.mrecv)}
        #: Kind -> (send, receive) arrays of zcoll's methods on that kind.
        self.zbuffers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        specs = {}
        for kind in dict.fromkeys(m.buffers for m in methods):
            zsend, zrecv = make_buffers(comm, kind, send_shape, recv_shape)
            zsend[...] = data
            self.zbuffers[kind] = (zsend, zrecv)
            specs[kind] = specify(zsend, zrecv)
        fn = getattr(zcoll, collective)
        for m in methods:
            zsend, zrecv = self.zbuffers[m.buffers]
            call = _zcoll_call(fn, comm, *specs[m.buffers], m.order, m.copy)
            if m.aggregate is not None:  # --between-nodes: forced one way
                call = aggregated_call(call, m.aggregate, comm, None)
            self.calls[m.name] = Call(call, (zsend, zrecv), zrecv)


def call_counts(
    comm, collective: str, block: int, spread=DEFAULT_SPREAD, zeros=DEFAULT_ZEROS, seed=DEFAULT_SEED
) -> tuple[list[int], list[int]]:
    """This rank's send and receive counts (bytes, one per block) of `collective` on `comm`
    (Cartesian for the neighbourhood calls) for the nominal `block`: uneven (draw_counts) for
    the v-variants, `block` each for the others."""
    size, rank = comm.size, comm.rank
    draw = functools.partial(draw_counts, block, spread=spread, zeros=zeros, seed=seed)
    neighbours = _neighbours(comm) if collective in NEIGHBOR_COMMANDS else []
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
    return [int(c) for c in send_counts], [int(c) for c in recv_counts]


def buffer_shapes(
    collective: str, block: int, send_counts: list[int], recv_counts: list[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The send and receive arrays' shapes: arrays of blocks for neighbor_alltoall and
    neighbor_allgather, packed 1-D arrays of the counts for the v-variants."""
    if collective == NEIGHBOR_ALLTOALL:
        return (len(send_counts), block), (len(recv_counts), block)
    if collective == NEIGHBOR_ALLGATHER:
        return (block,), (len(recv_counts), block)
    return (sum(send_counts),), (sum(recv_counts),)


def _specs(collective: str, send_spec, recv_spec, send, recv) -> tuple[object, object]:
    """The send and receive arguments of `collective` on `send` and `recv`: the arrays
    (neighbor_alltoall, neighbor_allgather), or mpi4py's buffer specifications ``[array,
    (counts, displs)]`` with the packed counts and displacements of `send_spec`/`recv_spec`."""
    if collective in (ALLGATHERV, NEIGHBOR_ALLGATHERV):  # one send block, counts in recv
        return send, [recv, recv_spec]
    if collective in (NEIGHBOR_ALLTOALL, NEIGHBOR_ALLGATHER):  # arrays of blocks
        return send, recv
    return [send, send_spec], [recv, recv_spec]


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


def _auto_width(auto: str) -> int:
    return max(10, len(auto) + 6)  # "MPI/" + auto + 2


def table_header(names: Sequence[str], auto: str = AUTO) -> str:
    """Column titles: latencies in µs, then the fastest zcoll method and the speedups (`auto`:
    the method of the last column, ``auto`` or with several kinds ``auto@KIND``)."""
    width = _width(names)
    titles = "".join(f"{name:>{width}}" for name in names)
    return (
        f"{'block':>9}{'MPI (us)':>11}{titles}{'best':>{width}}{'MPI/best':>10}"
        f"{'MPI/' + auto:>{_auto_width(auto)}}"
    )


def table_row(
    block: int, latencies: dict[str, float], names: Sequence[str], auto: str = AUTO
) -> str:
    width = _width(names)
    best = best_order(latencies)
    cells = "".join(f"{latencies[name]:{width}.2f}" for name in names)
    mpi = latencies[MPI_METHOD]
    over_auto = times(mpi / latencies[auto]) if auto in latencies else "n/a"
    return (
        f"{format_size(block):>9}{mpi:11.2f}{cells}{best:>{width}}"
        f"{times(mpi / latencies[best]):>10}{over_auto:>{_auto_width(auto)}}"
    )


def summarise(by_block: dict[int, dict[str, float]], auto: str = AUTO) -> dict[str, float | None]:
    """Geometric means of MPI / fastest zcoll method (``speedup_*``) and of MPI / `auto`
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
            by_block[b][MPI_METHOD] / by_block[b][auto] for b in blocks if auto in by_block[b]
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
        # They force a path of the call rather than time a kind of buffer: on the first kind.
        added = (replace(m, buffers=args.buffers[0]) for m in IRREGULAR_AGGREGATION_METHODS)
        args.methods = [*args.methods, *added]
    names = [m.name for m in args.methods]
    auto = kind_name(AUTO, args.buffers[0], args.buffers)  # the table's MPI/auto: first kind
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
    report(table_header(names, auto))
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
            report(table_row(block, by_block[block], names, auto))
    finally:
        report.close()
    summary = summarise(by_block, auto)
    small, large = f"blocks <= {format_size(SMALL_BLOCKS)}", f"> {format_size(SMALL_BLOCKS)}"
    report(
        f"geomean speedup over MPI of the best method: {small}: "
        f"{times(summary['speedup_small'])}, {large}: {times(summary['speedup_large'])}"
    )
    if auto in names:
        report(
            f"geomean speedup over MPI of {auto}: {small}: "
            f"{times(summary['auto_speedup_small'])}, {large}: "
            f"{times(summary['auto_speedup_large'])}"
        )
    by_buffers = speedups_by_buffers(by_block, args.methods)
    if len(args.buffers) > 1:
        for kind, kind_speedups in by_buffers.items():
            report(buffers_summary_line(kind, kind_speedups, BLOCK_RANGES))
    report(where(comm, layout))
    report(f"MPI library: {mpi_library()}")
    if comm.rank == 0:
        metadata = {
            "collective": collective,
            **common_metadata(comm, args, layout, now, command),
            "bench_method": args.method,
            "mpi_call": mpi_call,
            "orders": list(args.orders),
            "buffers": list(args.buffers),
            "copy_modes": list(args.copies),
            "topology": topology,
            "periodic": topology is not None,
            "spread": list(args.spread) if uneven else None,
            "zeros": args.zeros if uneven else None,
            "seed": args.seed,
            "small_blocks": SMALL_BLOCKS,
            **{f"geomean_{key}": value for key, value in summary.items()},
            "speedup_by_buffers": by_buffers,
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
    add_buffers_option(parser)
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
    args.methods = zcoll_methods(args.orders, args.copies, buffers=args.buffers)
