"""A Transfer's first runs on a communicator zcoll has not used yet: through MPI.

Making a communicator's context, a Transfer's work arrays and its plans costs about 100 us; a
transpose of a small array through MPI (``Ialltoallw`` of subarray datatypes, the exchange
mpi4py-fft makes) costs a few. So a Transfer on a communicator without a context runs through
MPI for its first ``_core.cold_transfer_runs(bytes)`` runs (the auto policy's ski-rental rule,
``cpp/zcoll/auto_policy.hpp``; ``ZCOLL_COLD_RUNS`` sets the count), and only then makes what
zcoll's engine needs. A Transfer made and run a few times (mpi4py-fft's test suites, a Pencil
per stage) never pays the set-up. A PFFT's transposes do the same (:class:`ColdCalls`): one
agreement per call for all of them, and ``_core.cold_plan_runs`` counts the calls.

On one rank a transpose is a copy: it stays one, with no set-up ever. Elsewhere each run
through MPI first agrees that every rank's arrays suit it (one small ``Iallreduce``): where
any rank's do not (a shape, dtype or leading axes of its own, a read-only result, arrays that
overlap), every rank takes zcoll's path instead, whose checks raise the same error on every
rank. Both waits are bounded by the zcoll timeout (then ``PeerError``).

Two transports of one interface (``run``: agree, then exchange; ``exchange``; and the
agreement by itself): the extension's own MPI (``_core.MpiTranspose``, one crossing per run
with the GIL released), wherever it is mpi4py's library, as the build makes it; else
:class:`_Mpi4pyTranspose`, the same collectives through mpi4py (a build without MPI). The
extension's run costs what the MPI calls cost; through mpi4py, its request objects, argument
lists and polling loop added about half again to a cold transpose (CHANGELOG.md).
"""

from __future__ import annotations

import functools
from math import prod
from typing import NoReturn

import numpy as np
from mpi4py import MPI

from .. import _core
from .._settings import current, get_timeout
from .._transport import abandon, allgather_bounded, wait_bounded

__all__ = ["ColdCalls", "MpiRuns", "agree_min"]


@functools.cache
def _element(itemsize: int) -> MPI.Datatype:
    """The MPI type of one array element: `itemsize` bytes, copied as they are (any dtype)."""
    return MPI.BYTE.Create_contiguous(itemsize).Commit()


class _Parts:
    """The parts of an array of `shape` that go to (or come from) each of `p` ranks: its
    blocks along `axis`, as subarray datatypes (count 0 where a part is empty). Freed with the
    last Transfer that holds them."""

    def __init__(self, itemsize: int, shape: tuple[int, ...], axis: int, p: int) -> None:
        element = _element(itemsize)
        self.counts: list[int] = []
        self.types: list[MPI.Datatype] = []
        self._made: list[MPI.Datatype] = []
        for r in range(p):
            count, start = _core.block_share(shape[axis], p, r)  # the pencils' distribution
            if count == 0 or 0 in shape:
                self.counts.append(0)
                self.types.append(element)
                continue
            part, starts = list(shape), [0] * len(shape)
            part[axis], starts[axis] = count, start
            made = element.Create_subarray(list(shape), part, starts).Commit()
            self._made.append(made)
            self.counts.append(1)
            self.types.append(made)

    def __del__(self) -> None:
        if not MPI.Is_finalized():
            for t in self._made:
                t.Free()


@functools.lru_cache(maxsize=64)
def _parts(itemsize: int, shape: tuple[int, ...], axis: int, p: int) -> _Parts:
    """The parts of such an array, made once: Transfers of the same shapes (a Pencil per stage,
    a test suite's loops) share them."""
    return _Parts(itemsize, shape, axis, p)


@functools.cache
def _extension_mpi() -> bool:
    """Whether the extension's own MPI is mpi4py's library (then the collectives run from C++)."""
    return _core.mpi_library_matches(MPI.Get_library_version())


def _target(comm: MPI.Comm):
    """What a transport's calls name the communicator by: its C handle for the extension's."""
    return MPI._handleof(comm) if _extension_mpi() else comm


class _Mpi4pyTranspose:
    """``_core.MpiTranspose`` through mpi4py: the same collectives, for a build whose extension
    has no MPI of its own. Its calls take the mpi4py communicator where the extension's take
    its C handle."""

    def __init__(self, size, itemsize, shape_a, axis_a, shape_b, axis_b) -> None:
        null = [0] * size  # the subarray types hold the offsets
        self._parts = (
            _parts(itemsize, shape_a, axis_a, size),
            _parts(itemsize, shape_b, axis_b, size),
        )
        self._blocks = [(p.counts, null, p.types) for p in self._parts]

    def run(self, comm, side, src, dst, suits, rank, timeout, what) -> bool:  # noqa: ARG002
        if not agree_min(comm, int(suits), what):
            return False
        self.exchange(comm, side, src, dst, rank, timeout, what)
        return True

    def exchange(self, comm, side, src, dst, rank, timeout, what) -> None:  # noqa: ARG002
        sends, recvs = self._blocks[side], self._blocks[1 - side]
        request = comm.Ialltoallw((src, *sends), (dst, *recvs))
        wait_bounded(request, rank, f"{what} (through MPI)", (src, dst, self._parts))


def _keeping(arrays: tuple, call, *args):
    """``call(*args)``; where it raises (a wait that gave up), `arrays` are kept alive for good,
    since MPI may still write into them."""
    try:
        return call(*args)
    except BaseException:
        abandon(arrays)
        raise


