"""Node pools: what a full context creation learned, kept for the communicators derived from it.

A full creation (:func:`zcoll._node.join`) splits the communicator into nodes, gathers the
ranks' processes and places, creates a node pool segment (``_core.NodePool``: control blocks,
each a context's call protocol, barrier and eager slots) and probes CMA. A :class:`Pool` keeps
all of it, with the communicator's group. The first zcoll call on a communicator whose ranks all
belong to a live pool's group -- a Dup, Split, Create_cart or Sub of it -- then makes its
context from the pool (:func:`derive`): its node ranks are found by translating its group into
the pool's (no Split_type), the node's lowest rank claims a block of the node's pool segment
(no new shared memory), and one allgather of two integers per rank checks that every rank chose
the same pool and tells each node's ranks their block. Pids, placement, the CMA verdict and the
tuning table come from the pool. What follows from the communicator's ranks -- its nodes, node
ranks and the engine's set-up of its contexts -- is a :class:`Layout`, which the pool keeps per
group of ranks and settings: a second ``Dup`` of a communicator, or ``Sub`` of a Cartesian one,
only claims a block, agrees and opens its context.

Each rank takes the earliest pool of its own that contains the communicator. Ranks whose pools
differ (a pool's contexts freed on some ranks only), a settings change that alters the node
structure (virtual nodes, topology, tuning), a full pool or ``ZCOLL_NODE_POOLS=0`` make the
allgather say so on every rank, and the context is then created in full, with a pool of its
own. Unrelated communicators (not contained in one pool's group) get their own pool too: a
shared one would need an agreement on its segment among ranks that share no communicator.
Contexts hold their pool, so a pool outlives the communicator that made it while any context
uses it; freeing them in any order is safe.

The last :data:`KEPT_POOLS` pools made are also kept after their last context is freed: code
that makes and frees a communicator at a time (a test suite, an FFT made per field or per
stage, each ``Subcomm`` of a communicator zcoll never saw) would otherwise make every one in
full. An idle pool holds one mapping and no reserved block.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import functools
import weakref
from collections.abc import Iterable
from typing import Any

from mpi4py import MPI

from . import _core, _settings, _tuning
from ._transport import wait_bounded

__all__ = ["Derived", "Layout", "Pool", "derive", "eager_capacity", "pool_for", "register"]

_NO_POOL = -1
#: What a PeerError of a context creation's wait names.
CREATION = "the first zcoll call on this communicator (making its context)"
_pools: list[weakref.ref[Pool]] = []  # live pools of this process, in creation order
#: How many of the latest pools stay alive with no context (see the module's notes).
KEPT_POOLS = 4
#: How many layouts a pool keeps (a program deriving from many different groups makes more).
MAX_LAYOUTS = 64
_kept: collections.deque[Pool] = collections.deque(maxlen=KEPT_POOLS)


@dataclasses.dataclass(eq=False)
class Pool:
    """A full creation's node structure and node pool segment, for derived communicators."""

    token: int  # the same on every rank of the communicator that made it (its rank 0's)
    group: MPI.Group  # that communicator's group
    rank: int  # this rank in it
    node_of: tuple[int, ...]  # node of each of its ranks, named by the node's lowest rank
    machine_of: tuple[str, ...]  # machine of each of its ranks
    places: dict[int, tuple[int, int, int, int]]  # rank on this node -> pid, NUMA, package, L3
    core: _core.NodePool  # this node's pool segment
    cma: tuple[str, str]  # the node's CMA verdict (state, why refused)
    settings: _settings.Settings  # what the full creation read
    tuning: _tuning.SharedTuning = _tuning.SharedTuning()  # as shared_tuning gave it
    # This rank's view of the pool's arena, which every context of the pool allocates from
    # first (held here: the arena's allocator must outlive every context that uses it).
    arena: _core.PoolArena | None = None
    # The layouts of communicators derived from the pool, by their pool ranks (Layout), the
    # most recently made last; at most MAX_LAYOUTS.
    layouts: dict[tuple[int, ...], Layout] = dataclasses.field(default_factory=dict)


