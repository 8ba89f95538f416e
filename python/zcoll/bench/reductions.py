"""``allreduce``, ``reduce``, ``bcast`` and ``barrier``: zcoll's reductions against MPI's.

For every message size (float64 elements, sum) and every method -- ``comm.Allreduce`` (or
``Reduce`` / ``Bcast``) on plain NumPy arrays, then zcoll with each algorithm and "auto", its
input in the arena and its result in a plain array, as an mpi4py program has them
(``--buffers``: both plain, or both on the shared heap, or several kinds side by side) -- the
latency of a call, OSU style (warm-up, barrier, timed loop; the largest of the ranks' means).

``allreduce`` also times, in the same run, the references its targets are stated against:
the 8-byte ``zcoll.alltoall`` (P blocks of 8 bytes), and for messages of 64 KiB and more a
``memcpy`` of the message on every rank at once -- the memory-bandwidth bound of an allreduce,
in which each rank must read P tiles of m/P bytes (m in all) and write its m-byte result.
``barrier`` times ``zcoll.barrier`` against ``comm.Barrier``. Every size is measured in
``--rounds`` rounds that take the methods in turn; each method's fastest round counts.

``--method fresh`` rewrites every rank's send buffer before each call, as a program's data
changes between reductions, and subtracts the rewrite's own time (measured in the same
rounds). The warm loop reuses one unchanged send buffer, whose lines stay cached wherever
they were read, and ranks the algorithms otherwise than a program sees them.
"""

from __future__ import annotations

import argparse
import functools
import socket
import sys
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _aggregated, _context, _core
from zcoll._registry import AUTO, TEMPORAL
from zcoll._timing import REWRITE, after_rewrite, parse_size

from .collectives import Call, Timer, add_size_options
from .common import (
    ARENA_BUFFERS,
    KIB,
    KIND_SEPARATOR,
    MEMCPY_METHOD,
    MIB,
    MPI_METHOD,
    NUMPY_BUFFERS,
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
    parse_choices,
    powers_of_two,
    ratio,
    times,
    where,
)
from .output import write_outputs

__all__ = ["REDUCTION_COMMANDS", "add_reduction_options", "finish_reduction_args", "run_reduction"]

#: The subcommands of this module.
REDUCTION_COMMANDS = ("allreduce", "reduce", "bcast", "barrier")
ALL_ALGORITHMS = (*zcoll.REDUCE_ALGORITHMS, AUTO)
BY_SIZE = ("over_memcpy", "pick_over_best")  # summary entries keyed by message size
SMALL = 16 * KIB  # summary: geometric mean over messages <= this ...
LARGE = 64 * KIB  # ... and over messages >= this (and the memcpy bound from here)
ALLTOALL8 = "alltoall8"  # the 8-byte-block zcoll.alltoall reference
METHODS = ("warm", "fresh")
#: Columns of ``--csv``; later ones are only ever appended.
FIELDS = (
    "collective", "P", "block_bytes", "method", "latency_us", "iterations", "warmup", "rounds",
    "buffers",
)  # fmt: skip


def _zcoll_call(command: str, comm, send, recv, algorithm: str):
    """The zcoll call of `command` as a user writes it ("auto": no keyword, a C partial)."""
    if command == "bcast":
        return functools.partial(zcoll.bcast, comm, send)
    fn = getattr(zcoll, command)
    if algorithm == AUTO:
        return functools.partial(fn, comm, send, recv)
    return lambda: fn(comm, send, recv, algorithm=algorithm)


