"""``alltoall`` and ``allgather``: zcoll's collectives against the MPI library's.

For every block size and every method -- ``comm.Alltoall`` / ``comm.Allgather`` on plain NumPy
arrays, then zcoll with each (block order, copy mode) pair on arena arrays (``--buffers``: on
plain or shared-heap NumPy arrays, or on several kinds side by side) -- the latency of a call,
warm (OSU: warm-up, barrier, timed loop) or cold (TPDS'18 Fig. 9: caches flushed before every
timed call). For blocks of 256 KiB and more, also the bandwidth of the fastest zcoll
method against a ``memcpy`` of the same bytes on every rank at once, the two timed in
alternating rounds (see :func:`paired_bandwidth`).

``--persistent`` adds the persistent collectives, each timed beside its plain twin: for every
zcoll method a plan (``zcoll.alltoall_init`` run as ``plan()``, method ``NAME_init``), the MPI
library's persistent request (``comm.Alltoall_init`` run as ``Start(); Wait()``, method
``MPI_init``) where the library has one (MPI-4), and ``comm.Barrier`` for reference; the
table then shows them side by side with the speedups of the plain call and of the plan over
MPI (see :func:`persistent_record`).
"""

from __future__ import annotations

import argparse
import functools
import math
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _aggregated, _context, _core, _internode
from zcoll._registry import ALLGATHER, ALLTOALL, AUTO, COPY_MODES, OPS, ORDERS, TEMPORAL

from .common import (
    ARENA_BUFFERS,
    BENCH_METHODS,
    COLD_ITERATIONS,
    KIB,
    KIND_SEPARATOR,
    MEMCPY_METHOD,
    MIB,
    MIN_ITERATIONS,
    MPI_METHOD,
    MPI_PERSISTENT_METHOD,
    PERSISTENT_SUFFIX,
    CacheFlusher,
    Reporter,
    add_buffers_option,
    budget_cold_iterations,
    budget_iterations,
    cold_iteration_seconds,
    command_line,
    common_metadata,
    default_iterations,
    format_size,
    geomean,
    kind_name,
    make_buffers,
    measure,
    measure_cold,
    median,
    mpi_library,
    node_layout,
    now_iso,
    parse_buffer_kinds,
    parse_choices,
    parse_size,
    parse_sizes,
    ratio,
    times,
    where,
)
from .output import write_outputs

__all__ = [
    "ALL_ORDERS",
    "BLOCK_RANGES",
    "FIELDS",
    "CheckError",
    "ZcollMethod",
    "internode_methods",
    "is_persistent",
    "buffers_summary_line",
    "mpi_persistent_missing",
    "parse_buffer_kinds",
    "parse_copy_modes",
    "parse_orders",
    "persistent_record",
    "persistent_summary",
    "run_collective",
    "speedups_by_buffers",
    "zcoll_methods",
]

BANDWIDTH_BLOCKS = 256 * KIB  # blocks from this size also get the paired bandwidth measurement
ALL_ORDERS = (*ORDERS, AUTO)
ALL_COPY_MODES = (AUTO, *COPY_MODES)
SMALL_BLOCKS = 16 * KIB  # summary: geometric mean over blocks <= this ...
LARGE_BLOCKS = 64 * KIB  # ... and over blocks >= this
PAIRED_ROUNDS = 7  # rounds of the paired bandwidth measurement: best zcoll method, then memcpy
PAIRED_MIN_ITERATIONS = 5  # per timed loop of a round
PAIRED_WARMUP = 2  # untimed calls before each timed loop of a round
#: The summary's two ranges of block sizes, a ``{}`` for each geometric mean.
BLOCK_RANGES = (
    f"blocks <= {format_size(SMALL_BLOCKS)}: {{}}, blocks >= {format_size(LARGE_BLOCKS)}: {{}}"
)
#: Columns of ``--csv`` (and keys of each JSON row); the first seven are the original schema,
#: later ones are only ever appended.
FIELDS = (
    "collective",
    "P",
    "block_bytes",
    "method",
    "latency_us",
    "iterations",
    "warmup",
    "order",
    "copy",
    "bench_method",
    "rounds",
    "persistent",  # a persistent method (NAME_init, MPI_init), not a plain call
    "plan_order",  # zcoll plans: what order="auto" resolved to ("eager" included) ...
    "plan_copy",  # ... and copy="auto" (after the timed runs); None on other rows
    "buffers",  # zcoll's buffers (--buffers: arena, numpy, heap); None for MPI and memcpy
)


class CheckError(RuntimeError):
    """A zcoll result differed from MPI's (raised on every rank)."""


def parse_orders(text: str) -> list[str]:
    """Parse a comma-separated list of zcoll block orders (``"row,hilbert,auto"``), in order."""
    return parse_choices(text, ALL_ORDERS, "order(s)")


def parse_copy_modes(text: str) -> list[str]:
    """Parse a comma-separated list of copy modes (``"auto,streaming"``), in order."""
    return parse_choices(text, ALL_COPY_MODES, "copy mode(s)")


@dataclass(frozen=True)
class ZcollMethod:
    """One zcoll configuration timed as a method: a block order and a copy mode, called plainly
    (``zcoll.alltoall``) or through a persistent plan (``zcoll.alltoall_init``, run as
    ``plan()``)."""

    name: str
    order: str
    copy: str
    persistent: bool = False
    internode: _internode.Choice | None = None  # allgather across nodes: forced this way
    aggregate: bool | None = None  # across nodes: blocks in the round (True) or after it, forced
    sender_packs: int | None = None  # aggregated: largest payload a sender packs alone, forced
    phase: bool = False  # the blocks between nodes alone (no agreement, no node-local part)
    buffers: str = ARENA_BUFFERS  # zcoll's buffers: a kind of BUFFER_KINDS


#: The allgather methods added on a communicator spanning several nodes: the direct path and
#: the leaders' concurrent exchange with C = 1, 2, 4, as whole calls (``xn:...``) and as the
#: inter-node phase alone (``phase:...``: after one whole call, only the blocks between nodes).
INTERNODE_CHOICES = (
    _internode.Choice(_internode.DIRECT),
    *(_internode.Choice(_internode.CONCURRENT, c) for c in (1, 2, 4)),
)


