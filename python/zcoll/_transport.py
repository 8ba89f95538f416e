"""Messages between nodes: a context's private duplicate of its communicator, the rounds and
exchanges of the multi-node path, and every wait for them, bounded by the zcoll timeout.

One transport: the extension sends the messages between nodes by calling MPI itself, each round
or exchange one call of it (the GIL released, bounded in C++). That needs the extension built
against the MPI library mpi4py loaded, as every compiled mpi4py-based extension is (the build
picks it: CMakeLists.txt). Where it is not (a build without MPI, or against another library),
the calls of a communicator spanning several nodes raise on every rank, naming both libraries;
calls on one node do not need MPI at all. A wait that gives up breaks the context: every later
call raises PeerError.
"""

from __future__ import annotations

import functools
import math
import os
import pickle
import time
from typing import Any, Callable, NoReturn

import numpy as np
from mpi4py import MPI

from . import _core, _mpi_library
from ._settings import get_timeout, machine

__all__ = [
    "NODE_TAG",
    "Route",
    "Transport",
    "VCallArgs",
    "allgather_bounded",
    "barrier_bounded",
    "bounded_waits",
    "machine_oversubscribed",
    "poll_bounded",
    "timeout_message",
    "wait_bounded",
]

_EAGER_POLLS = 100  # MPI_Testall polls before a wait on mpi4py requests starts yielding
NODE_TAG = 0x7A0F  # rounds of messages between nodes, on the private dup
# The mpi4py requests of waits that gave up, each with the buffers it reads and writes. MPI
# forbids freeing an unfinished collective's request, and a late peer may still complete it,
# writing into its buffers: both stay alive for good (one small entry per failure).
_abandoned: list[tuple[MPI.Request | list[MPI.Request], tuple]] = []
# Every bounded wait on mpi4py requests so far (wait_bounded, Transport.wait): the process's
# synchronisations over MPI made from Python, which tests count (how many agreements a plan or
# a communicator's first call makes). One int increment per wait.
_waits = 0
# Where the extension sends a context's messages between nodes: (private dup's C handle, rank,
# the rounds' tag, sends of a round in flight at most).
Route = tuple[int, int, int, int]
# The engine's arguments of an irregular call (NodeContext.vexchange): op code, pattern, send
# and receive buffers, in-place code, send counts and displacements, receive counts and
# displacements, order and copy codes.
VCallArgs = tuple[
    int, int, Any, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int
]


