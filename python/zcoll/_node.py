"""Node setup: which ranks of a communicator share this rank's node and machine, and the
engine's node context over the control block they share.

Collective over the communicator. A full creation (:func:`join`) splits the node, shares a new
node pool segment (its name through MPI, here) and probes CMA, and keeps what it learned as a
:class:`zcoll._pool.Pool`; a communicator derived from it takes a block of that pool instead
(:func:`from_pool`). The engine itself never calls MPI.
"""

from __future__ import annotations

import dataclasses
import functools
import os

from mpi4py import MPI

from . import _core, _pool, _settings
from ._registry import BARRIER_CODES

__all__ = [
    "Node",
    "context_setup",
    "from_pool",
    "join",
    "machine_id",
    "machine_ranks",
    "split_node",
]


@dataclasses.dataclass(frozen=True)
class Node:
    """This rank's node within a communicator, and the engine's context on it."""

    size: int
    rank: int
    local_ranks: tuple[int, ...]  # the node's ranks in the communicator, in node order
    node_of: tuple[int, ...]  # node of each communicator rank, named by its lowest rank
    multi_node: bool
    oversubscribed: bool  # more ranks on this machine than CPUs
    numa_nodes: tuple[int, ...]  # the NUMA node each node rank runs on
    core: _core.NodeContext
    pool: _pool.Pool  # the node pool its control block is in


@functools.cache  # fixed while the process runs; read once, not by every context made
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


def split_node(comm: MPI.Comm, virtual_node_size: int | None = None) -> tuple[MPI.Comm, int]:
    """Ranks of `comm` sharing memory with this one (ordered by rank in `comm`); optionally cut
    into virtual nodes of `virtual_node_size` ranks (default: ZCOLL_VIRTUAL_NODE_SIZE) so the
    multi-node path runs for real. Also returns how many ranks of `comm` share the machine
    (the CPUs are shared by all of them, virtual nodes or not: :func:`machine_ranks`).

    A rank's virtual node is its ``COMM_WORLD`` rank // k, the same for every communicator,
    so arena arrays allocated on one communicator are shared exactly as on a real node."""
    k = virtual_node_size
    if k is None:
        k = _settings.read("virtual_node_size").value
    return _node_comm(comm, k), machine_ranks(comm)


