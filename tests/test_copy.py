"""zcoll's copy kernels (``_core.copy``): every streaming kernel the CPU runs, forced in turn,
in streaming and hybrid mode, against the source bytes.

Each kernel copies an unaligned head up to a cache-line boundary of the destination, a body of
whole lines with streaming stores, and a tail; these tests sweep the sizes and misalignments
that move those boundaries, check that no byte outside the destination changes (guards on both
sides) and that the source is left alone.

The suite also runs under mpiexec, on every rank. The copies are per process, so the heavy
loops run on rank 0 of ``MPI.COMM_WORLD`` only while the other ranks wait without spinning
(which matters with 8 ranks on 2 cores); every rank then asserts rank 0's verdict. Which kernels
exist is decided on rank 0 too, so every rank skips the same tests. ``copy_box`` has no binding:
the collectives' and FFT tests cover it.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from mpi4py import MPI

from helpers import all_ranks_agree
from zcoll import _copy, _core

WORLD = MPI.COMM_WORLD
# The kernels rank 0's CPU runs; the same tuple on every rank.
AVAILABLE: tuple[str, ...] = WORLD.bcast(_core.copy_isas() if WORLD.rank == 0 else None, root=0)
STREAMING_MODES = ("streaming", "hybrid")
THRESHOLDS = (0, 1, 63, 64, 1000)  # hybrid: temporal bytes at the start
LINE = 64  # cache line: every misalignment the kernels can see
GUARD = 64  # bytes checked on each side of the destination
MAX_SWEEP = 4096
# Sizes with every boundary: each size up to 300, then k*16-3 ... k*16+3 up to 4096.
SWEEP_SIZES = sorted(
    set(range(301)) | {k * 16 + d for k in range(1, MAX_SWEEP // 16 + 1) for d in range(-3, 4)}
)
# Sizes that get every (destination, source) misalignment pair.
CROSS_SIZES = (100, 129, 257, 1000, 2051)
LARGE_SIZES = (1024 * 1024 + 13, 8 * 1024 * 1024 + 1)
MAX_FAILURES = 8  # reported per test


def aligned_bytes(nbytes: int, seed: int) -> np.ndarray:
    """Random uint8 array of `nbytes` starting on a 64-byte boundary."""
    raw = np.random.default_rng(seed).integers(0, 256, nbytes + LINE, dtype=np.uint8)
    start = -raw.ctypes.data % LINE
    return raw[start : start + nbytes]


def on_rank0(check) -> None:
    """Run ``check()`` (returns a list of failures) on rank 0 only; assert it on every rank.

    The other ranks wait in a non-blocking barrier, polled with short sleeps, so that they leave
    the CPU to rank 0. An exception on rank 0 is a failure on every rank.
    """
    failures: list[str] = []
    if WORLD.rank == 0:
        try:
            failures = check()
        except Exception as exc:  # keep the ranks in step: report it as a failure
            failures = [f"{type(exc).__name__}: {exc}"]
    request = WORLD.Ibarrier()
    while not request.Test():
        time.sleep(0.001)
    failures = WORLD.bcast(failures, root=0)
    shown = "; ".join(failures[:MAX_FAILURES])
    more = f" (+{len(failures) - MAX_FAILURES} more)" if len(failures) > MAX_FAILURES else ""
    all_ranks_agree(WORLD, not failures, shown + more)


class Bench:
    """A source and a guarded destination; ``check`` copies one case and verifies every byte.

    The destination buffer starts on a 64-byte boundary and holds a random pattern; a case
    copies `n` source bytes from offset ``soff`` into offset ``GUARD + doff``, then compares
    the whole buffer with the pattern overlaid by the source bytes, and restores it.
    """

    def __init__(self, capacity: int) -> None:
        self.src = aligned_bytes(capacity + LINE, seed=1)
        self.src_before = self.src.copy()
        self.pattern = aligned_bytes(GUARD + LINE + capacity + GUARD, seed=2)
        self.dst = aligned_bytes(self.pattern.size, seed=3)
        self.dst[...] = self.pattern
        self.expected = self.pattern.copy()

    def check(self, n: int, doff: int, soff: int, mode: str, threshold: int = 0) -> str | None:
        at = GUARD + doff
        src = self.src[soff : soff + n]
        _core.copy(self.dst[at : at + n], src, mode, threshold)
        self.expected[at : at + n] = src
        ok = np.array_equal(self.dst, self.expected)
        wrong = None if ok else np.flatnonzero(self.dst != self.expected)
        self.expected[at : at + n] = self.pattern[at : at + n]
        if wrong is None:
            self.dst[at : at + n] = self.pattern[at : at + n]
            return None
        self.dst[...] = self.pattern
        where = "inside" if at <= wrong[0] and wrong[-1] < at + n else "outside (guards)"
        return (
            f"{mode} threshold={threshold} n={n} dst+{doff} src+{soff}: {wrong.size} bytes "
            f"wrong {where}, first at {wrong[0] - at:+d}"
        )

    def source_unchanged(self) -> list[str]:
        return [] if np.array_equal(self.src, self.src_before) else ["the source changed"]


@pytest.fixture(params=_core.COPY_ISAS)
def isa(request):
    """Each copy kernel, made the active one on rank 0; skipped where rank 0's CPU lacks it."""
    name = request.param
    if name not in AVAILABLE:
        pytest.skip(f"this CPU has no {name} (it runs {', '.join(AVAILABLE)})")
    before = _core.active_copy_isa()
    if WORLD.rank == 0:
        _core.select_copy_isa(name)
    yield name
    if WORLD.rank == 0:
        _core.select_copy_isa(before)


