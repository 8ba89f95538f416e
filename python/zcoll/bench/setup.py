"""``setup``: what making and freeing costs, against the MPI and mpi4py-fft calls that do the same.

Three parts (``--parts``), all timed in the same run:

``comm``
    A new communicator and its first call: ``comm.Dup()`` of a communicator that already has a
    zcoll context, ``comm.Split`` and ``comm.Create_cart``, then the first ``zcoll.alltoall``
    (8-byte blocks, plain NumPy buffers made beforehand), then ``Free``; against the same with
    ``newcomm.Alltoall``. The three steps are timed separately: zcoll's first call makes the
    new communicator's context, and its ``Free`` closes it.
``pfft``
    ``PFFT(...)`` then ``destroy()``, ``zcoll.fft`` against ``mpi4py_fft`` with the same
    arguments, over the configuration space of mpi4py-fft's ``tests/test_mpifft.py``: shapes
    16x16x16, 12x13x14 and 12x13x14x15; dtypes float32, float64 (real-to-complex), complex64,
    complex128; slabs (``slab=True``) or the default pencils; unpadded or ``padding=1.5`` on
    every axis; each serial backend of ``--backends`` (planner flags are both libraries'
    defaults, FFTW_MEASURE for ``fftw``).
``pencil``
    mpi4py-fft's ``tests/test_pencil.py`` step for a 16x17x18 float64 array: ``Subcomm(comm,
    2)``, ``Pencil``, ``pencil(0)``, ``transfer()`` and the two arrays (made), one
    ``forward``/``backward`` (run), then the Transfer's and the Subcomm's ``destroy()``.

Each case (one communicator kind, one configuration) is warmed up (``--warmup`` iterations,
which also show whether a library accepts it), then timed in ``--rounds`` alternating rounds,
the order of the libraries reversed every other round, each round a loop of ``--iterations``
iterations. Every step of an iteration starts after a barrier, so it is timed from when all
ranks are ready to when each is done, and no step holds a wait for a rank still busy with the
step before; a step's time is the largest over the ranks of that rank's mean, the total the
largest of the ranks' sums of their steps (barriers excluded). The medians over the rounds are
reported (the fastest round's total too, in the files). Every
timed object is freed or destroyed in the iteration that made it; at the end the run checks
that nothing is left: no new zcoll entry in ``/dev/shm``, no zcoll context still open, and
resident memory flat over the timed rounds (``warning:`` lines if not).

The summary compares with issue 36's targets: the first zcoll call on a fresh ``Dup`` within
50 us and on any fresh communicator within 0.3 ms; PFFT construction plus ``destroy()`` at
least as fast as mpi4py-fft's (geomean of mpi4py-fft / zcoll at least 1, none below 0.8); the
Pencil and Transfer step at least 0.8x. mpi4py-fft is optional: without it ``pfft`` and
``pencil`` time zcoll alone, and the report says why.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _context

from .common import (
    MPI_METHOD,
    Reporter,
    command_line,
    common_metadata,
    geomean,
    mpi_library,
    node_layout,
    now_iso,
    parse_choices,
    ratio,
    where,
)
from .output import write_outputs

__all__ = [
    "PFFT_SHAPES",
    "SETUP_FIELDS",
    "SETUP_PARTS",
    "add_options",
    "finish_args",
    "pfft_configurations",
    "run_setup",
]

SETUP_PARTS = ("comm", "pfft", "pencil")
SETUP_BACKENDS = ("numpy", "fftw")
SETUP_ROUNDS = 5
SETUP_ITERATIONS = 10
ZCOLL, MPI4PY_FFT = "zcoll", "mpi4py-fft"

#: ``comm``: how each new communicator is made from its parent.
COMM_KINDS: dict[str, Callable[[MPI.Intracomm], MPI.Comm]] = {
    "Dup": lambda parent: parent.Dup(),
    "Split": lambda parent: parent.Split(0, parent.rank),
    "Create_cart": lambda parent: parent.Create_cart([parent.size], reorder=False),
}
#: ``pfft``: mpi4py-fft's test_mpifft shapes and dtypes, decompositions and paddings.
PFFT_SHAPES = ((16, 16, 16), (12, 13, 14), (12, 13, 14, 15))
PFFT_DTYPES = ("float32", "float64", "complex64", "complex128")
DECOMPOSITIONS = ("slab", "pencil")
PADDINGS = (0.0, 1.5)  # 0: unpadded
#: ``--quick``: a handful of configurations (the first backend of ``--backends`` each).
QUICK_PFFT = (
    ((16, 16, 16), "complex128", "pencil", 0.0),
    ((12, 13, 14), "float64", "slab", 1.5),
    ((12, 13, 14, 15), "float32", "pencil", 0.0),
)
#: ``pencil``: mpi4py-fft's test_pencil step on one array.
PENCIL_SHAPE = (16, 17, 18)
PENCIL_DTYPE = "float64"

#: Issue 36's targets.
DUP_FIRST_CALL_US = 50.0  # first zcoll call on a fresh Dup of a communicator with a context
FRESH_FIRST_CALL_US = 300.0  # ... on any fresh communicator
PFFT_GEOMEAN = 1.0  # mpi4py-fft / zcoll, PFFT construction + destroy(): geomean at least
PFFT_WORST = 0.8  # ... and no configuration below
PENCIL_RATIO = 0.8  # Subcomm + Pencil + transfer + one run + destroy(): at least

#: Resident memory may grow this much over all timed rounds before the run warns of a leak:
#: allocators keep some freed pages, so a little growth is no leak, while a leaked plan,
#: array or communicator per iteration adds far more over thousands of iterations.
RSS_SLACK = 4 << 20

#: Each step's time per part, in the order they run; a row has ``<step>_us`` for its steps.
STEPS = {
    "comm": ("create", "first_call", "free"),
    "pfft": ("construct", "destroy"),
    "pencil": ("construct", "run", "destroy"),
}
SETUP_FIELDS = (
    "benchmark",
    "part",
    "case",
    "method",
    "P",
    "backend",
    "dtype",
    "shape",
    "decomposition",
    "padding",
    "total_us",
    "best_total_us",
    "create_us",
    "first_call_us",
    "construct_us",
    "run_us",
    "free_us",
    "destroy_us",
    "iterations",
    "warmup",
    "rounds",
)


# --- options -----------------------------------------------------------------------------------


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``setup`` (output options are added elsewhere)."""
    parser.add_argument(
        "--parts",
        type=functools.partial(parse_choices, choices=SETUP_PARTS, what="part"),
        default=list(SETUP_PARTS),
        metavar="PART,...",
        help="what to time: comm (a new communicator and its first call), pfft (PFFT "
        "construction and destroy()), pencil (Subcomm, Pencil and Transfer) "
        f"(default {','.join(SETUP_PARTS)})",
    )
    parser.add_argument(
        "--backends",
        type=functools.partial(parse_choices, choices=SETUP_BACKENDS, what="backend"),
        default=list(SETUP_BACKENDS),
        metavar="NAME,...",
        help="pfft: the serial FFT backends, given to both libraries "
        f"(default {','.join(SETUP_BACKENDS)})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=SETUP_ROUNDS,
        help="alternating rounds per case, each one timed loop of every library, the order "
        f"reversed every other round; the medians are reported (default {SETUP_ROUNDS})",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=SETUP_ITERATIONS,
        help=f"make-and-free iterations per timed loop (default {SETUP_ITERATIONS})",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed iterations of each case first; at least one runs, to see whether each "
        "library accepts the case (default 1)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"pfft: {len(QUICK_PFFT)} configurations of the first backend only (for tests)",
    )
    parser.add_argument(
        "--no-mpi4py-fft",
        dest="mpi4py_fft",
        action="store_false",
        help="pfft, pencil: time zcoll alone",
    )


def finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks argparse cannot express (calls ``parser.error`` on misuse)."""
    for name in ("rounds", "iterations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")


# --- configurations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PfftConfig:
    """One PFFT configuration, given alike to both libraries."""

    backend: str
    shape: tuple[int, ...]
    dtype: str
    decomposition: str  # "slab" (slab=True) or "pencil" (the default grid)
    padding: float  # 0: unpadded; else this factor on every axis

    def kwargs(self) -> dict[str, Any]:
        """PFFT's keyword arguments, fresh for every call (mpi4py-fft rewrites the padding list
        it is given)."""
        kw: dict[str, Any] = {
            "dtype": np.dtype(self.dtype),
            "backend": self.backend,
            "padding": [self.padding] * len(self.shape) if self.padding else False,
        }
        if self.decomposition == "slab":
            kw["slab"] = True
        return kw

    def label(self) -> str:
        padding = f"pad {self.padding:g}" if self.padding else "-"
        shape = "x".join(map(str, self.shape))
        return f"{self.backend:<8}{self.dtype:<11}{shape:<12}{self.decomposition:<7}{padding:<8}"


def pfft_configurations(backends: Sequence[str], quick: bool = False) -> list[PfftConfig]:
    """The configurations of the ``pfft`` part: every backend x shape x dtype x decomposition
    x padding, or with `quick` the few of ``QUICK_PFFT`` on the first backend."""
    if quick:
        return [PfftConfig(backends[0], *config) for config in QUICK_PFFT]
    return [
        PfftConfig(backend, shape, dtype, decomposition, padding)
        for backend in backends
        for shape in PFFT_SHAPES
        for dtype in PFFT_DTYPES
        for decomposition in DECOMPOSITIONS
        for padding in PADDINGS
    ]


# --- what one iteration does -------------------------------------------------------------------

#: One iteration of a case: makes, uses and frees its objects; returns each step's seconds.
Iteration = Callable[[], Sequence[float]]


class Stopwatch:
    """The steps of one iteration, each timed from a barrier over `comm`: from when every rank
    is ready to when this one is done, so no step's time holds a wait for a rank still busy
    with the one before."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.comm = comm
        self.laps: list[float] = []
        self.started = 0.0

    def go(self) -> None:
        self.comm.Barrier()
        self.started = time.perf_counter()

    def stop(self) -> None:
        self.laps.append(time.perf_counter() - self.started)