def internode_methods() -> list[ZcollMethod]:
    """The ``xn:...`` and ``phase:...`` methods of a multi-node allgather (order and copy
    "auto"): ``xn:round``, every block in the round between nodes (the size rule's way for
    blocks within it), then each way that runs after the round, forced for every block."""
    methods = [ZcollMethod("xn:round", AUTO, AUTO, aggregate=True)]
    for phase in (False, True):
        for choice in INTERNODE_CHOICES:
            name = f"{'phase' if phase else 'xn'}:{choice.label()}"
            methods.append(ZcollMethod(name, AUTO, AUTO, internode=choice, phase=phase))
    return methods


#: The irregular collectives' methods added on a communicator spanning several nodes with
#: --between-nodes: every block between nodes carried in the round's messages, or every one
#: rank to rank (the size rule picks per block; aggregate.hpp).
IRREGULAR_AGGREGATION_METHODS = (
    ZcollMethod("xn:aggregated", AUTO, AUTO, aggregate=True),
    ZcollMethod("xn:direct", AUTO, AUTO, aggregate=False),
)

#: The alltoall methods added on a communicator spanning several nodes with --between-nodes:
#: the blocks aggregated into one message per node pair, or rank to rank (TPDS'18 §2.5); and
#: aggregated with each message packed by its sender alone (no barrier after packing) or by
#: the node's ranks in shares (then a barrier), whatever the payload: both sides of the
#: engine's threshold (aggregate.hpp's sender_packs_bytes, 64 KiB).
AGGREGATION_METHODS = (
    *IRREGULAR_AGGREGATION_METHODS,
    ZcollMethod("xn:alone", AUTO, AUTO, aggregate=True, sender_packs=2**64 - 1),
    ZcollMethod("xn:shares", AUTO, AUTO, aggregate=True, sender_packs=0),
)


def aggregated_call(
    fn: Callable[[], object], aggregate: bool, comm: MPI.Comm, sender_packs: int | None
) -> Callable[[], None]:
    """`fn` run with the alltoall across nodes forced to aggregate or not, and its packing
    threshold forced to `sender_packs` (restored after)."""
    core = _context.context(comm).core

    def run() -> None:
        previous = _aggregated.force(comm, aggregate)
        if sender_packs is not None:
            threshold = core.set_sender_packs_bytes(sender_packs)
        try:
            fn()
        finally:
            _aggregated.force(comm, previous)
            if sender_packs is not None:
                core.set_sender_packs_bytes(threshold)

    return run


def messages_between_nodes(comm: MPI.Comm, collective: str) -> str:
    """What crosses nodes per call on `comm` (several nodes): the node sizes and, for alltoall,
    the MPI messages of each way (the round of records is one message per ordered node pair)."""
    ctx = _context.context(comm)
    node_of = ctx.node_of
    sizes = [node_of.count(leader) for leader in sorted(set(node_of))]
    text = f"{len(sizes)} nodes of {sizes} ranks; MPI messages between nodes per call: "
    if collective == ALLTOALL:
        aggregated = _aggregated.messages_per_call(sizes, aggregate=True)
        direct = _aggregated.messages_per_call(sizes, aggregate=False)
        limit = format_size(_aggregated.pack_limit(ctx))
        return text + f"aggregated {aggregated} (blocks <= {limit}), direct {direct}"
    n, p = len(sizes), sum(sizes)
    limit = format_size(_aggregated.pack_limit(ctx, ALLGATHER))
    return (
        text
        + f"in the round {n * (n - 1)} (blocks <= {limit}); larger: records {n * (n - 1)}, "
        + f"then direct {sum(q * (p - q) for q in sizes)} or the leaders' concurrent exchange"
    )


def _forced_call(
    fn: Callable[[], object], comm: MPI.Comm, choice: _internode.Choice
) -> Callable[[], None]:
    """`fn` run with the inter-node method on `comm` forced to `choice` (restored after)."""
    force = _internode.force

    def run() -> None:
        previous = force(comm, choice)
        try:
            fn()
        finally:
            force(comm, previous)

    return run


def _phase_call(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, choice) -> Callable:
    """The inter-node phase of a multi-node allgather alone, as the whole call runs it (the
    crossing policy routes it: `choice` forced around each call)."""
    ctx = _context.context(comm)
    phase = functools.partial(ctx.transport.exchange_remote, OPS[ALLGATHER], send, recv)
    return _forced_call(phase, comm, choice)


def zcoll_methods(
    orders: Sequence[str],
    copies: Sequence[str],
    persistent: bool = False,
    buffers: Sequence[str] = (ARENA_BUFFERS,),
) -> list[ZcollMethod]:
    """One method per (order, copy) pair, order-major; with `persistent`, each followed by its
    persistent twin; each on every kind of `buffers` in turn.

    Named by the order alone when there is a single copy mode (``"morton"``), else
    ``"order/copy"`` (``"morton/streaming"``); a persistent twin adds ``"_init"``
    (``"morton_init"``, ``"morton/streaming_init"``); with several kinds of buffers, each name
    ends in ``"@KIND"`` (``"morton@numpy"``, ``"morton_init@heap"``).
    """
    single = len(copies) == 1
    methods = []
    for order in orders:
        for copy in copies:
            name = order if single else f"{order}/{copy}"
            twins = [ZcollMethod(name, order, copy)]
            if persistent:
                twins.append(ZcollMethod(name + PERSISTENT_SUFFIX, order, copy, True))
            for m in twins:
                for kind in buffers:
                    methods.append(replace(m, name=kind_name(m.name, kind, buffers), buffers=kind))
    return methods


def is_persistent(name: str) -> bool:
    """Whether method `name` is persistent (``MPI_init``, ``auto_init``, ``auto_init@heap``):
    no order or copy mode name ends in ``_init``."""
    return name.partition(KIND_SEPARATOR)[0].endswith(PERSISTENT_SUFFIX)


