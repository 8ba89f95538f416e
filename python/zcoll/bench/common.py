"""What every subcommand of ``python -m zcoll.bench`` shares: the cold-cache (TPDS'18 Fig. 9)
timing loop, run metadata and report helpers, the names of the reference methods; and, from
:mod:`zcoll._timing` (shared with ``python -m zcoll.tune``), size parsing and formatting,
iteration counts, the warm (OSU) timing loop and the rank-0 reporter. The ``--json`` /
``--csv`` / ``--plot`` writers are in :mod:`.output`.
"""

from __future__ import annotations

import argparse
import datetime
import math
import shlex
import socket
import sys
from collections.abc import Sequence
from statistics import median
from typing import Callable

import mpi4py
import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _settings
from zcoll._timing import (
    KIB,
    MIB,
    MIN_ITERATIONS,
    Reporter,
    budget_iterations,
    default_iterations,
    format_size,
    measure,
    node_layout,
    parse_choices,
    parse_size,
    parse_sizes,
    powers_of_two,
)

__all__ = [
    "ARENA_BUFFERS",
    "BUFFER_KINDS",
    "HEAP_BUFFERS",
    "KIB",
    "KIND_SEPARATOR",
    "MEMCPY_METHOD",
    "MIB",
    "MIN_ITERATIONS",
    "MPI_METHOD",
    "MPI_PERSISTENT_METHOD",
    "NUMPY_BUFFERS",
    "PERSISTENT_SUFFIX",
    "CacheFlusher",
    "Reporter",
    "add_buffers_option",
    "budget_cold_iterations",
    "budget_iterations",
    "common_metadata",
    "default_iterations",
    "format_size",
    "kind_name",
    "make_buffers",
    "measure",
    "measure_cold",
    "median",
    "mpi_library",
    "node_layout",
    "parse_buffer_kinds",
    "parse_choices",
    "parse_size",
    "parse_sizes",
    "powers_of_two",
    "ranks_on_node",
]

#: Method names of the references: the MPI library's collective, and a memcpy of its bytes.
MPI_METHOD = "MPI"
MEMCPY_METHOD = "memcpy"
#: ``--persistent``: a persistent method is named after its plain twin with this suffix, as the
#: calls are (``comm.Alltoall_init``, ``zcoll.alltoall_init``): "MPI_init", "auto_init".
PERSISTENT_SUFFIX = "_init"
MPI_PERSISTENT_METHOD = MPI_METHOD + PERSISTENT_SUFFIX
COLD_ITERATIONS = 20  # cold-cache default: each iteration flushes tens of MiB
COLD_MIN_ITERATIONS = 5  # the time budget never cuts a cold measurement below this
FLUSH_FACTOR = 2  # a node's ranks together sweep this many times its last-level cache
BENCH_METHODS = ("warm", "cold")
ARENA_BUFFERS = "arena"  # --buffers: zcoll on arena arrays (zcoll.empty) ...
NUMPY_BUFFERS = "numpy"  # ... or on plain NumPy arrays
HEAP_BUFFERS = "heap"  # ... or on NumPy arrays allocated with zcoll.use_shared_heap()
BUFFER_KINDS = (ARENA_BUFFERS, NUMPY_BUFFERS, HEAP_BUFFERS)
KIND_SEPARATOR = "@"  # several --buffers: method NAME@KIND (auto@numpy)
#: ``--buffers``' help for the byte-moving collectives (alltoall, allgather, the v and
#: neighbourhood ones); the reductions say what they do with the result instead.
BUFFERS_HELP = (
    "zcoll's buffers: arena (zcoll.empty), numpy (plain arrays, as an mpi4py program has them: "
    "pulled by CMA, or staged when small) or heap (plain arrays allocated with "
    "zcoll.use_shared_heap(): used in place); several time each method on each kind in the "
    "same run, named NAME@KIND, with a summary per kind (default arena)"
)


# --- kinds of buffers (--buffers) ----------------------------------------------------------------


def parse_buffer_kinds(text: str) -> list[str]:
    """Parse a comma-separated list of buffer kinds (``"numpy,heap,arena"``), in order."""
    return parse_choices(text, BUFFER_KINDS, "buffer kind(s)")


