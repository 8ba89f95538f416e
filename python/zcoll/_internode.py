"""allgather between nodes: the SC'05 concurrent exchange among the nodes' leaders.

After the node-local part of an allgather (the engine fills every rank's blocks of its own
node), the blocks of the other nodes are missing. The *direct* path
(``Transport.exchange_remote``, in the extension) sends every rank's block to every rank on another
node: ``P - q`` messages per rank. The *concurrent exchange* of the SC'05 all-gather paper
on network concurrency (its concurrency index C, §3) runs between the node leaders only
(``ctx.leaders``: one rank per node, in node order), moving whole nodes' worth of blocks at
once, and then each leader hands the blocks it received to its node's other ranks
through shared memory (one node-local ``bcast``).

The concurrent exchange with concurrency index ``C`` (§3.1): the ``N`` leaders form ``C``
groups of consecutive nodes (sizes differ by at most one). Within a group of ``m`` members the
leaders run a dissemination (Bruck) allgather: in step ``s`` (distance ``d = 2**s``,
``ceil(log2 m)`` steps) member ``j`` sends the group's blocks it holds, those of members
``j .. j + min(d, m - d) - 1`` (mod ``m``), to member ``j - d``; the same message goes to the
*peers of the pair* in every other group -- the members ``k`` with ``k mod m == j - d`` -- and
before the first step each member sends its own node's blocks to its peers (``k mod m == j``).
A member ``k`` of another group so receives, from its anchor ``a = k mod m`` and the members
``a + 1, a + 2, a + 4, ...``, every block of the group exactly once. A round waits for all its
messages: round 0 has the ``C - 1`` preamble messages and the first step's ``C`` (the paper
overlaps the preamble with the first step), every later round ``C``. ``C = 1`` is the ordinary
dissemination allgather over the leaders (``ceil(log2 N)`` rounds of one exchange), the
baseline. Group sizes need not be powers of two, nor equal (``k mod m`` maps a larger group's
extra members onto the smaller group's chains).

Message splitting (§3.2): for blocks of :data:`SPLIT_BYTES` and more, with ``C >= 2``, every
block is cut in two halves; the first halves travel as above, the second halves by the mirror
scheme (members numbered from the other end: the *co-pair* at the same distance in the
opposite direction), with ``C // 2`` groups, so each step still has ``C`` exchanges in flight.

No packing: each message is the receive buffer's byte ranges that hold its nodes' blocks,
the contiguous runs of them (one run for consecutive nodes of consecutive ranks, more where a
node's comm ranks are not contiguous or blocks are split: each run then travels as a message
of its own, in order), computed once per (context, block size, scheme) and cached. A round's
messages go through :meth:`Transport.exchange_buffers` on the context's private dup, sent by
the extension; every wait is bounded.

The choice between the direct path and the concurrent exchange (and ``C``) for blocks beyond
the round's limit is the engine's crossing policy's (``cpp/zcoll/crossing_policy.hpp``: a
forced choice, else the tuning table's ``internode`` rules from ``python -m zcoll.tune
--internode``, else the direct path); it is the same on every rank (the table's rules are
those rank 0 read, shared with the context). The table's "round" rules set the round's limit
there too.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from . import _aggregated, _registry, _tuning
from ._context import Context, context

__all__ = [
    "CONCURRENT",
    "DIRECT",
    "METHODS",
    "ROUND",
    "SPLIT_BYTES",
    "Choice",
    "Message",
    "allgather_between_nodes",
    "choose",
    "force",
    "schedule",
]

ROUND = "round"
DIRECT = "direct"
CONCURRENT = "concurrent"
#: How blocks beyond the round's limit cross nodes (the tuning table's internode rules name
#: these, and ROUND, which sets the round's limit).
METHODS = (DIRECT, CONCURRENT)
#: Blocks of this many bytes and more are split in halves between pair and co-pair (C >= 2).
SPLIT_BYTES = 64 * 1024
_TAG_BASE = 0x7D00  # tags of the leaders' messages on the private dup (direct path: 0x7A0C)
_CACHED_BLOCKS = 8  # plans kept per context (least recently used dropped)
_BCAST_CODE = _registry.OPS[_registry.BCAST]
_AUTO_ALGORITHM = _registry.REDUCE_ALGORITHM_CODES[_registry.AUTO]


@dataclass(frozen=True)
class Choice:
    """How an allgather's blocks cross nodes: `method` "round" (in the call's round of
    messages), "direct" (every rank to every remote rank) or "concurrent" (the leaders'
    concurrent exchange with index `concurrency`)."""

    method: str
    concurrency: int = 0

    def label(self) -> str:
        return self.method if self.method != CONCURRENT else f"C={self.concurrency}"


# --- which method ------------------------------------------------------------------------------


def force(comm: MPI.Comm, choice: Choice | None) -> Choice | None:
    """Make every later allgather across nodes on `comm` use `choice` (None: the table or the
    built-in rule again); returns the previous forced choice. Every rank of `comm` calls it
    alike, between collectives (benchmarks and tests); other communicators keep the policy's
    choices. On one node, where nothing crosses, it only checks `choice` and returns None.

    A forced choice applies to every block size: while one is set, the round between nodes
    carries every block ("round") or none (``_aggregated.force``; set back on
    ``force(comm, None)``) -- for every collective on `comm`, so "round" and "direct" force an
    alltoall's way too (``zcoll.tune --internode`` times both collectives so)."""
    if choice is not None:
        _check_choice(choice)  # before anything is set: a bad choice changes nothing
    ctx = context(comm)
    if not ctx.multi_node:
        return None
    state = _state(ctx)
    # The extension's one crossing runs what is rank to rank: every call when forced so, none
    # when the concurrent exchange is forced, else the sizes the policy chose it for.
    crossing = {None: 0, ROUND: 0, DIRECT: 1, CONCURRENT: 2}
    concurrency = choice.concurrency if choice is not None and choice.method == CONCURRENT else 0
    ctx.core.nodes_force_allgather_crossing(
        crossing[choice.method if choice else None], concurrency
    )
    if choice is not None:
        aggregation = _aggregated.force(comm, choice.method == ROUND)
        if state.forced is None:
            state.aggregation_before = aggregation
    elif state.forced is not None:
        _aggregated.force(comm, state.aggregation_before)
    previous, state.forced = state.forced, choice
    return previous