def eager_capacity(s: _settings.Settings) -> int:
    """Eager bytes per rank a pool's blocks hold: the largest the settings give any context."""
    return max(s.eager_bytes_for(True), s.eager_bytes_for(False))


def register(pool: Pool) -> None:
    """Local: `pool` serves later derived communicators while some context holds it."""
    _pools[:] = [ref for ref in _pools if ref() is not None]
    _pools.append(weakref.ref(pool))
    _kept.append(pool)
    weakref.finalize(pool, _free_group, pool.group)


def _free_group(group: MPI.Group) -> None:
    if not MPI.Is_finalized():
        group.Free()


@dataclasses.dataclass(eq=False)
class Layout:
    """A derived communicator's node as its pool gives it: a function of the communicator's
    pool ranks and the settings, so made once and kept by the pool for every communicator
    with the same ranks (each Dup of one communicator, each Sub of one Cartesian one)."""

    settings: _settings.Settings  # under which it was made
    ranks: tuple[int, ...]  # the pool rank of each communicator rank
    rank: int  # this rank among the node's
    members: tuple[int, ...]  # the communicator's ranks on this node, in rank order
    node_of: tuple[int, ...]  # node of each communicator rank, named by its lowest rank
    leaders: tuple[int, ...]  # the lowest communicator rank of each node
    oversubscribed: bool
    numa_nodes: tuple[int, ...]  # the NUMA node of each node rank
    # The engine's set-up of its contexts (_node.context_setup), made with the first.
    setup: _core.ContextSetup | None = None

    @property
    def multi_node(self) -> bool:
        return len(self.leaders) > 1


@dataclasses.dataclass(frozen=True)
class Derived:
    """A derived communicator's node, as the pool gives it, and its context's block."""

    pool: Pool
    layout: Layout
    block: int  # this node's block of the pool segment


def _compatible(pool: Pool, s: _settings.Settings) -> bool:
    """Whether a context made now under `s` has the pool's node structure and tuning."""
    p = pool.settings
    return (
        s.virtual_node_size == p.virtual_node_size
        and s.topology == p.topology
        and s.tuning == p.tuning
        and s.tuning_file == p.tuning_file
    )


def _oversubscribed(pool: Pool, ranks: tuple[int, ...], s: _settings.Settings) -> bool:
    """Whether the communicator of pool ranks `ranks` has more ranks on this machine than
    CPUs."""
    machine = pool.machine_of[pool.rank]
    return sum(1 for r in ranks if pool.machine_of[r] == machine) > s.cpus


def _layout(pool: Pool, ranks: tuple[int, ...], s: _settings.Settings) -> Layout:
    """The layout of the communicator of pool ranks `ranks` under `s`: the pool's if it has
    one, else made and kept."""
    layout = pool.layouts.get(ranks)
    if layout is not None and layout.settings is s:
        return layout
    here = pool.node_of[pool.rank]
    members = tuple(d for d, r in enumerate(ranks) if pool.node_of[r] == here)
    # The same nodes as the pool's, named by their lowest communicator rank.
    lowest: dict[int, int] = {}
    for d, r in enumerate(ranks):
        lowest.setdefault(pool.node_of[r], d)
    node_of = tuple(lowest[pool.node_of[r]] for r in ranks)
    me = members.index(ranks.index(pool.rank))
    layout = Layout(
        settings=s,
        ranks=ranks,
        rank=me,
        members=members,
        node_of=node_of,
        leaders=tuple(lowest.values()),
        oversubscribed=_oversubscribed(pool, ranks, s),
        numa_nodes=tuple(pool.places[ranks[m]][1] for m in members),
    )
    pool.layouts.pop(ranks, None)
    pool.layouts[ranks] = layout
    if len(pool.layouts) > MAX_LAYOUTS:
        del pool.layouts[next(iter(pool.layouts))]
    return layout