class Transport:
    """The messages between nodes of one context (`core`, its engine context), on a private
    duplicate of `comm` made when the communicator spans several nodes (`multi_node`). On one
    node only the bounded wait serves (online tuning's agreement)."""

    def __init__(
        self, comm: MPI.Comm, core: _core.NodeContext, multi_node: bool, oversubscribed: bool
    ):
        self.rank = comm.rank
        self.core = core
        self.multi_node = multi_node
        self.oversubscribed = oversubscribed  # its waits nap rather than yield
        self.dup: MPI.Comm | None = comm.Dup() if multi_node else None  # its own tag space
        # The private dup's C handle, for the extension's MPI calls; None where it cannot make
        # them (`unusable` says why): then every call across nodes raises.
        self.handle: int | None = None
        self.unusable = ""
        if self.dup is not None:
            if _core.mpi_library_matches(MPI.Get_library_version()):
                self.handle = MPI._handleof(self.dup)
            else:
                self.unusable = _mpi_library.mismatch_text()
        # At most sqrt(P) sends of a round in flight per rank (TPDS'18 §2.5).
        self.window = max(1, math.isqrt(comm.size))

    def route(self) -> Route | None:
        """Where the extension sends the messages between nodes: (the private dup's C handle,
        rank, tag, window); None on one node, or where the extension cannot send."""
        if self.handle is None:
            return None
        return (self.handle, self.rank, NODE_TAG, self.window)

    def round(self, opname: str, record: bytes) -> None:
        """A round of messages between nodes (aggregate.hpp) that carries every rank's call
        record to every rank, and raises on every rank the error the records call for."""
        self._in_cpp(
            self.core.nodes_round, record, self.check(), f"zcoll.{opname} (messages between nodes)"
        )

    def collective(self, op: int, sendbuf, recvbuf, order: int, copy: int) -> None:
        """An alltoall or allgather (engine op code `op`, valid order and copy codes) whole in
        one call of the extension, as the one crossing runs it: its round carries the blocks
        within the size rule, else the node's part and the blocks rank to rank follow."""
        self._in_cpp(self.core.nodes_call, op, sendbuf, recvbuf, order, copy, self.check())

    def exchange_remote(self, op: int, sendbuf, recvbuf) -> None:
        """Only the blocks of an alltoall or allgather between this rank and the ranks on
        other nodes, rank to rank (what `collective` sends after its node's part)."""
        self._in_cpp(self.core.nodes_exchange_remote, op, sendbuf, recvbuf, self.check())

    def transfer(self, src, dst, shape: list[int], axis_a: int, axis_b: int, order, copy):
        """A global transpose (``zcoll.fft``'s transfer) whole in one call of the extension: the
        round that agrees on every rank's call, the node's blocks, then the blocks between
        nodes as MPI subarray messages."""
        route = self.check()
        self._in_cpp(self.core.nodes_transfer, src, dst, shape, axis_a, axis_b, order, copy, route)

    def reduction(self, args: tuple) -> None:
        """A reduction or bcast whole in one call of the extension, as the one crossing runs
        it (`args` = (code, sendbuf, recvbuf, op code, algorithm code, root)): small calls in
        the round that agrees on the records, larger ones spread over the ranks after it."""
        self._in_cpp(self.core.nodes_reduction_call, *args, self.check())

    def v_round(self, opname: str, args: VCallArgs, carry: bool) -> int:
        """The round between nodes of an irregular call (aggregate.hpp). Every rank's call
        record and counts reach every rank, and every rank raises the same error -- any rank's
        argument error, or counts that differ between a sender and its receiver -- or goes on.
        With `carry`, the blocks between nodes within the size rule (`_aggregated.pack_limit`)
        travel in the round and are in the receive buffer after it. `args`: the engine's
        vexchange arguments. Returns how many of this rank's blocks between nodes the round
        did not carry (they go rank to rank)."""
        what = f"zcoll.{opname} (messages between nodes)"
        return self._in_cpp(self.core.nodes_v_round, *args, carry, self.check(), what)

    def v_call(self, args: VCallArgs) -> None:
        """An irregular call whole in one call of the extension: the round, the node's part,
        the larger blocks rank to rank (`args`: the engine's vexchange arguments)."""
        self._in_cpp(self.core.nodes_v_call, *args, self.check())

    def wait(self, requests: list, what: str, peers: list | None = None) -> None:
        """Wait for mpi4py requests at most the zcoll timeout; then raise PeerError naming the
        peers (``peers[i]`` is the rank behind ``requests[i]``) and break the context."""
        global _waits
        _waits += 1
        if poll_bounded(lambda: MPI.Request.Testall(requests), self.oversubscribed):
            return
        ranks = sorted({p for p, r in zip(peers or [], requests) if not r.Test()})
        _abandoned.append((requests, ()))
        self.fail(timeout_message(self.rank, what, f"rank(s) {ranks}" if ranks else None))

    def check(self) -> Route:
        """Before a call across nodes: its route (see `route`); the engine's ValueError once
        the context is closed, PeerError ("unusable after an earlier failure") once a wait
        failed, RuntimeError (the same on every rank) where the extension cannot send the
        messages."""
        self.core.nodes_check()
        route = self.route()
        if route is None:
            raise RuntimeError(self.unusable)
        return route

    def fail(self, why: str) -> NoReturn:
        """A wait of this context failed: every later call on it raises at once (the failure
        is kept in the engine, which the one-crossing path also asks)."""
        self.core.mark_failed(why)
        raise _core.PeerError(why)

    def allgather(self, comm: MPI.Comm, obj: Any, what: str) -> list:
        """:func:`allgather_bounded` over this context's communicator `comm`; a wait that
        gives up breaks the context."""
        try:
            return allgather_bounded(comm, obj, what)
        except _core.PeerError as exc:
            self.fail(str(exc))

    def close(self) -> None:
        if self.dup is not None and not MPI.Is_finalized():
            self.dup.Free()
        self.dup = None
        self.handle = None

    def _in_cpp(self, call: Callable, *args):
        """Runs `call`, an exchange between nodes in the extension (the GIL released, bounded
        by the timeout it is given); its PeerError breaks the context."""
        try:
            return call(*args)
        except _core.PeerError as e:
            self.fail(str(e))


