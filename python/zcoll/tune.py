"""Offline tuning: find the fastest block order and copy mode per block size on this machine,
and measure the cost models of the reduction algorithms.

Run it under MPI with as many ranks per node as the application will use::

    mpiexec -n 8 python -m zcoll.tune                      # writes zcoll.tuning_path()
    mpiexec -n 4 python -m zcoll.tune --sizes 8,4K,1M --collectives alltoall --dry-run
    mpiexec -n 2 python -m zcoll.tune --quick --output /tmp/tuning.json

For each collective and block size (bytes per block; default powers of two from 8 B to 4 MiB)
every candidate runs on the node's ranks at once, timed OSU-style (as the bench, with
:func:`~zcoll._timing.measure`: warm-up, barrier, timed loop, the largest mean over the
ranks, in interleaved rounds, the best round counting): first each block order with a distinct
schedule, with ordinary stores, and the eager path where a call fits
it; then, for blocks of 64 KiB and more, the fastest order with streaming stores and with the
hybrid copy at thresholds T0, T0/2, T0/4 (T0 = L2 / ranks per node). Two stages rather than every
(order, copy) pair: the order decides how well reads hit the cache, the copy mode how writes
bypass it, and the product would be four times longer. The fastest candidate per size wins;
neighbouring sizes with the same winner merge into one block range (boundaries halfway between
the measured sizes in log2, the first range from 0, the last open-ended) -- the rules of this
(collective, ranks per node) in the table, whose other rules are kept. Rank 0 writes the file
atomically. ``order="auto"`` and ``copy="auto"`` follow it in every later program on a
communicator with that many ranks per node (see :mod:`zcoll._tuning`).

``allreduce`` (in ``--collectives`` by default) times every reduction algorithm (float64 sum,
input in the arena, result in a private array, the input rewritten before each call as a
program's data changes -- the rewrite's own time subtracted; see the bench's ``--method
fresh``) at every message size of
``--reduction-sizes`` (default powers of two from 8 B to 32 MiB, bytes per rank), in the same
interleaved rounds on each of three buffer allocations (the mean of their best rounds counts),
and stores each algorithm's cost model as pieces ``a + b * m``: between two measured sizes the
line through both measurements (a falling one flat at its end), below the first size its time,
beyond the last the last piece extended. Algorithms are compared only within a size, where
they share the machine's conditions: this VM's bursts of load last several sizes.
``algorithm="auto"`` then takes the least predicted time (HPDC'13 §3.4) -- at a measured size,
the algorithm that was fastest.

``pulls`` (in ``--collectives`` by default) measures where buffers outside shared memory
(ordinary NumPy arrays) stop being staged and are pulled by CMA instead, for bcast, allreduce,
reduce and reduce_scatter_block: each call staged and pulled (the context's CMA threshold
forced to never and to 0 around each), float64 sum, the inputs (bcast: the root's buffer)
rewritten before each call, at every size of ``--pull-sizes`` (default powers of two from
256 KiB to 32 MiB, bytes per rank), in interleaved rounds on several allocations as above. The
threshold written for each call is the one with the least summed relative loss over the
measured sizes (:func:`pull_threshold_from`): staging in cache wins until the buffers outgrow
it, which is this machine's cache and page-pin cost, so the built-in factors (1 MiB for bcast,
4 MiB for the reductions) miss on some machines by a factor of four.

``--internode`` (on ranks spanning several nodes: real ones, or virtual ones with
``--virtual-node-size K`` / ``ZCOLL_VIRTUAL_NODE_SIZE``) times how a multi-node alltoall's and
allgather's blocks cross nodes -- in the call's round of messages (MN-CO: one message per pair
of nodes), rank to rank, and for allgather the leaders' concurrent exchange with C = 1, 2, 4
(:mod:`zcoll._internode`) -- as whole calls on arena arrays, at every size of
``--internode-sizes``, in the same interleaved rounds, and writes the fastest per size as the
table's ``internode`` rules for (nodes, ranks per node), merged into ranges as above. The
round then carries blocks up to the end of the first run of "round" rules, instead of the
built-in size rule's limit (measured on virtual nodes, where MPI's messages are cheap: a
network moves the limit up).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
from mpi4py import MPI

import zcoll

from . import _context, _core, _internode, _node, _settings, _tuning
from ._registry import (
    ALLGATHER,
    ALLTOALL,
    AUTO,
    COLLECTIVES,
    COPY_CODES,
    EAGER,
    HYBRID,
    ORDERS,
    REDUCE_ALGORITHMS,
    ROW,
    RULE_ORDER_CODES,
    STREAMING,
    TEMPORAL,
)
from ._timing import (
    KIB,
    MIB,
    REWRITE,
    Reporter,
    after_rewrite,
    budget_iterations,
    default_iterations,
    format_size,
    measure,
    node_layout,
    parse_choices,
    parse_sizes,
    powers_of_two,
)

__all__ = [
    "Candidate",
    "main",
    "models_from_times",
    "parse_args",
    "pull_threshold_from",
    "threshold_loss",
    "rules_from_winners",
    "write_table",
]

DEFAULT_SIZES = powers_of_two(8, 4 * MIB)
REDUCTION = "allreduce"  # --collectives name of the reduction sweep
REDUCTION_SIZES = powers_of_two(8, 32 * MIB)  # bytes per rank
QUICK_REDUCTION_SIZES = [8, 4 * KIB, 256 * KIB]
PULLS = "pulls"  # --collectives name of the pull-threshold sweep
PULL_SIZES = powers_of_two(256 * KIB, 32 * MIB)  # bytes per rank
QUICK_PULL_SIZES = [64 * KIB, 1 * MIB]
STAGED, PULLED = "staged", "pulled"
# The context's CMA threshold that forces each way of moving a buffer outside shared memory.
FORCED_CMA = {STAGED: 2**62, PULLED: 0}
QUICK_SIZES = [8, 4 * KIB, 256 * KIB]
INTERNODE_SIZES = powers_of_two(8, 256 * KIB)[::3]  # 8 B, 64 B, ..., 256 KiB
# How blocks cross nodes, per collective --internode times: in the call's round of messages
# (up to which size sets the round's limit), rank to rank, and an allgather's leaders'
# concurrent exchange.
INTERNODE_CHOICES = {
    ALLTOALL: (_internode.Choice(_internode.ROUND), _internode.Choice(_internode.DIRECT)),
    ALLGATHER: (
        _internode.Choice(_internode.ROUND),
        _internode.Choice(_internode.DIRECT),
        *(_internode.Choice(_internode.CONCURRENT, c) for c in (1, 2, 4)),
    ),
}
QUICK_ITERATIONS = 20
COPY_SWEEP_BLOCKS = 64 * KIB  # blocks from this size also try streaming and hybrid copies
HYBRID_STEPS = 3  # thresholds T0, T0/2, T0/4
SMALLEST_THRESHOLD = 4 * KIB  # below this the hybrid copy is as good as streaming
DEFAULT_TIME_BUDGET = 0.1  # seconds per timed loop
REPEATS = 3  # rounds over the candidates (the fastest counts: noise only ever adds time)
# The reduction sweep's rounds run on this many buffer allocations, the mean of each
# algorithm's best rounds counting: at 2-4 MiB tiled's time depends on where its buffers lie
# (103 or 138 us at 2 MiB, steady within one allocation), so the best round of one allocation
# made auto pick tiled where flat (109-113 us) was faster on average; the best of every
# allocation's rounds would favour such an algorithm, the worst would count a burst of load
# as the algorithm's.
REDUCTION_ALLOCATIONS = 3
REQUIRED_GAIN = 0.97  # a candidate must beat the built-in choice by 3% to get a rule


@dataclass(frozen=True)
class Candidate:
    """One way to run a call: an order (or "eager"), a copy mode and a hybrid threshold."""

    order: str
    copy: str = TEMPORAL
    threshold: int | None = None

    def label(self) -> str:
        if self.order == AUTO:
            return "built-in"
        if self.order == EAGER:
            return EAGER
        if self.threshold is not None:
            return f"{self.order}/{self.copy} T={format_size(self.threshold)}"
        return f"{self.order}/{self.copy}"


BUILTIN = Candidate(AUTO, AUTO)


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line of ``python -m zcoll.tune``."""
    p = argparse.ArgumentParser(
        prog="python -m zcoll.tune",
        description="Sweep block orders and copy modes on this machine and write the tuning "
        "table that order='auto' and copy='auto' follow. Run under mpiexec.",
    )
    p.add_argument("--sizes", type=parse_sizes, help="block sizes, e.g. 8,4K,1M (default 8..4M)")
    p.add_argument(
        "--collectives",
        default=",".join((*COLLECTIVES, REDUCTION, PULLS)),
        type=_parse_collectives,
        help="comma-separated: alltoall, allgather, allreduce (the reduction algorithms' cost "
        "models), pulls (where plain arrays are pulled by CMA; default all four)",
    )
    p.add_argument(
        "--pull-sizes",
        type=parse_sizes,
        help="message sizes (bytes per rank) of the pulls sweep (default powers of two, "
        "256 KiB..32 MiB)",
    )
    p.add_argument(
        "--reduction-sizes",
        type=parse_sizes,
        help="message sizes (bytes per rank) of the reduction sweep (default powers of two, "
        "8 B..32 MiB)",
    )
    p.add_argument("--output", type=Path, help="table file (default: zcoll.tuning_path())")
    p.add_argument("--dry-run", action="store_true", help="print the rules, write nothing")
    p.add_argument("--iterations", type=int, help="timed calls per candidate (default: by size)")
    p.add_argument(
        "--time-budget",
        type=float,
        default=DEFAULT_TIME_BUDGET,
        help=f"seconds per timed loop, caps the iterations (default {DEFAULT_TIME_BUDGET})",
    )
    p.add_argument("--quick", action="store_true", help="three sizes, few iterations (CI)")
    p.add_argument(
        "--internode",
        action="store_true",
        help="also time how a multi-node alltoall's and allgather's blocks cross nodes (in "
        "the call's round, rank to rank; allgather also C = 1, 2, 4) on the ranks' nodes and "
        "write the table's internode rules (they set the round's limit)",
    )
    p.add_argument(
        "--internode-sizes",
        type=parse_sizes,
        help="block sizes of the --internode sweep (default 8, 64, 512 ... 256K)",
    )
    p.add_argument(
        "--virtual-node-size",
        type=int,
        metavar="K",
        help="virtual nodes of K ranks (sets ZCOLL_VIRTUAL_NODE_SIZE before any context)",
    )
    args = p.parse_args(argv)
    if args.virtual_node_size is not None and args.virtual_node_size < 1:
        p.error("--virtual-node-size must be at least 1")
    if args.internode_sizes is None:
        args.internode_sizes = QUICK_SIZES if args.quick else INTERNODE_SIZES
    if args.iterations is not None and args.iterations < 1:
        p.error("--iterations must be at least 1")
    if args.time_budget < 0:
        p.error("--time-budget must be >= 0")
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else DEFAULT_SIZES
    if args.reduction_sizes is None:
        args.reduction_sizes = QUICK_REDUCTION_SIZES if args.quick else REDUCTION_SIZES
    if args.pull_sizes is None:
        args.pull_sizes = QUICK_PULL_SIZES if args.quick else PULL_SIZES
    for name in ("reduction_sizes", "pull_sizes"):
        if any(size % 8 for size in getattr(args, name)):
            p.error(f"--{name.replace('_', '-')} must be multiples of 8 bytes (float64 elements)")
    if args.quick and args.iterations is None:
        args.iterations = QUICK_ITERATIONS
    return args