@functools.lru_cache(maxsize=64)
def _transpose(itemsize: int, shape_a: tuple, axis_a: int, shape_b: tuple, axis_b: int, p: int):
    """A transpose's datatypes, made once: Transfers of the same shapes (a Pencil per stage, a
    test suite's loops) share them, whatever their communicators."""
    if _extension_mpi():
        return _core.MpiTranspose(p, itemsize, shape_a, axis_a, shape_b, axis_b)
    return _Mpi4pyTranspose(p, itemsize, shape_a, axis_a, shape_b, axis_b)


class MpiRuns:
    """A Transfer's runs through MPI, while the rule keeps it there (see the module notes).
    `shape` is the Transfer's global shape (the same on every rank), `subshapes` (A, B) this
    rank's shapes; forward sends the blocks along `axes[0]` and receives along `axes[1]`.
    The rule's count is read at the first :meth:`run` (a PFFT's transposes only
    :meth:`exchange`: their calls are counted for all of them, :class:`ColdCalls`)."""

    def __init__(self, comm: MPI.Comm, dtype: np.dtype, shape, subshapes, axes: tuple[int, int]):
        self.comm = comm
        self.dtype = dtype
        self.subshapes = subshapes
        self.axes = axes
        self._bytes_per_rank = prod(shape) * dtype.itemsize // comm.size
        self.limit: int | None = None  # the rule's runs (ZCOLL_COLD_RUNS), read at the first
        self.runs = 0  # through MPI so far
        self._target = _target(comm)
        self._transpose = None  # its datatypes, looked up at the first run

    def run(self, src, dst, side: int) -> bool:
        """Collective: this direction's transpose (`side` 0 forward) through MPI, if the rule
        still keeps the Transfer here (the same on every rank) and every rank's arrays suit it;
        False, having moved nothing, where zcoll's path must run it (from then on: the
        Transfer drops this object)."""
        comm = self.comm
        if comm.size == 1:  # a copy, whichever way: nothing to agree on or to set up
            if not self._suits(src, dst, side):
                return False
            np.copyto(dst, src)
            return True
        if self.limit is None:
            forced = current("cold_runs").value  # the one setting: settings() reads them all
            self.limit = (
                _core.cold_transfer_runs(self._bytes_per_rank) if forced is None else forced
            )
        if self.runs >= self.limit:
            return False
        suits = self._suits(src, dst, side)
        transpose = self._transpose or self._looked_up()
        ran = _keeping(
            (src, dst),
            transpose.run,
            self._target, side, src, dst, suits, comm.rank, get_timeout(), "zcoll.fft.Transfer",
        )  # fmt: skip
        self.runs += ran
        return ran

    def exchange(self, src, dst, side: int, what: str = "zcoll.fft.Transfer") -> None:
        """Collective, with no agreement: this direction's transpose of arrays known to suit
        it on every rank (a PFFT's own arrays, whose calls agree once for all their
        transposes)."""
        transpose = self._transpose or self._looked_up()
        _keeping(
            (src, dst),
            transpose.exchange,
            self._target, side, src, dst, self.comm.rank, get_timeout(), what,
        )  # fmt: skip

    def _suits(self, src, dst, side: int) -> bool:
        """Whether this rank's arrays suit a run through MPI."""
        if not (isinstance(src, np.ndarray) and isinstance(dst, np.ndarray)):
            return False
        into = dst.flags  # one flags object for both of dst's
        return (
            src.shape == self.subshapes[side]
            and dst.shape == self.subshapes[1 - side]
            and src.dtype == self.dtype
            and dst.dtype == self.dtype
            and src.flags.c_contiguous
            and into.c_contiguous
            and into.writeable
            and not np.may_share_memory(src, dst)
        )

    def _looked_up(self):
        (a, b), (axis_a, axis_b) = self.subshapes, self.axes
        self._transpose = _transpose(self.dtype.itemsize, a, axis_a, b, axis_b, self.comm.size)
        return self._transpose


def agree_min(comm: MPI.Comm, code: int, what: str) -> int:
    """Collective: the smallest of the ranks' `code` (one Iallreduce, bounded wait)."""
    if _extension_mpi():
        return _core.mpi_agree_min(MPI._handleof(comm), code, comm.rank, get_timeout(), what)
    flags = (np.full((), code, np.int32), np.zeros((), np.int32))
    request = comm.Iallreduce(flags[0], flags[1], op=MPI.MIN)
    wait_bounded(request, comm.rank, f"{what} (agreeing on a run through MPI)", flags)
    return int(flags[1])


class ColdCalls:
    """A PFFT's calls while its transposes run through MPI (see the module notes): each call
    first agrees on one code over the plan's grid `comm` (one ``Iallreduce``), then runs its
    serial transforms with each transpose an ``Ialltoallw`` (:meth:`MpiRuns.exchange`) on
    the plan's own arrays, which suit it by construction. `limit`: the calls the rule keeps
    here (``_core.cold_plan_runs``), the same on every rank."""

    RUN, WARM, ERROR = 2, 1, 0  # the codes a rank gives; the smallest decides

    def __init__(self, comm: MPI.Comm, limit: int) -> None:
        self.comm = comm
        self.limit = limit
        self.calls = 0  # run through MPI so far
        self.forever = False  # the arrays cannot take zcoll's plans: every call stays here

    def agree(self, code: int, name: str) -> int:
        """Collective: the smallest of the ranks' codes."""
        return agree_min(self.comm, code, name)

    def raise_first(self, name: str, error: Exception | None) -> NoReturn:
        """Collective, after an agreement that found an error: every rank raises the first
        failing rank's error (its type and message, with its rank)."""
        mine = None if error is None else (type(error), str(error))
        everyone = allgather_bounded(self.comm, mine, name)
        rank, (kind, message) = next((r, e) for r, e in enumerate(everyone) if e is not None)
        raise kind(f"[rank {rank}] {name}: {message}")
