"""Messages between nodes: a context's private duplicate of its communicator, who sends on it
(the extension, or mpi4py), the rounds and exchanges of the multi-node path, and every wait for
them, bounded by the zcoll timeout.

Where the extension's MPI is the library mpi4py initialized, a round or an exchange is one call
of the extension (the GIL released, bounded in C++); otherwise the same protocol runs here with
mpi4py's requests. A wait that gives up breaks the context: every later call raises PeerError.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, NoReturn

import numpy as np
from mpi4py import MPI

from . import _core
from ._settings import get_timeout

__all__ = ["NODE_TAG", "Transport", "VCallArgs"]

_EAGER_POLLS = 100  # MPI_Testall polls before a cross-node wait starts yielding
NODE_TAG = 0x7A0F  # rounds of messages between nodes, on the private dup
# The engine's arguments of an irregular call (NodeContext.vexchange): op code, pattern, send
# and receive buffers, in-place code, send counts and displacements, receive counts and
# displacements, order and copy codes.
VCallArgs = tuple[
    int, int, Any, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int
]


class Transport:
    """The messages between nodes of one context (`core`, its engine context), on a private
    duplicate of `comm` made when the communicator spans several nodes (`multi_node`). On one
    node only the bounded wait serves (online tuning's agreement). `asked` is the
    ZCOLL_NODE_MESSAGES setting: auto, cpp or mpi4py."""

    def __init__(self, comm: MPI.Comm, core: _core.NodeContext, multi_node: bool, asked: str):
        self.rank = comm.rank
        self.core = core
        self.multi_node = multi_node
        self.dup: MPI.Comm | None = comm.Dup() if multi_node else None  # its own tag space
        # The C handle of the private dup when the extension sends the rounds' messages itself.
        self.handle = self._sender(asked)
        # At most sqrt(P) sends of a round in flight per rank (TPDS'18 §2.5).
        self.window = max(1, math.isqrt(comm.size))

    def _sender(self, asked: str) -> int | None:
        """The private dup's C handle when the extension sends the rounds' messages (setting
        `asked`: auto, cpp, mpi4py), None when mpi4py does."""
        if self.dup is None or asked == "mpi4py":
            return None
        if _core.mpi_library_matches(MPI.Get_library_version()):
            return MPI._handleof(self.dup)
        if asked == "cpp":
            raise ValueError(
                "zcoll: ZCOLL_NODE_MESSAGES=cpp, but zcoll was built without MPI or against "
                "another MPI library than mpi4py's"
            )
        return None

    def route(self) -> tuple[int, int, int, int] | None:
        """What the one-crossing path needs to send the messages between nodes itself: (C
        handle, rank, tag, window); None where mpi4py sends them."""
        if self.handle is None:
            return None
        return (self.handle, self.rank, NODE_TAG, self.window)

    def p2p_comm(self) -> MPI.Comm:
        """The private duplicate of the communicator, for blocks between nodes."""
        assert self.dup is not None  # made when the communicator spans several nodes
        return self.dup

    def round(self, opname: str, record: bytes, alltoall: tuple | None = None) -> bool:
        """A round of messages between nodes (aggregate.hpp) that carries every rank's call
        record to every rank, and raises on every rank the error the records call for.
        `alltoall` = (sendbuf, recvbuf, order code, copy code): the call's blocks travel in the
        same messages when the node's ranks agree on them; returns whether they did (the call
        is then complete)."""
        self.check()
        what = f"zcoll.{opname} (messages between nodes)"
        if self.handle is not None:  # the whole round in one call of the extension
            send, recv, order, copy = (None, None, 0, 0) if alltoall is None else alltoall
            return self._in_cpp(
                self.core.nodes_round, record, send, recv, order, copy, self.handle, self.rank,
                NODE_TAG, self.window, get_timeout(), what,
            )  # fmt: skip
        if alltoall is None:
            self.core.nodes_begin(record)
        else:
            self.core.nodes_begin(record, *alltoall)
        return self._round_by_mpi4py(what)[0]

    def reduction_round(self, opname: str, record: bytes, args: tuple) -> None:
        """A reduction whole in its round between nodes (aggregate.hpp's begin_reduction;
        `args` = (code, sendbuf, recvbuf, op code, algorithm code, root), a call the engine's
        size rule lets through: ``core.nodes_carries``). Every rank raises the error the
        records call for, or has its result after it."""
        self.check()
        what = f"zcoll.{opname} (messages between nodes)"
        if self.handle is not None:  # the whole round in one call of the extension
            carried = self._in_cpp(
                self.core.nodes_reduction_round, record, *args, self.handle, self.rank,
                NODE_TAG, self.window, get_timeout(), what,
            )  # fmt: skip
        else:
            self.core.nodes_reduction_begin(record, *args)
            carried = self._round_by_mpi4py(what)[0]
        if not carried:  # the records agreed, so every node carried its partial
            raise RuntimeError(f"zcoll.{opname}: the round between nodes carried no result")

    def v_round(self, opname: str, args: VCallArgs, carry: bool) -> int:
        """The round between nodes of an irregular call (aggregate.hpp). Every rank's call
        record and counts reach every rank, and every rank raises the same error -- any rank's
        argument error, or counts that differ between a sender and its receiver -- or goes on.
        With `carry`, the blocks between nodes within the size rule (`_aggregated.pack_limit`)
        travel in the round and are in the receive buffer after it. `args`: the engine's
        vexchange arguments. Returns how many of this rank's blocks between nodes the round
        did not carry (they go rank to rank)."""
        self.check()
        what = f"zcoll.{opname} (messages between nodes)"
        if self.handle is not None:  # the whole round in one call of the extension
            return self._in_cpp(
                self.core.nodes_v_round, *args, carry, self.handle, self.rank, NODE_TAG,
                self.window, get_timeout(), what,
            )  # fmt: skip
        self.core.nodes_v_begin(*args, carry)
        return self._round_by_mpi4py(what)[1]

    def v_call(self, args: VCallArgs) -> bool:
        """Where the extension sends the messages between nodes, an irregular call whole in one
        call of it (the round, the node's part, the larger blocks rank to rank; `args`: the
        engine's vexchange arguments) and True; else False, having done nothing."""
        if self.handle is None:
            return False
        self.check()
        self._in_cpp(self.core.nodes_v_call, *args, self.handle, self.rank, NODE_TAG, self.window)
        return True

    def exchange_buffers(self, what: str, recvs: list, sends: list) -> None:
        """Receives into and sends from ``[(peer, tag, C-contiguous array)]`` on the private
        dup, all posted at once (the k-th message of a (peer, tag) fills its k-th buffer),
        bounded by the zcoll timeout: from C++ where the extension sends the messages between
        nodes, else by mpi4py requests. A late or dead peer breaks the context (PeerError)."""
        if not recvs and not sends:
            return
        if self.handle is not None:
            self._in_cpp(
                _core.exchange_buffers, self.handle, self.rank, recvs, sends, get_timeout(),
                what,
            )  # fmt: skip
            return
        comm = self.p2p_comm()
        reqs = [comm.Irecv([b, MPI.BYTE], peer, tag) for peer, tag, b in recvs]
        reqs += [comm.Isend([b, MPI.BYTE], peer, tag) for peer, tag, b in sends]
        peers = [peer for peer, _, _ in recvs] + [peer for peer, _, _ in sends]
        self.wait(reqs, what, peers=peers)

    def wait(self, requests: list, what: str, peers: list | None = None) -> None:
        """Wait for MPI requests at most the zcoll timeout; then raise PeerError naming the
        peers (``peers[i]`` is the rank behind ``requests[i]``) and break the context."""

        def late() -> list[int]:
            return sorted({p for p, r in zip(peers or [], requests) if not r.Test()})

        self._poll(lambda: MPI.Request.Testall(requests), what, late)

    def check(self) -> None:
        """PeerError ("unusable after an earlier failure") once a wait between nodes failed."""
        if self.multi_node:
            self.core.nodes_check()

    def fail(self, why: str) -> NoReturn:
        """A wait between nodes failed: every later call on this context raises at once (the
        failure is kept in the engine, which the one-crossing path also asks)."""
        self.core.nodes_fail(why)
        raise _core.PeerError(why)

    def close(self) -> None:
        if self.dup is not None and not MPI.Is_finalized():
            self.dup.Free()
        self.dup = None
        self.handle = None

    def _poll(self, step: Callable[[], bool], what: str, late: Callable[[], list[int]]) -> None:
        """Runs `step` until it returns True, at most the zcoll timeout; then breaks the
        context, naming the ranks `late` says are still waited for."""
        start, polls = time.monotonic(), 0
        while not step():
            polls += 1
            if polls < _EAGER_POLLS:
                continue
            waited = time.monotonic() - start
            if waited >= get_timeout():
                ranks = late()
                who = f"rank(s) {ranks}" if ranks else "a peer on another node"
                self.fail(
                    f"zcoll: rank {self.rank}: {what}: {who} did not take part within "
                    f"{get_timeout()} s (set ZCOLL_TIMEOUT or zcoll.set_timeout to change it)"
                )
            # Yield first (a peer may need this core), sleep once the wait is clearly long.
            time.sleep(0 if waited < 0.01 else 1e-3)

    def _in_cpp(self, call: Callable, *args):
        """Runs `call`, an exchange between nodes in the extension (the GIL released, bounded
        by the timeout it is given); its PeerError breaks the context."""
        try:
            return call(*args)
        except _core.PeerError as e:
            self.fail(str(e))

    def _round_by_mpi4py(self, what: str) -> tuple[bool, int]:
        """The rest of a begun round with mpi4py's messages: (packed, direct blocks)."""
        outgoing, incoming, packed = self.core.nodes_messages()
        self._exchange_messages(what, outgoing, incoming)
        self.core.barrier()  # every message of the node received
        return packed, self.core.nodes_finish()

    def _exchange_messages(self, what: str, outgoing: list, incoming: list) -> None:
        """Sends this rank's messages of the round (at most `window` in flight) and receives
        the ones it owns, as they come. A message of another size than expected (calls that
        differ between nodes) is received whole and only its head -- the records, whose size
        is known -- kept."""
        comm = self.p2p_comm()
        queued = list(outgoing)
        requests: list = []
        peers: list[int] = []
        in_flight: list = []
        pending = dict(incoming)
        resized: list[tuple[memoryview, np.ndarray]] = []
        status = MPI.Status()

        def progress() -> bool:
            """One pass: sends started as the window allows, arrived messages received;
            True once every message is sent or received."""
            in_flight[:] = [r for r in in_flight if not r.Test()]
            while queued and len(in_flight) < self.window:
                peer, view = queued.pop(0)
                in_flight.append(comm.Isend([view, MPI.BYTE], peer, NODE_TAG))
                requests.append(in_flight[-1])
                peers.append(peer)
            for peer in list(pending):
                message = comm.Improbe(peer, NODE_TAG, status)
                if message is None:
                    continue
                view = pending.pop(peer)
                count = status.Get_count(MPI.BYTE)
                if count == len(view):
                    requests.append(message.Irecv([view, MPI.BYTE]))
                else:
                    whole = np.empty(count, np.uint8)
                    requests.append(message.Irecv([whole, MPI.BYTE]))
                    resized.append((view, whole))
                peers.append(peer)
            return not pending and not queued

        self._poll(progress, what, lambda: sorted(pending) or [p for p, _ in queued])
        self.wait(requests, what, peers=peers)
        for view, whole in resized:
            into = np.frombuffer(view, np.uint8)
            head = min(len(whole), len(into))
            into[:head] = whole[:head]