def _parse_collectives(text: str) -> list[str]:
    return parse_choices(text, (*COLLECTIVES, REDUCTION, PULLS), "collective(s)")


# --- candidates and measurement ----------------------------------------------------------------


def distinct_orders(node_size: int, block: int, numa_nodes: Sequence[int] = ()) -> list[str]:
    """The orders whose schedules differ on `node_size` ranks placed on `numa_nodes` (each
    rank's NUMA node; empty: one), the built-in one first.

    Orders with the same schedule (row and Morton on 2 ranks, all of them on 1, numa and Morton
    on one NUMA node) run the same copies: timing both would only let noise pick between
    them."""
    seen, found = set(), []
    domains = len(set(numa_nodes)) or 1
    for code in (_core.default_order(node_size, block, domains), *range(len(ORDERS))):
        blocks, bounds = _core.schedule(node_size, code, numa_nodes=list(numa_nodes))
        key = (blocks.tobytes(), bounds.tobytes())
        if key not in seen:
            seen.add(key)
            found.append(ORDERS[code])
    return found


def order_candidates(
    block: int, node_size: int, eager_bytes: int, numa_nodes: Sequence[int] = ()
) -> list[Candidate]:
    """Stage 1: every distinct order with ordinary stores (on ranks placed on `numa_nodes`),
    and the eager path where the call fits it."""
    found = [Candidate(order) for order in distinct_orders(node_size, block, numa_nodes)]
    if 0 < node_size * block <= eager_bytes:
        found.append(Candidate(EAGER))
    return found