def _library(method: str, submodule: str) -> Any:
    """zcoll.fft's module, or mpi4py-fft's of the same name."""
    return importlib.import_module(("zcoll.fft" if method == ZCOLL else "mpi4py_fft") + submodule)


def comm_iteration(parent: MPI.Intracomm, kind: str, method: str) -> Iteration:
    """A new communicator of `kind` from `parent`, its first 8-byte-block alltoall (zcoll's or
    MPI's), its Free: (create, first call, free) seconds."""
    make = COMM_KINDS[kind]
    send = np.arange(parent.size, dtype=np.float64).reshape(parent.size, 1)
    recv = np.empty_like(send)
    if method == ZCOLL:

        def call(comm):
            zcoll.alltoall(comm, send, recv)
    else:

        def call(comm):
            comm.Alltoall(send, recv)

    def once() -> list[float]:
        watch = Stopwatch(parent)
        watch.go()
        comm = make(parent)
        watch.stop()
        watch.go()
        call(comm)
        watch.stop()
        watch.go()
        comm.Free()
        watch.stop()
        return watch.laps

    return once


def pfft_iteration(comm: MPI.Intracomm, config: PfftConfig, method: str) -> Iteration:
    """``PFFT(comm, shape, **config)`` then ``destroy()``: (construct, destroy) seconds."""
    PFFT = _library(method, "").PFFT

    def once() -> list[float]:
        watch = Stopwatch(comm)
        watch.go()
        plan = PFFT(comm, config.shape, **config.kwargs())
        watch.stop()
        watch.go()
        plan.destroy()
        del plan
        watch.stop()
        return watch.laps

    return once