def _active_is(name: str) -> list[str]:
    active = _core.active_copy_isa()
    return [] if active == name else [f"active kernel is {active}, not {name}"]


def sweep(isa: str, capacity: int, cases) -> None:
    """On rank 0, with kernel `isa` active, check every (n, doff, soff, mode, threshold) case of
    `cases` (iterated there only) in a ``Bench(capacity)``, then that the source is unchanged."""

    def check():
        bench = Bench(capacity)
        failures = _active_is(isa)
        failures += [failure for case in cases if (failure := bench.check(*case))]
        return failures + bench.source_unchanged()

    on_rank0(check)


@pytest.mark.parametrize("mode", STREAMING_MODES)
def test_sizes(isa, mode):
    """Every size up to 300 and around each multiple of 16 up to 4096 (for hybrid, with each
    threshold), with the misalignments of both sides varying from size to size."""
    thresholds = THRESHOLDS if mode == "hybrid" else (0,)
    cases = (
        (n, (7 * i + 3 * j) % LINE, (13 * i + 5 + 11 * j) % LINE, mode, threshold)
        for i, n in enumerate(SWEEP_SIZES)
        for j, threshold in enumerate(thresholds)
    )
    sweep(isa, MAX_SWEEP + 3, cases)


@pytest.mark.parametrize("mode", STREAMING_MODES)
def test_misalignments(isa, mode):
    """Every destination misalignment 0...63 with every source misalignment 0...63, for a few
    sizes (hybrid: the thresholds in turn)."""
    grid = itertools.product(CROSS_SIZES, range(LINE), range(LINE))
    cases = (
        (n, doff, soff, mode, THRESHOLDS[k % len(THRESHOLDS)] if mode == "hybrid" else 0)
        for k, (n, doff, soff) in enumerate(grid)
    )
    sweep(isa, max(CROSS_SIZES), cases)


@pytest.mark.parametrize("mode", STREAMING_MODES)
def test_large(isa, mode):
    """1 MiB + 13 and 8 MiB + 1 bytes, aligned and misaligned, with guards."""
    thresholds = (0, 1000, 64 * 1024 + 3) if mode == "hybrid" else (0,)
    cases = (
        (n, doff, soff, mode, threshold)
        for n in LARGE_SIZES
        for doff, soff in ((0, 0), (13, 50), (63, 1))
        for threshold in thresholds
    )
    sweep(isa, max(LARGE_SIZES), cases)