def _containing(comm: MPI.Comm, s: _settings.Settings) -> tuple[Pool, Layout] | None:
    """The earliest live pool that serves `comm` under `s` -- its group holds every rank of
    `comm`, its node structure and tuning are those of `s`, its blocks hold the eager slots --
    with the layout of `comm` in it; None when there is none."""
    group = comm.Get_group()
    try:
        for ref in _pools:
            pool = ref()
            if pool is None or not _compatible(pool, s):
                continue
            ranks = tuple(MPI.Group.Translate_ranks(group, None, pool.group))
            if MPI.UNDEFINED in ranks:
                continue
            layout = _layout(pool, ranks, s)
            if s.eager_bytes_for(layout.oversubscribed) <= pool.core.eager_bytes:
                return pool, layout
    finally:
        group.Free()
    return None


def pool_for(comm: MPI.Comm, s: _settings.Settings) -> Pool | None:
    """Local: the pool a context of `comm` made now would be derived from (what every rank
    chooses unless the ranks' pools differ), or None (pools off, or none holds `comm`)."""
    found = _containing(comm, s) if s.node_pools == "1" else None
    return None if found is None else found[0]


def derive(comm: MPI.Comm, s: _settings.Settings, live: Iterable[Any] = ()) -> Derived | None:
    """Collective over `comm`: its node from a pool and this node's block of the pool segment;
    None on every rank when the context must be created in full (no pool every rank shares, a
    full pool segment, pools off). `live`: the process's live contexts, whose barriers tell the
    agreement's wait of a node peer that left or died."""
    found = _containing(comm, s) if s.node_pools == "1" else None
    token, block = _NO_POOL, -1
    if found is not None:
        pool, layout = found
        token = pool.token
        if layout.members[0] == comm.rank:
            block = _claim(pool.core, len(layout.members))
    # The one agreement: every rank's pool and, from each node's lowest rank, its block. It is
    # the first message of every context creation, so its bounded wait is what keeps a rank
    # that never makes the call from hanging the others in the blocking MPI calls of a full
    # creation. A wait that gives up keeps the block: a late peer may still be told to use it.
    # array.array: two int64 per rank, made in a fraction of NumPy's time (a first call's cost).
    mine = array.array("q", (token, block))
    gathered = array.array("q", bytes(16 * comm.size))
    request = comm.Iallgather(mine, gathered)
    gone = None if found is None else functools.partial(_gone_peers, *found, live)
    wait_bounded(request, comm.rank, CREATION, (mine, gathered), gone)
    tokens, blocks = gathered[0::2], gathered[1::2]
    if (
        found is None
        or any(t != token for t in tokens)
        or not all(blocks[d] >= 0 for d in layout.leaders)
    ):
        _fall_back(found, block)
        return None
    return Derived(pool, layout, blocks[layout.members[0]])


def _gone_peers(pool: Pool, layout: Layout, live: Iterable[Any]) -> str:
    """Why ranks of the derived communicator on this node will never take part in its
    agreement ("peer rank 2 (pid 7) left on an uncaught ValueError", each such rank), or "":
    what the barriers of the pool's live contexts know of their processes."""
    rank_of = {pool.places[layout.ranks[m]][0]: m for m in layout.members}  # pid -> comm rank
    gone = {
        rank_of[pid]: f"peer rank {rank_of[pid]} (pid {pid}) {why}"
        for ctx in list(live)
        if ctx.pool is pool
        for pid, why in ctx.core.gone_peers()
        if pid in rank_of
    }
    return "; ".join(gone[rank] for rank in sorted(gone))


def _fall_back(found: tuple[Pool, Layout] | None, block: int) -> None:
    """Frees the block this rank claimed for a derivation the ranks did not agree on."""
    if found is not None and block >= 0:
        found[0].core.abandon(block)


def _claim(core: _core.NodePool, users: int) -> int:
    """A block for `users` node ranks, or -1 (none free, or /dev/shm full)."""
    try:
        return core.claim(users)
    except OSError:
        return -1