def pencil_iteration(comm: MPI.Intracomm, method: str) -> Iteration:
    """mpi4py-fft's test_pencil step on ``PENCIL_SHAPE``: (construct, run, destroy) seconds."""
    module = _library(method, ".pencil")
    Pencil, Subcomm = module.Pencil, module.Subcomm
    dtype = np.dtype(PENCIL_DTYPE)

    def once() -> list[float]:
        watch = Stopwatch(comm)
        watch.go()
        subcomm = Subcomm(comm, len(PENCIL_SHAPE) - 1)
        aligned = Pencil(subcomm, PENCIL_SHAPE)
        other = aligned.pencil(0)
        transfer = aligned.transfer(other, dtype)
        a = np.zeros(aligned.subshape, dtype)
        b = np.zeros(other.subshape, dtype)
        watch.stop()
        watch.go()
        transfer.forward(a, b)
        transfer.backward(b, a)
        watch.stop()
        watch.go()
        transfer.destroy()
        subcomm.destroy()
        del transfer, aligned, other, subcomm
        watch.stop()
        return watch.laps

    return once


# --- timing ------------------------------------------------------------------------------------


@dataclass
class Timing:
    """A case's times, in seconds: per step and in all (``total``), each the median over the
    rounds of the largest per-rank mean; ``best_total`` the fastest round's."""

    steps: dict[str, float]
    total: float
    best_total: float
    rounds: int


@dataclass
class Leaks:
    """How much each library's timed loops grew this rank's resident memory, in bytes, after
    the first round of each case (which may fill caches: FFTW's wisdom, NumPy's FFT plans,
    the allocators' free lists). Memory that each iteration frees stays flat over the later
    rounds; a leaked plan, array or communicator per iteration adds up over thousands."""

    growth: dict[str, int] = field(default_factory=dict)


def rss_bytes() -> int:
    """This process's resident memory (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _loop(comm: MPI.Intracomm, once: Iteration, nsteps: int, iterations: int) -> np.ndarray:
    """One timed loop: [each step, their sum] seconds per iteration, each the largest over the
    ranks of that rank's mean."""
    sums = np.zeros(nsteps + 1)
    for _ in range(iterations):
        sums[:nsteps] += once()
    sums[nsteps] = sums[:nsteps].sum()
    sums /= iterations
    comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.MAX)
    return sums


def warm_up(comm: MPI.Intracomm, once: Iteration, iterations: int) -> str:
    """Run `iterations` untimed iterations (at least one): "" where they ran on every rank,
    else why not. Collective."""
    why = ""
    try:
        for _ in range(max(1, iterations)):
            once()
    except Exception as exc:  # a library that rejects a configuration raises on every rank
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
    reasons = comm.allgather(why)
    return next((r for r in reasons if r), "")


def time_cases(
    comm: MPI.Intracomm,
    cases: Sequence[tuple[str, Iteration]],
    steps: Sequence[str],
    args,
    leaks: Leaks,
) -> list[Timing]:
    """Time each of `cases` (method, iteration; warmed up already) in ``--rounds`` alternating
    rounds of ``--iterations`` iterations; collective. Adds to `leaks` what each method's
    loops after the first round grew RSS by."""
    # Each loop starts and ends with a collection, untimed: no library's cyclic garbage is
    # collected inside another's loop, and what is still allocated after a loop is what it
    # kept, not garbage awaiting a collection.
    gc.collect()
    samples: list[list[np.ndarray]] = [[] for _ in cases]
    for r in range(args.rounds):
        order = range(len(cases)) if r % 2 == 0 else reversed(range(len(cases)))
        for k in order:
            method, once = cases[k]
            before = rss_bytes()
            samples[k].append(_loop(comm, once, len(steps), args.iterations))
            gc.collect()
            if r > 0:
                leaks.growth[method] = leaks.growth.get(method, 0) + rss_bytes() - before
    timings = []
    for rows in samples:
        table = np.array(rows)
        medians = np.median(table, axis=0)
        timings.append(
            Timing(
                steps=dict(zip(steps, map(float, medians[:-1]))),
                total=float(medians[-1]),
                best_total=float(table[:, -1].min()),
                rounds=len(rows),
            )
        )
    return timings


# --- the parts ---------------------------------------------------------------------------------