def _node_comm(comm: MPI.Comm, virtual_node_size: int) -> MPI.Comm:
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    if virtual_node_size:
        virtual = node.Split(color=MPI.COMM_WORLD.rank // virtual_node_size, key=node.rank)
        node.Free()
        node = virtual
    return node


def _share_pool(node: MPI.Comm, eager_bytes: int) -> _core.NodePool:
    """Collective over `node`: a new node pool segment, created by the node's rank 0, mapped by
    every rank, then unlinked; its block 0 is the full creation's."""
    segment, error = None, None
    if node.rank == 0:
        try:
            segment = _core.NodePool.create(node.size, eager_bytes)
        except OSError as exc:
            error = str(exc)
    name, error = node.bcast((segment.name if segment else None, error), root=0)
    if error is None and node.rank != 0:
        try:
            segment = _core.NodePool.attach(name, node.size, eager_bytes)
        except OSError as exc:
            error = str(exc)
    errors = node.allgather(error)
    if node.rank == 0 and segment is not None:
        segment.unlink()  # everyone has it mapped (or gave up): nothing can leak from here on
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        raise OSError(f"zcoll: could not share the node pool segment: {failed}")
    assert segment is not None  # every rank created or attached it, or all raised above
    return segment


def context_setup(
    comm_size: int,
    s: _settings.Settings,
    rank: int,
    local_ranks: tuple[int, ...],
    places: list[tuple[int, int, int, int]],
    oversubscribed: bool,
    node_of: tuple[int, ...],
    cma: tuple[str, str] | None = None,
) -> _core.ContextSetup:
    """The engine's set-up of a context (context_setup.hpp): node rank `rank` of the ranks
    `local_ranks` of a communicator of `comm_size` ranks, each at pid, NUMA node, package, L3
    `places`, configured by the settings `s`, each communicator rank on node `node_of` (named
    by its lowest rank); the node's CMA verdict `cma` when known (a pool's), else the context
    probes it."""
    size = len(local_ranks)
    multi_node = len(set(node_of)) > 1
    return _core.ContextSetup(
        rank=rank,
        size=size,
        comm_size=comm_size,
        comm_ranks=list(local_ranks),
        pids=[p[0] for p in places],
        barrier=BARRIER_CODES[s.barrier],
        **s.wait_for(oversubscribed),
        numa_nodes=[p[1] for p in places],
        packages=[p[2] for p in places],
        l3_caches=[p[3] for p in places],
        eager_bytes=s.eager_bytes_for(oversubscribed),
        copy_threshold=s.copy_threshold_for(size),
        copy_cache=s.llc_bytes,
        cma_bytes=s.cma_bytes,  # None: the built-in rule and the table's thresholds
        node_of=list(node_of) if multi_node else [],  # one node: no rounds between nodes
        cma=cma,
    )


def join(comm: MPI.Comm, s: _settings.Settings) -> Node:
    """Collective over `comm`: split it into nodes and make this rank's engine context on its
    node, configured by the settings `s` (read on every rank before any communication), in a
    new node pool that communicators derived from `comm` may share."""
    # What the node's ranks, and the communicator's, learn of each other travels in one
    # allgather over each: every allgather is a round of MPI messages.
    node = _node_comm(comm, s.virtual_node_size)
    try:
        # The reductions' tree follows L3s and NUMA nodes, order="numa" the NUMA nodes; under
        # ZCOLL_TOPOLOGY each rank's place on the described machine.
        here = s.placement(node.rank)
        mine = (comm.rank, os.getpid(), here["numa_node"], here["package"], here["l3_cache"])
        records = node.allgather(mine)
        pool = _share_pool(node, _pool.eager_capacity(s))
        rank = node.rank
    finally:
        node.Free()
    local_ranks = tuple(r[0] for r in records)
    places = [r[1:] for r in records]
    machine = machine_id()
    token = int.from_bytes(os.urandom(7), "little")  # rank 0's names the pool
    everyone = comm.allgather((local_ranks[0], machine, token))
    node_of = tuple(leader for leader, _, _ in everyone)
    multi_node = len(set(node_of)) > 1
    # Nodes of one machine (virtual or emulated) share its CPUs: count every rank on it.
    ranks_on_machine = sum(1 for _, m, _ in everyone if m == machine)
    oversubscribed = ranks_on_machine > s.cpus
    arena = pool.arena(rank, sorted(p[0] for p in places))
    setup = context_setup(comm.size, s, rank, local_ranks, places, oversubscribed, node_of)
    core = _core.open_context(pool, 0, setup, arena)
    # Collective on the node: can its ranks read each other's memory (CMA) and map each
    # other's shared heap? Decided before any call publishes a heap buffer.
    core.probe_cma()
    kept = _pool.Pool(
        token=everyone[0][2],
        group=comm.Get_group(),
        rank=comm.rank,
        node_of=node_of,
        machine_of=tuple(m for _, m, _ in everyone),
        places=dict(zip(local_ranks, places)),
        core=pool,
        cma=core.cma,
        settings=s,
        arena=arena,
    )
    numa_nodes = tuple(p[1] for p in places)
    return Node(
        len(local_ranks), rank, local_ranks, node_of, multi_node, oversubscribed, numa_nodes, core,
        kept,
    )  # fmt: skip


def from_pool(d: _pool.Derived) -> Node:
    """Local: this rank's node of a communicator derived from a pool (:func:`zcoll._pool.derive`,
    collective, made `d`), and its engine context on the node's block of the pool segment."""
    layout, pool = d.layout, d.pool
    if layout.setup is None:  # the layout's first context
        places = [pool.places[layout.ranks[m]] for m in layout.members]
        layout.setup = context_setup(
            len(layout.ranks), layout.settings, layout.rank, layout.members, places,
            layout.oversubscribed, layout.node_of, pool.cma,
        )  # fmt: skip
    core = _core.open_context(pool.core, d.block, layout.setup, pool.arena)
    return Node(
        len(layout.members), layout.rank, layout.members, layout.node_of, layout.multi_node,
        layout.oversubscribed, layout.numa_nodes, core, pool,
    )  # fmt: skip
