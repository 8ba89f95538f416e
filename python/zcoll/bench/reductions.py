"""``allreduce``, ``reduce``, ``bcast`` and ``barrier``: zcoll's reductions against MPI's.

For every message size (float64 elements, sum) and every method -- ``comm.Allreduce`` (or
``Reduce`` / ``Bcast``) on plain NumPy arrays, then zcoll with each algorithm and "auto", its
input in the arena and its result in a plain array, as an mpi4py program has them -- the
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
import math
import socket
import sys

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _aggregated, _context, _core
from zcoll._registry import AUTO, TEMPORAL
from zcoll._timing import REWRITE, after_rewrite, parse_size

from .collectives import Call, Timer, add_size_options
from .common import (
    KIB,
    MEMCPY_METHOD,
    MIB,
    MPI_METHOD,
    Reporter,
    command_line,
    common_metadata,
    format_size,
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
FIELDS = (
    "collective", "P", "block_bytes", "method", "latency_us", "iterations", "warmup", "rounds"
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
    `fresh`: each call rewrites its send buffer first, and the rewrite alone is a method."""

    def __init__(
        self,
        comm,
        command: str,
        nbytes: int,
        algorithms,
        rng,
        fresh: bool = False,
        buffers: str = "arena",
    ) -> None:
        n = nbytes // 8
        self.comm, self.command, self.nbytes = comm, command, nbytes
        if buffers == "arena":  # the result stays a plain array, as a user's would be
            self.zsend, self.zrecv = zcoll.empty(comm, n, np.float64), np.zeros(n)
        else:
            with zcoll.use_shared_heap(buffers == "heap"):
                self.zsend, self.zrecv = np.empty(n), np.zeros(n)
        self.zsend[:] = rng.uniform(-1, 1, n)
        self.source = self.zsend.copy()
        self.msend = np.array(self.zsend)
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
        names = ["zcoll"] if command == "bcast" else list(algorithms)
        for name in names:
            fn = _zcoll_call(command, comm, self.zsend, self.zrecv, name)
            self.calls[name] = Call(prepared(self.zsend, fn), (self.zsend, self.zrecv))
        if fresh:
            rewrite = functools.partial(np.copyto, self.zsend, self.source)
            self.calls[REWRITE] = Call(rewrite, (self.zsend,))

    def check(self) -> list[str]:
        """Each method's result against MPI's (floats: within the combination-order bound).
        Collective; the same list on every rank."""
        failed = []
        if self.command == "bcast":
            want = self.msend.copy()
            self.comm.Bcast(want, 0)
            self.calls["zcoll"].fn()
            same = bool(np.array_equal(self.zsend, want))
            return [] if self.comm.allreduce(same, op=MPI.LAND) else ["zcoll"]
        self.calls[MPI_METHOD].fn()
        tol = 4 * self.comm.size * np.finfo(np.float64).eps * max(1.0, self.comm.size)
        for name, call in self.calls.items():
            if name in (MPI_METHOD, REWRITE):
                continue
            self.zrecv[:] = np.nan
            call.fn()
            root = self.command == "allreduce" or self.comm.rank == 0
            ok = not root or bool(np.allclose(self.zrecv, self.mrecv, rtol=0, atol=tol))
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


def _row(command: str, comm, nbytes: int, method: str, timing) -> dict:
    latency, iterations, warmup = timing
    return {
        "collective": command,
        "P": comm.size,
        "block_bytes": nbytes,
        "method": method,
        "latency_us": latency,
        "iterations": iterations,
        "warmup": warmup,
    }


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


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


def run_sizes(comm: MPI.Comm, args, report: Reporter, timer: Timer) -> tuple[list, dict] | None:
    command = args.command
    names = ["zcoll"] if command == "bcast" else list(args.algorithms)
    width = max(12, *(len(n) + 2 for n in names))
    extra = ["speedup", "auto/best", "auto ran"] if command != "bcast" else ["speedup"]
    picks = AUTO in names and command != "bcast"
    core = _context.context(comm).core if picks else None
    # Across nodes no node algorithm runs: a call within the size rule travels whole in the
    # round (each node's inputs folded in rank order; the column says "round"), a larger one is
    # spread over the ranks (pieces folded in rank order, then node order: "spread").
    ctx = _context.context(comm)
    round_limit = _aggregated.pack_limit(ctx, command) if ctx.multi_node else -1
    report(
        f"{'bytes':>9}{MPI_METHOD:>{width}}"
        + "".join(f"{n:>{width}}" for n in names)
        + "".join(f"{e:>11}" for e in extra)
    )
    rng = np.random.default_rng(comm.rank)
    rows: list[dict] = []
    by_size: dict[int, dict[str, float]] = {}
    bound: dict[int, float] = {}
    chosen: dict[int, str] = {}
    timed = 1 + len(names) + (args.method == "fresh")  # MPI, zcoll's methods, the rewrite
    report.start(len(args.sizes) * timed * args.rounds, command)
    try:
        for nbytes in args.sizes:
            case = SizeCase(comm, command, nbytes, names, rng, args.method == "fresh", args.buffers)
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
            rewrite = best.pop(REWRITE, (0.0, 0, 0))[0]
            if args.method == "fresh":
                rows.append(_row(command, comm, nbytes, REWRITE, (rewrite, 0, 0)))
            latencies = {}
            for name, timing in best.items():
                timing = (max(0.0, timing[0] - rewrite), *timing[1:])
                row = _row(command, comm, nbytes, name, timing)
                row["rounds"] = args.rounds
                rows.append(row)
                latencies[name] = timing[0]
            if command == "allreduce" and nbytes >= LARGE:
                timing = _timed(timer, _memcpy(nbytes), nbytes)
                rows.append(_row(command, comm, nbytes, MEMCPY_METHOD, timing))
                bound[nbytes] = timing[0]
            by_size[nbytes] = latencies
            line = f"{format_size(nbytes):>9}" + "".join(
                f"{latencies[n]:{width}.2f}" for n in (MPI_METHOD, *names)
            )
            mine = latencies.get(AUTO, latencies.get("zcoll"))
            if mine is None:
                mine = min(latencies[n] for n in names)
            line += f"{times(ratio(latencies[MPI_METHOD], mine)):>11}"
            fixed = [latencies[n] for n in names if n != AUTO]
            if command != "bcast" and AUTO in latencies and fixed:
                line += f"{latencies[AUTO] / min(fixed):>11.2f}"
            if core is not None:
                carried = 0 < nbytes <= round_limit
                chosen[nbytes] = (
                    "round" if carried
                    else "spread" if ctx.multi_node
                    else core.reduction_choice(nbytes, args.buffers == "numpy")
                )  # fmt: skip
                line += f"{chosen[nbytes]:>15}"
            report(line)
    finally:
        report.close()
    summary = summarise(by_size, names, bound, chosen)
    if command == "allreduce":
        eight = _timed(timer, _alltoall8(comm), 8)
        rows.append(_row(command, comm, 8, ALLTOALL8, eight))
        summary["alltoall8_us"] = eight[0]
        if 8 in by_size and AUTO in by_size[8]:
            summary["allreduce8_over_alltoall8"] = by_size[8][AUTO] / eight[0]
    return rows, summary