@dataclass
class Run:
    """What the parts share: the communicator, options, reporter, and what they collect."""

    comm: MPI.Intracomm
    args: argparse.Namespace
    say: Reporter
    reference: bool  # mpi4py-fft is timed
    leaks: Leaks = field(default_factory=Leaks)
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def row(self, part: str, case: str, method: str, timing: Timing, **config) -> None:
        row: dict[str, Any] = {
            "benchmark": "setup",
            "part": part,
            "case": case,
            "method": method,
            "P": self.comm.size,
            "backend": None,
            "dtype": None,
            "shape": None,
            "decomposition": None,
            "padding": None,
            **config,
            "total_us": timing.total * 1e6,
            "best_total_us": timing.best_total * 1e6,
        }
        row.update({f"{step}_us": seconds * 1e6 for step, seconds in timing.steps.items()})
        row.update(iterations=self.args.iterations, warmup=self.args.warmup, rounds=timing.rounds)
        self.rows.append(row)


def _us(seconds: float | None, width: int) -> str:
    return f"{'n/a':>{width}}" if seconds is None else f"{seconds * 1e6:{width}.1f}"


def _ms(seconds: float | None, width: int) -> str:
    return f"{'n/a':>{width}}" if seconds is None else f"{seconds * 1e3:{width}.3f}"


def _times(value: float | None) -> str:
    """A ratio to 3 significant digits (the comm part's run to 0.001x), or "n/a"."""
    return "n/a" if value is None else f"{value:.3g}x"


def _verdict(value: float | None, target: float, at_most: bool) -> str:
    if value is None:
        return "n/a"
    met = value <= target if at_most else value >= target
    return "met" if met else "missed"


def run_comm_part(run: Run) -> None:
    """``comm``: each kind of new communicator with zcoll's and MPI's first call."""
    comm, say = run.comm, run.say
    parent = comm  # its context is made before anything is timed (run_setup)
    steps = STEPS["comm"]
    say("")
    say("# comm: us per iteration: a new communicator (create), its first alltoall of 8-byte")
    say("# blocks on plain NumPy arrays (first call), its Free (free), and all three (total);")
    say(f"# the parent ({comm.size} ranks) already has a zcoll context")
    say(
        f"{'':12}{'--------------- zcoll ---------------':>38}"
        f"{'---------------- MPI ----------------':>39}{'MPI/zcoll':>11}"
    )
    say(
        f"{'new comm':<12}"
        + f"{'create':>10}{'1st call':>10}{'free':>9}{'total':>9}" * 2
        + f"{'total':>11}"
    )
    first_calls: dict[str, float] = {}
    for kind in COMM_KINDS:
        methods = (ZCOLL, MPI_METHOD)
        cases = [(method, comm_iteration(parent, kind, method)) for method in methods]
        for _, once in cases:
            why = warm_up(comm, once, run.args.warmup)
            if why:  # MPI's own calls: nothing zcoll can skip
                raise RuntimeError(f"zcoll.bench setup: {kind} failed: {why}")
        z, m = time_cases(comm, cases, steps, run.args, run.leaks)
        run.say.step(f"comm {kind}")
        line = f"{kind:<12}"
        for t in (z, m):
            line += "".join(_us(t.steps[s], w) for s, w in zip(steps, (10, 10, 9)))
            line += _us(t.total, 9)
        say(line + f"{_times(ratio(m.total, z.total)):>11}")
        first_calls[kind] = z.steps["first_call"]
        for method, timing in zip(methods, (z, m)):
            run.row("comm", kind, method, timing)
    run.summary["dup_first_call_us"] = first_calls["Dup"] * 1e6
    worst = max(first_calls, key=first_calls.__getitem__)
    run.summary["fresh_first_call_max_us"] = first_calls[worst] * 1e6
    run.summary["fresh_first_call_max_case"] = worst


