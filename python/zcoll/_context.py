"""Per-communicator node contexts: the bridge between mpi4py and the C++ engine.

A context is created collectively the first time zcoll sees a communicator and is cached on it
as an MPI attribute, so it is found again in O(1), is not inherited by ``Dup`` and is released
by ``Free``. All MPI work happens here (node split, sharing the control segment's name); the
engine itself never calls MPI.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import sys
import time
import weakref
from typing import Any, Callable, NoReturn

import numpy as np
from mpi4py import MPI

from . import _core, _online, _settings, _tuning
from ._registry import ALLGATHER, ALLOCATE, ALLTOALL, BARRIER, BARRIER_CODES, COLLECTIVES, OPS
from ._settings import TUNING_MODES, get_timeout

__all__ = [
    "Context",
    "context",
    "set_timeout",
    "set_tuning",
]

_EAGER_POLLS = 100  # MPI_Testall polls before a cross-node wait starts yielding
_NODE_TAG = 0x7A0F  # rounds of messages between nodes, on the private dup
# The engine's arguments of an irregular call (NodeContext.vexchange): op code, pattern, send
# and receive buffers, in-place code, send counts and displacements, receive counts and
# displacements, order and copy codes.
VCallArgs = tuple[
    int, int, Any, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int
]


_live_contexts: weakref.WeakSet[Context] = weakref.WeakSet()


def set_timeout(seconds: float) -> None:
    """Set how long a rank waits for a peer before raising :class:`zcoll.PeerError`.

    Applies to existing and future contexts of this process. The default is 60 s or the value
    of the ``ZCOLL_TIMEOUT`` environment variable. Local: call it on every rank.
    """
    seconds = float(seconds)
    if not seconds > 0:
        raise ValueError("zcoll.set_timeout: seconds must be positive")
    _settings.override("timeout", seconds, "set_timeout")
    for ctx in list(_live_contexts):
        ctx.settings = ctx.settings.replace("set_timeout", timeout=seconds)
        ctx._apply_wait()


def set_tuning(mode: str) -> str:
    """Choose how ``order="auto"`` and ``copy="auto"`` decide.

    Local, but it must be the same on every rank: call it on every rank, between collectives.
    Applies to existing and future communicators of this process.

    Parameters
    ----------
    mode : {"table", "online", "off"}
        "table" (the default, or ``ZCOLL_TUNING``): follow the tuning table where it has a
        rule, the built-in rules elsewhere. "online": also, for calls no rule covers, try each
        order (and the eager path where allowed) on the first calls of each block size and
        keep the fastest (HINT's online selection; one small allreduce per block size).
        "off": built-in rules only.

    Returns
    -------
    str
        The previous mode.
    """
    if mode not in TUNING_MODES:
        raise ValueError(f"zcoll.set_tuning: mode must be one of {TUNING_MODES}, got {mode!r}")
    previous = _settings.get_tuning()
    _settings.override("tuning", mode, "set_tuning")
    for ctx in list(_live_contexts):
        ctx.settings = ctx.settings.replace("set_tuning", tuning=mode)
        ctx.apply_tuning(mode)
    return previous


def machine_id() -> str:
    """This machine's identity: the running kernel's boot id, which every process under that
    kernel shares, containers and hosts of their own name included; the host name where the
    kernel shows none."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return MPI.Get_processor_name()


def machine_ranks(comm: MPI.Comm) -> int:
    """How many ranks of `comm` run on this one's machine and so share its CPUs -- more than
    its node's when one machine holds several nodes: virtual ones, or several shared-memory
    domains as an emulated cluster or containers make (MPI then counts them as nodes).
    Collective over `comm`."""
    here = machine_id()
    return comm.allgather(here).count(here)


def _split_node(comm: MPI.Comm, virtual_node_size: int | None = None) -> tuple[MPI.Comm, int]:
    """Ranks of `comm` sharing memory with this one (ordered by rank in `comm`); optionally cut
    into virtual nodes of `virtual_node_size` ranks (default: ZCOLL_VIRTUAL_NODE_SIZE) so the
    multi-node path runs for real. Also returns how many ranks of `comm` share the machine
    (the CPUs are shared by all of them, virtual nodes or not: :func:`machine_ranks`).

    A rank's virtual node is its ``COMM_WORLD`` rank // k, the same for every communicator,
    so arena arrays allocated on one communicator are shared exactly as on a real node."""
    k = virtual_node_size
    if k is None:
        k = _settings.read("virtual_node_size").value
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    if k:
        virtual = node.Split(color=MPI.COMM_WORLD.rank // k, key=node.rank)
        node.Free()
        node = virtual
    return node, machine_ranks(comm)


def _share_control_segment(node: MPI.Comm) -> _core.SharedSegment:
    nbytes = _core.NodeContext.control_bytes(node.size)
    segment, error = None, None
    if node.rank == 0:
        try:
            segment = _core.SharedSegment.create(nbytes)
        except OSError as exc:
            error = str(exc)
    name, error = node.bcast((segment.name if segment else None, error), root=0)
    if error is None and node.rank != 0:
        try:
            segment = _core.SharedSegment.attach(name, nbytes)
        except OSError as exc:
            error = str(exc)
    errors = node.allgather(error)
    if node.rank == 0 and segment is not None:
        segment.unlink()  # everyone has it mapped (or gave up): nothing can leak from here on
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        raise OSError(f"zcoll: could not share the node control segment: {failed}")
    assert segment is not None  # every rank created or attached it, or all raised above
    return segment


class Context:
    """zcoll's state for one communicator: its node split and the C++ node context."""

    def __init__(self, comm: MPI.Comm) -> None:
        # Every setting is read first, on every rank: a bad value raises everywhere, before any
        # communication. The context keeps them (set_timeout and set_tuning update them).
        self.settings = s = _settings.settings()
        self.size = comm.size
        self.rank = comm.rank
        self.handle = comm.handle
        node, ranks_on_machine = _split_node(comm, s.virtual_node_size)
        try:
            self.node_size = node.size
            self.node_rank = node.rank
            self.local_ranks = tuple(node.allgather(comm.rank))
            pids = node.allgather(os.getpid())
            # The reductions' tree follows L3s and NUMA nodes, order="numa" the NUMA nodes; under
            # ZCOLL_TOPOLOGY each rank's place on the described machine.
            here = s.placement(node.rank)
            places = node.allgather((here["numa_node"], here["package"], here["l3_cache"]))
            control = _share_control_segment(node)
        finally:
            node.Free()
        leaders = comm.allgather(self.local_ranks[0])
        self.node_of = tuple(leaders)  # node of each comm rank, named by its lowest comm rank
        self.multi_node = len(set(leaders)) > 1
        # Nodes of one machine (virtual or emulated) share its CPUs: count every rank on it.
        self.oversubscribed = ranks_on_machine > s.cpus
        self._comm: MPI.Comm | None = comm  # used by the multi-node path and online tuning only
        self._p2p = comm.Dup() if self.multi_node else None  # inter-node traffic, own tag space
        # The C handle of the private dup when the extension sends the rounds' messages itself.
        self._p2p_handle = self._message_sender(s.node_messages)
        # At most sqrt(P) sends of a round in flight per rank (TPDS'18 §2.5).
        self._send_window = max(1, math.isqrt(self.size))
        # One rank per node (its lowest), in node order: the reductions' inter-node part.
        self.leaders: MPI.Comm | None = None
        if self.multi_node:
            leaders_comm = comm.Split(0 if self.node_rank == 0 else MPI.UNDEFINED, key=self.rank)
            self.leaders = None if leaders_comm == MPI.COMM_NULL else leaders_comm
        # The NUMA node each node rank runs on (hwloc, or the ZCOLL_TOPOLOGY placement).
        self.numa_nodes = tuple(numa for numa, _, _ in places)
        self.core = _core.NodeContext(
            control,
            rank=self.node_rank,
            size=self.node_size,
            comm_size=self.size,
            comm_ranks=list(self.local_ranks),
            pids=pids,
            barrier=BARRIER_CODES[s.barrier],
            **s.wait_for(self.oversubscribed),
            numa_nodes=list(self.numa_nodes),
            packages=[package for _, package, _ in places],
            l3_caches=[l3 for _, _, l3 in places],
        )
        if self.multi_node:
            self.core.setup_nodes(list(self.node_of))
        self.core.setup_eager(s.eager_bytes_for(self.oversubscribed))
        self.core.set_copy_threshold(s.copy_threshold_for(self.node_size))
        self.core.cma_bytes = s.cma_bytes_for()
        # Collective on the node: can its ranks read each other's memory (CMA) and map each
        # other's shared heap? Decided before any call publishes a heap buffer.
        self.core.probe_cma()
        self.core.set_copy_cache(s.llc_bytes)
        # The tuning table's rules for every node size, the same on every rank (rank 0 read it).
        shared = _tuning.shared_tuning(comm, s.tuning)
        self.tuning_rules, self.reduction_models, self.internode_rules = shared
        self.online: _online.OnlineTuner | None = None
        self.engine: dict = {}
        # The irregular collectives' communication patterns (_vcollectives), made on first use.
        self.patterns: dict = {}
        self.apply_tuning(s.tuning)
        _live_contexts.add(self)

    def apply_tuning(self, mode: str) -> None:
        """Local: give the engine the table rules for this node size (none when `mode` is
        "off"), and put online selection in front of it when `mode` is "online"."""
        if self.core.closed:
            return
        rules = () if mode == "off" else self.tuning_rules
        for op in COLLECTIVES:
            mine = [
                r.engine_rule()
                for r in rules
                if r.collective == op and r.ranks_per_node == self.node_size
            ]
            self.core.set_tuning_rules(op, mine)
        models = () if mode == "off" else self.reduction_models
        for code, pieces in _tuning.reduction_pieces(models, self.node_size).items():
            self.core.set_reduction_model(code, pieces)
        if self.multi_node:
            self._apply_round_limits(() if mode == "off" else self.internode_rules)
        # The engine's entry point for each collective, bound once (looked up per call).
        self.online = _online.OnlineTuner(self) if mode == "online" else None
        self.engine = {
            op: self.online.engine(op) if self.online else getattr(self.core, op)
            for op in COLLECTIVES
        }
        # The one-crossing path (_core.fast_collective) serves this communicator's calls
        # unless they need Python: online tuning, or blocks between nodes.
        # On several nodes only the irregular collectives take it, with the route of their
        # messages between nodes, and only when the extension sends them.
        sender = self._p2p_handle
        if self.online or (self.multi_node and sender is None):
            _core.register_fast(self.handle, None)
        elif sender is not None:
            route = (sender, self.rank, _NODE_TAG, self._send_window)
            _core.register_fast(self.handle, self.core, route)
        else:
            _core.register_fast(self.handle, self.core)

    def layout(self) -> tuple[int, int]:
        """(nodes, ranks of the largest node): what the table's internode rules match."""
        sizes = [self.node_of.count(leader) for leader in set(self.node_of)]
        return len(sizes), max(sizes)

    def _apply_round_limits(self, rules: tuple[_tuning.InternodeRule, ...]) -> None:
        """The largest blocks an alltoall's and an allgather's round carry, as the table's
        internode rules for these nodes measured (else the engine's size rule)."""
        nodes, per_node = self.layout()
        for op in (ALLTOALL, ALLGATHER):
            limit = _tuning.round_limit(rules, op, nodes, per_node)
            self.core.nodes_set_round_limit(OPS[op], limit)

    def tuning_comm(self) -> MPI.Comm:
        """The communicator online tuning agrees on (the private dup where there is one)."""
        comm = self._p2p if self._p2p is not None else self._comm
        assert comm is not None, "the context is closed"
        return comm

    def _apply_wait(self) -> None:
        if not self.core.closed:
            self.core.set_wait(**self.settings.wait_for(self.oversubscribed))

    def allocate(self, nbytes: int) -> _core.ArenaBlock:
        """Collective arena allocation (ranks on other nodes allocate in their own arena)."""
        if self.multi_node:  # pairs with a failing rank's agree() in fail()
            self.agree("empty", _core.op_record(ALLOCATE))
        return self.core.allocate(nbytes)

    def fail(self, opname: str, exc: Exception) -> NoReturn:
        """Publish a local argument error; raises the same error on every rank."""
        message = f"zcoll.{opname}: {exc}"
        type_error = isinstance(exc, TypeError)
        if self.multi_node:
            self.agree(opname, _core.error_record(type_error, message))
        else:
            self.core.fail(type_error, message)
        raise AssertionError("unreachable: a published error raises on every rank")

    def raise_together(self, opname: str, exc: Exception | None) -> None:
        """Collective: every rank raises the first rank's error if any rank has one (`exc`
        is this rank's, or None), else every rank returns. One node barrier on one node."""
        if exc is not None:
            self.fail(opname, exc)
        if self.multi_node:
            self.agree(opname, _core.op_record(BARRIER))
        else:
            self.core.barrier()

    def agree(self, opname: str, record: bytes) -> None:
        """Multi-node only: every rank learns every rank's call record (this rank's is
        `record`, from the engine) and raises the error the ranks of one node would raise
        for those calls -- the same on every rank -- or returns.

        One round of messages between nodes (`node_round`): the records of a node travel
        together, one message per ordered pair of nodes."""
        self.node_round(opname, record)

    def node_round(self, opname: str, record: bytes, alltoall: tuple | None = None) -> bool:
        """Multi-node only: a round of messages between nodes (aggregate.hpp) that carries
        every rank's call record to every rank, and raises on every rank the error the
        records call for. `alltoall` = (sendbuf, recvbuf, order code, copy code): the call's
        blocks travel in the same messages when the node's ranks agree on them; returns
        whether they did (the call is then complete)."""
        self.check_unbroken()
        what = f"zcoll.{opname} (messages between nodes)"
        if self._p2p_handle is not None:  # the whole round in one call of the extension
            send, recv, order, copy = (None, None, 0, 0) if alltoall is None else alltoall
            return self._bounded_in_cpp(
                self.core.nodes_round, record, send, recv, order, copy, self._p2p_handle,
                self.rank, _NODE_TAG, self._send_window, get_timeout(), what,
            )  # fmt: skip
        if alltoall is None:
            self.core.nodes_begin(record)
        else:
            self.core.nodes_begin(record, *alltoall)
        return self._round_by_mpi4py(what)[0]

    def reduction_round(self, opname: str, record: bytes, args: tuple) -> None:
        """Multi-node only: a reduction whole in its round between nodes (aggregate.hpp's
        begin_reduction; `args` = (code, sendbuf, recvbuf, op code, algorithm code, root), a
        call the engine's size rule lets through: ``core.nodes_carries``). Every rank
        raises the error the records call for, or has its result after it."""
        self.check_unbroken()
        what = f"zcoll.{opname} (messages between nodes)"
        if self._p2p_handle is not None:  # the whole round in one call of the extension
            carried = self._bounded_in_cpp(
                self.core.nodes_reduction_round, record, *args, self._p2p_handle, self.rank,
                _NODE_TAG, self._send_window, get_timeout(), what,
            )  # fmt: skip
        else:
            self.core.nodes_reduction_begin(record, *args)
            carried = self._round_by_mpi4py(what)[0]
        if not carried:  # the records agreed, so every node carried its partial
            raise RuntimeError(f"zcoll.{opname}: the round between nodes carried no result")

    def v_round(self, opname: str, args: VCallArgs, carry: bool) -> int:
        """Multi-node only: the round between nodes of an irregular call (aggregate.hpp).
        Every rank's call record and counts reach every rank, and every rank raises the same
        error -- any rank's argument error, or counts that differ between a sender and its
        receiver -- or goes on. With `carry`, the blocks between nodes within the size rule
        (`_aggregated.pack_limit`) travel in the round and are in the receive buffer after
        it. `args`: the engine's vexchange arguments. Returns how many of this rank's blocks
        between nodes the round did not carry (they go rank to rank)."""
        self.check_unbroken()
        what = f"zcoll.{opname} (messages between nodes)"
        if self._p2p_handle is not None:  # the whole round in one call of the extension
            return self._bounded_in_cpp(
                self.core.nodes_v_round, *args, carry, self._p2p_handle, self.rank,
                _NODE_TAG, self._send_window, get_timeout(), what,
            )  # fmt: skip
        self.core.nodes_v_begin(*args, carry)
        return self._round_by_mpi4py(what)[1]

    def v_call(self, args: VCallArgs) -> bool:
        """Multi-node: where the extension sends the messages between nodes, an irregular call
        whole in one call of it (the round, the node's part, the larger blocks rank to rank;
        `args`: the engine's vexchange arguments) and True; else False, having done nothing."""
        if self._p2p_handle is None:
            return False
        self.check_unbroken()
        self._bounded_in_cpp(
            self.core.nodes_v_call, *args, self._p2p_handle, self.rank, _NODE_TAG,
            self._send_window,
        )  # fmt: skip
        return True

    def _round_by_mpi4py(self, what: str) -> tuple[bool, int]:
        """The rest of a begun round with mpi4py's messages: (packed, direct blocks)."""
        outgoing, incoming, packed = self.core.nodes_messages()
        self._exchange_messages(what, outgoing, incoming)
        self.core.barrier()  # every message of the node received
        return packed, self.core.nodes_finish()

    def _bounded_in_cpp(self, wait: Callable, *args):
        """Runs `wait`, an exchange between nodes in the extension (the GIL released, bounded
        by the timeout it is given); its PeerError breaks the context."""
        try:
            return wait(*args)
        except _core.PeerError as e:
            self.break_context(str(e))

    def _message_sender(self, asked: str) -> int | None:
        """The private dup's C handle when the extension sends the rounds' messages (setting
        `asked`: auto, cpp, mpi4py), None when mpi4py does."""
        if self._p2p is None or asked == "mpi4py":
            return None
        if _core.mpi_library_matches(MPI.Get_library_version()):
            return MPI._handleof(self._p2p)
        if asked == "cpp":
            raise ValueError(
                "zcoll: ZCOLL_NODE_MESSAGES=cpp, but zcoll was built without MPI or against "
                "another MPI library than mpi4py's"
            )
        return None

    def _exchange_messages(self, what: str, outgoing: list, incoming: list) -> None:
        """Sends this rank's messages of the round (at most `_send_window` in flight) and
        receives the ones it owns, as they come. A message of another size than expected
        (calls that differ between nodes) is received whole and only its head -- the records,
        whose size is known -- kept."""
        comm = self.p2p_comm()
        window = self._send_window
        queued = list(outgoing)
        requests: list = []
        peers: list[int] = []
        in_flight: list = []
        pending = dict(incoming)
        resized: list[tuple[memoryview, np.ndarray]] = []
        status = MPI.Status()
        start, polls = time.monotonic(), 0
        while True:
            in_flight = [r for r in in_flight if not r.Test()]
            while queued and len(in_flight) < window:
                peer, view = queued.pop(0)
                in_flight.append(comm.Isend([view, MPI.BYTE], peer, _NODE_TAG))
                requests.append(in_flight[-1])
                peers.append(peer)
            for peer in list(pending):
                message = comm.Improbe(peer, _NODE_TAG, status)
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
            if not pending and not queued:
                break
            polls = self._pause(
                start, polls, what, lambda: sorted(pending) or [p for p, _ in queued]
            )
        self.wait_bounded(requests, what, peers=peers)
        for view, whole in resized:
            into = np.frombuffer(view, np.uint8)
            head = min(len(whole), len(into))
            into[:head] = whole[:head]

    def exchange_buffers(self, what: str, recvs: list, sends: list) -> None:
        """Receives into and sends from ``[(peer, tag, C-contiguous array)]`` on the private
        dup, all posted at once (the k-th message of a (peer, tag) fills its k-th buffer),
        bounded by the zcoll timeout: from C++ where the extension sends the messages between
        nodes, else by mpi4py requests. A late or dead peer breaks the context (PeerError)."""
        if not recvs and not sends:
            return
        if self._p2p_handle is not None:
            self._bounded_in_cpp(
                _core.exchange_buffers, self._p2p_handle, self.rank, recvs, sends,
                get_timeout(), what,
            )  # fmt: skip
            return
        comm = self.p2p_comm()
        reqs = [comm.Irecv([b, MPI.BYTE], peer, tag) for peer, tag, b in recvs]
        reqs += [comm.Isend([b, MPI.BYTE], peer, tag) for peer, tag, b in sends]
        peers = [peer for peer, _, _ in recvs] + [peer for peer, _, _ in sends]
        self.wait_bounded(reqs, what, peers=peers)

    def _pause(self, start: float, polls: int, what: str, late: Callable[[], list[int]]) -> int:
        """One pause of a polling loop between nodes, bounded by the zcoll timeout (`late`:
        the ranks still waited for, asked only when the wait gives up)."""
        polls += 1
        if polls < _EAGER_POLLS:
            return polls
        waited = time.monotonic() - start
        if waited >= get_timeout():
            self.break_context(
                f"zcoll: rank {self.rank}: {what}: rank(s) {late()} did not take part within "
                f"{get_timeout()} s (set ZCOLL_TIMEOUT or zcoll.set_timeout to change it)"
            )
        # Yield first (a peer may need this core), sleep once the wait is clearly long.
        time.sleep(0 if waited < 0.01 else 1e-3)
        return polls

    def wait_bounded(self, requests: list, what: str, peers: list | None = None) -> None:
        """Wait for MPI requests at most the zcoll timeout; then raise PeerError naming the
        peers (``peers[i]`` is the rank behind ``requests[i]``) and break the context."""
        start = time.monotonic()
        polls = 0
        while not MPI.Request.Testall(requests):
            polls += 1
            if polls < _EAGER_POLLS:
                continue
            waited = time.monotonic() - start
            if waited >= get_timeout():
                late = sorted({p for p, r in zip(peers or [], requests) if not r.Test()})
                who = f"rank(s) {late}" if late else "a peer on another node"
                self.break_context(
                    f"zcoll: rank {self.rank}: {what}: {who} did not take part within "
                    f"{get_timeout()} s (set ZCOLL_TIMEOUT or zcoll.set_timeout to change it)"
                )
            # Yield first (a peer may need this core), sleep once the wait is clearly long.
            time.sleep(0 if waited < 0.01 else 1e-3)

    def break_context(self, why: str) -> NoReturn:
        """A multi-node wait failed: every later call on this context raises at once (the
        failure is kept in the engine, which the one-crossing path also asks)."""
        self.core.nodes_fail(why)
        raise _core.PeerError(why)

    def check_unbroken(self) -> None:
        """PeerError ("unusable after an earlier failure") once a wait between nodes failed."""
        if self.multi_node:
            self.core.nodes_check()

    @property
    def p2p_handle(self) -> int | None:
        """The private dup's C handle when the extension sends the messages between nodes
        (None: mpi4py sends them, or one node)."""
        return self._p2p_handle

    def p2p_comm(self) -> MPI.Comm:
        """Private duplicate of the communicator for inter-node blocks."""
        assert self._p2p is not None  # made in __init__ when multi_node
        return self._p2p

    def close(self) -> None:
        if _by_handle.get(self.handle, self) is self:  # the handle may already name a new comm
            _core.register_fast(self.handle, None)
        self.core.close()
        if self._p2p is not None and not MPI.Is_finalized():
            self._p2p.Free()
        if self.leaders is not None and not MPI.Is_finalized():
            self.leaders.Free()
        self._p2p = None
        self._p2p_handle = None
        self.leaders = None
        self._comm = None


_by_handle: dict[int, Context] = {}  # MPI handle -> context; entries leave when the comm is freed
_keyval = None


def _delete_attribute(comm: MPI.Comm, keyval: int, ctx: Context) -> None:  # noqa: ARG001 - MPI callback signature
    if _by_handle.get(ctx.handle) is ctx:
        del _by_handle[ctx.handle]
    ctx.close()


def _attribute_key() -> int:
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_delete_attribute)
    return _keyval


def lookup(comm: MPI.Comm) -> Context:
    """Fast path of :func:`context` for the collectives' hot path."""
    try:
        return _by_handle[comm.handle]
    except (KeyError, AttributeError):
        return context(comm)


def context(comm: MPI.Comm) -> Context:
    """The zcoll context of `comm`, created collectively on first use."""
    try:
        # mpi4py's stub types every attribute value as `int | Any | None`; ours is a Context.
        ctx: Context | None = comm.Get_attr(_attribute_key())  # type: ignore[assignment]
    except AttributeError:
        raise TypeError(
            f"zcoll: expected an mpi4py communicator, got {type(comm).__name__}"
        ) from None
    except MPI.Exception as exc:
        if comm == MPI.COMM_NULL:
            raise ValueError(
                "zcoll: the communicator is MPI.COMM_NULL (freed, or this rank is not in it)"
            ) from None
        raise ValueError(f"zcoll: unusable communicator ({exc.Get_error_string()})") from None
    if ctx is not None:
        return ctx
    if comm.Is_inter():
        raise TypeError("zcoll: intercommunicators are not supported; use an intracommunicator")
    ctx = Context(comm)
    comm.Set_attr(_attribute_key(), ctx)
    _by_handle[ctx.handle] = ctx
    return ctx


def _close_all() -> None:
    # Peers still waiting for this rank (it leaves with them inside a collective) learn it now,
    # not after their timeout: the process lives on in MPI_Finalize, where no liveness check
    # can see that it left.
    _core.depart_everywhere(_core.DEPARTED_EXITED, "")
    for ctx in list(_live_contexts):
        ctx.close()


def _announce_uncaught(exc_type, exc, tb) -> None:
    """sys.excepthook: the departure, with the exception's type, then the previous hook. Not
    at an interactive prompt, where an uncaught exception does not end the interpreter."""
    if not hasattr(sys, "ps1"):
        name = getattr(exc_type, "__name__", "exception")
        _core.depart_everywhere(_core.DEPARTED_EXCEPTION, name)
    _previous_excepthook(exc_type, exc, tb)


# mpi4py finalizes MPI from Py_AtExit, after every atexit handler: this one runs first.
atexit.register(_close_all)
_previous_excepthook = sys.excepthook
sys.excepthook = _announce_uncaught
# mpiexec ends a job with SIGTERM: the handler announces the departure, then hands the signal
# on (to a Python handler installed before zcoll, or the default action).
_core.install_departure_handler(signal.SIGTERM)


def _as_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects, which cannot live in shared memory")
    return dt