class SizeCase:
    """Buffers and calls of every method for one message size (bytes, a multiple of 8);
    `fresh`: each call rewrites its send buffer first, and the rewrite alone is a method.

    zcoll gets a send and a result array of each kind of `buffers` (arena: the input in the
    arena, the result a plain array, as a user's would be; numpy: both plain; heap: both on
    the shared heap), and each algorithm runs on each kind (``NAME@KIND`` when there are
    several); every kind and MPI's plain arrays hold the same data.
    """

    def __init__(
        self,
        comm,
        command: str,
        nbytes: int,
        algorithms,
        rng,
        fresh: bool = False,
        buffers: Sequence[str] = (ARENA_BUFFERS,),
    ) -> None:
        n = nbytes // 8
        self.comm, self.command, self.nbytes = comm, command, nbytes
        kinds = list(buffers)
        self.source = rng.uniform(-1, 1, n)
        #: Kind -> (send, result) arrays of zcoll's methods on that kind.
        self.zbuffers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for kind in kinds:
            zsend, zrecv = make_buffers(comm, kind, n, n, np.float64, arena_recv=False)
            zsend[:] = self.source
            self.zbuffers[kind] = (zsend, zrecv)
        self.msend = np.array(self.source)
        self.mrecv = np.zeros(n)
        if command == "allreduce":
            mpi = functools.partial(comm.Allreduce, self.msend, self.mrecv, MPI.SUM)
        elif command == "reduce":
            mpi = functools.partial(comm.Reduce, self.msend, self.mrecv, MPI.SUM, 0)
        else:
            mpi = functools.partial(comm.Bcast, self.msend, 0)

        def prepared(send: np.ndarray, fn):
            return after_rewrite(send, self.source, fn) if fresh else fn

        self.calls = {MPI_METHOD: Call(prepared(self.msend, mpi), (self.msend, self.mrecv))}
        #: zcoll's methods and the rewrites: name -> the kind of buffers it runs on.
        self.kind_of: dict[str, str] = {}
        #: With `fresh`: kind -> the name of its rewrite (``rewrite``, ``rewrite@KIND``).
        self.rewrites: dict[str, str] = {}
        names = ["zcoll"] if command == "bcast" else list(algorithms)
        for name in names:
            for kind in kinds:  # the kinds of one algorithm timed one after the other
                zsend, zrecv = self.zbuffers[kind]
                fn = _zcoll_call(command, comm, zsend, zrecv, name)
                method = kind_name(name, kind, kinds)
                self.calls[method] = Call(prepared(zsend, fn), (zsend, zrecv))
                self.kind_of[method] = kind
        if fresh:
            for kind in kinds:
                zsend = self.zbuffers[kind][0]
                rewrite = kind_name(REWRITE, kind, kinds)
                self.calls[rewrite] = Call(
                    functools.partial(np.copyto, zsend, self.source), (zsend,)
                )
                self.kind_of[rewrite] = kind
                self.rewrites[kind] = rewrite

    def check(self) -> list[str]:
        """Each method's result against MPI's (floats: within the combination-order bound).
        Collective; the same list on every rank."""
        failed = []
        methods = [n for n in self.calls if n != MPI_METHOD and n not in self.rewrites.values()]
        if self.command == "bcast":
            want = self.msend.copy()
            self.comm.Bcast(want, 0)
            for name in methods:
                self.calls[name].fn()
                same = bool(np.array_equal(self.zbuffers[self.kind_of[name]][0], want))
                if not self.comm.allreduce(same, op=MPI.LAND):
                    failed.append(name)
            return failed
        self.calls[MPI_METHOD].fn()
        tol = 4 * self.comm.size * np.finfo(np.float64).eps * max(1.0, self.comm.size)
        root = self.command == "allreduce" or self.comm.rank == 0
        for name in methods:
            zrecv = self.zbuffers[self.kind_of[name]][1]
            zrecv[:] = np.nan
            self.calls[name].fn()
            ok = not root or bool(np.allclose(zrecv, self.mrecv, rtol=0, atol=tol))
            if not self.comm.allreduce(ok, op=MPI.LAND):
                failed.append(name)
        return failed


def _alltoall8(comm) -> Call:
    send = zcoll.empty(comm, (comm.size, 1), np.float64)
    recv = zcoll.empty(comm, (comm.size, 1), np.float64)
    return Call(functools.partial(zcoll.alltoall, comm, send, recv), (send, recv))


def _memcpy(nbytes: int) -> Call:
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    return Call(functools.partial(_core.copy, dst, src, TEMPORAL), (src, dst))