def run_pfft_part(run: Run) -> None:
    """``pfft``: each configuration's construction and ``destroy()``, both libraries."""
    comm, say, args = run.comm, run.say, run.args
    configs = pfft_configurations(args.backends, args.quick)
    say("")
    say("# pfft: ms per PFFT(comm, shape, dtype=, backend=, padding=, [slab=True]) and its")
    say("# destroy(): construct, destroy, and both (total)")
    say(
        f"{'':46}{'--------- zcoll ----------':>27}{'------- mpi4py-fft -------':>27}"
        f"{'mpi4py-fft':>12}"
    )
    say(
        f"{'backend':<8}{'dtype':<11}{'shape':<12}{'decomp':<7}{'padding':<8}"
        + f"{'construct':>10}{'destroy':>8}{'total':>9}" * 2
        + f"{'/zcoll':>12}"
    )
    ratios: list[tuple[float, PfftConfig]] = []
    skipped = 0
    for config in configs:
        zcase = pfft_iteration(comm, config, ZCOLL)
        why = warm_up(comm, zcase, args.warmup)
        if why:
            say(f"{config.label()}  skipped: zcoll: {why}")
            skipped += 1
            run.say.step()
            continue
        cases = [(ZCOLL, zcase)]
        if run.reference:
            mcase = pfft_iteration(comm, config, MPI4PY_FFT)
            why = warm_up(comm, mcase, args.warmup)
            if why:
                say(f"# mpi4py-fft skipped for {config.label().strip()}: {why}")
            else:
                cases.append((MPI4PY_FFT, mcase))
        timings = time_cases(comm, cases, STEPS["pfft"], args, run.leaks)
        run.say.step(config.label())
        line = config.label()
        for t in (*timings, None)[:2]:
            if t is None:
                line += f"{'n/a':>10}{'n/a':>8}{'n/a':>9}"
            else:
                line += _ms(t.steps["construct"], 10) + _ms(t.steps["destroy"], 8)
                line += _ms(t.total, 9)
        r = ratio(timings[1].total, timings[0].total) if len(timings) > 1 else None
        if r is not None:
            ratios.append((r, config))
        say(line + f"{_times(r):>12}")
        described = {
            "backend": config.backend,
            "dtype": config.dtype,
            "shape": "x".join(map(str, config.shape)),
            "decomposition": config.decomposition,
            "padding": config.padding or None,
        }
        for method, timing in zip((ZCOLL, MPI4PY_FFT), timings):
            run.row("pfft", " ".join(config.label().split()), method, timing, **described)
    values = [r for r, _ in ratios]
    run.summary["pfft_configurations"] = len(configs) - skipped
    run.summary["pfft_compared"] = len(values)
    run.summary["pfft_geomean_ratio"] = geomean(values)
    by_backend = {
        backend: geomean([r for r, c in ratios if c.backend == backend])
        for backend in args.backends
    }
    run.summary["pfft_geomean_ratio_by_backend"] = by_backend
    if ratios:
        worst, config = min(ratios, key=lambda item: item[0])
        run.summary["pfft_min_ratio"] = worst
        run.summary["pfft_min_case"] = " ".join(config.label().split())
    else:
        run.summary["pfft_min_ratio"] = run.summary["pfft_min_case"] = None


def run_pencil_part(run: Run) -> None:
    """``pencil``: mpi4py-fft's test_pencil step, both libraries."""
    comm, say, args = run.comm, run.say, run.args
    shape = "x".join(map(str, PENCIL_SHAPE))
    say("")
    say(
        f"# pencil: ms per Subcomm(comm, {len(PENCIL_SHAPE) - 1}) + Pencil + pencil(0) + transfer()"
    )
    say("# + 2 arrays (construct), forward + backward (run), destroy() of both (destroy);")
    say(f"# {shape} {PENCIL_DTYPE}")
    say(f"{'library':<12}{'construct':>10}{'run':>8}{'destroy':>9}{'total':>9}{'best':>9}")
    cases = []
    for method in (ZCOLL, MPI4PY_FFT) if run.reference else (ZCOLL,):
        once = pencil_iteration(comm, method)
        why = warm_up(comm, once, args.warmup)
        if why:
            say(f"# {method} skipped: {why}")
        else:
            cases.append((method, once))
    timings = time_cases(comm, cases, STEPS["pencil"], args, run.leaks) if cases else []
    run.say.step("pencil")
    found = dict(zip((method for method, _ in cases), timings))
    for method, t in found.items():
        say(
            f"{method:<12}{_ms(t.steps['construct'], 10)}{_ms(t.steps['run'], 8)}"
            f"{_ms(t.steps['destroy'], 9)}{_ms(t.total, 9)}{_ms(t.best_total, 9)}"
        )
        run.row("pencil", f"{shape} {PENCIL_DTYPE}", method, t, dtype=PENCIL_DTYPE, shape=shape)
    z, m = found.get(ZCOLL), found.get(MPI4PY_FFT)
    run.summary["pencil_ratio"] = ratio(m.total, z.total) if z and m else None


