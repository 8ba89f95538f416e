"""alltoall on a communicator spanning several nodes (TPDS'18 §2.5, "MN-CO"): the size rule
and its forcing, and the blocks a plan sends rank to rank between nodes. The calls themselves
run whole in the extension (`Transport.collective`, `bind_exchange.cpp`).

Every call on several nodes starts with a round of messages between nodes that carries each
rank's call record to every rank (`Transport.round`, engine `aggregate.hpp`): one message
per ordered pair of nodes, sent and received by ranks spread over each node. An alltoall puts
its blocks into the same round: phase 1 (engine) packs, in Morton order and equal shares,
every block bound for another node into that node's message; phase 2 is the round's MPI
point-to-point exchange, N * (N - 1) messages instead of P * (P - P/N); phase 3 (engine)
checks every rank's record -- so the check across nodes costs no extra round -- and copies the
node-local and the received blocks into the receive buffers.

Blocks larger than the size rule's limit (`pack_limit`: 4 KiB times the smallest node's ranks, at
most 64 KiB) are not packed (a copy that saves nothing once
messages are large): the round then carries the records only, and after the node-local part
the blocks between nodes go rank to rank. Either way nothing is written into a receive buffer
before every rank of every node is known to have valid, matching arguments.
"""

from __future__ import annotations

from mpi4py import MPI

from . import _core, _registry
from ._context import Context, context

__all__ = [
    "AGGREGATE_MAX_BLOCK",
    "AGGREGATE_UNIT_BLOCK",
    "force",
    "messages_per_call",
    "pack_limit",
]

ALLTOALL = _registry.ALLTOALL

#: The size rule (the engine's, aggregate.hpp): a call across nodes carries in its round's
#: messages -- an alltoall aggregates, an irregular call packs -- the blocks of at most
#: ``AGGREGATE_UNIT_BLOCK * q`` bytes, q the ranks of the smallest node, and at most
#: ``AGGREGATE_MAX_BLOCK``; larger ones go rank to rank (docs/design.md).
AGGREGATE_UNIT_BLOCK: int = _core.AGGREGATE_UNIT_BLOCK
AGGREGATE_MAX_BLOCK: int = _core.AGGREGATE_MAX_BLOCK


def force(comm: MPI.Comm, aggregate: bool | None) -> bool | None:
    """Make every later call across nodes on `comm` carry its blocks in the round between
    nodes (True: an alltoall aggregates, an allgather or irregular call packs them) or send
    them after it (False) whatever their size; None: the size rule again. Returns the previous
    setting. Every rank of `comm` calls it alike, between collectives (benchmarks and tests);
    other communicators keep the size rule. On one node, where nothing crosses, it does
    nothing and returns None."""
    ctx = context(comm)
    if not ctx.multi_node:
        return None
    previous = ctx.core.nodes_force_aggregation(0 if aggregate is None else 1 if aggregate else -1)
    return {0: None, 1: True, -1: False}[previous]


#: Bytes of a segment of the messages of a reduction or bcast spread across nodes (the engine's,
#: spread_reduction.hpp): an owner folds (a bcast's: forwards) each segment as it arrives.
SPREAD_SEGMENT_BYTES: int = _core.SPREAD_SEGMENT_BYTES


def spread_segment(comm: MPI.Comm, nbytes: int | None) -> int | None:
    """Cut the messages of later reductions and bcasts on `comm` spread across nodes (beyond
    their round's rule) into segments of `nbytes` (a positive multiple of 64); None:
    ``SPREAD_SEGMENT_BYTES`` again. Returns the previous setting. Every rank of `comm` calls
    it alike, between collectives (benchmarks and tests); on one node it does nothing and
    returns None."""
    ctx = context(comm)
    if not ctx.multi_node:
        return None
    return ctx.core.nodes_force_spread_segment(nbytes or 0) or None


def pack_limit(ctx: Context, opname: str = ALLTOALL) -> int:
    """Largest block (bytes) a call of `opname` on the multi-node context `ctx` carries in its
    round's messages: the size rule (an allgather's four times an alltoall's; irregular calls take
    an alltoall's), or what `force` set (everything, or -1: nothing)."""
    return ctx.core.nodes_pack_limit(_registry.OPS[opname])


def messages_per_call(nodes: list[int], aggregate: bool) -> int:
    """MPI messages between nodes per alltoall on nodes of `nodes` ranks each: one per ordered
    node pair when aggregated (N * (N - 1)), else those plus one per pair of ranks on
    different nodes (P * (P - P/N) for equal nodes)."""
    n = len(nodes)
    pairs = n * (n - 1)
    if aggregate:
        return pairs
    p = sum(nodes)
    return pairs + sum(q * (p - q) for q in nodes)