def _check_choice(choice: Choice) -> None:
    known = (ROUND, *METHODS)
    if choice.method not in known:
        raise ValueError(f"internode method must be one of {known}, got {choice.method!r}")
    if choice.method == CONCURRENT and not (
        type(choice.concurrency) is int and choice.concurrency >= 1
    ):
        raise ValueError(f"concurrency must be a positive integer, got {choice.concurrency!r}")


class _State:
    """What this module keeps per context: the cached plans of the leaders' rounds, and the
    forced choice (:func:`force`) with the round's carry as it was before it."""

    def __init__(self) -> None:
        self.plans: OrderedDict[tuple, list] = OrderedDict()
        self.forced: Choice | None = None
        self.aggregation_before: bool | None = None


_states: weakref.WeakKeyDictionary[Context, _State] = weakref.WeakKeyDictionary()


def _state(ctx: Context) -> _State:
    state = _states.get(ctx)
    if state is None:
        state = _states[ctx] = _State()
    return state


def _layout(ctx: Context) -> tuple[list[int], list[list[int]]]:
    """The nodes (named by their leader's comm rank, in node order) and each node's ranks."""
    nodes = sorted(set(ctx.node_of))
    index = {n: i for i, n in enumerate(nodes)}
    members: list[list[int]] = [[] for _ in nodes]
    for rank, node in enumerate(ctx.node_of):
        members[index[node]].append(rank)
    return nodes, members


def choose(ctx: Context, block: int) -> Choice:
    """How this multi-node allgather of `block`-byte blocks, beyond its round's limit, crosses
    nodes: the engine's crossing policy decides (a forced choice, else the tuning table's
    rules for these nodes when the tuning mode is not "off", else the direct path). The same
    on every rank."""
    method, concurrency = ctx.core.nodes_allgather_route(block)
    if method == _tuning.INTERNODE_METHOD_CODES[CONCURRENT]:
        return Choice(CONCURRENT, concurrency)
    return Choice(DIRECT)