def test_temporal():
    """Temporal copies (memcpy) of a few sizes and misalignments, on every rank."""
    bench = Bench(5000)
    failures = [
        f
        for i, n in enumerate((0, 1, 7, 64, 127, 128, 129, 1000, 4999))
        if (f := bench.check(n, (5 * i) % LINE, (11 * i) % LINE, "temporal", 1000 * i))
    ]
    all_ranks_agree(WORLD, not failures, "; ".join(failures + bench.source_unchanged()))


def test_shapes_and_dtypes():
    """Any shapes and dtypes with the same number of bytes: src's bytes land in dst's."""
    src = np.arange(600, dtype=np.float64).reshape(20, 30)
    dst = np.zeros((4, 300), dtype=np.int32)
    _core.copy(dst, src, "streaming")
    ok = dst.tobytes() == src.tobytes()
    dst[...] = 0
    _core.copy(dst, src, "hybrid", 1000, repeat=3)
    ok = ok and dst.tobytes() == src.tobytes()
    _core.copy(np.zeros((0, 3)), np.zeros(0, np.uint8), "hybrid", 5)
    all_ranks_agree(WORLD, ok, "streaming / hybrid copy of float64 (20, 30) -> int32 (4, 300)")


def test_names_and_selection():
    """Mode and kernel names; the best kernel is the default; select_copy_isa switches."""
    assert _core.COPY_MODES == ("temporal", "streaming", "hybrid")
    assert _core.COPY_ISAS == ("portable", "sse2", "avx2", "avx512")
    available = _core.copy_isas()
    assert available[0] == "portable"
    assert set(available) <= set(_core.COPY_ISAS)
    assert available == tuple(isa for isa in _core.COPY_ISAS if isa in available)
    assert _core.best_copy_isa() == available[-1]
    before = _core.active_copy_isa()
    try:
        for name in available:
            _core.select_copy_isa(name)
            assert _core.active_copy_isa() == name
        for name in set(_core.COPY_ISAS) - set(available):
            with pytest.raises(ValueError, match="cannot run"):
                _core.select_copy_isa(name)
        with pytest.raises(ValueError, match="unknown copy kernel"):
            _core.select_copy_isa("avx1024")
    finally:
        _core.select_copy_isa(before)
    assert _core.active_copy_isa() == before


def test_argument_errors():
    src = np.arange(64, dtype=np.uint8)
    dst = np.zeros(64, dtype=np.uint8)
    with pytest.raises(ValueError, match="bytes"):
        _core.copy(dst, src[:63])
    with pytest.raises(ValueError, match="unknown mode"):
        _core.copy(dst, src, "sideways")
    with pytest.raises(ValueError, match="threshold"):
        _core.copy(dst, src, "hybrid", -1)
    with pytest.raises(ValueError, match="repeat"):
        _core.copy(dst, src, repeat=0)
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.copy(np.zeros(128, np.uint8)[::2], src)
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.copy(dst, np.zeros(128, np.uint8)[::2])
    readonly = np.zeros(64, np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _core.copy(readonly, src)
    with pytest.raises(ValueError, match="overlap"):
        _core.copy(src[1:33], src[:32])
    with pytest.raises(TypeError):
        _core.copy(bytearray(64), src)
    assert not dst.any(), "a rejected copy wrote"


def test_environment_variable():
    """ZCOLL_COPY_ISA: each available kernel by name (any case), auto, and errors."""
    before = _core.active_copy_isa()
    try:
        for name in _core.copy_isas():
            assert _copy.select_from_environment({_copy.ENV_VAR: f" {name.upper()} "}) == name
        assert _copy.select_from_environment({_copy.ENV_VAR: "auto"}) == _core.best_copy_isa()
        _core.select_copy_isa("portable")
        assert _copy.select_from_environment({}) == _core.best_copy_isa()
        with pytest.raises(ValueError, match="ZCOLL_COPY_ISA='bogus'"):
            _copy.select_from_environment({_copy.ENV_VAR: "bogus"})
        for name in set(_core.COPY_ISAS) - set(_core.copy_isas()):
            with pytest.raises(ValueError, match="cannot run"):
                _copy.select_from_environment({_copy.ENV_VAR: name})
    finally:
        _core.select_copy_isa(before)