PARTS: dict[str, Callable[[Run], None]] = {
    "comm": run_comm_part,
    "pfft": run_pfft_part,
    "pencil": run_pencil_part,
}


# --- leaks -------------------------------------------------------------------------------------


def zcoll_shm_entries() -> set[str]:
    """zcoll's names in /dev/shm (none where there is no /dev/shm)."""
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith("zcoll")}
    except OSError:
        return set()


def _creator(entry: str) -> int | None:
    """zcoll-<uid>-<pid>-<counter>-<salt> -> pid."""
    parts = entry.split("-")
    return int(parts[2]) if len(parts) >= 3 and parts[2].isdigit() else None


def open_contexts() -> int:
    """zcoll contexts of this process not closed yet."""
    return sum(not ctx.core.closed for ctx in list(_context._live_contexts))


def leak_check(
    comm: MPI.Intracomm, shm_before: set[str], contexts_before: int, leaks: Leaks
) -> tuple[list[str], dict[str, int]]:
    """Collective: warnings (the same list on every rank; empty when nothing leaked), and each
    method's growth of RSS (the largest over the ranks). zcoll's growth is a warning beyond
    ``RSS_SLACK``; the references' is reported only, as theirs to explain."""
    gc.collect()
    pids = set(comm.allgather(os.getpid()))
    left = sorted(e for e in zcoll_shm_entries() - shm_before if _creator(e) in pids)
    found = comm.allgather((left, open_contexts() - contexts_before))
    methods = sorted(set().union(*comm.allgather(sorted(leaks.growth))))
    growth = {m: comm.allreduce(leaks.growth.get(m, 0), op=MPI.MAX) for m in methods}
    warnings = []
    entries = sorted({e for names, _ in found for e in names})
    if entries:
        warnings.append(f"left in /dev/shm: {', '.join(entries)}")
    extra = max(n for _, n in found)
    if extra > 0:
        warnings.append(f"{extra} zcoll context(s) still open that the run made")
    if growth.get(ZCOLL, 0) > RSS_SLACK:
        warnings.append(
            f"zcoll's loops grew resident memory by {growth[ZCOLL] / 2**20:.1f} MiB after the "
            f"first round of each case (more than {RSS_SLACK >> 20} MiB): a leak per iteration?"
        )
    return warnings, growth


# --- the subcommand ----------------------------------------------------------------------------


def _mpi4py_fft(args) -> tuple[bool, str, str]:
    """(whether mpi4py-fft is timed, why not, its version)."""
    if not args.mpi4py_fft:
        return False, "mpi4py-fft not run (--no-mpi4py-fft)", ""
    try:
        import mpi4py_fft
    except ImportError as exc:
        return False, f"mpi4py-fft not available ({exc})", ""
    return True, "", getattr(mpi4py_fft, "__version__", "")


def _summarise(run: Run) -> None:
    s, say = run.summary, run.say
    say("")
    if "dup_first_call_us" in s:
        dup, worst = s["dup_first_call_us"], s["fresh_first_call_max_us"]
        say(
            f"comm: first zcoll call on a fresh Dup {dup:.1f} us (target <= "
            f"{DUP_FIRST_CALL_US:g} us: {_verdict(dup, DUP_FIRST_CALL_US, True)}); slowest fresh "
            f"communicator ({s['fresh_first_call_max_case']}) {worst:.1f} us (target <= "
            f"{FRESH_FIRST_CALL_US:g} us: {_verdict(worst, FRESH_FIRST_CALL_US, True)})"
        )
    if "pfft_geomean_ratio" in s:
        mean, worst = s["pfft_geomean_ratio"], s["pfft_min_ratio"]
        if mean is None:
            say(f"pfft: {s['pfft_configurations']} configurations, none compared")
        else:
            backends = ", ".join(
                f"{b} {_times(g)}" for b, g in s["pfft_geomean_ratio_by_backend"].items() if g
            )
            say(
                f"pfft: mpi4py-fft/zcoll over {s['pfft_compared']} configurations: geomean "
                f"{_times(mean)} (target >= {PFFT_GEOMEAN:g}: "
                f"{_verdict(mean, PFFT_GEOMEAN, False)}; {backends}), min {_times(worst)} at "
                f"{s['pfft_min_case']} (target >= {PFFT_WORST:g}: "
                f"{_verdict(worst, PFFT_WORST, False)})"
            )
    if "pencil_ratio" in s:
        r = s["pencil_ratio"]
        say(
            f"pencil: mpi4py-fft/zcoll {_times(r)} (target >= {PENCIL_RATIO:g}: "
            f"{_verdict(r, PENCIL_RATIO, False)})"
        )