def _timed(timer: Timer, call: Call, nbytes: int) -> tuple[float, int, int]:
    iterations = timer.iterations(call, max(8, nbytes // max(1, timer.comm.size)))
    warmup = timer.warmup(iterations)
    return timer.seconds(call, iterations, warmup) * 1e6, iterations, warmup


def _row(command: str, comm, nbytes: int, method: str, timing, buffers=None) -> dict:
    """One JSON/CSV row (`buffers`: the kind of zcoll's buffers; None for MPI's and memcpy's)."""
    latency, iterations, warmup = timing
    return {
        "collective": command,
        "P": comm.size,
        "block_bytes": nbytes,
        "method": method,
        "latency_us": latency,
        "iterations": iterations,
        "warmup": warmup,
        "buffers": buffers,
    }


def run_barrier(comm: MPI.Comm, args, report: Reporter, timer: Timer) -> tuple[list, dict]:
    methods = ((MPI_METHOD, comm.Barrier), ("zcoll", functools.partial(zcoll.barrier, comm)))
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(args.rounds):
        for name, fn in methods:
            timing = _timed(timer, Call(fn, ()), 8)
            if name not in best or timing[0] < best[name][0]:
                best[name] = timing
    rows = [_row("barrier", comm, 0, name, best[name]) for name, _ in methods]
    mpi, mine = rows[0]["latency_us"], rows[1]["latency_us"]
    report(f"{'comm.Barrier':>14}{mpi:10.2f} us")
    report(f"{'zcoll.barrier':>14}{mine:10.2f} us   speedup {times(ratio(mpi, mine))}")
    return rows, {"barrier_speedup": ratio(mpi, mine)}


def run_sizes(
    comm: MPI.Comm, args, report: Reporter, timer: Timer
) -> tuple[list, dict[str, dict]] | None:
    """Sweep the message sizes; print a row per size. Returns the rows and, per kind of
    ``--buffers``, the :func:`summarise` of its methods; None when ``--check`` failed."""
    command = args.command
    kinds = list(args.buffers)
    algorithms = ["zcoll"] if command == "bcast" else list(args.algorithms)
    names = [kind_name(a, kind, kinds) for a in algorithms for kind in kinds]
    width = max(12, *(len(n) + 2 for n in names))
    extra = ["speedup", "auto/best", "auto ran"] if command != "bcast" else ["speedup"]
    titles = [kind_name(e, kind, kinds) for kind in kinds for e in extra]
    widths = {e: max(11, *(len(kind_name(e, k, kinds)) + 2 for k in kinds)) for e in extra}
    picks = AUTO in algorithms and command != "bcast"
    core = _context.context(comm).core if picks else None
    # Across nodes no node algorithm runs: a call within the size rule travels whole in the
    # round (each node's inputs folded in rank order; the column says "round"), a larger one is
    # spread over the ranks (pieces folded in rank order, then node order: "spread").
    ctx = _context.context(comm)
    round_limit = _aggregated.pack_limit(ctx, command) if ctx.multi_node else -1
    report(
        f"{'bytes':>9}{MPI_METHOD:>{width}}"
        + "".join(f"{n:>{width}}" for n in names)
        + "".join(f"{t:>{widths[t.partition(KIND_SEPARATOR)[0]]}}" for t in titles)
    )
    rng = np.random.default_rng(comm.rank)
    rows: list[dict] = []
    by_size: dict[str, dict[int, dict[str, float]]] = {kind: {} for kind in kinds}
    bound: dict[int, float] = {}
    chosen: dict[str, dict[int, str]] = {kind: {} for kind in kinds}
    fresh = args.method == "fresh"
    timed = 1 + len(names) + fresh * len(kinds)  # MPI, zcoll's methods, the rewrites
    report.start(len(args.sizes) * timed * args.rounds, command)
    try:
        for nbytes in args.sizes:
            case = SizeCase(comm, command, nbytes, algorithms, rng, fresh, kinds)
            if args.check:
                failed = case.check()
                if failed:
                    report.close()
                    report(
                        f"zcoll.bench: check failed: {command} with {', '.join(failed)} "
                        f"differs from MPI's result for {format_size(nbytes)} at P={comm.size}",
                        file=sys.stderr,
                    )
                    return None
            # Rounds over every method in turn, each method's fastest round counting: a burst
            # of background load (or a drift of the shared machine) hits them all alike.
            best: dict[str, tuple[float, int, int]] = {}
            for _ in range(args.rounds):
                for name, call in case.calls.items():
                    timing = _timed(timer, call, nbytes)
                    if name not in best or timing[0] < best[name][0]:
                        best[name] = timing
                    report.step(f"{format_size(nbytes)} {name}")
            rewrites = {kind: best.pop(name)[0] for kind, name in case.rewrites.items()}
            for kind, name in case.rewrites.items():
                rows.append(_row(command, comm, nbytes, name, (rewrites[kind], 0, 0), kind))
            # MPI's send buffer is a plain array: the numpy kind's rewrite where it is timed.
            mpi_rewrite = rewrites.get(NUMPY_BUFFERS, rewrites.get(kinds[0], 0.0))
            latencies = {}
            for name, timing in best.items():
                on = case.kind_of.get(name)  # None: MPI
                rewrite = mpi_rewrite if on is None else rewrites.get(on, 0.0)
                timing = (max(0.0, timing[0] - rewrite), *timing[1:])
                row = _row(command, comm, nbytes, name, timing, on)
                row["rounds"] = args.rounds
                rows.append(row)
                latencies[name] = timing[0]
            if command == "allreduce" and nbytes >= LARGE:
                timing = _timed(timer, _memcpy(nbytes), nbytes)
                rows.append(_row(command, comm, nbytes, MEMCPY_METHOD, timing))
                bound[nbytes] = timing[0]
            line = f"{format_size(nbytes):>9}" + "".join(
                f"{latencies[n]:{width}.2f}" for n in (MPI_METHOD, *names)
            )
            for kind in kinds:
                own = {MPI_METHOD: latencies[MPI_METHOD]}
                own |= {a: latencies[kind_name(a, kind, kinds)] for a in algorithms}
                by_size[kind][nbytes] = own
                mine = own.get(AUTO, own.get("zcoll"))
                if mine is None:
                    mine = min(own[a] for a in algorithms)
                line += f"{times(ratio(own[MPI_METHOD], mine)):>{widths['speedup']}}"
                fixed = [own[a] for a in algorithms if a != AUTO]
                if command != "bcast":
                    cell = ""
                    if AUTO in own and fixed:
                        over = ratio(own[AUTO], min(fixed))
                        cell = "n/a" if over is None else f"{over:.2f}"
                    line += f"{cell:>{widths['auto/best']}}"
                if core is not None:
                    carried = 0 < nbytes <= round_limit
                    chosen[kind][nbytes] = (
                        "round" if carried
                        else "spread" if ctx.multi_node
                        else core.reduction_choice(
                            nbytes, private_inputs=kind == NUMPY_BUFFERS
                        )
                    )  # fmt: skip
                    line += f"{chosen[kind][nbytes]:>{max(15, widths['auto ran'])}}"
            report(line)
    finally:
        report.close()
    summaries = {kind: summarise(by_size[kind], algorithms, bound, chosen[kind]) for kind in kinds}
    if command == "allreduce":
        eight = _timed(timer, _alltoall8(comm), 8)
        rows.append(_row(command, comm, 8, ALLTOALL8, eight, ARENA_BUFFERS))
        for kind, summary in summaries.items():
            summary["alltoall8_us"] = eight[0]
            if 8 in by_size[kind] and AUTO in by_size[kind][8]:
                summary["allreduce8_over_alltoall8"] = by_size[kind][8][AUTO] / eight[0]
    return rows, summaries


def summarise(
    by_size: dict, names: list[str], bound: dict[int, float], chosen: dict[int, str]
) -> dict:
    """Geometric-mean speedups of "auto" (or the one zcoll method) and of the best algorithm
    over MPI, small and large messages; the worst auto/best-fixed ratio, and that of the
    algorithm auto ran (`chosen`, by size) timed as a fixed one: apart from auto's own noise,
    which size the model got wrong; the memcpy bound.

    A latency of 0 (``--method fresh``: the rewrite's subtraction took a noisy measurement to
    nothing) says nothing: ratios with it in the denominator are left out."""
    out: dict = {}
    method = AUTO if AUTO in names else names[0]
    for label, within in (("small", lambda b: b <= SMALL), ("large", lambda b: b >= LARGE)):
        sizes = [b for b in by_size if within(b)]
        out[f"speedup_{label}"] = geomean(
            ratio(by_size[b][MPI_METHOD], by_size[b][method]) for b in sizes
        )
        out[f"best_speedup_{label}"] = geomean(
            ratio(by_size[b][MPI_METHOD], min(by_size[b][n] for n in names)) for b in sizes
        )
    fixed = [n for n in names if n != AUTO]
    if AUTO in names and fixed:
        auto_over_best = [
            ratio(by_size[b][AUTO], min(by_size[b][n] for n in fixed)) for b in by_size
        ]
        if any(r is not None for r in auto_over_best):
            out["auto_over_best_max"] = max(r for r in auto_over_best if r is not None)
        pick_over_best = {
            b: ratio(by_size[b][chosen[b]], min(by_size[b][n] for n in fixed))
            for b in by_size
            if chosen.get(b) in by_size[b]
        }
        pick_over_best = {b: r for b, r in pick_over_best.items() if r is not None}
        if pick_over_best:
            out["pick_over_best"] = pick_over_best
    if bound:
        out["over_memcpy"] = {
            b: min(by_size[b][n] for n in names) / bound[b] for b in sorted(bound)
        }
    return out


def run_reduction(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """``allreduce``, ``reduce``, ``bcast`` or ``barrier``: sweep, print, write outputs.
    Collective; returns 0, or 1 (on every rank) when ``--check`` found a difference."""
    layout = node_layout(comm)
    now, command = now_iso(), command_line(args)
    report = Reporter(comm, args.progress)
    timer = Timer(comm, args, layout[2])
    report(f"# zcoll.bench {args.command} | {now} | host {socket.gethostname()} | {command}")
    loop = "warm OSU loop"
    if args.method == "fresh" and args.command != "barrier":
        loop = "OSU loop, send buffers rewritten before each call (the rewrite's time subtracted)"
    report(
        f"# latency in us per call (float64 sum), {loop}, max over ranks of the mean; P={comm.size}"
    )
    if args.spread_segment:
        report(f"# reductions spread across nodes in segments of {args.spread_segment} bytes")
    previous = _aggregated.spread_segment(comm, args.spread_segment)
    by_buffers: dict[str, dict] = {}
    try:
        if args.command == "barrier":
            rows, summary = run_barrier(comm, args, report, timer)
        else:
            result = run_sizes(comm, args, report, timer)
            if result is None:
                return 1
            rows, by_buffers = result
            summary = by_buffers[args.buffers[0]]
    finally:
        _aggregated.spread_segment(comm, previous)
    for kind, kind_summary in by_buffers.items():
        at = KIND_SEPARATOR + kind if len(by_buffers) > 1 else ""
        for line in summary_lines(args.command, kind_summary, at):
            report(line)
    report(where(comm, layout))
    report(f"MPI library: {mpi_library()}")
    if comm.rank == 0:
        metadata = {
            "collective": args.command,
            **common_metadata(comm, args, layout, now, command),
            "bench_method": args.method,
            "algorithms": list(getattr(args, "algorithms", [])),
            "spread_segment": args.spread_segment or _aggregated.SPREAD_SEGMENT_BYTES,
            **{k: v for k, v in summary.items() if k not in BY_SIZE},  # the first kind's
        }
        if by_buffers:
            metadata["buffers"] = list(args.buffers)
            metadata["by_buffers"] = {
                kind: {k: _by_size(v) if k in BY_SIZE else v for k, v in entries.items()}
                for kind, entries in by_buffers.items()
            }
        extra = {k: _by_size(summary.get(k, {})) for k in BY_SIZE}
        write_outputs(args, rows, metadata, FIELDS, extra)
    return 0


def _by_size(values: dict) -> dict[str, float]:
    """A summary entry keyed by message size, with JSON's string keys."""
    return {str(b): v for b, v in values.items()}


def summary_lines(command: str, summary: dict, at: str = "") -> list[str]:
    """The closing lines of a reduction's sweep for one kind of buffers (:func:`summarise`);
    `at` (``"@numpy"``) names the kind when several were timed."""
    lines = [
        f"geomean speedup over MPI ({AUTO if command != 'bcast' else 'zcoll'}{at}): "
        f"<= {format_size(SMALL)}: {times(summary['speedup_small'])}, "
        f">= {format_size(LARGE)}: {times(summary['speedup_large'])}"
    ]
    if "auto_over_best_max" in summary:
        lines.append(
            f"auto{at} / best fixed algorithm{at}, worst size: {summary['auto_over_best_max']:.2f}"
        )
    if summary.get("pick_over_best"):
        worst = max(summary["pick_over_best"].items(), key=lambda item: item[1])
        off = [format_size(b) for b, r in summary["pick_over_best"].items() if r > 1.1]
        lines.append(
            f"the algorithm auto{at} ran, timed as a fixed one / best fixed: worst "
            f"{worst[1]:.2f} at {format_size(worst[0])}; beyond 1.10 at "
            f"{', '.join(off) or 'no size'}"
        )
    if summary.get("over_memcpy"):
        text = ", ".join(f"{format_size(b)} {r:.2f}" for b, r in summary["over_memcpy"].items())
        lines.append(
            f"best{at} / memcpy of the message on every rank (the bandwidth bound): {text}"
        )
    if "allreduce8_over_alltoall8" in summary:
        lines.append(
            f"8 B allreduce{at} / 8 B-block zcoll.alltoall ({summary['alltoall8_us']:.2f} us): "
            f"{summary['allreduce8_over_alltoall8']:.2f}"
        )
    return lines


def add_reduction_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``allreduce``, ``reduce``, ``bcast`` and ``barrier``."""
    add_buffers_option(
        parser,
        "zcoll's input: arena (zcoll.empty; the result a plain array), numpy (both plain) "
        "or heap (both allocated with zcoll.use_shared_heap()); several time each algorithm "
        "on each kind in the same rounds, named NAME@KIND, with the speedups, auto/best and "
        "the algorithm auto ran per kind (default arena)",
    )
    add_size_options(
        parser, "message sizes (default: powers of two, 8 B to 16 MiB)", "message", "16M"
    )
    parser.add_argument(
        "--algorithms",
        type=functools.partial(parse_choices, choices=ALL_ALGORITHMS, what="algorithm"),
        default=list(ALL_ALGORITHMS),
        help=f"zcoll algorithms to time (default: {','.join(ALL_ALGORITHMS)})",
    )
    parser.add_argument("--iterations", type=int, help="timed calls per measurement")
    parser.add_argument("--warmup", type=int, help="untimed calls first (default 10%%, >= 2)")
    parser.add_argument(
        "--time-budget",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="cap on a measurement's timed loop in seconds; 0: no cap (default 0.5)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds over all methods per size, each method's fastest counting (default 3)",
    )
    parser.add_argument(
        "--check", action="store_true", help="first compare each method's result with MPI's"
    )
    parser.add_argument(
        "--spread-segment",
        type=parse_size,
        metavar="BYTES",
        help="across nodes, cut the messages of reductions and bcasts beyond their round's "
        "rule into segments of BYTES, a multiple of 64 (default: zcoll's, "
        f"{_aggregated.SPREAD_SEGMENT_BYTES // 1024} KiB)",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="warm",
        help="warm: OSU loop on one unchanged send buffer; fresh: every rank rewrites its send "
        "buffer before each call, as programs do, and the rewrite's own time is subtracted "
        "(default warm)",
    )


def finish_reduction_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.sizes and (args.min or args.max):
        parser.error("--sizes cannot be combined with --min/--max")
    if not args.sizes:
        args.sizes = powers_of_two(args.min or 8, args.max or 16 * MIB)
    if any(s % 8 for s in args.sizes):
        parser.error("sizes must be multiples of 8 bytes (float64 elements)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.spread_segment is not None and (args.spread_segment <= 0 or args.spread_segment % 64):
        parser.error("--spread-segment must be a positive multiple of 64 bytes")