def copy_candidates(order: str, block: int, base_threshold: int) -> list[Candidate]:
    """Stage 2 (large blocks): `order` with streaming stores and hybrid thresholds T0, T0/2..."""
    if block < COPY_SWEEP_BLOCKS or order == EAGER:
        return []
    found = [Candidate(order, STREAMING)]
    for step in range(HYBRID_STEPS):
        t = base_threshold >> step
        if SMALLEST_THRESHOLD <= t < block:
            found.append(Candidate(order, HYBRID, t))
    return found


class _Sweep:
    """Times candidates on the node communicator; every rank of `world` gets the same times."""

    def __init__(self, world: MPI.Comm, node: MPI.Comm, args: argparse.Namespace) -> None:
        self.world, self.node, self.args = world, node, args
        self.ctx = _context.context(node)
        self.oversubscription = node_layout(world)[2]
        self.eager_bytes = world.allreduce(self.ctx.core.eager_bytes, op=MPI.MIN)
        self.base_threshold = world.allreduce(self.ctx.core.copy_threshold(0), op=MPI.MIN)
        self.repeats = 1 if args.quick else REPEATS
        self.reduction_allocations = 1 if args.quick else REDUCTION_ALLOCATIONS

    def buffers(self, collective: str, block: int) -> tuple[np.ndarray, np.ndarray]:
        p = self.node.size
        send_shape = (p, block) if collective == ALLTOALL else (block,)
        send = zcoll.empty(self.node, send_shape, np.uint8)
        send[...] = self.node.rank  # owner's first touch
        recv = zcoll.zeros(self.node, (p, block), np.uint8)
        return send, recv

    def caller(self, collective: str, c: Candidate, send, recv):
        """A no-argument function that runs `c` once on the arena buffers."""
        run = getattr(self.ctx.core, collective)
        order = RULE_ORDER_CODES[c.order]
        copy = COPY_CODES[c.copy]
        return lambda: run(send, recv, order, copy)

    def compare(self, collective: str, candidates, send, recv, block: int, report) -> dict:
        """Seconds per call of each candidate: the best of `repeats` rounds that take the
        candidates in turn, so a burst of background load hits them all alike; collective."""
        calls = {c: self.caller(collective, c, send, recv) for c in candidates}
        wanted = self.args.iterations or default_iterations(
            block, self.node.size, self.oversubscription
        )
        size = format_size(block)
        return self.best_of_rounds(
            calls, wanted, report, lambda c: f"{collective} {size} {c.label()}", self.threshold
        )

    def best_of_rounds(
        self,
        calls: dict,
        wanted: int,
        report,
        label,
        around=lambda key: contextlib.nullcontext(),
    ) -> dict:
        """Seconds per call of each of `calls` ({key: no-argument function}): the best of
        `repeats` rounds that take them in turn (each call inside ``around(key)``, progress
        shown as ``label(key)``), the slowest node's, so every node decides alike; collective."""
        counts = {}
        for key, call in calls.items():
            with around(key):
                counts[key] = budget_iterations(
                    call, wanted, self.args.time_budget / self.repeats, self.node
                )
        best = dict.fromkeys(calls, math.inf)
        for _ in range(self.repeats):
            for key, call in calls.items():
                with around(key):
                    warmup = min(100, max(2, counts[key] // 10))
                    best[key] = min(best[key], measure(call, counts[key], warmup, self.node))
                report.step(label(key))
        mine = np.array([best[key] for key in calls])
        worst = np.empty_like(mine)
        self.world.Allreduce(mine, worst, op=MPI.MAX)
        return dict(zip(calls, worst.tolist()))

    @contextlib.contextmanager
    def threshold(self, c: Candidate):
        """The hybrid threshold of `c` in force for copy="hybrid" calls, T0 again after."""
        if c.threshold is None:
            yield
            return
        self.ctx.core.set_copy_threshold(c.threshold)
        try:
            yield
        finally:
            self.ctx.core.set_copy_threshold(self.base_threshold)


def sweep(sw: _Sweep, collective: str, sizes, report: Reporter) -> dict[int, dict]:
    """Measure every candidate for every size: ``{block: {Candidate: seconds}}``; collective."""
    results: dict[int, dict] = {}
    for block in sizes:
        send, recv = sw.buffers(collective, block)
        stage1 = order_candidates(block, sw.node.size, sw.eager_bytes, sw.ctx.numa_nodes)
        times = sw.compare(collective, stage1, send, recv, block, report)
        best_order = min(times, key=times.__getitem__).order
        stage2 = copy_candidates(best_order, block, sw.base_threshold)
        if stage2:
            times.update(sw.compare(collective, stage2, send, recv, block, report))
        results[block] = times
        del send, recv
    return results


def planned_steps(sizes, collectives, sw: _Sweep) -> int:
    """How many timed loops :func:`sweep` runs (for the progress bar)."""
    p, eager, base = sw.node.size, sw.eager_bytes, sw.base_threshold
    per_size = [
        len(order_candidates(b, p, eager, sw.ctx.numa_nodes)) + len(copy_candidates(ROW, b, base))
        for b in sizes
    ]
    reductions = (
        len(sw.args.reduction_sizes) * (len(REDUCE_ALGORITHMS) + 1)  # + the rewrite
        if REDUCTION in collectives
        else 0
    )
    pulls = len(sw.args.pull_sizes) * len(_tuning.PULLED_CALLS) * 2 if PULLS in collectives else 0
    tuned = [c for c in collectives if c not in (REDUCTION, PULLS)]
    swept = reductions + pulls
    return (len(tuned) * sum(per_size) + swept * sw.reduction_allocations) * sw.repeats


def _allreduce_with(comm: MPI.Comm, send, recv, algorithm: str) -> None:
    zcoll.allreduce(comm, send, recv, algorithm=algorithm)


def sweep_reductions(sw: _Sweep, sizes, report: Reporter) -> dict[int, dict[str, float]]:
    """Seconds per allreduce of every algorithm at every size (bytes per rank), its send buffer
    rewritten before each call (the rewrite's own time subtracted): the best of the interleaved
    rounds, the slowest node's, averaged over the buffer allocations:
    ``{size: {algorithm: seconds}}``; collective."""
    results: dict[int, dict[str, float]] = {}
    for nbytes in sizes:
        wanted = sw.args.iterations or default_iterations(nbytes, 1, sw.oversubscription)
        label = f"{REDUCTION} {format_size(nbytes)} {{}}".format
        kept = []  # every allocation alive until the size is done: each at new addresses
        for _ in range(sw.reduction_allocations):
            send = zcoll.empty(sw.node, nbytes // 8, np.float64)
            send[:] = sw.node.rank + 1.0  # owner's first touch
            source, recv = send.copy(), np.zeros(nbytes // 8)
            kept.append((send, recv))
            # Through the public call, as programs make it (one crossing into the engine).
            calls = {
                a: after_rewrite(
                    send, source, functools.partial(_allreduce_with, sw.node, send, recv, a)
                )
                for a in REDUCE_ALGORITHMS
            }
            calls[REWRITE] = functools.partial(np.copyto, send, source)
            timed = sw.best_of_rounds(calls, wanted, report, label)
            rewrite = timed.pop(REWRITE)
            total = results.setdefault(nbytes, dict.fromkeys(timed, 0.0))
            for a, t in timed.items():
                total[a] += max(0.0, t - rewrite) / sw.reduction_allocations
        del kept
    return results


def _pulled_call(call: str, comm: MPI.Comm, nbytes: int):
    """(buffer rewritten before each call, its source, the call) for `call` of `nbytes` per
    rank on ordinary NumPy arrays."""
    p, n = comm.size, nbytes // 8
    if call == "reduce_scatter_block":
        n -= n % p
    send = np.empty(n)
    send[:] = comm.rank + 1.0  # owner's first touch
    source = send.copy()
    if call == "bcast":
        return send, source, functools.partial(zcoll.bcast, comm, send, root=0)
    if call == "reduce_scatter_block":
        recv = np.zeros(n // p)
        return send, source, functools.partial(zcoll.reduce_scatter_block, comm, send, recv)
    recv = np.zeros(n)
    return send, source, functools.partial(getattr(zcoll, call), comm, send, recv)


def sweep_pulls(sw: _Sweep, sizes, report: Reporter) -> dict[str, dict[int, dict[str, float]]]:
    """Seconds per call of every pulled call staged and pulled at every size (bytes per rank),
    its input (bcast: the root's buffer) rewritten before each call: the best of the
    interleaved rounds, the slowest node's, averaged over the buffer allocations:
    ``{call: {size: {"staged" | "pulled": seconds}}}``; collective."""
    core = sw.ctx.core

    @contextlib.contextmanager
    def forced(way: str):
        before = core.cma_bytes
        core.cma_bytes = FORCED_CMA[way]
        try:
            yield
        finally:
            core.cma_bytes = before

    results: dict[str, dict[int, dict[str, float]]] = {}
    for call in _tuning.PULLED_CALLS:
        for nbytes in sizes:
            wanted = sw.args.iterations or default_iterations(nbytes, 1, sw.oversubscription)
            label = f"{call} {format_size(nbytes)} {{}}".format
            total = results.setdefault(call, {}).setdefault(nbytes, dict.fromkeys(FORCED_CMA, 0.0))
            kept = []  # every allocation alive until the size is done: each at new addresses
            for _ in range(sw.reduction_allocations):
                send, source, run = _pulled_call(call, sw.node, nbytes)
                kept.append(send)
                rewritten = after_rewrite(send, source, run)
                calls = dict.fromkeys(FORCED_CMA, rewritten)
                timed = sw.best_of_rounds(calls, wanted, report, label, forced)
                for way, t in timed.items():
                    total[way] += t / sw.reduction_allocations
            del kept
    return results


def threshold_loss(times: dict[int, dict[str, float]], threshold: int) -> float:
    """The summed time, relative to the faster way at each measured size, of pulling from
    `threshold` bytes per rank and staging below it."""
    return sum(t[PULLED if m >= threshold else STAGED] / min(t.values()) for m, t in times.items())


def pull_threshold_from(times: dict[int, dict[str, float]], builtin: int) -> int:
    """The fewest bytes per rank from which a call pulls, from its staged and pulled times per
    measured size and the built-in threshold: of pulling from each measured size (or from none
    of them), the choice of least :func:`threshold_loss` (a tie: the larger threshold), unless
    the built-in one loses less than 3% per size more (noise must not move it: this VM's
    launches differ more than that). One slow round at one size then moves the threshold only
    as far as it costs. Pulling from size b after staging at a < b pulls from
    ``isqrt(a * b) + 1`` (the ranges of :func:`winner_ranges`); from the first size, from it;
    from none, from one byte beyond the largest."""
    sizes = sorted(times)
    bounds = [sizes[0], *(math.isqrt(a * b) + 1 for a, b in zip(sizes, sizes[1:])), sizes[-1] + 1]
    best = min(reversed(bounds), key=lambda t: threshold_loss(times, t))
    slack = (1 / REQUIRED_GAIN - 1) * len(sizes)
    if threshold_loss(times, builtin) <= threshold_loss(times, best) + slack:
        return builtin
    return best


def builtin_pull_bytes(call: str) -> int:
    """Where `call` (a table's name) pulls without a table: the engine's built-in rule."""
    return _core.builtin_pull_bytes(_tuning.PULLED_CALLS[call])


def pull_rules(
    ranks_per_node: int, results: dict[str, dict[int, dict[str, float]]]
) -> list[_tuning.PullRule]:
    """The table's pull thresholds for one node size from :func:`sweep_pulls`' times (the
    built-in one where it is as good: the table records it, so that a later built-in rule does
    not change what was measured here)."""
    return [
        _tuning.PullRule(call, ranks_per_node, pull_threshold_from(t, builtin_pull_bytes(call)))
        for call, t in results.items()
    ]


def print_pulls(report, results: dict[str, dict[int, dict[str, float]]], rules) -> None:
    report("\npulls: us per call on plain arrays (max over ranks), staged or pulled by CMA")
    report(f"  {'call':<22}{'bytes':>9}{STAGED:>12}{PULLED:>12}   faster")
    for call, times in results.items():
        for m, t in times.items():
            faster = min(t, key=t.__getitem__)
            report(
                f"  {call:<22}{format_size(m):>9}{_us(t[STAGED]):>12}{_us(t[PULLED]):>12}"
                f"   {faster}"
            )
    for r in rules:
        builtin = builtin_pull_bytes(r.call)
        how = "the built-in rule's" if r.min_bytes == builtin else f"built in {_mib(builtin)}"
        report(f"  {r.call}: pulls from {_mib(r.min_bytes)} per rank ({how})")


def models_from_times(
    ranks_per_node: int, results: dict[int, dict[str, float]]
) -> list[_tuning.ReductionModel]:
    """Each algorithm's cost model from its measured times: pieces ``a + b * m`` through
    consecutive measurements (see the module's docstring)."""
    sizes = sorted(results)
    models = []
    for alg in REDUCE_ALGORITHMS:
        points = [(m, results[m][alg]) for m in sizes if alg in results[m]]
        if not points:
            continue
        first_m, first_t = points[0]
        pieces = [(first_m, first_t, 0.0)]
        for (m0, t0), (m1, t1) in zip(points, points[1:]):
            b = max(0.0, (t1 - t0) / (m1 - m0))
            a = t1 - b * m1
            if a < 0:
                a, b = 0.0, t1 / m1
            pieces.append((m1, a, b))
        for i, (m, a, b) in enumerate(pieces):
            last = i + 1 == len(pieces)
            models.append(_tuning.ReductionModel(ranks_per_node, alg, None if last else m, a, b))
    return models


def print_reductions(report, results: dict[int, dict[str, float]]) -> None:
    report(f"\n{REDUCTION}: us per call (max over ranks) by algorithm")
    report(f"  {'bytes':>9}" + "".join(f"{a:>15}" for a in REDUCE_ALGORITHMS) + "   fastest")
    for m, times in results.items():
        best = min(times, key=times.__getitem__)
        report(
            f"  {format_size(m):>9}"
            + "".join(f"{_us(times.get(a)):>15}" for a in REDUCE_ALGORITHMS)
            + f"   {best}"
        )


# --- from measurements to rules ----------------------------------------------------------------


_W = TypeVar("_W")


def rules_from_winners(
    collective: str, ranks_per_node: int, winners: dict[int, Candidate]
) -> list[_tuning.TuningRule]:
    """Turn the fastest candidate per measured block size into disjoint block ranges.

    Neighbouring sizes with the same winner merge; a boundary between measured sizes a < b
    lies halfway in log2 (``floor(sqrt(a * b))`` belongs to a's range); the first range starts
    at 0 and the last has no upper bound.
    """
    return [
        _tuning.TuningRule(collective, ranks_per_node, low, high, c.order, c.copy, c.threshold)
        for low, high, c in winner_ranges(winners)
    ]


def winner_ranges(winners: dict[int, _W]) -> list[tuple[int, int | None, _W]]:
    """(low, high, winner) block ranges from the winner per measured block size, as
    :func:`rules_from_winners` describes them."""
    sizes = sorted(winners)
    ranges: list[tuple[int, int | None, _W]] = []
    low = 0
    for i, block in enumerate(sizes):
        c = winners[block]
        last = i + 1 == len(sizes)
        if not last and winners[sizes[i + 1]] == c:
            continue
        high = None if last else math.isqrt(block * sizes[i + 1])
        ranges.append((low, high, c))
        low = (high or 0) + 1
    return ranges


def winner(times: dict, builtin: Candidate) -> Candidate:
    """The fastest candidate, or BUILTIN when the built-in choice was measured and is within
    3% of it (noise must not fragment the table, and the built-in rule adapts at run time)."""
    best = min(times, key=times.__getitem__)
    if builtin in times and times[best] >= REQUIRED_GAIN * times[builtin]:
        return BUILTIN
    return best


def builtin_candidate(block: int, node_size: int, sw: _Sweep) -> Candidate:
    """What order="auto", copy="auto" do without a table (for the summary)."""
    if 0 < node_size * block <= sw.eager_bytes:
        return Candidate(EAGER)
    order = ORDERS[_core.default_order(node_size, block)]
    mode, threshold = sw.ctx.core.auto_copy_plan(block, node_size * block)
    return Candidate(order, mode, threshold if mode == HYBRID else None)


# --- the table file ----------------------------------------------------------------------------


def write_table(table: _tuning.TuningTable, path: str | os.PathLike) -> None:
    """Write `table` as JSON to `path` atomically (a temporary file, then ``os.replace``).

    Parameters
    ----------
    table : TuningTable
        What to write.
    path : str or path-like
        The file; its directory is created if needed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(table.as_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def merged_table(
    path: Path,
    new_rules: list,
    replaced: set,
    new_models: list | None = None,
    ranks_per_node: int = 0,
    new_internode: list | None = None,
    new_pulls: list | None = None,
) -> _tuning.TuningTable:
    """The new rules plus those of `path` for other (collective, ranks per node) pairs; the
    new reduction models (when given) replace those of `path` for `ranks_per_node`; the new
    internode rules (when given) those of `path` for their (collective, nodes, ranks per
    node); the new pull thresholds (when given) those of `path` for their (call, ranks per
    node)."""
    kept: tuple = ()
    kept_models: tuple = ()
    kept_internode: tuple = ()
    kept_pulls: tuple = ()
    pulled = {(r.call, r.ranks_per_node) for r in new_pulls or ()}
    swept = {(r.collective, r.nodes, r.ranks_per_node) for r in new_internode or ()}
    if path.exists():
        try:
            old = _tuning.load_tuning(path)
            kept = tuple(r for r in old.rules if (r.collective, r.ranks_per_node) not in replaced)
            kept_models = tuple(
                m
                for m in old.reductions
                if new_models is None or m.ranks_per_node != ranks_per_node
            )
            kept_internode = tuple(
                r for r in old.internode if (r.collective, r.nodes, r.ranks_per_node) not in swept
            )
            kept_pulls = tuple(r for r in old.pulls if (r.call, r.ranks_per_node) not in pulled)
        except (OSError, ValueError) as exc:
            warnings.warn(f"zcoll.tune: replacing {path}: {exc}", RuntimeWarning, stacklevel=2)
    rules = tuple(
        sorted((*kept, *new_rules), key=lambda r: (r.collective, r.ranks_per_node, r.min_block))
    )
    models = (*kept_models, *(new_models or ()))
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    internode = (*kept_internode, *(new_internode or ()))
    pulls = tuple(
        sorted((*kept_pulls, *(new_pulls or ())), key=lambda r: (r.call, r.ranks_per_node))
    )
    return _tuning.TuningTable(
        rules, _tuning.current_machine(), now, zcoll.__version__, tuple(models), internode, pulls
    )


# --- between nodes -----------------------------------------------------------------------------


def _forced_call(collective: str, comm: MPI.Comm, send, recv, choice: _internode.Choice):
    """One `collective` whose blocks cross nodes as `choice` says, whatever their size."""
    previous = _internode.force(comm, choice)
    try:
        getattr(zcoll, collective)(comm, send, recv)
    finally:
        _internode.force(comm, previous)


def sweep_internode(
    world: MPI.Comm, sw: _Sweep, collective: str, sizes, report: Reporter
) -> dict[int, dict[_internode.Choice, float]]:
    """Seconds per multi-node `collective` (alltoall or allgather) of each way its blocks
    cross nodes at every block size: the best of the interleaved rounds, the slowest rank's;
    collective over `world`."""
    results: dict[int, dict[_internode.Choice, float]] = {}
    p = world.size
    for block in sizes:
        send = zcoll.empty(world, block * (p if collective == ALLTOALL else 1), np.uint8)
        send[:] = world.rank % 251
        recv = zcoll.zeros(world, (p, block), np.uint8)
        calls = {
            c: functools.partial(_forced_call, collective, world, send, recv, c)
            for c in INTERNODE_CHOICES[collective]
        }
        wanted = sw.args.iterations or default_iterations(block, p, sw.oversubscription)
        counts = {
            c: budget_iterations(call, wanted, sw.args.time_budget / sw.repeats, world)
            for c, call in calls.items()
        }
        best = dict.fromkeys(calls, math.inf)
        for _ in range(sw.repeats):
            for c, call in calls.items():
                warmup = min(100, max(2, counts[c] // 10))
                best[c] = min(best[c], measure(call, counts[c], warmup, world))
                report.step(f"{collective} between nodes {format_size(block)} {c.label()}")
        results[block] = best  # measure() returns the largest mean over the ranks already
        del send, recv
    return results


def internode_rules(
    collective: str,
    nodes: int,
    ranks_per_node: int,
    results: dict[int, dict[_internode.Choice, float]],
) -> list[_tuning.InternodeRule]:
    """The fastest method per block size, neighbouring sizes with the same winner merged
    (boundaries as in :func:`rules_from_winners`)."""
    winners = {b: min(t, key=t.__getitem__) for b, t in results.items()}
    return [
        _tuning.InternodeRule(collective, nodes, ranks_per_node, low, high, c.method, c.concurrency)
        for low, high, c in winner_ranges(winners)
    ]


def print_internode(
    report, collective: str, results: dict[int, dict[_internode.Choice, float]]
) -> None:
    choices = INTERNODE_CHOICES[collective]
    report(f"\n{collective} between nodes: us per call (max over ranks) by method")
    report(f"  {'block':>9}" + "".join(f"{c.label():>12}" for c in choices) + "  fastest")
    for block, t in results.items():
        best = min(t, key=t.__getitem__)
        cells = "".join(f"{_us(t.get(c)):>12}" for c in choices)
        report(f"  {format_size(block):>9}{cells}  {best.label()}")


# --- output ------------------------------------------------------------------------------------


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.2f} MiB"


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.2f}"


def _range_text(rule: _tuning.TuningRule) -> str:
    high = "inf" if rule.max_block is None else str(rule.max_block)
    return f"{rule.min_block}..{high}"


def print_measurements(report, collective: str, results: dict, builtins: dict) -> None:
    report(f"\n{collective}: fastest per block size (us per call, max over ranks)")
    report(f"  {'block':>9}  {'fastest':<28}{'us':>10}  {'built-in is':<28}{'us':>10}")
    for block, times in results.items():
        best = min(times, key=times.get)
        default = builtins[block]
        report(
            f"  {format_size(block):>9}  {best.label():<28}{_us(times[best]):>10}  "
            f"{default.label():<28}{_us(times.get(default)):>10}"
        )


def print_rules(report, rules) -> None:
    report(f"\n{'collective':<10} {'ranks/node':>10}  {'blocks (bytes)':<22}{'order':<9}copy")
    for r in rules:
        copy = r.copy if r.threshold is None else f"{r.copy} T={format_size(r.threshold)}"
        report(f"{r.collective:<10} {r.ranks_per_node:>10}  {_range_text(r):<22}{r.order:<9}{copy}")


# --- main --------------------------------------------------------------------------------------


def main(argv=None, comm: MPI.Comm | None = None) -> int:
    """Run the sweep on `comm` (``MPI.COMM_WORLD`` by default) and write the table.

    Collective over `comm`. Only rank 0 prints and writes.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (``sys.argv[1:]`` by default); see ``--help``.
    comm : mpi4py.MPI.Comm, optional
        The ranks to tune with; every node must hold the same number of them.

    Returns
    -------
    int
        0 on success, 2 when the nodes hold different numbers of ranks or the file cannot be
        written (the same on every rank).
    """
    args = parse_args(argv)
    if args.virtual_node_size is not None:  # before any context: the node split reads it
        os.environ["ZCOLL_VIRTUAL_NODE_SIZE"] = str(args.virtual_node_size)
    world = MPI.COMM_WORLD if comm is None else comm
    report = Reporter(world)
    node, _ = _node.split_node(world)
    try:
        sizes_per_node = set(world.allgather(node.size))
        if len(sizes_per_node) > 1:
            report(f"zcoll.tune: nodes hold different numbers of ranks {sorted(sizes_per_node)}")
            return 2
        return _run(world, node, args, report)
    finally:
        node.Free()


def _run(world: MPI.Comm, node: MPI.Comm, args, report: Reporter) -> int:
    sw = _Sweep(world, node, args)
    facts = _settings.machine()
    l2, l3 = facts["l2_bytes"].value, facts["llc_bytes"].value
    report(
        f"zcoll.tune: {world.size} ranks, {node.size} per node; L2 {format_size(l2)}, "
        f"L3 {format_size(l3)}; eager path up to {format_size(sw.eager_bytes)} per rank, "
        f"hybrid T0 {format_size(sw.base_threshold)}"
    )
    steps = planned_steps(args.sizes, args.collectives, sw)
    if args.internode:
        choices = sum(len(c) for c in INTERNODE_CHOICES.values())
        steps += len(args.internode_sizes) * choices * sw.repeats
    report.start(steps, "zcoll.tune")
    new_rules = []
    new_models: list[_tuning.ReductionModel] = []
    new_internode: list[_tuning.InternodeRule] | None = None
    new_pulls: list[_tuning.PullRule] | None = None
    crossing = args.internode and _context.context(world).multi_node
    if args.internode and not crossing:
        report("zcoll.tune: --internode needs ranks on several nodes (or --virtual-node-size)")
    try:
        if crossing:
            nodes, per_node = _context.context(world).layout()
            new_internode = []
            for collective in INTERNODE_CHOICES:
                timed_x = sweep_internode(world, sw, collective, args.internode_sizes, report)
                print_internode(report, collective, timed_x)
                new_internode += internode_rules(collective, nodes, per_node, timed_x)
        for collective in args.collectives:
            if collective == REDUCTION:
                timed = sweep_reductions(sw, args.reduction_sizes, report)
                print_reductions(report, timed)
                new_models = models_from_times(node.size, timed)
                continue
            if collective == PULLS:
                pulled_times = sweep_pulls(sw, args.pull_sizes, report)
                new_pulls = pull_rules(node.size, pulled_times)
                print_pulls(report, pulled_times, new_pulls)
                continue
            results = sweep(sw, collective, args.sizes, report)
            builtins = {b: builtin_candidate(b, node.size, sw) for b in results}
            winners = {b: winner(t, builtins[b]) for b, t in results.items()}
            print_measurements(report, collective, results, builtins)
            new_rules += rules_from_winners(collective, node.size, winners)
    finally:
        report.close()
    path = args.output or _tuning.tuning_path()
    replaced = {(c, node.size) for c in args.collectives}
    error = None
    if world.rank == 0:
        table = merged_table(
            path,
            new_rules,
            replaced,
            new_models if REDUCTION in args.collectives else None,
            node.size,
            new_internode,
            new_pulls,
        )
        print_rules(report, table.rules)
        for r in table.internode:
            report(
                f"{r.collective} on {r.nodes} nodes of {r.ranks_per_node}: blocks "
                f"{r.min_block}..{'inf' if r.max_block is None else r.max_block} "
                f"{r.method}{f' C={r.concurrency}' if r.concurrency else ''}"
            )
        if args.dry_run:
            report("\n(dry run: nothing written)")
        else:
            try:
                write_table(table, path)
                report(f"\nwrote {path}")
            except OSError as exc:
                error = f"zcoll.tune: cannot write {path}: {exc}"
                print(error, file=sys.stderr, flush=True)
    return 2 if world.bcast(error, root=0) else 0


if __name__ == "__main__":
    sys.exit(main())