def kind_name(name: str, kind: str, kinds: Sequence[str]) -> str:
    """Method `name` on buffers of `kind`: ``NAME@KIND`` when several `kinds` are timed, else
    `name` unchanged."""
    return f"{name}{KIND_SEPARATOR}{kind}" if len(kinds) > 1 else name


def make_buffers(
    comm: MPI.Comm, kind: str, send_shape, recv_shape, dtype=np.uint8, arena_recv: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """A send and a (zeroed) receive array of buffer `kind`: in the node's arena ("arena":
    ``zcoll.empty``/``zcoll.zeros``; the receive array a plain one unless `arena_recv`),
    ordinary NumPy arrays as an mpi4py program has them ("numpy"), or NumPy arrays on the
    shared heap ("heap": allocated under ``zcoll.use_shared_heap()``). Collective for
    "arena" (the arena allocates collectively), local otherwise."""
    if kind == ARENA_BUFFERS:
        send = zcoll.empty(comm, send_shape, dtype)
        recv = zcoll.zeros(comm, recv_shape, dtype) if arena_recv else np.zeros(recv_shape, dtype)
        return send, recv
    # "numpy" turns the heap off too: plain arrays even under ZCOLL_SHARED_HEAP=1.
    with zcoll.use_shared_heap(kind == HEAP_BUFFERS):
        return np.empty(send_shape, dtype), np.zeros(recv_shape, dtype)


def add_buffers_option(parser: argparse.ArgumentParser, help_text: str = BUFFERS_HELP) -> None:
    """``--buffers KIND[,KIND...]`` (default arena; :func:`parse_buffer_kinds`)."""
    parser.add_argument(
        "--buffers",
        type=parse_buffer_kinds,
        default=[ARENA_BUFFERS],
        metavar="KIND[,KIND...]",
        help=help_text,
    )


# --- cold-cache timing (TPDS'18 Fig. 9) --------------------------------------------------------


def ranks_on_node(comm: MPI.Comm) -> int:
    """How many ranks of `comm` share this rank's node (memory); collective."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    size = node.size
    node.Free()
    return size


class CacheFlusher:
    """A private buffer whose sweep (read and write every byte) evicts this rank's caches.

    The ranks of a node sweep ``FLUSH_FACTOR`` times the last-level cache between them (the
    LLC is shared, and they all flush at once, before a barrier), each at least
    ``FLUSH_FACTOR`` times its core's L2 (private). Cache sizes come from hwloc. Collective
    over `comm` (counts the ranks on each node).
    """

    def __init__(self, comm: MPI.Comm) -> None:
        facts = _settings.machine()
        l2, llc = facts["l2_bytes"].value, facts["llc_bytes"].value
        share = FLUSH_FACTOR * llc // ranks_on_node(comm)
        nbytes = max(share, FLUSH_FACTOR * l2, 64 * KIB)
        self.buffer = np.ones(-(-nbytes // 8), np.uint64)  # touched now: no zero pages later

    @property
    def nbytes(self) -> int:
        """Bytes swept per flush."""
        return self.buffer.nbytes

    def flush(self) -> None:
        """Read and write the whole buffer: what was cached before is evicted."""
        np.add(self.buffer, 1, out=self.buffer)


def touch(buffers: Sequence[np.ndarray]) -> int:
    """Read every byte of `buffers` (this rank's own send and receive buffers), sequentially.

    Returns a checksum, so the reads cannot be optimised away.
    """
    total = 0
    for buf in buffers:
        flat = buf.reshape(-1).view(np.uint8)
        words = flat.size // 8
        if flat.ctypes.data % 8 == 0 and words:
            total += int(flat[: words * 8].view(np.uint64).sum(dtype=np.uint64))
        total += int(flat[words * 8 :].sum())
    return total


def measure_cold(
    fn: Callable[[], object],
    iterations: int,
    warmup: int,
    comm: MPI.Comm,
    buffers: Sequence[np.ndarray],
    flusher: CacheFlusher,
) -> float:
    """Time a collective call with cold caches, as TPDS'18 Fig. 9 does.

    Collective over `comm`. After ``warmup`` untimed calls, every iteration: each rank sweeps
    its flush buffer (evicting everything), meets the others at a barrier (so no rank's flush
    evicts what another has just brought in), reads its own `buffers` sequentially (its send
    and receive buffers: in its own caches, as after the owner wrote them), meets the others
    again, then times one call.

    Returns
    -------
    float
        Seconds per call: the largest over the ranks of each rank's mean per-call time.
    """
    for _ in range(warmup):
        fn()
    total = 0.0
    for _ in range(iterations):
        flusher.flush()
        comm.Barrier()
        touch(buffers)
        comm.Barrier()
        start = MPI.Wtime()
        fn()
        total += MPI.Wtime() - start
    return comm.allreduce(total / iterations, op=MPI.MAX)


def budget_cold_iterations(iterations: int, budget: float, per_iteration: float) -> int:
    """Cut a cold measurement's `iterations` so that it takes about `budget` seconds (0: no cut).

    `per_iteration` is the cost of a whole cold iteration (flush, barriers, touch and call),
    the same on every rank. Never cut below ``min(iterations, COLD_MIN_ITERATIONS)``.
    """
    if budget <= 0 or per_iteration <= 0:
        return iterations
    affordable = int(budget / per_iteration)
    return max(min(iterations, COLD_MIN_ITERATIONS), min(iterations, affordable))


def cold_iteration_seconds(comm, fn, buffers, flusher: CacheFlusher) -> float:
    """Wall time of one whole cold iteration (the largest over the ranks); collective."""
    start = MPI.Wtime()
    measure_cold(fn, 1, 0, comm, buffers, flusher)
    return comm.allreduce(MPI.Wtime() - start, op=MPI.MAX)


# --- run metadata ------------------------------------------------------------------------------


def mpi_library() -> str:
    """First line of the MPI library's version string."""
    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0].strip()


def common_metadata(comm: MPI.Comm, args, layout, now: str, command: str) -> dict:
    """Metadata every subcommand records: ranks, nodes, host, date, command, versions."""
    nodes, cpus, oversubscription = layout
    return {
        "P": comm.size,
        "nodes": nodes,
        "cpus_per_node": cpus,
        "ranks_per_cpu": oversubscription,
        "date": now,
        "host": socket.gethostname(),
        "command": command,
        "mpi_library": mpi_library(),
        "versions": {
            "zcoll": zcoll.__version__,
            "mpi4py": mpi4py.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
        },
        "environment": _settings.zcoll_environment(),
        "time_budget_s": getattr(args, "time_budget", None),
        "checked": getattr(args, "check", False),
    }


def now_iso() -> str:
    """The local date and time, to the second, with the UTC offset."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def command_line(args) -> str:
    """The command that reproduces this run."""
    return shlex.join(["python", "-m", "zcoll.bench", *args.argv])


def where(comm: MPI.Comm, layout) -> str:
    """``P = 4 ranks on 1 node, 2 CPUs per node, 2 ranks per CPU``."""
    nodes, cpus, oversubscription = layout
    crowded = f", {oversubscription:g} ranks per CPU" if oversubscription > 1 else ""
    ranks = plural(comm.size, "rank")
    return f"P = {ranks} on {plural(nodes, 'node')}, {cpus} CPUs per node{crowded}"


def plural(count: int, word: str) -> str:
    """``"1 rank"``, ``"2 ranks"``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def times(value: float | None) -> str:
    """A ratio as ``"1.23x"``, or ``"n/a"``."""
    return "n/a" if value is None else f"{value:.2f}x"


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """`numerator` / `denominator`, or None when either is missing (or the denominator is 0)."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def geomean(values) -> float | None:
    """Geometric mean of the values that are set and nonzero; None if there are none."""
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def all_ok(comm: MPI.Comm, ok: bool) -> bool:
    """Whether `ok` holds on every rank (the same answer on every rank)."""
    return comm.allreduce(bool(ok), op=MPI.LAND)
