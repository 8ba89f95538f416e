"""Cache misses of zcoll's block orders: TPDS'18 Tables 1-2 for this machine.

``python -m zcoll.bench cachemiss`` replays the schedule of one alltoall or allgather in one process
(``zcoll_replay``, installed in ``zcoll/bin``) under valgrind's cache simulator, for every
collective, number of ranks P, block size and order asked for, and prints the L1 and last-level
misses per rank in the layout of the paper's tables, with the ratio Morton / row.

``--collective neighbor_alltoall --grid 8x8`` (any ``AxB`` or ``AxBxC``, several separated by
commas) does the same for the neighbourhood collective on a periodic Cartesian grid of
P = A*B(*C) ranks (row-major, as ``comm.Create_cart`` without reordering), every edge carrying
one block: the replay builds each rank's lists as zcoll does for a Cartesian communicator,
matches them into 4-tuples (sender, receiver, send block, receive block) and orders them as the
engine does (``zcoll::match_edges``, ``zcoll::ordered_tuples``). Row order is the engine's naive
baseline (each rank copies its own receive blocks); the other orders cut the ordered stream of
bytes into P equal pieces at cache lines. Each rank's piece runs through the engine's own copy
loop (``zcoll::copy_tuples``), which walks the ordered tuples from the start of the stream; the
engine reads every tuple's metadata just before copying (it checks all counts and sums the
stream), so the replay does too outside the counted region, and the counts are the data's
misses (``--metadata cold``: with every rank's walk through the tuples up to its piece cold).

The model is the paper's ideal distributed cache (§2.3): every rank has a private cache. The
replay runs the ranks' segments one after another; before each it evicts the simulated caches,
so every rank starts cold as on its own core (the cache complexities of §2.3 count every line a
rank touches). ``--warm own`` first reads the rank's own send and receive buffers, as the
benchmark of TPDS'18 Fig. 9 does before each call.
Only the segment's copies are counted (callgrind ``--toggle-collect`` on the function that runs
them, through the engine's own ``zcoll::copy_segment``; neighbourhood collectives: the one that
runs ``zcoll::copy_tuples``): setup, eviction and warm-up are not.

valgrind simulates two levels: D1 (the L1 data cache) and an "LL" level, which this tool sets to
each core's private L2 (the last private level; a shared L3 is not a per-rank cache and is not
modelled). ``perf stat`` hardware counters would count the whole process, not one segment, and
are often unavailable (virtual machines); this tool uses the simulator only.

``--topology "package:2 numa:2 core:4 pu:1"`` (an hwloc synthetic description or XML file, as
``ZCOLL_TOPOLOGY``) places rank i on that machine's i-th PU (wrapping), replays ``numa`` (and
every order) with those NUMA nodes, and reports per order the cross-domain bytes: what the
ranks read and write in a NUMA domain other than their own, every buffer living in its owner's
domain (TPDS'18 §2.4's remote accesses), counted from the schedule itself (no simulation).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import zcoll
from zcoll import _core, _registry, _settings
from zcoll._registry import MORTON, ROW

__all__ = [
    "ALL_OPS",
    "NEIGHBOR",
    "ORDERS",
    "OPS",
    "PAPER_GEOMETRY",
    "CacheGeometry",
    "Config",
    "cross_domain_bytes",
    "placed_numa_nodes",
    "Measurement",
    "add_options",
    "build_parser",
    "finish_args",
    "format_grid",
    "host_geometry",
    "main",
    "measure",
    "parse_event_totals",
    "parse_grid",
    "replay_binary",
    "run",
    "run_config",
]

ORDERS = _registry.ORDERS
OPS = _registry.COLLECTIVES
NEIGHBOR = "neighbor_alltoall"  # on a periodic Cartesian grid (--grid)
ALL_OPS = (*OPS, NEIGHBOR)
REPLAY_NAME = "zcoll_replay"
ARENA_COLOUR_STRIDE = _core.ARENA_COLOUR_STRIDE  # the replay lays buffers out like the arena
SEGMENT_FUNCTION = "zcoll_replay_segment"
TUPLES_FUNCTION = "zcoll_replay_tuples"  # the measured function of neighbourhood replays
DEFAULT_GRIDS = ((8, 8),)  # issue #14
DEFAULT_PROCS = (16, 64)
DEFAULT_BLOCKS = (8, 64, 512, 4096, 32768)  # the rows of TPDS'18 Tables 1-2 up to 32 KiB
QUICK = {"procs": (16,), "blocks": (8, 512), "orders": (ROW, MORTON)}
TARGET = {"p": 64, "max_block": 512, "ratio": 0.6}  # issue #5: morton <= 0.6 x row
RUN_TIMEOUT_S = 900


@dataclasses.dataclass(frozen=True)
class CacheGeometry:
    """One simulated cache: total bytes, ways, line bytes (valgrind's ``--D1=``/``--LL=``)."""

    size: int
    assoc: int
    line: int

    @classmethod
    def parse(cls, text: str) -> CacheGeometry:
        """Parses ``"SIZE,ASSOC,LINE"`` (bytes, ways, bytes)."""
        try:
            size, assoc, line = (int(v) for v in text.split(","))
        except ValueError:
            raise ValueError(f"cache geometry is SIZE,ASSOC,LINE in bytes, got {text!r}") from None
        geometry = cls(size, assoc, line)
        geometry.check()
        return geometry

    def check(self) -> None:
        """Raises ``ValueError`` unless valgrind can simulate this cache."""
        sets, rest = divmod(self.size, max(self.assoc * self.line, 1))
        if min(self.size, self.assoc, self.line) <= 0 or rest or sets & (sets - 1):
            raise ValueError(
                f"cache of {self.size} B, {self.assoc} ways, {self.line} B lines: valgrind needs "
                "a power-of-two number of sets (size / (ways * line))"
            )

    def arg(self) -> str:
        return f"{self.size},{self.assoc},{self.line}"

    def __str__(self) -> str:
        return f"{_human(self.size)} {self.assoc}-way {self.line} B lines"


# Xeon E7-8890 v3 (the paper's Tables 1-2): L1d 32 KiB 8-way; the private L2 256 KiB 8-way.
PAPER_GEOMETRY = (CacheGeometry(32768, 8, 64), CacheGeometry(262144, 8, 64))


def host_geometry(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> tuple:
    """This machine's L1 data cache and private L2, as Linux describes CPU 0's caches.

    Returns
    -------
    tuple of CacheGeometry
        ``(l1d, l2)``.

    Raises
    ------
    RuntimeError
        When sysfs does not describe both (give ``--d1`` and ``--ll`` instead).
    """
    found = {}
    for index in sorted(sysfs.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_sysfs_size((index / "size").read_text().strip())
            assoc = int((index / "ways_of_associativity").read_text())
            line = int((index / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        if (level, kind) in ((1, "Data"), (2, "Unified"), (2, "Data")):
            found[level] = CacheGeometry(size, assoc, line)
    if 1 not in found or 2 not in found:
        raise RuntimeError(
            f"{sysfs} does not describe this machine's L1d and L2; "
            "give --d1 and --ll (SIZE,ASSOC,LINE) or --cache paper"
        )
    return found[1], found[2]


def _parse_sysfs_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def parse_grid(text: str) -> tuple:
    """``"8x8"`` -> ``(8, 8)``: a Cartesian grid's dimensions (each at least 1)."""
    try:
        dims = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"a grid is AxB or AxBxC (positive integers), got {text!r}") from None
    if min(dims) < 1:
        raise ValueError(f"a grid is AxB or AxBxC (positive integers), got {text!r}")
    return dims


def format_grid(dims: Sequence[int]) -> str:
    """``(8, 8)`` -> ``"8x8"``."""
    return "x".join(map(str, dims))


@dataclasses.dataclass(frozen=True)
class Config:
    """One replay: a collective, P ranks, a block size in bytes, an order; for
    ``neighbor_alltoall`` the periodic Cartesian grid's dimensions (P is their product)."""

    op: str
    p: int
    block: int
    order: str
    grid: tuple = ()
    numa: tuple = ()  # each rank's NUMA node (--topology), empty: unknown (one domain)

    def key(self) -> tuple:
        """(op, grid, p, block, order): what a table row and column stand for."""
        return (self.op, self.grid, self.p, self.block, self.order)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Simulated misses of one replay, summed over its P ranks' segments."""

    config: Config
    d1_read: int
    d1_write: int
    ll_read: int
    ll_write: int
    data_refs: int  # loads and stores the segments made
    cross_read: int | None = None  # bytes read in another NUMA domain (--topology only)
    cross_write: int | None = None  # bytes written in another NUMA domain

    @property
    def d1_per_rank(self) -> float:
        """L1 data misses (reads + writes) per rank."""
        return (self.d1_read + self.d1_write) / self.config.p

    @property
    def ll_per_rank(self) -> float:
        """Last-level (here: L2) data misses per rank."""
        return (self.ll_read + self.ll_write) / self.config.p

    def row(self) -> dict:
        """A flat dict for JSON/CSV output (``grid`` as ``"8x8"``, only for a grid)."""
        config = dataclasses.asdict(self.config)
        if self.config.grid:
            config["grid"] = format_grid(self.config.grid)
        else:
            del config["grid"]
        del config["numa"]
        cross = {}
        if self.cross_read is not None:
            cross = {"cross_read": self.cross_read, "cross_write": self.cross_write}
        return {
            **config,
            "d1_read": self.d1_read,
            "d1_write": self.d1_write,
            "ll_read": self.ll_read,
            "ll_write": self.ll_write,
            "data_refs": self.data_refs,
            "d1_per_rank": self.d1_per_rank,
            "ll_per_rank": self.ll_per_rank,
            **cross,
        }


def placed_numa_nodes(topology: str, p: int) -> tuple:
    """The NUMA node of each of `p` ranks placed on `topology`'s PUs in order (wrapping), as
    ``ZCOLL_TOPOLOGY`` places a node's ranks."""
    return tuple(_core.locate_described_pu(topology, i)["numa_node"] for i in range(p))


def cross_domain_bytes(config: Config) -> tuple:
    """(read, write): bytes the ranks of `config` read and write, over the whole call, in a
    NUMA domain (``config.numa``) other than their own; each rank's buffers live in its own.

    A block (d, s) copied by rank e is read from rank s's buffer and written into rank d's, as
    the engine's copy loop does (out of place: the replay's collectives)."""
    import numpy as np

    p = config.p
    numa = np.asarray(config.numa or (0,) * p)
    blocks, starts = _core.schedule(p, ORDERS.index(config.order), "full", list(config.numa))
    copier = np.repeat(np.arange(p), np.diff(starts))
    read = int(np.count_nonzero(numa[blocks[:, 1]] != numa[copier])) * config.block
    write = int(np.count_nonzero(numa[blocks[:, 0]] != numa[copier])) * config.block
    return read, write


def parse_event_totals(path: str | os.PathLike) -> dict:
    """Event totals of a callgrind or cachegrind output file.

    Reads the ``events:`` line (the event names) and the ``totals:`` line (callgrind) or else
    the ``summary:`` line (both tools), which hold the counts in the same order.

    Returns
    -------
    dict
        Event name (``Dr``, ``D1mr``, ``DLmw``, ...) to count.

    Raises
    ------
    ValueError
        When the file lacks either line or they do not match.
    """
    events = None
    totals = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("events", "totals", "summary") and rest.strip():
                if key == "events":
                    events = rest.split()
                else:
                    totals[key] = [int(v) for v in rest.split()]
    counts = totals.get("totals", totals.get("summary"))
    if events is None or counts is None:
        raise ValueError(f"{path}: no 'events:' and 'totals:'/'summary:' lines")
    if len(counts) > len(events):
        raise ValueError(f"{path}: {len(counts)} counts for {len(events)} events")
    # Trailing zero counts may be omitted.
    return dict(zip(events, counts + [0] * (len(events) - len(counts))))


def replay_binary() -> Path:
    """Path of the installed ``zcoll_replay`` executable (``ZCOLL_REPLAY`` overrides it).

    Raises
    ------
    FileNotFoundError
        When it is not installed next to the package.
    """
    override = _settings.read("replay")
    if override.value is not None:
        if not os.access(override.value, os.X_OK):
            raise FileNotFoundError(f"ZCOLL_REPLAY={override.text} is not an executable file")
        return override.value
    roots = [Path(p) for p in zcoll.__path__]
    # Editable installs keep the Python sources elsewhere than the installed files.
    roots += [Path(sysconfig.get_paths()[k]) / "zcoll" for k in ("platlib", "purelib")]
    for root in roots:
        path = root / "bin" / REPLAY_NAME
        if os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(
        f"{REPLAY_NAME} is not installed in zcoll/bin (looked in "
        f"{', '.join(str(r / 'bin') for r in roots)}); reinstall zcoll with pip"
    )


def valgrind_binary() -> str:
    """Path of ``valgrind``; ``RuntimeError`` naming the package to install when missing."""
    path = shutil.which("valgrind")
    if path is None:
        raise RuntimeError(
            "valgrind is not installed: apt-get install valgrind (Debian/Ubuntu), "
            "or your distribution's valgrind package"
        )
    return path


def replay_command(
    config: Config,
    d1: CacheGeometry,
    ll: CacheGeometry,
    out_file: str,
    *,
    warm: str = "none",
    prefetch: bool = False,
    skew: int = ARENA_COLOUR_STRIDE,
    metadata: str = "warm",
) -> list:
    """The valgrind command line that simulates ``config`` (see :func:`run_config`)."""
    if config.grid:
        function = TUPLES_FUNCTION
        shape = ["--grid", format_grid(config.grid), "--metadata", metadata]
    else:
        function, shape = SEGMENT_FUNCTION, ["--p", str(config.p)]
        if config.numa:
            shape += ["--numa", ",".join(map(str, config.numa))]
    return [
        valgrind_binary(),
        "--tool=callgrind",
        "--cache-sim=yes",
        f"--simulate-hwpref={'yes' if prefetch else 'no'}",
        f"--D1={d1.arg()}",
        f"--LL={ll.arg()}",
        f"--toggle-collect={function}",
        f"--callgrind-out-file={out_file}",
        str(replay_binary()),
        "--op",
        config.op,
        "--order",
        config.order,
        *shape,
        "--block",
        str(config.block),
        "--warm",
        warm,
        "--evict-bytes",
        str(2 * max(d1.size, ll.size)),
        "--skew",
        str(skew),
    ]


def run_config(
    config: Config,
    d1: CacheGeometry,
    ll: CacheGeometry,
    *,
    warm: str = "none",
    prefetch: bool = False,
    skew: int = ARENA_COLOUR_STRIDE,
    metadata: str = "warm",
) -> Measurement:
    """Simulates one replay under valgrind and returns its misses.

    Parameters
    ----------
    config : Config
        The collective, P, block bytes and order.
    d1, ll : CacheGeometry
        The simulated L1 data cache and last level (the private L2 in the presets).
    warm : {"own", "none"}
        Whether each rank reads its own buffers before its segment (TPDS'18 Fig. 9).
    prefetch : bool
        Simulate valgrind's hardware prefetcher (it prefetches into the LL level only).
    skew : int
        Start rank r's partition r * skew bytes (mod 4096) into its pages instead of on a page
        boundary (a multiple of 64): shows what page-aligned partitions cost in conflict misses.
    metadata : {"warm", "cold"}
        Neighbourhood collectives: whether each rank reads the tuples' metadata before its piece,
        as the engine does (warm), or its copy loop's walk through the tuples starts cold.

    Raises
    ------
    RuntimeError
        When valgrind or the replay fails.
    """
    with tempfile.TemporaryDirectory(prefix="zcoll-cachemiss-") as tmp:
        out_file = os.path.join(tmp, "callgrind.out")
        cmd = replay_command(
            config, d1, ll, out_file, warm=warm, prefetch=prefetch, skew=skew, metadata=metadata
        )
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{config}: valgrind ran past {RUN_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            raise RuntimeError(
                f"{config}: valgrind exited {proc.returncode}:\n{proc.stderr[-2000:]}"
            )
        ev = parse_event_totals(out_file)
    cross = cross_domain_bytes(config) if config.numa else (None, None)
    try:
        return Measurement(
            config, ev["D1mr"], ev["D1mw"], ev["DLmr"], ev["DLmw"], ev["Dr"] + ev["Dw"], *cross
        )
    except KeyError as e:
        raise RuntimeError(f"{config}: callgrind did not report event {e}") from None


def measure(
    configs: Sequence[Config],
    d1: CacheGeometry,
    ll: CacheGeometry,
    *,
    warm: str = "none",
    prefetch: bool = False,
    skew: int = ARENA_COLOUR_STRIDE,
    metadata: str = "warm",
    jobs: int | None = None,
    progress: bool | None = None,
) -> list:
    """Runs :func:`run_config` for every configuration, ``jobs`` at a time.

    Parameters
    ----------
    warm, prefetch, skew, metadata
        As for :func:`run_config`.
    jobs : int or None
        Valgrind runs at a time (default: the number of CPUs).
    progress : bool or None
        Show a tqdm progress bar; ``None``: when stderr is a terminal and tqdm is installed.

    Returns
    -------
    list of Measurement
        In the order of ``configs``.
    """
    jobs = jobs or _settings.machine()["cpus"].value
    bar = _progress_bar(len(configs), progress)
    # The work runs in valgrind subprocesses: threads are enough to keep `jobs` of them going.
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [
            pool.submit(
                run_config, c, d1, ll, warm=warm, prefetch=prefetch, skew=skew, metadata=metadata
            )
            for c in configs
        ]
        try:
            for _ in concurrent.futures.as_completed(futures):
                if bar is not None:
                    bar.update()
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()
            if bar is not None:
                bar.close()


def _progress_bar(total: int, progress: bool | None):
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="cachegrind replays", unit="run", file=sys.stderr)


def format_tables(results: Iterable[Measurement], orders: Sequence[str]) -> str:
    """The results as the paper's tables: one per collective and P (or grid), rows by block
    size."""
    by_key = {m.config.key(): m for m in results}
    lines = []
    for op in sorted({k[0] for k in by_key}, key=ALL_OPS.index):
        for grid, p in sorted({k[1:3] for k in by_key if k[0] == op}, key=lambda g: (g[1], g[0])):
            blocks = sorted({k[3] for k in by_key if k[:3] == (op, grid, p)})
            lines += _table(op, grid, p, blocks, orders, by_key)
    return "\n".join(lines)


def _table(
    op: str, grid: tuple, p: int, blocks: Sequence[int], orders: Sequence[str], by_key: dict
) -> list:
    ratio = ROW in orders and MORTON in orders
    group = list(orders) + (["m/row"] if ratio else [])
    width = 9
    group_width = width * len(group)
    titles = (f"{t:^{group_width}}" for t in ("L1d misses per rank", "L2 misses per rank"))
    head = f"{'block':>8}  " + "  ".join(titles)
    names = "".join(f"{n:>{width}}" for n in group)
    title = f"{op}, grid {format_grid(grid)} (P = {p})" if grid else f"{op}, P = {p}"
    out = [title, head, f"{'':>8}  {names}  {names}"]
    for b in blocks:
        cells = []
        for attr in ("d1_per_rank", "ll_per_rank"):
            vals = {o: getattr(by_key[(op, grid, p, b, o)], attr) for o in orders}
            cell = "".join(f"{vals[o]:>{width}.0f}" for o in orders)
            if ratio:
                cell += f"{_ratio(vals['morton'], vals['row']):>{width}.2f}"
            cells.append(cell)
        out.append(f"{_human(b):>8}  {cells[0]}  {cells[1]}")
    out.append("")
    if all(by_key[(op, grid, p, b, o)].cross_read is not None for b in blocks for o in orders):
        out += _cross_table(op, p, blocks, orders, by_key)
    return out


def _cross_table(
    op: str, p: int, blocks: Sequence[int], orders: Sequence[str], by_key: dict
) -> list:
    """Cross-domain bytes per rank (reads, writes) of each order: a table under the misses."""
    width = max(9, *(len(o) + 1 for o in orders))
    group_width = width * len(orders)
    titles = (f"{t:^{group_width}}" for t in ("cross-domain reads", "cross-domain writes"))
    names = "".join(f"{n:>{width}}" for n in orders)
    domains = len(set(by_key[(op, (), p, blocks[0], orders[0])].config.numa))
    out = [
        f"{op}, P = {p} on {domains} NUMA domains: bytes per rank in another domain",
        f"{'block':>8}  " + "  ".join(titles),
        f"{'':>8}  {names}  {names}",
    ]
    for b in blocks:
        cells = []
        for attr in ("cross_read", "cross_write"):
            cells.append(
                "".join(
                    f"{getattr(by_key[(op, (), p, b, o)], attr) / p:>{width}.0f}" for o in orders
                )
            )
        out.append(f"{_human(b):>8}  {cells[0]}  {cells[1]}")
    out.append("")
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def target_report(results: Iterable[Measurement]) -> list:
    """Lines saying, per collective, whether Morton's L1 misses are at most 0.6 x row's for
    blocks up to 512 B at P = 64 (issue #5's target); empty when those runs are absent."""
    by_key = {dataclasses.astuple(m.config)[:4]: m for m in results if not m.config.grid}
    lines = []
    for op in OPS:
        keys = sorted(
            k
            for k in by_key
            if k[0] == op
            and k[1] == TARGET["p"]
            and k[2] <= TARGET["max_block"]
            and k[3] == MORTON
            and (op, k[1], k[2], ROW) in by_key
        )
        if not keys:
            continue
        parts = []
        for k in keys:
            r = _ratio(by_key[k].d1_per_rank, by_key[(op, k[1], k[2], ROW)].d1_per_rank)
            parts.append(f"{_human(k[2])}: {r:.2f} {'ok' if r <= TARGET['ratio'] else 'MISSED'}")
        lines.append(
            f"target {op} P={TARGET['p']} L1 morton/row <= {TARGET['ratio']}: " + ", ".join(parts)
        )
    return lines


def _human(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def _int_list(text: str) -> tuple:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas: {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def _name_list(allowed: Sequence[str]):
    def parse(text: str) -> tuple:
        names = tuple(text.split(","))
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
        return names

    return parse


def _grid_list(text: str) -> tuple:
    try:
        return tuple(parse_grid(g) for g in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _geometry(text: str) -> CacheGeometry:
    try:
        return CacheGeometry.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


DESCRIPTION = (
    "Simulated L1/L2 misses per rank of zcoll's block orders for alltoall and allgather "
    "(TPDS'18 Tables 1-2), or neighbor_alltoall on a periodic Cartesian grid (--grid), from a "
    "one-process replay under valgrind."
)


def build_parser(prog: str = "python -m zcoll.bench cachemiss") -> argparse.ArgumentParser:
    """The command line of ``python -m zcoll.bench cachemiss`` (or of `prog`)."""
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_options(p)
    return p


def add_options(p: argparse.ArgumentParser) -> None:
    """Add the options of ``python -m zcoll.bench cachemiss`` to `p`."""
    p.add_argument(
        "--ops",
        "--collective",
        dest="ops",
        type=_name_list(ALL_OPS),
        default=None,
        help=f"collectives: {', '.join(ALL_OPS)} (default: alltoall and allgather; with --grid "
        f"{NEIGHBOR})",
    )
    p.add_argument("--procs", type=_int_list, default=DEFAULT_PROCS, help="P values (16,64)")
    p.add_argument(
        "--grid",
        dest="grids",
        type=_grid_list,
        default=None,
        metavar="AxB[,...]",
        help=f"{NEIGHBOR}'s periodic Cartesian grids, e.g. 8x8 or 4x4x4 (P = the product; "
        f"default {','.join(map(format_grid, DEFAULT_GRIDS))}); --procs does not apply",
    )
    p.add_argument(
        "--blocks",
        type=_int_list,
        default=DEFAULT_BLOCKS,
        help="block sizes in bytes (8,64,512,4096,32768: the paper's rows)",
    )
    p.add_argument("--orders", type=_name_list(ORDERS), default=ORDERS, help="block orders")
    p.add_argument(
        "--cache",
        choices=("host", "paper"),
        default="host",
        help="host: this machine's L1d and private L2 (sysfs); paper: the Xeon E7-8890 v3's "
        "(L1d 32 KiB 8-way, L2 256 KiB 8-way)",
    )
    p.add_argument("--d1", type=_geometry, help="L1d as SIZE,ASSOC,LINE (overrides --cache)")
    p.add_argument("--ll", type=_geometry, help="L2 as SIZE,ASSOC,LINE (overrides --cache)")
    p.add_argument(
        "--warm",
        choices=("none", "own"),
        default="none",
        help="none (default): every rank starts with a cold cache, the model of TPDS'18 §2.3; "
        "own: each rank first reads its own send and receive buffers (TPDS'18 Fig. 9)",
    )
    p.add_argument(
        "--prefetch",
        action="store_true",
        help="simulate valgrind's stride prefetcher (into the L2 level only)",
    )
    p.add_argument(
        "--skew",
        type=int,
        default=ARENA_COLOUR_STRIDE,
        metavar="BYTES",
        help="start rank r's buffers r*BYTES (mod 4096, a multiple of 64) past a page boundary; "
        f"default {ARENA_COLOUR_STRIDE}, as the arena colours its partitions; 0: page-aligned",
    )
    p.add_argument(
        "--metadata",
        choices=("warm", "cold"),
        default="warm",
        help=f"{NEIGHBOR}: warm (default): each rank reads every tuple's metadata before its "
        "piece, as the engine does; cold: its copy loop's walk through the tuples to its piece "
        "misses too",
    )
    p.add_argument(
        "--topology",
        metavar="DESCRIPTION",
        help="an hwloc synthetic description (e.g. 'package:2 numa:2 core:4 pu:1') or XML file: "
        "rank i on its i-th PU (as ZCOLL_TOPOLOGY); order numa follows its NUMA nodes, and a "
        "table of cross-domain bytes per rank follows each table of misses",
    )
    p.add_argument("--jobs", type=int, default=None, help="parallel valgrind runs (CPU count)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="P=16, blocks 8 and 512, row and morton: a few seconds (CI)",
    )
    p.add_argument("--json", metavar="PATH", help="write the raw results as JSON")
    p.add_argument("--csv", metavar="PATH", help="write the raw results as CSV")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks and defaults that argparse cannot express (``parser.error`` on misuse)."""
    if args.skew < 0 or args.skew % 64:
        parser.error(f"--skew must be a non-negative multiple of 64, got {args.skew}")
    if args.topology is not None:
        try:
            _core.described_topology(args.topology)
        except ValueError as e:
            parser.error(f"--topology: {str(e).removeprefix('zcoll: ')}")
    if args.grids and args.ops is not None and NEIGHBOR not in args.ops:
        parser.error(f"--grid goes with --collective {NEIGHBOR}")
    _default_ops(args)
    if args.quick:
        args.procs, args.blocks, args.orders = QUICK["procs"], QUICK["blocks"], QUICK["orders"]


def _default_ops(args: argparse.Namespace) -> None:
    if args.ops is None:
        args.ops = (NEIGHBOR,) if args.grids else OPS
    if NEIGHBOR in args.ops and not args.grids:
        args.grids = DEFAULT_GRIDS


def _configs(args: argparse.Namespace) -> list:
    configs = []
    for op in args.ops:
        shapes = (
            [(math.prod(g), g) for g in args.grids]
            if op == NEIGHBOR
            else [(p, ()) for p in args.procs]
        )
        topology = getattr(args, "topology", None)
        configs += [
            Config(
                op, p, b, o, grid, placed_numa_nodes(topology, p) if topology and not grid else ()
            )
            for p, grid in shapes
            for b in args.blocks
            for o in args.orders
        ]
    return configs


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of ``python -m zcoll.bench cachemiss`` (and ``python -m zcoll.cachemiss``,
    `prog`); returns the exit status."""
    parser = build_parser(prog) if prog else build_parser()
    args = parser.parse_args(argv)
    finish_args(parser, args)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Replay and report what `args` (see :func:`build_parser`) asks for; the exit status:
    0, 1 when a replay failed, 2 when valgrind, the replay or the host's caches are missing."""
    try:
        valgrind_binary()
        replay_binary()
        d1, ll = PAPER_GEOMETRY if args.cache == "paper" else host_geometry()
    except (RuntimeError, FileNotFoundError) as e:
        print(f"zcoll.bench cachemiss: {e}", file=sys.stderr)
        return 2
    d1, ll = args.d1 or d1, args.ll or ll
    _default_ops(args)
    configs = _configs(args)
    neighbours = NEIGHBOR in args.ops
    print(
        f"# simulated caches: L1d {d1}, L2 {ll}; warm={args.warm}, "
        f"prefetch={'on' if args.prefetch else 'off'}, skew={args.skew}"
        f"{f', metadata={args.metadata}' if neighbours else ''}; "
        "misses per rank, copies only"
        f"{f'; topology {args.topology!r}' if getattr(args, 'topology', None) else ''}"
    )
    try:
        results = measure(
            configs,
            d1,
            ll,
            warm=args.warm,
            prefetch=args.prefetch,
            skew=args.skew,
            metadata=args.metadata,
            jobs=args.jobs,
            progress=False if args.no_progress else None,
        )
    except RuntimeError as e:
        print(f"zcoll.bench cachemiss: {e}", file=sys.stderr)
        return 1
    print(format_tables(results, args.orders))
    for line in target_report(results):
        print(line)
    _write_outputs(results, args, d1, ll)
    return 0


def _write_outputs(results: Sequence[Measurement], args, d1, ll) -> None:
    rows = [m.row() for m in results]
    if args.json:
        meta = {
            "d1": dataclasses.asdict(d1),
            "ll": dataclasses.asdict(ll),
            "warm": args.warm,
            "prefetch": args.prefetch,
            "skew": args.skew,
        }
        if NEIGHBOR in args.ops:
            meta["metadata"] = args.metadata
        if getattr(args, "topology", None):
            meta["topology"] = args.topology
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"caches": meta, "results": rows}, f, indent=1)
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            fields = list(dict.fromkeys(k for row in rows for k in row))  # grid: some rows only
            writer = csv.DictWriter(f, fieldnames=fields, restval="")
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