# --- timing ------------------------------------------------------------------------------------


@dataclass
class Call:
    """A method ready to run: the call, this rank's own buffers it reads and writes (which
    the cold method brings into cache before each timed call), and the one it writes its
    result into (which ``--check`` compares with MPI's)."""

    fn: Callable[[], object]
    buffers: tuple[np.ndarray, ...]
    result: np.ndarray | None = None


def _start_wait(request: MPI.Prequest) -> Callable[[], None]:
    """One run of an MPI persistent request, with as little Python around it as a plan's."""
    start, wait = request.Start, request.Wait

    def run() -> None:
        start()
        wait()

    return run


def _mpi_persistent_init(comm: MPI.Comm, collective: str, sendbuf, recvbuf):
    """``comm.Alltoall_init(sendbuf, recvbuf)`` (or ``Allgather_init``): the MPI library's
    persistent collective (MPI-4), made on every rank or on none. Collective.

    Returns
    -------
    tuple
        ``(request, None)``, or ``(None, reason)`` -- the same reason on every rank -- when
        mpi4py or the library lacks it (NotImplementedError, AttributeError) or it fails
        (``MPI.Exception``) on some rank.
    """
    name = f"comm.{collective.capitalize()}_init"
    request, reason = None, None
    try:
        request = getattr(comm, f"{collective.capitalize()}_init")(sendbuf, recvbuf)
    except (NotImplementedError, AttributeError, MPI.Exception) as exc:
        reason = f"{name}: {type(exc).__name__}{f': {exc}' if str(exc) else ''}"
        version = MPI.Get_version()
        if version < (4, 0):
            reason += (
                f" (an MPI-{version[0]}.{version[1]} library; persistent collectives are MPI-4)"
            )
    reasons = comm.allgather(reason)
    failed = next((r for r in reasons if r is not None), None)
    if failed is not None:
        if request is not None:
            request.Free()
        if any(r != failed for r in reasons):  # not the same everywhere: say where
            failed += f" [rank {reasons.index(failed)}]"
        return None, failed
    return request, None


def mpi_persistent_missing(comm: MPI.Comm, collective: str) -> str | None:
    """Why the MPI library's persistent `collective` cannot be timed here, or None if it can.

    Makes (and frees) one request on 1-byte blocks; the same answer on every rank. Collective.
    """
    nblocks = comm.size
    send = np.zeros(nblocks if collective == ALLTOALL else 1, np.uint8)
    request, reason = _mpi_persistent_init(comm, collective, send, np.zeros(nblocks, np.uint8))
    if request is not None:
        request.Free()
    return reason