def run_setup(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """Time making and freeing communicators, PFFT plans, Pencils and Transfers against MPI's
    and mpi4py-fft's, as the module's docstring says; print, write ``--json``/``--csv``.

    Collective over `comm`. Returns 0 (leaks are reported as warnings, not a failure).
    """
    comm = comm if isinstance(comm, MPI.Intracomm) else MPI.Intracomm(comm)
    layout = node_layout(comm)
    now, command = now_iso(), command_line(args)
    say = Reporter(comm, args.progress)
    reference, why_not, version = _mpi4py_fft(args)
    # The parent of the comm part's communicators has its context from the start, so that
    # part times derived communicators, and the leak check does not count it.
    zcoll.alltoall(comm, np.zeros((comm.size, 1)), np.zeros((comm.size, 1)))
    shm_before, contexts_before = zcoll_shm_entries(), open_contexts()
    run = Run(comm, args, say, reference)
    say(f"# zcoll.bench setup | {now} | host {socket.gethostname()} | {command}")
    say(
        f"# P={comm.size}; each step timed from a barrier, the largest over the ranks of each "
        f"rank's mean over {args.iterations}"
    )
    say(f"# iterations, median of {args.rounds} alternating rounds; total: the sum of the steps")
    say(f"# vs MPI and {f'mpi4py-fft {version}' if reference else why_not}")
    steps = 0
    if "comm" in args.parts:
        steps += len(COMM_KINDS)
    if "pfft" in args.parts:
        steps += len(pfft_configurations(args.backends, args.quick))
    if "pencil" in args.parts:
        steps += 1
    say.start(steps, "setup")
    # mpi4py-fft's numpy backend plans by transforming uninitialised memory, whose NaNs and
    # overflows would print RuntimeWarnings.
    try:
        with np.errstate(all="ignore"):
            for part, function in PARTS.items():
                if part in args.parts:
                    function(run)
    finally:
        say.close()
    _summarise(run)
    warnings, growth = leak_check(comm, shm_before, contexts_before, run.leaks)
    for text in warnings:
        say(f"warning: {text}")
    grown = ", ".join(f"{m} {g / 2**20:+.1f} MiB" for m, g in growth.items()) or "n/a (1 round)"
    if not warnings:
        say("no leaks: nothing new in /dev/shm, no zcoll context left open")
    say(f"RSS growth over the timed rounds after each case's first (largest over ranks): {grown}")
    say(where(comm, layout))
    say(f"MPI library: {mpi_library()}")
    if comm.rank == 0:
        metadata = {
            "benchmark": "setup",
            **common_metadata(comm, args, layout, now, command),
            "parts": list(args.parts),
            "backends": list(args.backends),
            "quick": args.quick,
            "rounds": args.rounds,
            "iterations": args.iterations,
            "warmup": args.warmup,
            "mpi4py_fft_missing": why_not or None,
            "targets": {
                "dup_first_call_us": DUP_FIRST_CALL_US,
                "fresh_first_call_us": FRESH_FIRST_CALL_US,
                "pfft_geomean_ratio": PFFT_GEOMEAN,
                "pfft_min_ratio": PFFT_WORST,
                "pencil_ratio": PENCIL_RATIO,
            },
            **run.summary,
            "rss_growth_bytes": growth,
            "leak_warnings": warnings,
        }
        if version:
            metadata["versions"]["mpi4py_fft"] = version
        write_outputs(args, run.rows, metadata, SETUP_FIELDS)
    return 0
