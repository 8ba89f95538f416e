"""A Transfer's first runs on a communicator zcoll has not used yet: through MPI.

Making a communicator's context, a Transfer's work arrays and its plans costs about 100 us; a
transpose of a small array through MPI (``Ialltoallw`` of subarray datatypes, the exchange
mpi4py-fft makes) costs a few. So a Transfer on a communicator without a context runs through
MPI for its first ``_core.cold_transfer_runs(bytes)`` runs (the auto policy's ski-rental rule,
``cpp/zcoll/auto_policy.hpp``), and only then makes what zcoll's engine needs. A Transfer made
and run a few times (mpi4py-fft's test suites, a Pencil per stage) never pays the set-up.

On one rank a transpose is a copy: it stays one, with no set-up ever. Elsewhere each run
through MPI first agrees that every rank's arrays suit it (one small ``Iallreduce``): where
any rank's do not (a shape, dtype or leading axes of its own, a read-only result, arrays that
overlap), every rank takes zcoll's path instead, whose checks raise the same error on every
rank. Both waits are bounded by the zcoll timeout (then ``PeerError``).
"""

from __future__ import annotations

import functools
from math import prod

import numpy as np
from mpi4py import MPI

from .. import _core
from .._transport import machine_oversubscribed, poll_bounded, timeout_message

__all__ = ["MpiRuns"]


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


class MpiRuns:
    """A Transfer's runs through MPI, while the rule keeps it there (see the module notes).
    `shape` is the Transfer's global shape (the same on every rank), `subshapes` (A, B) this
    rank's shapes; forward sends the blocks along `axes[0]` and receives along `axes[1]`."""

    def __init__(self, comm: MPI.Comm, dtype: np.dtype, shape, subshapes, axes: tuple[int, int]):
        self.comm = comm
        self.dtype = dtype
        self.subshapes = subshapes
        self.axes = axes
        self.limit = _core.cold_transfer_runs(prod(shape) * dtype.itemsize // comm.size)
        self.runs = 0  # through MPI so far
        self._sides: list[tuple[_Parts, _Parts] | None] = [None, None]
        self._flags = (np.zeros((), np.int32), np.zeros((), np.int32))  # the agreement's

    def run(self, src, dst, side: int) -> bool:
        """Collective: this direction's transpose (`side` 0 forward) through MPI, if the rule
        still keeps the Transfer here (the same on every rank) and every rank's arrays suit it;
        False, having moved nothing, where zcoll's path must run it (from then on: the
        Transfer drops this object, and with it the datatypes)."""
        if self.comm.size == 1:  # a copy, whichever way: nothing to agree on or to set up
            if not self._suits(src, dst, side):
                return False
            np.copyto(dst, src)
            return True
        if self.runs >= self.limit or not self._agree(self._suits(src, dst, side)):
            return False
        self.runs += 1
        sends, recvs = self._side(side)
        null = [0] * len(sends.counts)  # the subarray types hold the offsets
        request = self.comm.Ialltoallw(
            [src, sends.counts, null, sends.types], [dst, recvs.counts, null, recvs.types]
        )
        self._wait(request, "zcoll.fft.Transfer (through MPI)")
        return True

    def _suits(self, src, dst, side: int) -> bool:
        """Whether this rank's arrays suit a run through MPI (None: they do not)."""
        shapes = (self.subshapes[side], self.subshapes[1 - side])
        return (
            isinstance(src, np.ndarray)
            and isinstance(dst, np.ndarray)
            and src.shape == shapes[0]
            and dst.shape == shapes[1]
            and src.dtype == self.dtype
            and dst.dtype == self.dtype
            and src.flags.c_contiguous
            and dst.flags.c_contiguous
            and dst.flags.writeable
            and not np.may_share_memory(src, dst)
        )

    def _agree(self, suits: bool) -> bool:
        """Collective: whether every rank's arrays suit a run through MPI."""
        mine, every = self._flags
        mine[()] = suits
        request = self.comm.Iallreduce(mine, every, op=MPI.MIN)
        self._wait(request, "zcoll.fft.Transfer (agreeing on a run through MPI)")
        return bool(every)

    def _wait(self, request: MPI.Request, what: str) -> None:
        if not request.Test() and not poll_bounded(request.Test, machine_oversubscribed()):
            raise _core.PeerError(timeout_message(self.comm.rank, what, "a peer"))

    def _side(self, side: int) -> tuple[_Parts, _Parts]:
        """(what this rank sends, what it receives) in direction `side`."""
        made = self._sides[side]
        if made is None:
            src, dst = self.subshapes[side], self.subshapes[1 - side]
            cut_src, cut_dst = self.axes if side == 0 else self.axes[::-1]
            n, p = self.dtype.itemsize, self.comm.size
            made = self._sides[side] = (_parts(n, src, cut_src, p), _parts(n, dst, cut_dst, p))
        return made