# --- the schedule ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """One message of the leaders' exchange: from node `source` to node `dest` (indices in
    node order) in round `round`, carrying the blocks of nodes `content`; `part` 0 is the
    whole block (or its first half when split), 1 the second half; `preamble` marks the
    own-node messages sent before the first step."""

    source: int
    dest: int
    round: int
    content: tuple[int, ...]
    part: int = 0
    preamble: bool = False

    @property
    def tag(self) -> int:
        return _TAG_BASE + ((self.round * 2 + self.part) * 2 + int(self.preamble))


def _groups(nodes: int, count: int) -> list[list[int]]:
    """`count` groups of consecutive node indices, sizes differing by at most one."""
    base, extra = divmod(nodes, count)
    out, start = [], 0
    for g in range(count):
        size = base + (g < extra)
        out.append(list(range(start, start + size)))
        start += size
    return out


def _steps(m: int) -> int:
    return (m - 1).bit_length()  # ceil(log2 m), 0 for m = 1


def schedule(nodes: int, concurrency: int, split: bool = False) -> list[Message]:
    """Every message of the concurrent exchange on `nodes` nodes (see the module docstring).

    Parameters
    ----------
    nodes : int
        Number of nodes (leaders).
    concurrency : int
        The concurrency index C (capped at `nodes`); 1 is the dissemination allgather.
    split : bool
        Halves of every block by pair and co-pair (§3.2): ``C // 2`` groups, each run in both
        directions, part 0 and part 1.

    Returns
    -------
    list of Message
        Each node receives every other node's blocks exactly once per part.
    """
    parts: tuple[tuple[int, bool], ...] = ((0, False), (1, True)) if split else ((0, False),)
    count = max(1, min(concurrency // 2 if split else concurrency, nodes))
    groups = _groups(nodes, count)
    messages = []
    for part, mirrored in parts:
        # The mirror scheme numbers each group's members from the other end.
        order = [g[::-1] if mirrored else g for g in groups]
        for gi, group in enumerate(order):
            m = len(group)
            for gj, receivers in enumerate(order):
                for k, dest in enumerate(receivers):
                    a = k % m
                    if gi != gj:  # the preamble: the anchor's own node
                        messages.append(Message(group[a], dest, 0, (group[a],), part, True))
                    for s in range(_steps(m)):
                        d = 1 << s
                        j = (a + d) % m
                        content = tuple(group[(j + t) % m] for t in range(min(d, m - d)))
                        messages.append(Message(group[j], dest, s, content, part))
    return messages


# --- running it --------------------------------------------------------------------------------


def _runs(members: list[list[int]], content, block: int, part: int, split: bool) -> list:
    """The receive buffer's byte ranges (start, stop) of `content`'s blocks (or of their
    `part` half when `split`), adjacent ones merged; sender and receiver compute the same."""
    first = block // 2 if split else block
    offset, length = (0, first) if part == 0 else (first, block - first)
    runs: list[list[int]] = []
    for node in content:
        for r in members[node]:
            start = r * block + offset
            if runs and runs[-1][1] == start:
                runs[-1][1] += length
            else:
                runs.append([start, start + length])
    return [(start, stop) for start, stop in runs]


def _plan(ctx: Context, concurrency: int, block: int) -> list:
    """This leader's rounds for (C, block): per round, (receives, sends), each a list of
    (peer's comm rank, tag, start, stop) byte ranges of the receive buffer, one message each;
    cached per context (LRU over block sizes)."""
    state = _state(ctx)
    split = concurrency >= 2 and block >= SPLIT_BYTES
    key = (concurrency, block, split)
    entry = state.plans.get(key)
    if entry is not None:
        state.plans.move_to_end(key)
        return entry
    nodes, members = _layout(ctx)
    assert ctx.leaders is not None  # leaders only
    me = ctx.leaders.rank  # the leaders in node order: a leader's rank is its node's index
    messages = schedule(len(nodes), concurrency, split)
    rounds: list[tuple[list, list]] = [([], []) for _ in range(1 + max(m.round for m in messages))]
    for m in messages:
        if me not in (m.source, m.dest):
            continue
        peer, into = (m.source, 0) if m.dest == me else (m.dest, 1)
        runs = _runs(members, m.content, block, m.part, split)
        rounds[m.round][into].extend((nodes[peer], m.tag, a, b) for a, b in runs)
    entry = [r for r in rounds if r[0] or r[1]]
    state.plans[key] = entry
    if len(state.plans) > _CACHED_BLOCKS:
        state.plans.popitem(last=False)
    return entry


def allgather_between_nodes(ctx: Context, send, recv: np.ndarray, block: int, concurrency: int):
    """The blocks of the other nodes into every rank's `recv`, after the node-local engine
    allgather filled this node's blocks: the leaders' concurrent exchange with index
    `concurrency`, then a node-local bcast of the leader's `recv`.

    Parameters
    ----------
    ctx : Context
        A multi-node context.
    send : numpy.ndarray or zcoll.IN_PLACE
        This rank's block (unused: the node's blocks are already in `recv`); kept for the
        signature the direct path has.
    recv : numpy.ndarray
        C-contiguous receive buffer, ``ctx.size`` blocks of `block` bytes.
    block : int
        Bytes per block, the same on every rank.
    concurrency : int
        Concurrency index C >= 1.

    Raises
    ------
    zcoll.PeerError
        If a peer leader does not take part within the timeout, or a node peer dies.
    """
    del send
    if block == 0:
        return
    flat = recv.reshape(-1).view(np.uint8)
    if ctx.leaders is not None:
        what = f"zcoll.allgather (concurrent exchange between nodes, C={concurrency})"
        for receives, sends in _plan(ctx, concurrency, block):
            ctx.transport.exchange_buffers(
                what,
                [(peer, tag, flat[a:b]) for peer, tag, a, b in receives],
                [(peer, tag, flat[a:b]) for peer, tag, a, b in sends],
            )
    if ctx.node_size > 1:
        ctx.core.reduction(_BCAST_CODE, None, flat, 0, _AUTO_ALGORITHM, ctx.local_ranks[0])