class Timer:
    """Times calls the way ``--method`` says, with the iteration counts of the options.

    warm: :func:`~zcoll.bench.common.measure` (OSU); iterations from ``--iterations`` or
    :func:`~zcoll.bench.common.default_iterations`, cut to ``--time-budget``. cold:
    :func:`~zcoll.bench.common.measure_cold` (TPDS'18 Fig. 9); ``--iterations`` or
    ``COLD_ITERATIONS``, cut so the whole measurement (flushes included) fits the budget.
    """

    def __init__(self, comm: MPI.Comm, args, oversubscription: float) -> None:
        self.comm, self.args, self.oversubscription = comm, args, oversubscription
        self.cold = args.method == "cold"
        self.flusher = CacheFlusher(comm) if self.cold else None

    def iterations(self, call: Call, block: int) -> int:
        """Timed calls for `call` with blocks of `block` bytes (the same on every rank)."""
        args = self.args
        if self.cold:
            assert self.flusher is not None  # made when cold
            per_iteration = cold_iteration_seconds(self.comm, call.fn, call.buffers, self.flusher)
            count = args.iterations or COLD_ITERATIONS
            return budget_cold_iterations(count, args.time_budget, per_iteration)
        count = args.iterations or default_iterations(block, self.comm.size, self.oversubscription)
        return budget_iterations(call.fn, count, args.time_budget, self.comm)

    def warmup(self, iterations: int) -> int:
        """Untimed calls before a measurement of `iterations` calls."""
        if self.args.warmup is not None:
            return self.args.warmup
        return 1 if self.cold else max(2, iterations // 10)

    def seconds(self, call: Call, iterations: int, warmup: int) -> float:
        """Seconds per call, the largest over the ranks of each rank's mean; collective."""
        if self.cold:
            assert self.flusher is not None  # made when cold
            return measure_cold(call.fn, iterations, warmup, self.comm, call.buffers, self.flusher)
        return measure(call.fn, iterations, warmup, self.comm)


# --- one block size ----------------------------------------------------------------------------


class BlockCase:
    """The buffers and calls of every method for one block size.

    zcoll's buffers are of the kinds its `methods` name (:attr:`ZcollMethod.buffers`), a send
    and a receive array of each: in the node's arena, each rank filling (first-touching) its
    own ("arena"), ordinary NumPy arrays as an mpi4py program has them ("numpy"), or NumPy
    arrays on the shared heap ("heap"); every kind and MPI's ordinary NumPy arrays get the same
    data. memcpy copies what a rank receives (P blocks) between two private arrays on every
    rank at once -- the physical limit, with the same memory footprint as the collective (send
    and receive matrices of all ranks).

    With `mpi_persistent`, the MPI library's persistent collective too (method ``MPI_init``,
    on the same send buffer, into a receive buffer of its own); zcoll's persistent methods are
    plans on the buffers of the plain ones. :meth:`close` frees the plans and requests.
    """

    def __init__(
        self,
        comm,
        collective: str,
        block: int,
        methods,
        rng,
        mpi_persistent: bool = False,
    ) -> None:
        nranks = comm.size
        send_shape = (nranks, block) if collective == ALLTOALL else (block,)
        recv_shape = (nranks, block)
        self.comm, self.collective, self.block = comm, collective, block
        data = rng.integers(0, 256, size=send_shape, dtype=np.uint8)
        #: Kind -> (send, receive) arrays of zcoll's methods on that kind.
        self.zbuffers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for kind in dict.fromkeys(m.buffers for m in methods):
            zsend, zrecv = make_buffers(comm, kind, send_shape, recv_shape)
            zsend[...] = data
            self.zbuffers[kind] = (zsend, zrecv)
        self.msend = np.array(data)
        self.mrecv = np.zeros(recv_shape, np.uint8)
        mpi_fn = getattr(comm, collective.capitalize())
        mpi_call = functools.partial(mpi_fn, self.msend, self.mrecv)
        self.calls = {MPI_METHOD: Call(mpi_call, (self.msend, self.mrecv), self.mrecv)}
        self.plans: dict[str, zcoll.Plan] = {}
        self.requests: list[MPI.Prequest] = []
        self.mpi_persistent_missing: str | None = None
        if mpi_persistent:
            precv = np.zeros(recv_shape, np.uint8)
            request, self.mpi_persistent_missing = _mpi_persistent_init(
                comm, collective, self.msend, precv
            )
            if request is not None:
                self.requests.append(request)
                call = Call(_start_wait(request), (self.msend, precv), precv)
                self.calls[MPI_PERSISTENT_METHOD] = call
        zcoll_fn = getattr(zcoll, collective)
        init_fn = getattr(zcoll, f"{collective}_init")
        for m in methods:
            zsend, zrecv = self.zbuffers[m.buffers]
            if m.aggregate is not None:
                plain = functools.partial(zcoll_fn, comm, zsend, zrecv)
                fn = aggregated_call(plain, m.aggregate, comm, m.sender_packs)
                self.calls[m.name] = Call(fn, (zsend, zrecv), zrecv)
                continue
            if m.internode is not None:
                if m.phase:  # the result of a whole call first, then the phase alone
                    fn = _phase_call(comm, zsend, zrecv, m.internode)
                    self.calls[m.name] = Call(fn, (zsend, zrecv))
                    continue
                plain = functools.partial(zcoll_fn, comm, zsend, zrecv)
                fn = _forced_call(plain, comm, m.internode)
                self.calls[m.name] = Call(fn, (zsend, zrecv), zrecv)
                continue
            if m.persistent:
                plan = init_fn(comm, zsend, zrecv, order=m.order, copy=m.copy)
                self.plans[m.name] = plan
                self.calls[m.name] = Call(plan, (zsend, zrecv), zrecv)
                continue
            fn = _plain_call(zcoll_fn, comm, zsend, zrecv, m.order, m.copy)
            self.calls[m.name] = Call(fn, (zsend, zrecv), zrecv)

    def close(self) -> None:
        """Free the plans and MPI requests (local; the arrays go with the garbage collector)."""
        for plan in self.plans.values():
            plan.free()
        for request in self.requests:
            request.Free()
        self.requests = []

    def memcpy_call(self) -> Call:
        """Every rank copies as many bytes as it receives, from one private array to another."""
        src, dst = np.array(self.mrecv), np.empty_like(self.mrecv)
        return Call(functools.partial(_core.copy, dst, src, TEMPORAL), (src, dst))

    def check(self) -> list[str]:
        """Run MPI once, then every other method once (zcoll's, and MPI's persistent request),
        and compare the results bit for bit.

        Each receive buffer is first set to the complement of MPI's result, so every byte must
        be written. Collective; returns the names of the methods that differ on some rank, the
        same list on every rank.
        """
        self.calls[MPI_METHOD].fn()
        failed = []
        for name, call in self.calls.items():
            if name == MPI_METHOD or call.result is None:
                continue
            np.invert(self.mrecv, out=call.result)
            call.fn()
            same = bool(np.array_equal(call.result, self.mrecv))
            if not self.comm.allreduce(same, op=MPI.LAND):
                failed.append(name)
        return failed


def _plain_call(fn, comm, send, recv, order: str, copy: str):
    """`fn(comm, send, recv, order=order, copy=copy)` as a user writes it. Without keywords
    when both are "auto" (a C-level partial, as MPI's call is timed); otherwise a closure that
    passes them -- not functools.partial with keywords, which merges a keyword dict on every
    call (~0.25 us on the dev VM, more than the 8-byte call itself)."""
    if order == AUTO and copy == AUTO:
        return functools.partial(fn, comm, send, recv)
    return lambda: fn(comm, send, recv, order=order, copy=copy)


def latency_row(case: BlockCase, name: str, seconds: float, iterations, warmup, args) -> dict:
    """One JSON/CSV row: the original seven fields, then order, copy, bench_method, rounds,
    persistent, plan_order, plan_copy, buffers."""
    method = next((m for m in args.methods if m.name == name), None)
    plan = case.plans.get(name)
    return {
        "collective": case.collective,
        "P": case.comm.size,
        "block_bytes": case.block,
        "method": name,
        "latency_us": seconds * 1e6,
        "iterations": iterations,
        "warmup": warmup,
        "order": method.order if method else None,
        "copy": method.copy if method else (TEMPORAL if name == MEMCPY_METHOD else None),
        "bench_method": args.method,
        "rounds": 1,
        "persistent": is_persistent(name),
        "plan_order": plan.order if plan is not None else None,
        "plan_copy": plan.copy if plan is not None else None,
        "buffers": method.buffers if method else None,
    }


def measure_barrier(comm: MPI.Comm, timer: Timer) -> tuple[float, int]:
    """``comm.Barrier``'s latency (µs) and iteration count, timed as the methods are: the
    reference for a collective's synchronisation cost. Collective."""
    call = Call(comm.Barrier, ())
    iterations = timer.iterations(call, 1)
    return timer.seconds(call, iterations, timer.warmup(iterations)) * 1e6, iterations


def measure_block(case: BlockCase, timer: Timer, args, report: Reporter) -> list[dict]:
    """Time MPI and every zcoll method for one block size; one row per method, MPI first."""
    rows = []
    for name, call in case.calls.items():
        iterations = timer.iterations(call, case.block)
        warmup = timer.warmup(iterations)
        seconds = timer.seconds(call, iterations, warmup)
        rows.append(latency_row(case, name, seconds, iterations, warmup, args))
        report.step(f"{format_size(case.block)} {name}")
    return rows


# --- paired bandwidth --------------------------------------------------------------------------


def paired_iterations(timer: Timer, latency_s: float, sweep_iterations: int) -> int:
    """Calls per timed loop of a paired round: ``--iterations`` if given; else, warm, the
    sweep's count cut so the 2 x PAIRED_ROUNDS loops take about ``--time-budget`` together
    (never below PAIRED_MIN_ITERATIONS); cold, PAIRED_MIN_ITERATIONS."""
    if timer.args.iterations:
        return timer.args.iterations
    if timer.cold:  # each cold iteration also sweeps the flush buffer: tens of ms
        return min(sweep_iterations, PAIRED_MIN_ITERATIONS)
    budget = timer.args.time_budget
    if budget <= 0 or latency_s <= 0:
        return sweep_iterations
    affordable = int(budget / (2 * PAIRED_ROUNDS) / latency_s)
    floor = min(sweep_iterations, PAIRED_MIN_ITERATIONS)
    return max(floor, min(sweep_iterations, affordable))


def paired_bandwidth(case: BlockCase, timer: Timer, best: str, iterations: int) -> dict:
    """Bandwidth of method `best` against a memcpy of the same bytes, timed in alternation.

    PAIRED_ROUNDS rounds; each times a short loop of `best` and one of the memcpy (the same
    `iterations`, PAIRED_WARMUP untimed calls first; the order alternates between rounds so
    neither always runs first). Measured at nearly the same moment, the two see the same
    machine: on a VM whose effective last-level cache varies with its neighbours' load, a
    memcpy timed seconds apart from the collective can be 2x off. The ratio reported is the
    median of the per-round ratios (zcoll GB/s / memcpy GB/s); the GB/s columns are the
    medians of each method's own rounds. Collective.

    Returns
    -------
    dict
        ``block_bytes``, ``method``, ``received_bytes``, ``zcoll_us`` and ``memcpy_us``
        (medians), ``zcoll_gbps``, ``memcpy_gbps``, ``ratio``, ``round_ratios``, ``rounds``,
        ``iterations``, ``warmup``.
    """
    calls = {best: case.calls[best], MEMCPY_METHOD: case.memcpy_call()}
    seconds: dict[str, list[float]] = {best: [], MEMCPY_METHOD: []}
    for round_ in range(PAIRED_ROUNDS):
        names = [best, MEMCPY_METHOD] if round_ % 2 == 0 else [MEMCPY_METHOD, best]
        for name in names:
            seconds[name].append(timer.seconds(calls[name], iterations, PAIRED_WARMUP))
    round_ratios = [m / z for z, m in zip(seconds[best], seconds[MEMCPY_METHOD])]
    received = case.comm.size * case.block
    zcoll_s, memcpy_s = median(seconds[best]), median(seconds[MEMCPY_METHOD])
    return {
        "block_bytes": case.block,
        "method": best,
        "received_bytes": received,
        "zcoll_us": zcoll_s * 1e6,
        "memcpy_us": memcpy_s * 1e6,
        "zcoll_gbps": received / zcoll_s / 1e9,
        "memcpy_gbps": received / memcpy_s / 1e9,
        "ratio": median(round_ratios),
        "round_ratios": round_ratios,
        "rounds": PAIRED_ROUNDS,
        "iterations": iterations,
        "warmup": PAIRED_WARMUP,
    }


def auto_copy_label(comm: MPI.Comm, block: int) -> str:
    """The copy mode ``copy="auto"`` uses on this rank for such calls (after the sweep's
    run-time tuning): ``temporal`` or ``hybrid T=256 KiB``."""
    mode, threshold = _context.context(comm).core.auto_copy_plan(block, comm.size * block)
    return mode if mode == TEMPORAL else f"{mode} T={format_size(threshold)}"


# --- reporting ---------------------------------------------------------------------------------


def best_order(latencies: dict[str, float], persistent: bool = False) -> str:
    """Return the fastest zcoll method in `latencies` (method -> µs, MPI and memcpy included):
    among the plain calls, or with `persistent` among the plans (``NAME_init``)."""
    orders = (
        m
        for m in latencies
        if m not in (MPI_METHOD, MEMCPY_METHOD, MPI_PERSISTENT_METHOD)
        and is_persistent(m) == persistent
        and not m.startswith("phase:")  # a part of a call, not a call
    )
    return min(orders, key=latencies.__getitem__)


def _width(names: Sequence[str]) -> int:
    return max([10, *(len(n) + 2 for n in names)])


def table_header(names: Sequence[str]) -> str:
    """Column titles of the results table (latencies in µs)."""
    width = _width(names)
    titles = "".join(f"{name:>{width}}" for name in names)
    return f"{'block':>9}{'MPI (us)':>11}{titles}{'best':>{width}}{'speedup':>9}"


def table_row(block: int, latencies: dict[str, float], names: Sequence[str]) -> str:
    """One line of the results table: latencies, best method, MPI latency / best latency."""
    width = _width(names)
    best = best_order(latencies)
    cells = "".join(f"{latencies[name]:{width}.2f}" for name in names)
    speedup = latencies[MPI_METHOD] / latencies[best]
    mpi = latencies[MPI_METHOD]
    return f"{format_size(block):>9}{mpi:11.2f}{cells}{best:>{width}}{speedup:8.2f}x"


def persistent_header(collective: str, names: Sequence[str], missing: str | None) -> list[str]:
    """Title lines of the ``--persistent`` table: what each column is, then the column titles."""
    width = _width(names)
    mpi_init = f"comm.{collective.capitalize()}_init(...) run as Start(); Wait()"
    if missing:
        mpi_init = f"n/a: {missing}"
    titles = "".join(f"{name:>{width}}" for name in names)
    return [
        f"# NAME_init: zcoll.{collective}_init(...) run as plan(); MPI_init: {mpi_init}; "
        "Barrier: comm.Barrier (reference)",
        "# speedups: plain = MPI / fastest plain zcoll call, persistent = MPI / fastest plan, "
        "vs init = MPI_init / fastest plan",
        f"{'block':>9}{'Barrier':>9}{'MPI (us)':>11}{'MPI_init':>10}{titles}"
        f"{'plain':>9}{'persistent':>12}{'vs init':>9}",
    ]


def persistent_row(record: dict, latencies: dict[str, float], names: Sequence[str]) -> str:
    """One line of the ``--persistent`` table (see :func:`persistent_record`)."""
    width = _width(names)
    cells = "".join(f"{latencies[name]:{width}.2f}" for name in names)
    mpi_init = record["mpi_persistent_us"]
    mpi_init_cell = "n/a" if mpi_init is None else f"{mpi_init:.2f}"
    return (
        f"{format_size(record['block_bytes']):>9}{record['barrier_us']:9.2f}"
        f"{record['mpi_us']:11.2f}{mpi_init_cell:>10}{cells}"
        f"{times(record['plain_speedup']):>9}{times(record['persistent_speedup']):>12}"
        f"{times(record['persistent_vs_mpi_persistent']):>9}"
    )


def persistent_record(case: BlockCase, latencies: dict[str, float], barrier) -> dict:
    """The ``--persistent`` comparison for one block size (a record of the JSON's
    ``"persistent"`` list).

    Parameters
    ----------
    case : BlockCase
        The block size's calls (its plans say what ``auto`` resolved to).
    latencies : dict
        Method -> µs for this block size (MPI, MPI_init where measured, zcoll's methods).
    barrier : tuple
        ``(µs, iterations)`` of ``comm.Barrier`` (:func:`measure_barrier`).

    Returns
    -------
    dict
        ``block_bytes``; ``plain_method`` and ``persistent_method``, the fastest plain zcoll
        call and the fastest plan, with ``plain_us`` and ``persistent_us``; ``mpi_us``,
        ``mpi_persistent_us`` (None where the library has no persistent collective),
        ``barrier_us``, ``barrier_iterations``; the speedups ``plain_speedup`` (MPI / plain),
        ``persistent_speedup`` (MPI / plan), ``persistent_vs_mpi_persistent`` (MPI_init /
        plan, or None), ``persistent_vs_plain`` (plain / plan); ``plan_order``, ``plan_copy``.
    """
    plain, persistent = best_order(latencies), best_order(latencies, persistent=True)
    mpi, mpi_init = latencies[MPI_METHOD], latencies.get(MPI_PERSISTENT_METHOD)
    plan = case.plans[persistent]
    return {
        "block_bytes": case.block,
        "plain_method": plain,
        "persistent_method": persistent,
        "plain_us": latencies[plain],
        "persistent_us": latencies[persistent],
        "mpi_us": mpi,
        "mpi_persistent_us": mpi_init,
        "barrier_us": barrier[0],
        "barrier_iterations": barrier[1],
        "plain_speedup": mpi / latencies[plain],
        "persistent_speedup": mpi / latencies[persistent],
        "persistent_vs_mpi_persistent": ratio(mpi_init, latencies[persistent]),
        "persistent_vs_plain": latencies[plain] / latencies[persistent],
        "plan_order": plan.order,
        "plan_copy": plan.copy,
    }


def persistent_summary(records: Sequence[dict]) -> dict[str, float | None]:
    """Geometric means of the ``--persistent`` speedups for small and for large blocks.

    Returns
    -------
    dict
        ``plain_small``, ``persistent_small``, ``vs_mpi_persistent_small`` over blocks <= 16 KiB
        and the same with ``_large`` over blocks >= 64 KiB (MPI / fastest plain call, MPI /
        fastest plan, MPI_init / fastest plan); None where no block (or no MPI_init) falls in
        the range.
    """
    ranges = {"small": lambda b: b <= SMALL_BLOCKS, "large": lambda b: b >= LARGE_BLOCKS}
    keys = {
        "plain": "plain_speedup",
        "persistent": "persistent_speedup",
        "vs_mpi_persistent": "persistent_vs_mpi_persistent",
    }
    return {
        f"{name}_{where_}": geomean(r[key] for r in records if within(r["block_bytes"]))
        for name, key in keys.items()
        for where_, within in ranges.items()
    }


def bandwidth_header(args) -> list[str]:
    """Title lines of the paired bandwidth table."""
    width = _width([m.name for m in args.methods])
    return [
        "# GB/s each rank receives: the best method against a memcpy of the same bytes on every",
        f"# rank at once, timed in {PAIRED_ROUNDS} alternating rounds (medians); ratio = median of",
        f"# the per-round ratios (range: lowest-highest). --copy {','.join(args.copies)}",
        f"{'block':>9}{'best':>{width}}{'zcoll':>10}{'memcpy':>10}{'ratio':>8}"
        f"{'range':>13}   copy='auto' uses",
    ]


def bandwidth_row(record: dict, args) -> str:
    """One line of the paired bandwidth table."""
    width = _width([m.name for m in args.methods])
    low, high = min(record["round_ratios"]), max(record["round_ratios"])
    spread = f"{low:.0%}-{high:.0%}"
    return (
        f"{format_size(record['block_bytes']):>9}{record['method']:>{width}}"
        f"{record['zcoll_gbps']:10.2f}{record['memcpy_gbps']:10.2f}{record['ratio']:8.0%}"
        f"{spread:>13}   {record['auto_copy']}"
    )


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


def speedups_by_buffers(
    by_block: dict[int, dict[str, float]], methods: Sequence[ZcollMethod]
) -> dict[str, dict]:
    """Per kind of buffers, MPI latency / the best latency among the methods on that kind.

    Returns
    -------
    dict
        Kind -> ``{"small": ..., "large": ...}`` (as :func:`geomean_speedups`) with
        ``"lowest"``, the smallest ratio over the block sizes, and ``"lowest_block"``, where.
    """
    result = {}
    for kind in dict.fromkeys(m.buffers for m in methods):
        names = [m.name for m in methods if m.buffers == kind]
        own = {
            block: {MPI_METHOD: lat[MPI_METHOD], **{n: lat[n] for n in names}}
            for block, lat in by_block.items()
        }
        ratios = {block: lat[MPI_METHOD] / lat[best_order(lat)] for block, lat in own.items()}
        lowest = min(ratios, key=ratios.__getitem__) if ratios else None
        result[kind] = {
            **geomean_speedups(own),
            "lowest": ratios[lowest] if lowest is not None else None,
            "lowest_block": lowest,
        }
    return result


def buffers_summary_line(kind: str, speedups: dict, ranges: str) -> str:
    """The summary line of one kind of buffers (see :func:`speedups_by_buffers`); `ranges`
    has two ``{}`` for the small and large geometric means."""
    lowest = speedups["lowest"]
    where_ = f" at {format_size(speedups['lowest_block'])}" if lowest is not None else ""
    return (
        f"geomean speedup of best {KIND_SEPARATOR}{kind} method over MPI: "
        + ranges.format(times(speedups["small"]), times(speedups["large"]))
        + f"; lowest {times(lowest)}{where_}"
    )


def _describe_method(timer: Timer) -> str:
    if timer.flusher is None:  # not cold
        return "warm (OSU: warm-up calls, barrier, timed loop; max over ranks of the mean)"
    return (
        f"cold (TPDS'18 Fig. 9: before each timed call every rank sweeps "
        f"{timer.flusher.nbytes / MIB:.1f} MiB to flush its caches, then reads its own buffers; "
        "max over ranks of the mean)"
    )


# --- the subcommand ----------------------------------------------------------------------------


def _sweep_steps(args, mpi_persistent: bool) -> int:
    paired = sum(block >= BANDWIDTH_BLOCKS for block in args.sizes)
    references = 1 + (1 + int(mpi_persistent) if args.persistent else 0)  # MPI; Barrier, MPI_init
    return len(args.sizes) * (references + len(args.methods)) + paired


@dataclass
class Sweep:
    """What :func:`sweep_sizes` measured."""

    rows: list[dict]  # the JSON/CSV rows
    by_block: dict[int, dict[str, float]]  # block -> {method: µs}
    bandwidth: list[dict]  # the paired bandwidth records (blocks >= BANDWIDTH_BLOCKS)
    persistent: list[dict]  # --persistent: one persistent_record per block


def sweep_sizes(
    comm, collective: str, args, timer: Timer, report: Reporter, names, mpi_persistent=False
) -> Sweep | None:
    """Measure every block size of ``--sizes``, printing a table row after each.

    With ``--persistent``, also ``comm.Barrier`` and (where `mpi_persistent`) the MPI
    library's persistent collective, for each block size before the methods.

    Returns the :class:`Sweep`, or None (on every rank) if ``--check`` found a difference.
    """
    rng = np.random.default_rng(comm.rank)
    sweep = Sweep([], {}, [], [])
    for block in args.sizes:
        case = BlockCase(comm, collective, block, args.methods, rng, mpi_persistent)
        try:
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
                    return None
            if case.mpi_persistent_missing:  # made for the probe, but not for this size
                report(f"# {format_size(block)}: MPI_init n/a: {case.mpi_persistent_missing}")
            if args.persistent:
                barrier = measure_barrier(comm, timer)
                report.step(f"{format_size(block)} Barrier")
            block_rows = measure_block(case, timer, args, report)
            latencies = {row["method"]: row["latency_us"] for row in block_rows}
            if block >= BANDWIDTH_BLOCKS:
                record, memcpy_row = bandwidth_against_memcpy(case, timer, block_rows, args)
                sweep.bandwidth.append(record)
                block_rows.append(memcpy_row)
                report.step(f"{format_size(block)} paired")
            sweep.rows += block_rows
            sweep.by_block[block] = latencies
            if args.persistent:
                record = persistent_record(case, latencies, barrier)
                sweep.persistent.append(record)
                report(persistent_row(record, latencies, names))
            else:
                report(table_row(block, latencies, names))
        finally:
            case.close()
    return sweep


def bandwidth_against_memcpy(case: BlockCase, timer: Timer, block_rows, args):
    """The paired measurement of the fastest method in `block_rows` against memcpy.

    Returns the bandwidth record (see :func:`paired_bandwidth`, plus ``auto_copy``) and the
    memcpy row (its median latency, ``rounds`` = PAIRED_ROUNDS). Collective.
    """
    latencies = {row["method"]: row["latency_us"] for row in block_rows}
    best = best_order(latencies)
    swept = next(row["iterations"] for row in block_rows if row["method"] == best)
    count = paired_iterations(timer, latencies[best] * 1e-6, swept)
    record = paired_bandwidth(case, timer, best, count)
    record["auto_copy"] = auto_copy_label(case.comm, case.block)
    seconds = record["memcpy_us"] * 1e-6
    memcpy_row = latency_row(case, MEMCPY_METHOD, seconds, count, PAIRED_WARMUP, args)
    memcpy_row["rounds"] = PAIRED_ROUNDS
    return record, memcpy_row


def run_collective(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """Sweep block sizes and methods for ``args.command`` (alltoall or allgather) and report.

    Collective over `comm`. Returns 0, or 1 (on every rank) if ``--check`` found a difference.
    """
    collective = args.command
    layout = node_layout(comm)
    now, command = now_iso(), command_line(args)
    report = Reporter(comm, args.progress)
    timer = Timer(comm, args, layout[2])
    multi_node = _context.context(comm).multi_node
    if args.between_nodes and multi_node and not args.persistent:
        added = internode_methods() if collective == ALLGATHER else list(AGGREGATION_METHODS)
        # They force a path of the call rather than time a kind of buffer: on the first kind.
        args.methods = [*args.methods, *(replace(m, buffers=args.buffers[0]) for m in added)]
    names = [m.name for m in args.methods]
    missing = mpi_persistent_missing(comm, collective) if args.persistent else None

    report(f"# zcoll.bench {collective} | {now} | host {socket.gethostname()} | {command}")
    report(f"# latency in us per call, {_describe_method(timer)}; P={comm.size}")
    if args.persistent:
        for line in persistent_header(collective, names, missing):
            report(line)
    else:
        report(table_header(names))
    mpi_persistent = args.persistent and missing is None
    report.start(_sweep_steps(args, mpi_persistent), collective)
    try:
        sweep = sweep_sizes(comm, collective, args, timer, report, names, mpi_persistent)
    finally:
        report.close()
    if sweep is None:
        return 1

    if sweep.bandwidth:
        for line in bandwidth_header(args):
            report(line)
        for record in sweep.bandwidth:
            report(bandwidth_row(record, args))
    speedups = geomean_speedups(sweep.by_block)
    ranges = BLOCK_RANGES
    report(
        "geomean speedup of best method over MPI: "
        + ranges.format(times(speedups["small"]), times(speedups["large"]))
    )
    by_buffers = speedups_by_buffers(sweep.by_block, args.methods)
    if len(args.buffers) > 1:
        for kind, kind_speedups in by_buffers.items():
            report(buffers_summary_line(kind, kind_speedups, ranges))
    summary = persistent_summary(sweep.persistent)
    if args.persistent:
        report(
            "geomean speedup of best persistent plan over MPI: "
            + ranges.format(times(summary["persistent_small"]), times(summary["persistent_large"]))
        )
        note = " (no MPI_init: see the table's title)" if missing else ""
        report(
            "geomean speedup of best persistent plan over MPI_init: "
            + ranges.format(
                times(summary["vs_mpi_persistent_small"]), times(summary["vs_mpi_persistent_large"])
            )
            + note
        )
    report(where(comm, layout))
    if multi_node:
        report(messages_between_nodes(comm, collective))
    report(f"MPI library: {mpi_library()}")
    if comm.rank == 0:
        metadata = {
            "collective": collective,
            **common_metadata(comm, args, layout, now, command),
            "bench_method": args.method,
            "orders": list(args.orders),
            "buffers": list(args.buffers),
            "copy_modes": list(args.copies),
            "flush_bytes": timer.flusher.nbytes if timer.flusher is not None else None,
            "paired_rounds": PAIRED_ROUNDS,
            "geomean_speedup_small": speedups["small"],
            "geomean_speedup_large": speedups["large"],
            "persistent": args.persistent,
            "mpi_persistent": f"comm.{collective.capitalize()}_init" if mpi_persistent else None,
            "mpi_persistent_missing": missing,
            **{f"geomean_speedup_{key}": value for key, value in summary.items()},
            "speedup_by_buffers": by_buffers,
        }
        extra = {"bandwidth": sweep.bandwidth, "persistent": sweep.persistent}
        write_outputs(args, sweep.rows, metadata, FIELDS, extra)
    return 0


def add_timing_options(parser: argparse.ArgumentParser) -> None:
    """The options of how a collective is timed and checked: --method, --iterations,
    --warmup, --time-budget, --check (shared by the collective and irregular benches)."""
    parser.add_argument(
        "--method",
        choices=BENCH_METHODS,
        default="warm",
        help="warm: OSU loop (warm-up, barrier, timed loop); cold: TPDS'18 Fig. 9, caches "
        "flushed and own buffers read before each timed call (default warm)",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        help=f"timed calls per measurement (default: scaled by size, warm; {COLD_ITERATIONS}, "
        "cold)",
    )
    parser.add_argument(
        "--warmup", type=int, help="untimed calls first (default: 10%% of iterations, >= 2; cold 1)"
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="cap on a measurement's timed loop, in seconds (cold: on the whole measurement); "
        f"0: no cap; never cuts below {MIN_ITERATIONS} (warm) calls (default 0.5)",
    )
    parser.add_argument(
        "--check", action="store_true", help="first compare each method's result with MPI's"
    )


def add_size_options(
    parser: argparse.ArgumentParser, title: str, what: str = "block", largest: str = "1M"
) -> None:
    """``--sizes``, ``--min`` and ``--max`` in a group titled `title` (sizes of `what`)."""
    sizes = parser.add_argument_group(title)
    sizes.add_argument("--sizes", type=parse_sizes, help=f"list of {what} sizes, e.g. 8,64,4K,1M")
    sizes.add_argument("--min", type=parse_size, help=f"smallest power-of-two {what} (default 8)")
    sizes.add_argument(
        "--max", type=parse_size, help=f"largest power-of-two {what} (default {largest})"
    )


def add_collective_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``alltoall`` and ``allgather`` (output options are added elsewhere)."""
    add_size_options(parser, "block sizes (default: powers of two, 8 B to 1 MiB)")
    parser.add_argument(
        "--orders",
        type=parse_orders,
        help=f"zcoll block orders to time (default: {','.join(ALL_ORDERS)}; "
        f"with --persistent: {AUTO})",
    )
    parser.add_argument(
        "--copy",
        dest="copies",
        type=parse_copy_modes,
        default=[AUTO],
        metavar="MODE[,MODE...]",
        help="zcoll copy mode(s): auto, temporal, streaming, hybrid; several give one method "
        "per (order, mode), named order/mode (default auto)",
    )
    add_timing_options(parser)
    parser.add_argument(
        "--between-nodes",
        action="store_true",
        help="on a communicator spanning several nodes (or virtual nodes: --virtual-node-size), "
        "also time each way blocks cross nodes: alltoall xn:aggregated (one message per node "
        "pair, TPDS'18 MN-CO) and xn:direct (rank to rank); allgather xn:direct and the "
        "leaders' concurrent exchange xn:C=1,2,4 (SC'05), and phase:* (that part alone)",
    )
    add_buffers_option(parser)
    parser.add_argument(
        "--persistent",
        action="store_true",
        help="also time the persistent collectives beside the plain calls: a zcoll plan per "
        "method (zcoll.alltoall_init run as plan(), named NAME_init), the MPI library's "
        "comm.Alltoall_init (MPI_init, where it has one: MPI-4) and comm.Barrier for "
        "reference, with the speedups of plain calls and plans over MPI",
    )