def poll_bounded(
    step: Callable[[], bool], oversubscribed: bool, gone: Callable[[], str] | None = None
) -> bool:
    """Runs `step` until it returns True (then True), at most the zcoll timeout (then False).
    Polls a little, then lets the core go between polls (a peer may need it), then sleeps once
    the wait is clearly long. Letting it go: a zero sleep where ranks outnumber cores (a nap of
    the kernel's timer slack, about 50 us, which leaves the core to the peer that needs it), else
    sched_yield (the core comes back at once: a zero sleep's nap cost a cold transfer on two
    ranks of two cores 4x its time; sched_yield cost a reduction on four ranks of two cores 1.6x
    its time). `gone` (see wait_bounded) is asked before each sleep: a reason ends the wait
    (False)."""
    start, polls = time.monotonic(), 0
    while not step():
        polls += 1
        if polls < _EAGER_POLLS:
            continue
        waited = time.monotonic() - start
        if waited >= get_timeout():
            return False
        if waited >= 0.01:
            if gone is not None and gone():
                return False
            time.sleep(1e-3)
        elif oversubscribed:
            time.sleep(0)
        else:
            os.sched_yield()
    return True


def wait_bounded(
    request: MPI.Request,
    rank: int,
    what: str,
    keep: tuple = (),
    gone: Callable[[], str] | None = None,
) -> None:
    """Wait for one mpi4py request (a nonblocking collective, typically) at most the zcoll
    timeout; then raise PeerError ("rank `rank`: `what`: a peer did not take part ..."),
    keeping the request and `keep` (the buffers it uses) alive for good. `gone`, asked once
    the wait is long, says why a peer will never come ("peer rank 2 (pid 7) died"; "" while
    none is known to): the wait then gives up at once, with that reason."""
    global _waits
    _waits += 1
    if request.Test() or poll_bounded(request.Test, machine_oversubscribed(), gone):
        return
    _abandoned.append((request, keep))
    why = gone() if gone is not None else ""
    raise _core.PeerError(
        f"zcoll: rank {rank}: {what}: {why}" if why else timeout_message(rank, what, "a peer")
    )


def bounded_waits() -> int:
    """How many bounded waits on MPI requests this process has made outside the engine's
    rounds (each one an agreement, a barrier or an exchange over MPI: through mpi4py, or the
    extension's collectives of a transpose, zcoll.fft._mpi_runs)."""
    return _waits + _core.mpi_waits()


def abandon(keep: tuple) -> None:
    """Keep `keep` (the arrays a collective of the extension's that gave up may still write)
    alive for good, as wait_bounded keeps its requests' buffers."""
    _abandoned.append(([], keep))


def barrier_bounded(comm: MPI.Comm, what: str) -> None:
    """Collective: one ``Ibarrier``, its wait bounded (:func:`wait_bounded`). After an
    agreement that blocking MPI calls follow (communicator constructors): a rank that came
    after its peers gave up on the agreement has the agreement's answer but no peers, and
    raises PeerError here where a blocking call would hang."""
    wait_bounded(comm.Ibarrier(), comm.rank, what)


def allgather_bounded(comm: MPI.Comm, obj: Any, what: str) -> list:
    """Collective: ``comm.allgather(obj)`` with bounded waits (:func:`wait_bounded`): the
    pickled sizes in one ``Iallgather``, then the pickles in one ``Iallgatherv``. For the
    rare agreements that carry Python objects (topologies, error messages)."""
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    mine = np.array([data.size], np.int64)
    sizes = np.empty(comm.size, np.int64)
    wait_bounded(comm.Iallgather(mine, sizes), comm.rank, what, (mine, sizes))
    starts = np.zeros(comm.size, np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    gathered = bytearray(int(sizes.sum()))
    spec = [gathered, sizes.tolist(), starts.tolist(), MPI.BYTE]
    wait_bounded(comm.Iallgatherv(data, spec), comm.rank, what, (data, gathered))
    view = memoryview(gathered)
    return [pickle.loads(view[a : a + n]) for a, n in zip(starts.tolist(), sizes.tolist())]


@functools.cache
def machine_oversubscribed() -> bool:
    """Whether this machine runs more ranks than it has CPUs, as the MPI launcher tells (Open
    MPI's OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's MPI_LOCALNRANKS); True where it does not say: a
    wait that cannot tell naps (see poll_bounded)."""
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value) > machine()["cpus"].value
    return True


def timeout_message(rank: int, what: str, who: str | None) -> str:
    """The PeerError message of a wait that gave up (`who`: the ranks waited for, if known)."""
    return (
        f"zcoll: rank {rank}: {what}: {who or 'a peer on another node'} did not take part "
        f"within {get_timeout()} s (set ZCOLL_TIMEOUT or zcoll.set_timeout to change it)"
    )