def summarise(
    by_size: dict, names: list[str], bound: dict[int, float], chosen: dict[int, str]
) -> dict:
    """Geometric-mean speedups of "auto" (or the one zcoll method) and of the best algorithm
    over MPI, small and large messages; the worst auto/best-fixed ratio, and that of the
    algorithm auto ran (`chosen`, by size) timed as a fixed one: apart from auto's own noise,
    which size the model got wrong; the memcpy bound."""
    out: dict = {}
    method = AUTO if AUTO in names else names[0]
    for label, within in (("small", lambda b: b <= SMALL), ("large", lambda b: b >= LARGE)):
        sizes = [b for b in by_size if within(b)]
        out[f"speedup_{label}"] = _geomean(
            [by_size[b][MPI_METHOD] / by_size[b][method] for b in sizes]
        )
        out[f"best_speedup_{label}"] = _geomean(
            [by_size[b][MPI_METHOD] / min(by_size[b][n] for n in names) for b in sizes]
        )
    fixed = [n for n in names if n != AUTO]
    if AUTO in names and fixed:
        out["auto_over_best_max"] = max(
            by_size[b][AUTO] / min(by_size[b][n] for n in fixed) for b in by_size
        )
        pick_over_best = {
            b: by_size[b][chosen[b]] / min(by_size[b][n] for n in fixed)
            for b in by_size
            if chosen.get(b) in by_size[b]
        }
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
    previous = _aggregated.spread_segment(args.spread_segment)
    try:
        if args.command == "barrier":
            rows, summary = run_barrier(comm, args, report, timer)
        else:
            result = run_sizes(comm, args, report, timer)
            if result is None:
                return 1
            rows, summary = result
    finally:
        _aggregated.spread_segment(previous)
    if args.command != "barrier":
        report(
            f"geomean speedup over MPI ({AUTO if args.command != 'bcast' else 'zcoll'}): "
            f"<= {format_size(SMALL)}: {times(summary['speedup_small'])}, "
            f">= {format_size(LARGE)}: {times(summary['speedup_large'])}"
        )
        if "auto_over_best_max" in summary:
            report(f"auto / best fixed algorithm, worst size: {summary['auto_over_best_max']:.2f}")
        if summary.get("pick_over_best"):
            worst = max(summary["pick_over_best"].items(), key=lambda item: item[1])
            off = [format_size(b) for b, r in summary["pick_over_best"].items() if r > 1.1]
            report(
                f"the algorithm auto ran, timed as a fixed one / best fixed: worst "
                f"{worst[1]:.2f} at {format_size(worst[0])}; beyond 1.10 at "
                f"{', '.join(off) or 'no size'}"
            )
        if summary.get("over_memcpy"):
            text = ", ".join(f"{format_size(b)} {r:.2f}" for b, r in summary["over_memcpy"].items())
            report(f"best / memcpy of the message on every rank (the bandwidth bound): {text}")
        if "allreduce8_over_alltoall8" in summary:
            report(
                f"8 B allreduce / 8 B-block zcoll.alltoall ({summary['alltoall8_us']:.2f} us): "
                f"{summary['allreduce8_over_alltoall8']:.2f}"
            )
    report(where(comm, layout))
    report(f"MPI library: {mpi_library()}")
    if comm.rank == 0:
        metadata = {
            "collective": args.command,
            **common_metadata(comm, args, layout, now, command),
            "bench_method": args.method,
            "algorithms": list(getattr(args, "algorithms", [])),
            "spread_segment": args.spread_segment or _aggregated.SPREAD_SEGMENT_BYTES,
            **{k: v for k, v in summary.items() if k not in BY_SIZE},
        }
        extra = {k: {str(b): v for b, v in summary.get(k, {}).items()} for k in BY_SIZE}
        write_outputs(args, rows, metadata, FIELDS, extra)
    return 0


def add_reduction_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--buffers",
        choices=("arena", "numpy", "heap"),
        default="arena",
        help="zcoll's input: arena (zcoll.empty; the result a plain array), numpy (both plain) "
        "or heap (both allocated with zcoll.use_shared_heap()) (default arena)",
    )
    """The options of ``allreduce``, ``reduce``, ``bcast`` and ``barrier``."""
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
